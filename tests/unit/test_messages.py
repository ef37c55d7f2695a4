"""The chat interface: ``{"messages": [...]}`` in, an ``AIMessage`` with citations out, so the
specrag graph is a node of a ``MessagesState`` graph unchanged; follow-up questions are
rewritten into a self-contained retrieval query (fake models, offline)."""

import asyncio

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph

from specrag.graph.builder import build_graph
from tests.fakes import FakeLogprobChat, chunk, ctx, services


def recording_services(**kw):
    queries: list[str] = []
    found = [chunk("Rollo, the Norse leader, died around 930.", source="normans.txt")]
    svc = services(chunks=found, **kw)
    inner = svc.retriever

    def retriever(question, document, context):
        queries.append(question)
        return inner(question, document, context)

    svc.retriever = retriever
    return svc, queries


def test_specrag_is_a_node_of_a_messages_state_graph():
    answer = FakeLogprobChat(reply="Rollo [1].", calls=[])
    svc, _ = recording_services(answer=answer)
    parent = StateGraph(MessagesState)
    parent.add_node("specrag", build_graph(svc))
    parent.add_edge(START, "specrag")
    parent.add_edge("specrag", END)
    out = asyncio.run(
        parent.compile().ainvoke(
            {"messages": [HumanMessage("Who was the Norse leader?")]}, context=ctx()
        )
    )
    human, reply = out["messages"]
    assert human.content == "Who was the Norse leader?"
    assert isinstance(reply, AIMessage) and reply.content == "Rollo [1]."
    assert reply.additional_kwargs["citations"][0]["source"] == "normans.txt"
    meta = reply.response_metadata
    assert meta["route"] in ("refine", "generate") and meta["verified"] is True
    assert meta["reason"] and "total_s" in meta["timings"]
    # the whole run's timings, not only the answer node's (a parent graph sees the message)
    assert {"retrieve_s", "answer_s"} <= set(meta["timings"])


def test_question_input_keeps_working_without_messages():
    svc, _ = recording_services()
    out = asyncio.run(build_graph(svc).ainvoke({"question": "Who?"}, context=ctx()))
    assert out["answer"] and not out.get("messages")


def conversation(question="When did he die?"):
    return [
        HumanMessage("Who was the Norse leader?"),
        AIMessage("Rollo."),
        HumanMessage(question),
    ]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("off", "When did he die?"),
        ("concat", "Who was the Norse leader? When did he die?"),
        ("model", "When did Rollo die?"),
    ],
)
def test_follow_up_is_rewritten_before_retrieval(mode, expected):
    draft = FakeLogprobChat(reply="When did Rollo die?", calls=[])
    svc, queries = recording_services(draft=draft)
    out = asyncio.run(
        build_graph(svc).ainvoke(
            {"messages": conversation()}, context=ctx(query_rewrite=mode, draft_policy="off")
        )
    )
    assert queries == [expected]
    assert out["query"] == expected
    assert out["messages"][-1].content == out["answer"]


def test_the_model_rewrite_reads_the_earlier_answers_too():
    """A mutation review (2026-12-08): a rewrite prompt holding only the user's turns passed
    every test, yet "When did he die?" can be resolved only from the earlier answer
    ("Rollo."), so the search asked about the wrong thing."""
    draft = FakeLogprobChat(reply="When did Rollo die?", calls=[])
    svc, _ = recording_services(draft=draft)
    asyncio.run(
        build_graph(svc).ainvoke(
            {"messages": conversation()}, context=ctx(query_rewrite="model", draft_policy="off")
        )
    )
    (prompt,) = draft.calls  # the rewrite, the draft model's one call
    turns = prompt[-1].content.split("Conversation:\n", 1)[1].split("\n\nLast question:")[0]
    assert turns.splitlines() == ["user: Who was the Norse leader?", "assistant: Rollo."]


def test_a_concat_query_joins_the_latest_earlier_question():
    """Three turns in: the question before this one, not the conversation's first."""
    svc, queries = recording_services()
    talk = [*conversation(), AIMessage("Around 930."), HumanMessage("Where was he buried?")]
    asyncio.run(
        build_graph(svc).ainvoke(
            {"messages": talk}, context=ctx(query_rewrite="concat", draft_policy="off")
        )
    )
    assert queries == ["When did he die? Where was he buried?"]


def test_a_hung_rewrite_leaves_the_search_half_the_retrieval_budget():
    """A draft model that never answered the rewrite took the whole retrieval budget: an
    instant search ended in the fallback ("retrieval timed out"). Half the budget, then the
    concat query."""
    import threading

    hold = threading.Event()
    draft = FakeLogprobChat(reply="When did Rollo die?", hold=hold, calls=[])
    svc, queries = recording_services(draft=draft)

    async def run():
        try:
            return await build_graph(svc).ainvoke(
                {"messages": conversation()},
                context=ctx(query_rewrite="model", draft_policy="off", retrieval_timeout_s=1.0),
            )
        finally:
            hold.set()  # before the loop closes: it waits for the hung thread

    out = asyncio.run(run())
    assert out["route"] != "fallback", out["reason"]
    assert queries == ["Who was the Norse leader? When did he die?"]


