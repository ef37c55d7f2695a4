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
