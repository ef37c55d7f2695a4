"""RAPID on the real SmolLM2-135M: lossless at eta=0, prefix cache reuse."""

import pytest
from langchain_core.messages import HumanMessage

from specrag import ChatRapid
from specrag.data.datasets import hotpot_questions
from specrag.decoding.prefix_cache import PrefixCache
from specrag.decoding.rapid import RapidConfig, rapid_decode
from specrag.decoding.sampling import Sampler
from specrag.decoding.speculative import decode
from specrag.decoding.state import LMState
from specrag.models.rapid_chat import RAPID_INSTRUCTIONS, layout

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def example():
    ex = hotpot_questions()[0]
    document = "\n\n".join(f"{p.title}: {p.text}" for p in ex.paragraphs)
    gold = "\n\n".join(f"{p.title}: {p.text}" for p in ex.paragraphs if p.id in ex.gold_ids)
    return ex, document, gold


def test_eta0_greedy_is_token_identical_to_target_only(smol, example):
    ex, document, gold = example
    head, doc, tail = layout(smol, RAPID_INSTRUCTIONS, document, ex.question)
    d_head, d_doc, d_tail = layout(smol, RAPID_INSTRUCTIONS, gold, ex.question)
    target_prompt, drafter_prompt = head + doc + tail, d_head + d_doc + d_tail
    ref = [
        t.id
        for s in decode(
            LMState(smol.model),
            target_prompt,
            max_new_tokens=40,
            sampler=Sampler(0.0),
            eos_ids=smol.eos_token_ids,
        )
        for t in s
    ]
    for gamma in (4, 10):
        out = [
            t.id
            for s in rapid_decode(
                LMState(smol.model),
                LMState(smol.model),
                target_prompt,
                drafter_prompt,
                max_new_tokens=40,
                sampler=Sampler(0.0),
                cfg=RapidConfig(gamma=gamma, eta=0.0),
                eos_ids=smol.eos_token_ids,
            )
            for t in s
        ]
        assert out == ref


def test_chat_rapid_metadata_and_prefix_cache(smol, example):
    ex, document, _ = example
    model = ChatRapid(eta=0.0, max_new_tokens=32, prefix_cache=PrefixCache())
    first = model.invoke([HumanMessage(ex.question)], document=document)
    second = model.invoke([HumanMessage(ex.question)], document=document)
    m1, m2 = first.response_metadata, second.response_metadata
    for key in (
        "acceptance_rate",
        "mean_accepted_per_step",
        "target_forward_passes",
        "draft_tokens",
        "prefix_cache_hit",
        "eta",
        "gamma",
    ):
        assert key in m1
    assert m1["prefix_cache_hit"] is False and m2["prefix_cache_hit"] is True
    assert first.content == second.content  # reuse changes nothing
    assert m2["prefix_s"] < m1["prefix_s"]
    assert 0 < m1["acceptance_rate"] <= 1
    assert first.usage_metadata["input_tokens"] > 1000
