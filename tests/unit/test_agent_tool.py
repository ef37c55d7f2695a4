"""specrag as a tool inside a LangChain agent, and as a subgraph node."""

import json
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import START, MessagesState, StateGraph

from specrag import build_graph, make_specrag_tool
from tests.fakes import ctx, services


class FakeToolCaller(BaseChatModel):
    """Calls the tool once, then answers with what the tool returned."""

    @property
    def _llm_type(self) -> str:
        return "fake-tool-caller"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "FakeToolCaller":
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            data = json.loads(last.content)
            text = (
                f"{data['answer']} (sources: {', '.join(data['sources'])}; route {data['route']})"
            )
            msg = AIMessage(content=text)
        else:
            msg = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "search_documents",
                        "args": {"question": last.content},
                        "id": "call-1",
                    }
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=msg)])


async def test_agent_calls_specrag_tool_and_reports_answer_and_sources():
    graph_calls = []
    inner = build_graph(services())

    class Spy:
        async def ainvoke(self, inputs, **kw):
            graph_calls.append(inputs)
            return await inner.ainvoke(inputs, **kw)

    tool = make_specrag_tool(ctx(), graph=Spy())
    agent = create_agent(FakeToolCaller(), tools=[tool])
    result = await agent.ainvoke({"messages": [("user", "What is the capital of France?")]})
    final = result["messages"][-1]
    assert graph_calls == [{"question": "What is the capital of France?"}]
    assert isinstance(result["messages"][-2], ToolMessage)
    assert "Paris." in final.content and "doc.txt" in final.content and "refine" in final.content


async def test_compiled_graph_works_as_a_subgraph_node():
    specrag_graph = build_graph(services())

    async def ask(state: MessagesState):
        question = state["messages"][-1].content
        result = await specrag_graph.ainvoke({"question": question}, context=ctx())
        return {"messages": [AIMessage(content=result["answer"])]}

    parent = StateGraph(MessagesState)
    parent.add_node("specrag", ask)
    parent.add_edge(START, "specrag")
    out = await parent.compile().ainvoke({"messages": [("user", "capital of France?")]})
    assert out["messages"][-1].content == "Paris."


def test_the_agent_prompt_names_the_tool_it_is_for():
    """AGENT_PROMPT named search_documents whatever name= the tool was given."""
    from specrag.tools import AGENT_PROMPT, agent_prompt

    assert AGENT_PROMPT == agent_prompt() and "search_documents tool" in AGENT_PROMPT
    assert "Answer with the ask_notes tool," in agent_prompt("ask_notes")


def test_the_tool_runs_under_a_sync_agent_with_a_sync_checkpointer_and_keeps_out_of_its_thread():
    # the default graph has no checkpointer of its own: inside a tool call it took the
    # agent's, through its async API, which SqliteSaver does not have (every call failed)
    import sqlite3

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    tool = make_specrag_tool(ctx(), graph=build_graph(services()))
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    agent = create_agent(FakeToolCaller(), tools=[tool], checkpointer=SqliteSaver(conn))
    result = agent.invoke(
        {"messages": [("user", "What is the capital of France?")]},
        {"configurable": {"thread_id": "t1"}},
    )
    assert json.loads(result["messages"][-2].content)["answer"] == "Paris."
    assert "Paris." in result["messages"][-1].content

    memory = InMemorySaver()
    agent = create_agent(FakeToolCaller(), tools=[tool], checkpointer=memory)
    agent.invoke(
        {"messages": [("user", "What is the capital of France?")]},
        {"configurable": {"thread_id": "t2"}},
    )
    assert list(memory.storage["t2"]) == [""]  # the agent's own namespace, no run of the tool's
