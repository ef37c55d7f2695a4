"""Routes that need the draft to outlive a failed retrieval, clean state per thread question,
timings from one origin, and the rapid_generate route through the graph (issue 9)."""

import asyncio
import time

from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.memory import InMemorySaver

from specrag import build_graph, prompts
from tests.fakes import FakeLogprobChat, chunk, ctx, services

SLOW_DRAFT = "The capital of France is Paris and it lies on the Seine river in the north"


async def run(svc, question="What is the capital of France?", graph=None, config=None, **kw):
    graph = graph or build_graph(svc)
    inputs = {"question": question, **kw.pop("inputs", {})}
    return await graph.ainvoke(inputs, config=config, context=ctx(**kw))


async def test_default_policy_draft_outlives_a_failed_retrieval():
    # issue 9 #1: with the DEFAULT draft_policy the draft used to stop ~1 token after a failed
    # retrieval, so the promised "unverified draft" fallback was unreachable.
    draft = FakeLogprobChat(reply=SLOW_DRAFT, delay_s=0.02, calls=[])
    svc = services(draft=draft, retrieve_error=OSError("disk gone"))
    result = await run(svc, draft_policy="until_retrieval")
    assert result["route"] == "fallback", result["reason"]
    assert result["answer"] == prompts.UNSEARCHED_PREFIX + SLOW_DRAFT
    assert "retrieval failed" in result["reason"]


async def test_default_policy_draft_outlives_irrelevant_and_slow_retrieval():
    draft = FakeLogprobChat(reply=SLOW_DRAFT, delay_s=0.02, calls=[])
    irrelevant = services(draft=draft, chunks=[chunk("unrelated", score=0.01)])
    result = await run(irrelevant, draft_policy="until_retrieval")
    assert result["answer"] == prompts.UNVERIFIED_PREFIX + SLOW_DRAFT, result["reason"]
    slow = services(draft=draft, retrieve_delay_s=1.0)
    result = await run(slow, draft_policy="until_retrieval", retrieval_timeout_s=0.1)
    assert result["answer"] == prompts.UNSEARCHED_PREFIX + SLOW_DRAFT, result["reason"]


