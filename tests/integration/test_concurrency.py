"""16 concurrent runs on one local model: all complete, no cross-talk, bounded memory."""

import pytest

from specrag import SpecRagContext
from specrag.evaluation.bench_load import load_questions, measure

pytestmark = pytest.mark.integration
MEMORY_BOUND_MB = 1024  # documented in the README (Reliability)


def test_sixteen_concurrent_runs_match_their_sequential_answers(smol):
    questions, directory = load_questions(16)
    assert len(set(questions)) == 16
    ctx = SpecRagContext(
        index_dir=str(directory),
        collection="bench_load",
        refine_temperature=0.0,
        answer_max_tokens=24,
        answer_timeout_s=600.0,
        # 16 query embeddings queue on the model thread behind the drafts' steps: a loaded
        # machine must not turn one into a retrieval timeout (a fallback answer differs)
        retrieval_timeout_s=600.0,
    )
    result = measure(questions, ctx, [1, 16])
    sequential, concurrent = result["levels"]
    assert all(o["answer"] for o in concurrent["outputs"])
    assert [o["question"] for o in concurrent["outputs"]] == questions
    # each answer and its sources belong to its own question
    assert result["cross_talk"] == 0, concurrent["mismatches"]
    assert result["rss_growth_mb"] < MEMORY_BOUND_MB
