"""What LangGraph Studio reads from the graph langgraph.json names: its schemas as JSON."""

import json
from pathlib import Path

from specrag.graph.builder import graph

ROOT = Path(__file__).resolve().parents[2]


def test_langgraph_json_names_the_compiled_graph():
    spec = json.loads((ROOT / "langgraph.json").read_text())
    path, _, name = next(iter(spec["graphs"].values())).partition(":")
    assert (ROOT / path).is_file() and name == "graph"


def test_studio_renders_input_output_and_context_forms():
    """On Python 3.11 pydantic refuses typing.TypedDict: the input and output schemas raised,
    and Studio showed no form for the question (langgraph_api logs and drops the schema)."""
    assert list(graph.get_input_jsonschema()["properties"]) == ["question", "messages", "document"]
    output = graph.get_output_jsonschema()["properties"]
    assert {"answer", "route", "reason", "verified", "chunks", "stats"} <= set(output)
    assert "answer_policy" in graph.get_context_jsonschema()["properties"]


def test_the_studio_env_file_leaves_tracing_to_the_shell():
    """`langgraph dev` reads langgraph.json's env file and its values override the shell's:
    its LANGSMITH_TRACING=false switched off the tracing a user exported."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env_file = root / json.loads((root / "langgraph.json").read_text())["env"]
    settings = [
        line.split("=", 1)[0].strip()
        for line in env_file.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert settings and not [k for k in settings if k.startswith(("LANGSMITH_", "LANGCHAIN_"))]
