"""A fully offline agent: the pair's 1.5B (``ChatLocalLM``, tools through its chat template)
calls specrag's tool, which answers on the pair, and the agent cites the tool's source."""

import re

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage

from specrag import ChatLocalLM, SpecRagContext, make_specrag_tool
from specrag.data.datasets import squad_paragraphs
from specrag.indexing.pipeline import index_records
from specrag.tools import AGENT_PROMPT


def test_offline_agent_calls_specrag_and_cites_its_source(pair_models, tmp_path):
    records = [(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"][:10]
    index_records(records, tmp_path / "index", collection="agent")
    ctx = SpecRagContext(
        models="pair",
        index_dir=str(tmp_path / "index"),
        collection="agent",
        refine_temperature=0.0,
        answer_max_tokens=48,
        answer_timeout_s=600,
    )
    agent = create_agent(
        ChatLocalLM(
            model_name="qwen2.5-coder-1.5b", device="cpu", dtype="float32", max_new_tokens=160
        ),
        tools=[make_specrag_tool(ctx, output="text")],
        system_prompt=AGENT_PROMPT,
    )
    result = agent.invoke({"messages": [("user", "Who was the Norse leader?")]})
    messages = result["messages"]
    for m in messages:
        print(type(m).__name__, ":", m.content[:300] or m.tool_calls)
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls and calls[0]["name"] == "search_documents"
    tool_out = next(m for m in messages if isinstance(m, ToolMessage)).content
    assert "Rollo" in tool_out and "[sources: squad:Normans:" in tool_out
    sources = re.search(r"\[sources: ([^\]]+)\]", tool_out).group(1).split(", ")
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
    assert "Rollo" in final.content
    assert any(source in final.content for source in sources), final.content
