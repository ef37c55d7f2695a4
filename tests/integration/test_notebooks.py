"""Every notebook runs top to bottom on the embedded CPU defaults; a failing cell fails."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.integration
NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_notebooks_are_committed_executed():
    # issue 9 #19a: a reader on the web sees answers, routes and plots; which run made them
    # is in the metadata. CI re-executes each notebook below (it must run, outputs may differ).
    assert len(NOTEBOOKS) == 5
    for path in NOTEBOOKS:
        book = nbformat.read(path, as_version=4)
        code = [c for c in book.cells if c.cell_type == "code"]
        assert all(c.get("execution_count") for c in code), path.name
        assert sum(bool(c.get("outputs")) for c in code) >= len(code) // 2, path.name
        errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, path.name
        assert book.metadata["specrag_run"]["commit"], path.name


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, tmp_path, monkeypatch, smol):
    monkeypatch.setenv("SPECRAG_NOTEBOOK_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("SPECRAG_NOTEBOOK_PAIR", raising=False)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    book = nbformat.read(path, as_version=4)
    NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [
        o for c in book.cells for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors


def test_committed_notebooks_hold_the_generators_cells(tmp_path):
    """The .ipynb files are written by notebooks/_make_notebooks.py: a cell edited in one and
    not the other would be lost (or kept stale) at the next regeneration."""
    import os
    import subprocess
    import sys

    script = NOTEBOOKS[0].parent / "_make_notebooks.py"
    env = {**os.environ, "SPECRAG_NOTEBOOKS_OUT": str(tmp_path)}
    subprocess.run([sys.executable, str(script)], check=True, env=env, capture_output=True)
    for path in NOTEBOOKS:
        made = nbformat.read(tmp_path / path.name, as_version=4)
        committed = nbformat.read(path, as_version=4)
        assert [(c.cell_type, c.source) for c in committed.cells] == [
            (c.cell_type, c.source) for c in made.cells
        ], path.name
