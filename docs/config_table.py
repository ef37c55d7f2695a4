"""Regenerate the README's configuration table from ``SpecRagContext`` (run: python docs/config_table.py)."""

import dataclasses
import re
import typing
from pathlib import Path

from specrag.graph.context import SpecRagContext, _range_text


def table() -> str:
    hints = typing.get_type_hints(SpecRagContext)
    rows = ["| field | default | allowed | description |", "|---|---|---|---|"]
    for f in dataclasses.fields(SpecRagContext):
        default = f.default
        shown = "`(see prompts/)`" if f.name.endswith("_prompt") else f"`{default!r}`"
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Literal:
            allowed = ", ".join(map(str, typing.get_args(hint)))
        elif hint is bool:
            allowed = "true, false"
        else:
            allowed = _range_text(f.metadata)
        desc = f.metadata.get("description", "").replace("\n", "\\n").replace("|", "\\|")
        rows.append(f"| `{f.name}` | {shown} | {allowed} | {desc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    readme = Path(__file__).resolve().parents[1] / "README.md"
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(r"\| field \| default \| allowed \| description \|\n(?:\|.*\n)+")
    readme.write_text(pattern.sub(lambda _: table(), text, count=1), encoding="utf-8")