async def test_second_question_on_a_thread_starts_a_clean_run():
    # issue 9 #2: the second question inherited the first run's document, errors and marks
    seen = []
    svc = services()
    inner = svc.retriever

    def spy(question, document, context):
        seen.append(document)
        if question.startswith("broken"):
            raise OSError("store down")
        return inner(question, document, context)

    svc.retriever = spy
    graph = build_graph(svc, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    first = await run(
        svc, "broken: capital?", graph=graph, config=config, inputs={"document": "short doc"}
    )
    assert first["errors"] and seen == ["short doc"]
    await asyncio.sleep(0.6)  # a gap between the two questions
    start = time.perf_counter()
    second = await run(svc, "capital of France?", graph=graph, config=config)
    wall = time.perf_counter() - start  # this run's own time, however loaded the machine
    assert seen == ["short doc", None]  # not answered from the previous run's document
    assert second["errors"] == [] and second["route"] == "refine"
    assert second["timings"]["total_s"] <= wall  # the gap is not part of this run
    assert second["timings"]["ttft_s"] <= wall
    third = await run(svc, "capital of France?", graph=graph, config=config, draft_policy="off")
    assert third["route"] == "generate" and "refine" in second["stats"]
    assert set(third["stats"]) <= {"generate", "retrieve"}  # not the second run's refine
    history = [s async for s in graph.aget_state_history(config)]
    assert any(s.values.get("question") == "broken: capital?" for s in history)  # kept


async def test_rapid_generate_route_through_the_graph():
    # issue 9 #13: the graph's rapid_generate route was exercised by no test
    rapid = FakeLogprobChat(reply="Rollo.", calls=[])
    svc = services(answer=rapid)
    document = "Rollo led the Norse. " * 400  # 1600 words > long_document_tokens
    result = await run(svc, "Who led the Norse?", inputs={"document": document})
    assert result["route"] == "rapid_generate" and result["answer"] == "Rollo."
    assert "long document" in result["reason"]
    assert result["timings"]["document_index_s"] >= 0


async def test_a_long_document_without_a_local_answer_model_takes_serial_rag_and_says_why():
    """A remote answer model cannot run RAPID: every long --document run went to
    rapid_generate, failed there ("RAPID needs a local answer model") and recorded the error."""
    import dataclasses

    answer = FakeLogprobChat(reply="Rollo.", calls=[])

    from specrag.graph.services import RapidUnavailable

    def no_rapid(ctx):
        raise RapidUnavailable("RAPID needs a local answer model, not 'openai:gpt-4o-mini'")

    svc = dataclasses.replace(services(answer=answer), rapid_model=no_rapid)
    document = "Rollo led the Norse. " * 400
    result = await run(svc, "Who led the Norse?", inputs={"document": document})
    assert result["route"] in ("refine", "generate") and result["answer"] == "Rollo."
    assert result["reason"].startswith(
        "long document, but no RAPID (RapidUnavailable: RAPID needs a local answer model"
    ), result["reason"]
    assert not any("rapid_generate" in e for e in result["errors"]), result["errors"]

    def breaks(ctx):  # any other failure of the factory: rapid_generate's own error route
        raise RuntimeError("weights missing")

    svc = dataclasses.replace(services(answer=answer), rapid_model=breaks)
    result = await run(svc, "Who led the Norse?", inputs={"document": document})
    assert result["route"] == "generate" and "rapid_generate: RuntimeError" in result["reason"]


async def test_a_long_document_whose_search_failed_is_still_read_by_rapid():
    """A failed search routed a long document to fallback ("not ... in the indexed
    documents"), although RAPID's target reads the whole document; its drafter then picks
    its own chunks. Should RAPID fail too, serial RAG has no evidence: fallback, which says
    the answer model failed on the document (it did not find "no evidence" in it)."""
    rapid = FakeLogprobChat(reply="Rollo.", calls=[])
    svc = services(answer=rapid, retrieve_error=OSError("embedding model missing"))
    document = "Rollo led the Norse. " * 400
    result = await run(svc, "Who led the Norse?", inputs={"document": document})
    assert result["route"] == "rapid_generate" and result["answer"] == "Rollo."
    assert (
        "(retrieval failed (OSError: embedding model missing): the drafter picks its own chunks)"
        in result["reason"]
    )
    broken = FakeLogprobChat(fail=True, calls=[])
    svc = services(answer=broken, retrieve_error=OSError("embedding model missing"))
    result = await run(svc, "Who led the Norse?", inputs={"document": document}, draft_policy="off")
    assert result["route"] == "fallback" and "rapid_generate" in result["reason"]
    # the model failed, not the document: no "could not find evidence in the given document"
    assert result["answer"] == prompts.DOCUMENT_ANSWER_FAILED
    result = await run(svc, "Who led the Norse?", inputs={"document": document})
    assert result["route"] == "fallback"
    assert result["answer"].startswith(prompts.DOCUMENT_UNCHECKED_PREFIX)


async def test_a_short_document_whose_search_failed_says_so_naming_the_document():
    svc = services(retrieve_error=OSError("embedding model missing"))
    result = await run(
        svc, "Who led the Norse?", inputs={"document": "Rollo led the Norse."}, draft_policy="off"
    )
    assert result["route"] == "fallback" and "retrieval failed" in result["reason"]
    # the search looked at nothing: not "could not find evidence in the given document"
    assert result["answer"] == prompts.SEARCH_FAILED_IN_DOCUMENT


async def test_a_follow_up_on_the_rapid_route_gets_the_conversation():
    """rapid_generate sent only the system prompt and the question: a follow-up about a long
    document was answered without the earlier turns, which generate and refine both get."""
    from langchain_core.messages import AIMessage, HumanMessage

    rapid = FakeLogprobChat(reply="Around 930.", calls=[])
    document = "Rollo led the Norse. " * 400
    turns = [HumanMessage("Who led the Norse?"), AIMessage("Rollo."), HumanMessage("Died when?")]
    result = await run(services(answer=rapid), "", inputs={"messages": turns, "document": document})
    assert result["route"] == "rapid_generate"
    (prompt,) = rapid.calls
    assert [type(m).__name__ for m in prompt] == [
        "SystemMessage",
        "HumanMessage",
        "AIMessage",
        "HumanMessage",
    ]
    assert [str(m.content) for m in prompt[1:]] == ["Who led the Norse?", "Rollo.", "Died when?"]


async def test_a_document_whose_length_cannot_be_counted_says_why_rapid_was_not_taken():
    import dataclasses

    def broken(ctx, text):
        raise RuntimeError("tokenizer missing")

    svc = dataclasses.replace(services(), document_tokens=broken)
    document = "Rollo led the Norse. " * 400
    result = await run(svc, "Who led the Norse?", inputs={"document": document})
    assert result["route"] != "rapid_generate"  # the run still answers ...
    assert (  # ... and says why RAPID was not considered (silently skipped before)
        "prepare: RuntimeError: tokenizer missing (the document's length is unknown: RAPID "
        "not considered)"
    ) in result["errors"]


SCENARIOS = {
    "refine": {},
    "generate": {"draft_policy": "off"},
    "fallback": {"retrieval_timeout_s": 0.05},
    "rapid_generate": {},
}


@settings(max_examples=12, deadline=None)
@given(
    route=st.sampled_from(sorted(SCENARIOS)),
    draft_delay=st.sampled_from([0.0, 0.01, 0.03]),
    load_delay=st.sampled_from([0.0, 1.0]),
)
def test_timings_of_every_route_share_one_origin(route, draft_delay, load_delay):
    # issue 9 #9b: model loading inside some stage timings made draft_ttft_s > draft_s
    draft = FakeLogprobChat(reply=SLOW_DRAFT, delay_s=draft_delay, calls=[])
    svc = services(draft=draft, retrieve_delay_s=0.1 if route == "fallback" else 0.0)
    loaded = set()

    def warm(model):  # a first load per model, as a real first call pays
        if id(model) not in loaded:
            loaded.add(id(model))
            time.sleep(load_delay)

    svc.warm = warm
    inputs = {"document": "word " * 2000} if route == "rapid_generate" else {}
    result = asyncio.run(run(svc, inputs=inputs, **SCENARIOS[route]))
    t = result["timings"]
    assert result["route"] == route, result["reason"]
    assert t["load_s"] >= load_delay * 0.9
    for stage in ("retrieve_s", "draft_s", "answer_s", "ttft_s", "draft_ttft_s"):
        if stage in t:
            assert 0 <= t[stage] <= t["total_s"] + 1e-3, (stage, t)
    if "draft_ttft_s" in t:
        assert t["draft_ttft_s"] <= t["draft_s"], t
        assert t["draft_ttft_s"] < load_delay or load_delay == 0, t  # loading not inside
    if route != "fallback":
        assert t["ttft_s"] <= t["total_s"], t
    assert isinstance(result["seed"], int)


def test_stage_timings_count_from_the_runs_origin_not_the_nodes_start():
    """draft_ttft_s was timed from the draft node's start, ttft_s from the origin: the ratio
    of the two (bench's draft_ttft_vs_serial_ttft) left the step to the node out of one side."""
    from langgraph.runtime import Runtime

    from specrag.nodes.draft import make_draft
    from specrag.nodes.streaming import clock, now

    node = make_draft(services(draft=FakeLogprobChat(reply=SLOW_DRAFT, calls=[])))
    runtime = Runtime(context=ctx())
    marks = {"origin": now() - 0.5, "clock": clock()}  # the run began 0.5 s before the node
    state = {"question": "Who led the Norse?", "marks": marks}
    t = asyncio.run(node(state, runtime))["timings"]
    assert 0.5 <= t["draft_ttft_s"] <= t["draft_s"] < 5, t
    resumed = {"question": "Who led the Norse?", "marks": {**marks, "clock": -1.0}}
    t = asyncio.run(node(resumed, runtime))["timings"]  # another process's clock: node start
    assert t["draft_ttft_s"] <= t["draft_s"] < 0.5, t


async def test_a_replay_from_before_the_join_drafts_again():
    """A fork or replay from the checkpoint after prepare (Studio's time travel) keeps the
    run's run_id; its draft found the first execution's retrieval signal still set and
    stopped at once. The gate forgets the signal once draft and retrieve have joined."""
    svc = services(
        draft=FakeLogprobChat(reply=SLOW_DRAFT, delay_s=0.01, calls=[]), retrieve_delay_s=1.0
    )
    graph = build_graph(svc, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "replay"}}
    first = await run(svc, graph=graph, config=config, draft_policy="until_retrieval")
    assert first["draft"] == SLOW_DRAFT  # done before retrieval ended
    states = [s async for s in graph.aget_state_history(config)]
    (fork,) = [s for s in states if set(s.next) == {"draft", "retrieve"}]
    again = await graph.ainvoke(
        None, config=fork.config, context=ctx(draft_policy="until_retrieval")
    )
    assert again["draft"] == SLOW_DRAFT, again["reason"]


