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
