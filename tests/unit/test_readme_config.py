"""The README's configuration table is the one generated from ``SpecRagContext``."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_config_table_matches_the_context():
    spec = importlib.util.spec_from_file_location("config_table", ROOT / "docs/config_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert module.table() in readme, "README config table is stale: run python docs/config_table.py"


def test_every_run_folder_is_in_the_history_index():
    """README says every run is in docs/pair-history.md; its index ended on 2026-12-04 while
    the runs went on. Every docs/bench/ folder must be named there, and every folder it links
    must exist."""
    import re

    history = (ROOT / "docs/pair-history.md").read_text(encoding="utf-8")
    folders = {d.name for d in (ROOT / "docs/bench").iterdir() if d.is_dir()}
    linked = set(re.findall(r"\]\(bench/([^/)]+)/\)", history))
    assert folders - linked == set(), "add these to the index at the end of docs/pair-history.md"
    assert linked - folders == set(), "the index links folders that do not exist"


def test_make_repairs_a_venv_left_without_pip(tmp_path):
    """A review (2026-12-06): the Makefile made .venv only where ``bin/python`` was missing;
    a venv whose ensurepip was cut short (or missing: Debian without python3-venv) has that
    file, so every target then failed at ``pip`` until ``make clean``. The recipe's own line,
    run on such a venv, makes it whole."""
    import re
    import subprocess
    import sys

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (line,) = [ln.strip() for ln in makefile.splitlines() if "-m venv" in ln]
    values = {"BIN": ".venv/bin", "VENV": ".venv", "PY": sys.executable}
    command = re.sub(r"\$\((\w+)\)", lambda m: values[m[1]], line)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", ".venv"], cwd=tmp_path, check=True
    )
    pip = [str(tmp_path / ".venv/bin/python"), "-m", "pip", "--version"]
    assert subprocess.run(pip, capture_output=True).returncode != 0  # the broken venv
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert subprocess.run(pip, capture_output=True).returncode == 0