def test_the_draft_and_the_answer_draw_from_independent_seeds():
    """Both stages were seeded with the run's seed: the draft's tokens, the answer's
    candidates, came from the verifier's own random stream, and sampled answers were off the
    model's distribution (a review, 2026-12-06: p < 0.001 on a tiny model). The answer keeps
    the run's seed; the draft's is drawn from it, so a seed still reproduces both."""
    from tests.unit.test_budgets import SlowLocal

    seen: dict[str, list] = {"draft": [], "answer": []}

    class Seeds(SlowLocal):
        stage: str = "answer"

        def _job(self, messages, options):
            seen[self.stage].append(options.seed)
            return super()._job(messages, options)

    svc = services(draft=Seeds(stage="draft", step_s=0.0), answer=Seeds(step_s=0.0))
    for _ in range(2):
        result = asyncio.run(build_graph(svc).ainvoke({"question": "Who?"}, context=ctx(seed=7)))
        assert result["route"] == "refine", result["reason"]
    assert seen["answer"] == [7, 7]
    assert seen["draft"][0] == seen["draft"][1] and seen["draft"][0] not in (None, 7)


async def test_a_failed_rapid_run_without_evidence_falls_back_unverified():
    """RAPID failing on a document whose search failed leaves no evidence: the fallback's
    honest answer, never serial RAG's generate (an answer checked against nothing, marked
    verified) - even when the answer model itself works."""
    import dataclasses

    def breaks(context):
        raise RuntimeError("weights missing")

    svc = services(
        answer=FakeLogprobChat(reply="Rollo.", calls=[]),
        retrieve_error=OSError("embedding model missing"),
    )
    svc = dataclasses.replace(svc, rapid_model=breaks)
    document = "Rollo led the Norse. " * 400
    result = await run(svc, "Who led the Norse?", inputs={"document": document}, draft_policy="off")
    assert result["route"] == "fallback" and "rapid_generate" in result["reason"]
    assert result["verified"] is False and result["citations"] == []


