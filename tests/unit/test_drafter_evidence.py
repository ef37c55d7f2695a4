"""A separate drafter may read only the top-ranked evidence blocks (``drafter_evidence``; by
default every block): the answer model's prompt keeps every block, so answers are unchanged,
and the drafter's prefill shrinks (docs/bench/2026-12-05-drafter-top-chunk/)."""

import pytest

import specrag.nodes.answer as answer_node
from specrag import build_graph
from tests.fakes import FakeLogprobChat, chunk, ctx, services

CHUNKS = [
    chunk("Rollo led the Norse settlers.", score=0.9, n=0),
    chunk("The treaty of 911 gave them land.", score=0.8, n=1),
    chunk("His descendants ruled the duchy.", score=0.7, n=2),
]


@pytest.fixture
def seen(monkeypatch):
    """Each answer node's (messages, options) as it hands them to the model."""
    calls = []
    inner = answer_node.stream_model

    async def spy(model, messages, *args, options=None, **kw):
        calls.append((messages, options))
        return await inner(model, messages, *args, options=options, **kw)

    monkeypatch.setattr(answer_node, "stream_model", spy)
    return calls


async def answer_call(seen, **kw):
    """The route and the answer model's (messages, options) of one run over ``CHUNKS``."""
    answer = FakeLogprobChat(reply="Rollo.", calls=[])
    svc = services(answer=answer, chunks=CHUNKS)
    result = await build_graph(svc).ainvoke(
        {"question": "Who led the Norse settlers?"}, context=ctx(**kw)
    )
    assert result["answer"] == "Rollo.", result["reason"]
    return (result["route"], *seen[-1])


def blocks(messages) -> int:
    return messages[-1].content.count("<evidence id=")


@pytest.mark.parametrize("policy, route", [("complete", "refine"), ("off", "generate")])
@pytest.mark.parametrize("mode", ["verify", "rewrite"])
async def test_the_drafter_reads_the_top_blocks_and_the_answer_model_all(seen, policy, route, mode):
    got, messages, options = await answer_call(
        seen, draft_policy=policy, refine_mode=mode, min_draft_tokens=1, drafter_evidence=1
    )
    assert got == route
    assert blocks(messages) == 3
    drafter = options.drafter_messages
    assert drafter is not None and blocks(drafter) == 1
    assert "Rollo led" in drafter[-1].content and "treaty" not in drafter[-1].content
    # the same prompt otherwise: system message and the question (and draft) after the evidence
    assert drafter[0].content == messages[0].content
    assert drafter[-1].content.endswith(messages[-1].content.rsplit("</evidence>", 1)[1])


@pytest.mark.parametrize("n", [None, 0, 3, 5])
async def test_the_drafter_reads_the_answer_models_prompt_by_default_or_told_all_blocks(seen, n):
    _, _, options = await answer_call(seen, **({} if n is None else {"drafter_evidence": n}))
    assert options.drafter_messages is None


async def test_two_blocks_for_the_drafter(seen):
    _, messages, options = await answer_call(seen, drafter_evidence=2)
    assert blocks(messages) == 3 and blocks(options.drafter_messages) == 2
