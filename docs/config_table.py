"""Regenerate the README's configuration table from ``SpecRagContext`` (run: python docs/config_table.py)."""

import dataclasses
import re
from pathlib import Path

from specrag.graph.context import SpecRagContext


def table() -> str:
    allowed = SpecRagContext.allowed()
    rows = ["| field | default | allowed | description |", "|---|---|---|---|"]
    for f in dataclasses.fields(SpecRagContext):
        default = f.default
        shown = "`(see prompts/)`" if f.name.endswith("_prompt") else f"`{default!r}`"
        desc = f.metadata.get("description", "").replace("\n", "\\n").replace("|", "\\|")
        rows.append(f"| `{f.name}` | {shown} | {allowed[f.name]} | {desc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(r"\| field \| default \| allowed \| description \|\n(?:\|.*\n)+")
    readme.write_text(pattern.sub(lambda _: table(), text, count=1), encoding="utf-8")
