import json

from specrag import build_graph, make_specrag_tool
from tests.fakes import ctx, services


async def test_tool_runs_graph_and_returns_answer_with_sources():
    tool = make_specrag_tool(ctx(), graph=build_graph(services()))
    out = json.loads(await tool.ainvoke({"question": "What is the capital of France?"}))
    assert out["answer"] == "Paris." and out["route"] == "refine"
    assert out["sources"] == ["doc.txt"] and out["verified"] is True


def test_context_rejects_bad_values():
    import pytest

    from specrag.errors import InputError
    from specrag.graph.context import SpecRagContext

    with pytest.raises(InputError):
        SpecRagContext(top_k=0)
    with pytest.raises(InputError, match="unknown config key"):
        SpecRagContext.from_overrides({"bogus": "1"})
    assert SpecRagContext.from_overrides({"top_k": "5"}).top_k == 5