async def test_a_runs_document_is_evidence_whatever_its_chunks_score():
    """A run's ``document`` is the user's chosen evidence: no relevance threshold (README)."""
    svc = services(chunks=[chunk("Rollo led the Norse.", score=0.05)])
    result = await run(svc, "Who led them?", inputs={"document": "Rollo led the Norse."})
    assert result["route"] != "fallback"
    assert result["verified"] is True
    irrelevant = await run(svc, "Who led them?")  # the same score from the index: dropped
    assert irrelevant["route"] == "fallback"


async def test_seed_zero_is_a_seed_not_a_request_for_a_random_one():
    assert (await run(services(), seed=0))["seed"] == 0
    assert (await run(services(), seed=7))["seed"] == 7
    drawn = {(await run(services(), seed=-1))["seed"] for _ in range(3)}
    assert len(drawn) > 1  # -1: a fresh seed per run


def test_merged_state_dicts_take_the_later_value():
    """``timings``/``stats`` merge: a later node's value replaces an earlier one's (generate's
    answer time replaces that of the refine it recovered from)."""
    from specrag.graph.state import merge_dicts

    assert merge_dicts({"answer_s": 1.0, "a": 1}, {"answer_s": 0.1}) == {"answer_s": 0.1, "a": 1}
    assert merge_dicts(None, {"a": 1}) == {"a": 1} and merge_dicts({"a": 1}, None) == {"a": 1}