def test_a_rewritten_follow_up_query_is_not_streamed_as_an_answer():
    """The draft model's rewrite of a follow-up streamed in `messages` mode from node
    `retrieve`: the CLI showed it as the answer, Studio and a parent chat graph as AI text."""
    draft = FakeLogprobChat(reply="When did Rollo die?", calls=[])
    svc, _ = recording_services(draft=draft)

    async def streamed_nodes():
        nodes = []
        async for piece, meta in build_graph(svc).astream(
            {"messages": conversation()},
            context=ctx(query_rewrite="model", draft_policy="off"),
            stream_mode="messages",
        ):
            if piece.content:
                nodes.append(meta["langgraph_node"])
        return nodes

    nodes = asyncio.run(streamed_nodes())
    assert "retrieve" not in nodes and {"generate", "refine"} & set(nodes), nodes


@pytest.mark.parametrize("refine_mode", ["verify", "rewrite"])
def test_history_reaches_the_prompts_bounded_by_tokens(refine_mode):
    """``rewrite`` sent the evidence, question and draft without the conversation."""
    answer = FakeLogprobChat(reply="Around 930.", calls=[])
    svc, _ = recording_services(answer=answer)
    long_turns = [HumanMessage("old " * 500), AIMessage("older answer " * 200)]
    result = asyncio.run(
        build_graph(svc).ainvoke(
            {"messages": long_turns + conversation()},
            context=ctx(history_tokens=64, refine_mode=refine_mode),
        )
    )
    assert result["route"] == "refine"
    (prompt,) = answer.calls
    texts = [str(m.content) for m in prompt]
    assert "Who was the Norse leader?" in texts and "Rollo." in texts  # recent turns kept
    assert not any(t.startswith("old old") for t in texts)  # over the budget: dropped
    assert "When did he die?" in texts[-1]  # the question ends the prompt, with the evidence


@pytest.mark.parametrize("stream", [False, True])
def test_a_cli_thread_is_a_conversation(stream, capsys):
    """`specrag ask --thread ID` sent a bare question key: a follow-up got no history and no
    self-contained query. On a thread the question is a human message; streamed, the
    answer is shown once (the message appended to the state is not streamed again)."""
    from langgraph.checkpoint.memory import InMemorySaver

    from specrag.runner import _run, run_inputs

    answer = FakeLogprobChat(reply="Rollo.", calls=[])
    svc, queries = recording_services(answer=answer)
    app = build_graph(svc, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "cli-thread"}}
    for question in ("Who was the Norse leader?", "When did he die?"):
        out = asyncio.run(_run(app, run_inputs(question, None, True), ctx(), stream, config))
        assert out["answer"] == "Rollo."
    assert queries[-1] == "Who was the Norse leader? When did he die?"  # concat, the default
    texts = [str(m.content) for m in answer.calls[-1]]
    assert "Who was the Norse leader?" in texts and "Rollo." in texts
    assert [m.type for m in out["messages"]] == ["human", "ai", "human", "ai"]
    if stream:
        assert capsys.readouterr().err.count("Rollo.") == 2  # once per question
    assert run_inputs("Who?", None, False) == {"question": "Who?"}  # no thread: no history
    assert run_inputs("", None, True) is None  # --resume


@pytest.mark.parametrize("answered_before", [False, True])
def test_a_question_after_a_failed_message_run_is_the_one_asked(answered_before):
    """A messages run that failed in prepare (an empty question) leaves its human message
    last in ``messages``: the thread's next run, given a ``question``, re-asked that message
    and failed again, whatever it asked."""
    from langgraph.checkpoint.memory import InMemorySaver

    from specrag.errors import InputError

    app = build_graph(services(), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"t-mixed-{answered_before}"}}
    if answered_before:
        asyncio.run(app.ainvoke({"messages": [HumanMessage("Who?")]}, config, context=ctx()))
    with pytest.raises(InputError):
        asyncio.run(app.ainvoke({"messages": [HumanMessage("   ")]}, config, context=ctx()))
    out = asyncio.run(app.ainvoke({"question": "capital of France?"}, config, context=ctx()))
    assert out["answer"] == "Paris." and out["query"] == "capital of France?"
    state = app.get_state(config).values
    assert state["question_taken"] == "capital of France?" and not state["from_messages"]
    # the chat goes on: a new human message is asked, with the answered turns as history
    asyncio.run(app.ainvoke({"messages": [HumanMessage("And Spain?")]}, config, context=ctx()))
    assert app.get_state(config).values["question_taken"] == "And Spain?"


