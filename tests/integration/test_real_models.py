"""The real embedded models: SmolLM2-135M, all-MiniLM-L6-v2, persistent Chroma."""

import asyncio

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from specrag import ChatLocalLM, SpecRagContext, build_graph
from specrag.data.datasets import squad_paragraphs, squad_questions
from specrag.indexing.pipeline import index_records

pytestmark = pytest.mark.integration

# Questions SmolLM2-135M answers from its evidence (found by scanning SQuAD v2 dev).
QUESTIONS = [
    "Who was the Norse leader?",
    "When was the Duchy of Normandy founded?",
    "What was the name of the count of Apulia ",
    "When was the Battle of Hastings?",
    "What was the Anglo-Norman language's final form?",
]


@pytest.fixture(scope="module")
def normans_index(tmp_path_factory, smol):
    directory = tmp_path_factory.mktemp("index")
    records = [(p.id, p.text) for p in squad_paragraphs() if p.title == "Normans"]
    report = index_records(records, directory)
    assert report.chunks_added == report.chunks_total > len(records) - 1
    again = index_records(records, directory)
    assert again.chunks_added == 0 and again.chunks_removed == 0  # content-hash ids
    return directory


def test_graph_answers_squad_questions_with_gold_answers(normans_index):
    golds = {q.question: q.answers for q in squad_questions() if q.question in QUESTIONS}
    ctx = SpecRagContext(index_dir=str(normans_index), refine_temperature=0.0)
    graph = build_graph()

    async def ask_all():
        return [await graph.ainvoke({"question": q}, context=ctx) for q in QUESTIONS]

    results = asyncio.run(ask_all())
    hits = 0
    for question, result in zip(QUESTIONS, results, strict=True):
        assert result["route"] in ("refine", "generate")
        assert result["citations"] and result["timings"]["total_s"] > 0
        assert result["chunks"][0]["source"].startswith("squad:Normans:")
        hits += any(g.lower() in result["answer"].lower() for g in golds[question])
    assert hits >= 3, [r["answer"] for r in results]


def test_verify_is_token_identical_to_serial_rag(normans_index, smol):
    """Draft-guided decoding (verify) == plain decoding of the same prompt, greedy."""
    from specrag.graph.services import open_index
    from specrag.prompts import evidence_messages

    ctx = SpecRagContext(index_dir=str(normans_index))
    plain = ChatLocalLM(speculation="none", max_new_tokens=60)
    guided = ChatLocalLM(speculation="draft+prompt", max_new_tokens=60)
    saved = 0.0
    proposed = accepted = 0
    for question, draft in [
        ("Who was the Norse leader?", "The Norse leader was Harald Hardrada, king of Norway."),
        ("When was the Duchy of Normandy founded?", "It was founded in 1066 by William."),
    ]:
        chunks = [c.as_dict() for c in open_index(ctx).search(question, 3)]
        messages = evidence_messages(question, chunks, ctx.answer_prompt)
        a = plain.invoke(messages)
        b = guided.invoke(messages, draft=draft)
        assert a.content == b.content
        pa = a.response_metadata["decoding"]["passes_per_token"]
        pb = b.response_metadata["decoding"]["passes_per_token"]
        assert pa == 1.0
        saved += pa - pb
        stats = b.response_metadata["decoding"]
        proposed += sum(stats["candidates_proposed"].values())
        accepted += sum(stats["candidates_accepted"].values())
    assert saved > 0  # the candidates saved forward passes
    assert proposed > accepted > 0  # and the wrong drafts' were refused


def test_candidates_per_pass_follow_the_measured_wide_pass_cost(normans_index, smol):
    """The measured cost of a 17-token pass (about 2x a step for SmolLM2 in fp32 on CPU
    cores) decides the candidates per pass; with the threshold moved, both regimes run on the
    real model: greedy output == plain decoding either way, candidates proposed AND rejected."""
    from specrag.graph.services import open_index
    from specrag.prompts import evidence_messages

    ctx = SpecRagContext(index_dir=str(normans_index))
    question, draft = "Who was the Norse leader?", "The Norse leader was Harald, king of Norway."
    chunks = [c.as_dict() for c in open_index(ctx).search(question, 3)]
    messages = evidence_messages(question, chunks, ctx.answer_prompt)
    plain = ChatLocalLM(speculation="none", max_new_tokens=60).invoke(messages)
    assert "verify" in plain.response_metadata["decoding"]
    for threshold, cheap in ((0.0, False), (1e9, True)):
        model = ChatLocalLM(
            speculation="draft+prompt", max_new_tokens=60, wide_pass_cheap=threshold
        )
        msg = model.invoke(messages, draft=draft)
        meta = msg.response_metadata["decoding"]
        verify = meta["verify"]
        print(verify, meta["candidates_proposed"], meta["candidates_accepted"])
        assert verify["cheap"] is cheap and verify["wide_pass_ratio"] > 0
        assert verify["max_candidates"] == (16 if cheap else 8)
        # narrower passes measured too; a cap for weak proposals, if any, from those
        widths = [3, 7, 11, 16] if cheap else [1, 2, 3, 16]
        assert sorted(verify["pass_ratio_by_candidates"]) == widths
        assert verify["narrow_candidates"] in (0, *widths[:-1])
        if cheap:  # weak matches run to the timed cap (none: 16), strong ones to 16
            assert meta["widest_proposal"] >= min(verify["narrow_candidates"] or 16, 9), meta
        else:
            assert meta["widest_proposal"] <= 8, meta["widest_proposal"]
        assert msg.content == plain.content
        proposed = sum(meta["candidates_proposed"].values())
        accepted = sum(meta["candidates_accepted"].values())
        assert proposed > accepted > 0, (proposed, accepted)


def test_local_chat_model_streams_logprobs_and_stops_at_max_time(smol):
    model = ChatLocalLM(temperature=0.8, max_new_tokens=400, speculation="none", seed=1)
    msg = model.invoke(
        [HumanMessage("Write a long story about a lighthouse keeper.")], max_time=0.8
    )
    meta = msg.response_metadata
    assert meta["truncated"] is True and meta["finish_reason"] == "time"
    assert meta["decoding"]["total_s"] < 2.0  # the loop itself stopped
    logprobs = meta["logprobs"]["content"]
    assert logprobs and all(lp["logprob"] <= 0 for lp in logprobs)
    answer = ChatLocalLM().invoke(
        [
            SystemMessage("Answer the question directly."),
            HumanMessage("What is the capital of France?"),
        ]
    )
    assert "Paris" in answer.content
    assert answer.usage_metadata["output_tokens"] > 0


def test_a_loaded_model_is_keyed_by_its_weights(smol):
    """KV caches (on disk too) are keyed by the weights, not only by the name a user gave."""
    import dataclasses

    assert smol.weights.startswith(str(smol_dir(smol))) and "@" in smol.weights
    assert smol.weights in smol.key
    other = dataclasses.replace(smol, weights=smol.weights + "-finetuned")
    assert other.key != smol.key


def smol_dir(loaded):
    from pathlib import Path

    return Path(loaded.model.name_or_path).resolve()
