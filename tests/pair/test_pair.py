"""The real pair: Qwen2.5-Coder-0.5B-Instruct drafts, Qwen2.5-Coder-1.5B-Instruct answers.

* refine (draft + drafter + evidence candidates) gives answers token-identical to serial RAG
  with the 1.5B alone, on 5 SQuAD questions, and the drafter's proposals are both accepted and
  rejected;
* RAPID at eta=0 (the 1.5B reads a 2K-token HotpotQA haystack, the 0.5B the retrieved chunks)
  is token-identical to the 1.5B alone.
"""

import asyncio
import random
from collections import Counter

from langchain_core.messages import HumanMessage

from specrag.data.datasets import hotpot_questions, sample, squad_paragraphs, squad_questions
from specrag.decoding.prefix_cache import PrefixCache
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import decode
from specrag.decoding.state import LMState
from specrag.evaluation.bench_rapid import build_document
from specrag.graph.builder import build_graph
from specrag.graph.context import SpecRagContext
from specrag.indexing.pipeline import index_records
from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, ChatRapid, layout


def test_refine_on_the_pair_is_identical_to_serial_rag(pair_models, tmp_path):
    questions = sample([q for q in squad_questions() if q.answers], 5, 11)
    titles = {
        p.title for p in squad_paragraphs() if p.id in {g for q in questions for g in q.gold_ids}
    }
    records = [(p.id, p.text) for p in squad_paragraphs() if p.title in titles]
    index_records(records, tmp_path / "index", collection="pair_test")
    base = SpecRagContext(
        models="pair",
        index_dir=str(tmp_path / "index"),
        collection="pair_test",
        refine_temperature=0.0,
        answer_max_tokens=40,
        answer_timeout_s=600,
        retrieval_timeout_s=60,
    )
    refine = {
        "draft_policy": "complete",  # a full 0.5B draft, so every run takes the refine route
        "draft_timeout_s": 120,
        "draft_max_tokens": 32,
        "min_draft_tokens": 1,
        "confidence_threshold": 0.0,
        "drafter_after_tokens": 0,  # the drafter proposes from the first token on
        "drafter_join_factor": 0.0,
        # identity is the point here, not the cost model: the drafter proposes throughout
        "drafter_max_cost_ratio": 1.0,
        "drafter_pay_check": False,
    }
    serial = {"draft_policy": "off", "speculation": "none"}
    graph = build_graph()
    proposed, accepted, sources = Counter(), Counter(), Counter()

    async def ask(question, overrides):
        ctx = SpecRagContext(**{**base.__dict__, **overrides})
        return await graph.ainvoke({"question": question}, context=ctx)

    for q in questions:
        spec = asyncio.run(ask(q.question, refine))
        plain = asyncio.run(ask(q.question, serial))
        stats = spec["stats"]["refine"]
        proposed.update(stats["candidates_proposed"])
        accepted.update(stats["candidates_accepted"])
        sources.update(stats["tokens_from"])
        print(f"{q.question!r}: {spec['answer']!r} | from {stats['tokens_from']}")
        assert spec["route"] == "refine", spec["reason"]
        assert plain["route"] == "generate"
        assert stats["proposer"]["drafter_used"] is True, stats["proposer"]
        assert spec["answer"] == plain["answer"]
    print(f"proposed {dict(proposed)} accepted {dict(accepted)} tokens_from {dict(sources)}")
    assert proposed["drafter"] > accepted["drafter"] > 0
    assert proposed["draft"] + proposed["prompt"] > 0


def test_rapid_eta0_on_the_pair_is_identical_to_the_target(pair_models):
    target, drafter = pair_models
    pool = hotpot_questions()
    ex = sample(pool, 1, 7)[0]
    document = build_document(ex, sample(pool, 300, 8), 2048, target, random.Random(3))
    head, doc, tail = layout(target, RAPID_INSTRUCTIONS, document, ex.question)
    ref = [
        t.id
        for s in decode(
            LMState(target.model),
            head + doc + tail,
            max_new_tokens=32,
            sampler=Sampler(0.0),
            eos_ids=target.eos_token_ids,
        )
        for t in s
    ]
    expected = target.tokenizer.decode(ref, skip_special_tokens=True).strip()
    cache = PrefixCache()  # the second run reuses the first's document prefill
    metas = {}
    for cut in (0.6, 0.0):  # ChatRapid's confidence cut-off, and none
        model = ChatRapid(
            target_model=target.name,
            drafter_model=drafter.name,
            device="cpu",
            dtype="float32",
            eta=0.0,
            min_draft_confidence=cut,
            max_new_tokens=32,
            prefix_cache=cache,
        )
        msg = model.invoke([HumanMessage(ex.question)], document=document)
        meta = metas[cut] = msg.response_metadata
        print(
            f"RAPID pair, cut-off {cut}: {msg.content!r} draft {meta['draft_tokens']} accepted "
            f"{meta['accepted_tokens']}, {meta['unsure_stops']} rounds cut; reference "
            f"{expected!r}"
        )
        assert str(msg.content).strip() == expected
    # the cut-off ended rounds early (on this haystack every token it let through was right);
    # without it the drafter's proposals were accepted AND rejected
    assert metas[0.6]["draft_tokens"] > 0 and metas[0.6]["unsure_stops"] > 0
    assert metas[0.0]["draft_tokens"] > metas[0.0]["accepted_tokens"] > 0
    assert metas[0.0]["unsure_stops"] == 0