def test_a_batch_record_names_dropped_only_the_chunks_that_left_the_evidence():
    """A re-ranking batch's record says which earlier chunks it pushed out, and only those: a
    chunk it re-ranked but kept is not 'dropped'."""
    from specrag.indexing.store import Batch
    from specrag.nodes.retrieve import Delivered

    kept, lost, new = (chunk(f"Paris fact {n}.", n=n) for n in range(3))
    got = Delivered(ctx(), None, 0.0)
    got.add(Batch("dense", [kept, lost]))
    got.add(Batch("hybrid", [new], [new, kept]))  # fused: `lost` fell out of the top k
    assert "dropped" not in got.records[0]
    assert got.records[1]["dropped"] == [lost.id]
    assert [c["id"] for c in got.found] == [new.id, kept.id]


def test_a_runs_document_is_searched_not_the_index(monkeypatch):
    """With the default retriever, a run's document is one batch of its own chunks: the
    persistent index is not searched (nor opened) for it."""
    from specrag.graph import services as services_module
    from specrag.graph.context import SpecRagContext
    from specrag.indexing.store import Batch

    found = [chunk("Rollo led the Norse.")]

    def no_index(ctx):
        raise AssertionError("the index was opened for a run's document")

    monkeypatch.setattr(services_module, "open_index", no_index)
    monkeypatch.setattr(services_module, "search_document", lambda *a, **k: found)
    monkeypatch.setattr(services_module, "load_embeddings", lambda name: None)
    monkeypatch.setattr(services_module, "answer_token_length", lambda ctx: len)
    monkeypatch.setattr(services_module, "answer_tokenizer_key", lambda ctx: "chars")
    svc = services_module.Services()
    got = list(svc.retrieve_batches("Who led them?", "Rollo led the Norse.", SpecRagContext()))
    assert got == [Batch("document", found)]


def test_the_pairs_drafter_loads_in_its_own_dtype_and_drafts_for_rapid(monkeypatch):
    """The pair's drafter is built in ``draft_dtype`` (a drafter loaded in the answer's dtype
    is a second copy of the 0.5B beside the int8 one the answer model proposes with), and
    RAPID's drafter is the context's draft model, not the answer model drafting for itself."""
    from specrag.graph import services as services_module
    from specrag.graph.context import SpecRagContext
    from specrag.models import rapid_chat

    built: dict[str, dict] = {}
    monkeypatch.setattr(
        services_module,
        "chat_model_from_spec",
        lambda spec, **kw: built.setdefault(spec, kw),
    )
    monkeypatch.setattr(rapid_chat, "ChatRapid", lambda **kw: kw)
    context = SpecRagContext(models="pair", drafter_dtype="int8")
    assert context.draft_dtype == "int8" != context.dtype
    services_module.default_chat_model(context.draft_spec, context)
    services_module.default_chat_model(context.answer_spec, context)
    assert built[context.draft_spec]["dtype"] == "int8"
    assert built[context.answer_spec]["dtype"] == context.dtype
    assert built[context.answer_spec]["drafter_dtype"] == "int8"
    rapid = services_module.default_rapid_model(context)
    assert (rapid["target_model"], rapid["drafter_model"]) == (
        context.answer_spec,
        context.draft_spec,
    )


async def test_a_benchmarks_added_batch_latency_delays_only_the_later_batches():
    """``added_batch_latency_s`` (bench rag's streamed-retrieval rows) models a slow tail:
    the first batch comes as fast as the search gives it."""
    import dataclasses

    from tests.fakes import two_batches

    svc = dataclasses.replace(services(), batch_retriever=two_batches(lambda: None))
    result = await run(svc, answer_policy="wait", added_batch_latency_s=2.0)
    first, second = (b["arrival_s"] for b in result["batches"])
    assert first < 1.0 and second >= 2.0, (first, second)