def test_a_thread_answered_before_question_taken_existed_asks_its_new_message():
    """Threads checkpointed by an older specrag hold the previous run's ``question`` and no
    ``question_taken``: their next human message is the question, not that stale key."""
    from specrag.nodes.prepare import asked

    old = {
        "question": "Who was the Norse leader?",
        "messages": [
            HumanMessage("Who was the Norse leader?"),
            AIMessage("Rollo."),
            HumanMessage("When did he die?"),
        ],
    }
    assert asked(old) == "When did he die?"


def test_a_draft_model_that_rewrites_follow_ups_loads_before_the_run(monkeypatch, capsys):
    """`query_rewrite="model"` with drafting off: nothing loaded the draft model before the
    run, so a follow-up's rewrite loaded it inside the retrieval budget (a graph review)."""
    import dataclasses
    import importlib

    from specrag.runner import preload

    warmed = []
    svc = services()
    svc = dataclasses.replace(svc, warm=lambda model: warmed.append(model))
    draft, answer = svc.chat_model("fake:draft", ctx()), svc.chat_model("fake:answer", ctx())
    settings = ctx(draft_policy="off", query_rewrite="model")
    asyncio.run(build_graph(svc).ainvoke({"question": "Who?"}, context=settings))
    assert draft in warmed and answer in warmed  # by prepare
    assert settings.drafter_runs and not ctx(draft_policy="off").drafter_runs
    loaded = []  # and by the CLI's preload
    module = importlib.import_module("specrag.graph.services")  # specrag.graph: the graph
    monkeypatch.setattr(module, "default_chat_model", lambda spec, c: loaded.append(spec))
    monkeypatch.setattr(module.Services, "warm", lambda self, model: None)
    monkeypatch.setattr(module.Services, "warm_retriever", lambda self, c, d: None)
    preload(settings, None, index=False)
    assert loaded == ["fake:draft", "fake:answer"]  # the draft model first
    # said before the load (a new cache converts for ~20 s), not only when it is done
    said = capsys.readouterr().err
    # a model not held here (a provider's) loads nothing: the note says so
    note = "loading models (fake:draft - remote, nothing to load, fake:answer - remote, nothing"
    assert said.index(note) < said.index("models ready")
    loaded.clear()  # a dict of settings, as a graph run takes them (was an AttributeError)
    preload(dataclasses.asdict(settings), None, index=False)
    assert loaded == ["fake:draft", "fake:answer"]


@pytest.mark.parametrize(("question", "said"), [(None, "the question is empty"), (42, "not int")])
def test_a_question_that_is_not_text_is_a_one_line_error(question, said):
    """`{"question": 42}` (a JSON client, Studio) raised a bare TypeError from the check."""
    from specrag.errors import InputError

    with pytest.raises(InputError, match=said):
        asyncio.run(build_graph(services()).ainvoke({"question": question}, context=ctx()))


@pytest.mark.parametrize(
    ("document", "said"), [("   \n  ", "the document is empty"), (b"Rollo", "not bytes")]
)
def test_a_document_that_is_blank_or_not_text_is_a_one_line_error(document, said):
    """A blank document replaced the index with nothing ("retrieval found nothing"); bytes
    gave two raw errors from the document's tokenizer and embedder."""
    from specrag.errors import InputError

    with pytest.raises(InputError, match=said):
        asyncio.run(
            build_graph(services()).ainvoke(
                {"question": "Who?", "document": document}, context=ctx()
            )
        )


def test_stats_map_each_node_to_a_dict():
    """`stats` held {"refine": {...}, "refine_mode": "verify"}: a plain string beside the
    nodes' dicts broke code that reads it as node -> statistics."""
    out = asyncio.run(build_graph(services()).ainvoke({"question": "Who?"}, context=ctx()))
    assert out["route"] == "refine", out["reason"]
    assert all(isinstance(v, dict) for v in out["stats"].values()), out["stats"]
    assert out["stats"]["refine"]["refine_mode"] == "verify"


def test_history_keeps_the_latest_turns_that_fit_and_none_before_a_gap():
    """Newest first up to ``history_tokens``: a turn too long ends the history there; an older
    short turn past it is not kept (it would read as if it came right before the rest)."""
    from specrag.nodes.prepare import history

    talk = [
        HumanMessage("Who was the Norse leader?"),  # oldest: short, but before the long turn
        AIMessage(" ".join(["word"] * 100)),
        HumanMessage("When did he die?"),
        AIMessage("Around 930."),
        HumanMessage("Where was he buried?"),  # the question: not history
    ]
    kept = history({"messages": talk}, ctx(history_tokens=40), lambda text: len(text.split()))
    assert [t["content"] for t in kept] == ["When did he die?", "Around 930."]
