"""The demo's scenario texts follow the run's settings."""

import dataclasses

from specrag.demo import SCENARIOS, scenario_context
from specrag.graph.context import SpecRagContext


def test_every_intro_fills_in_and_names_the_settings_in_use():
    """The "no evidence" intro said threshold 0.2 whatever `--set relevance_threshold` said."""
    base = dataclasses.replace(SpecRagContext(), relevance_threshold=0.35)
    texts = {s.name: s.describe(scenario_context(base, s)) for s in SCENARIOS}
    assert all(texts.values()) and not any("{" in t for t in texts.values())
    assert "relevance_threshold 0.35 or more" in texts["no evidence"]


def test_a_setting_the_user_gave_wins_over_the_scenarios():
    """The remote-store scenario set draft_temperature=0.0 over a user's --set unseen."""
    remote = next(s for s in SCENARIOS if "draft_temperature" in s.overrides)
    base = dataclasses.replace(SpecRagContext(), draft_temperature=0.8)
    assert scenario_context(base, remote).draft_temperature == 0.0  # not given: the scenario's
    kept = scenario_context(base, remote, {"draft_temperature": 0.8})
    assert kept.draft_temperature == 0.8
    assert kept.added_retrieval_latency_s == remote.overrides["added_retrieval_latency_s"]


def test_the_long_document_holds_the_answer_to_its_question():
    """The RAPID scenario asked for the Anglo-Norman language's final form, whose paragraph
    (Normans 17) the ~1,500-word document stops before: the model could only make it up."""
    from specrag.data.datasets import squad_questions
    from specrag.demo import normans_document

    document = normans_document()
    key = lambda question: question.strip().rstrip("?")  # noqa: E731  (SQuAD's own spelling)
    golds = {key(q.question): q.answers for q in squad_questions()}
    for scenario in (s for s in SCENARIOS if s.long_document):
        answers = golds[key(scenario.question)]
        assert any(a in document for a in answers), (scenario.question, answers)


def test_a_decode_cut_past_its_grace_is_not_told_as_zero_passes():
    """A review (2026-12-07): a decode cut past its budget's grace keeps new_tokens (2b4ceeb)
    but no pass counts; the demo's line read "12 tokens in 0 target passes"."""
    from specrag.demo import savings

    for route in ("rapid_generate", "refine", "generate"):
        cut = {"route": route, "stats": {route: {"new_tokens": 12, "truncated": True}}}
        assert savings(cut) == (
            "the answer budget ended the decode after 12 tokens (no decoding statistics)"
        )
    whole = {"route": "generate", "stats": {"generate": {"new_tokens": 12, "forward_passes": 7}}}
    assert savings(whole).startswith("12 tokens in 7 target passes")
    kept = {"route": "rapid_generate", "stats": {"rapid_generate": {"truncated": True}}}
    assert savings(kept) == "the answer budget ended the decode (no decoding statistics)"


def test_the_demos_fallback_line_and_intro_say_what_happened():
    """A review (2026-12-07): every fallback read "no answer model ran: the draft is the
    answer", with no draft shown or after an answer model failed; the remote-store intro said
    1.5 s of latency whatever `--set added_retrieval_latency_s` gave."""
    from specrag.demo import SCENARIOS, savings, scenario_context
    from specrag.graph.context import SpecRagContext

    shown = {"route": "fallback", "draft": "Rollo.", "answer": "Unverified (...): Rollo."}
    assert savings(shown) == "no answer model ran: the draft is the answer"
    none = {"route": "fallback", "draft": "", "answer": "I could not find evidence for this."}
    assert "no draft is shown" in savings(none)
    failed = {**shown, "reason": "draft usable; generate: RuntimeError: boom -> fallback"}
    assert savings(failed).startswith("the answer model failed")
    remote = SCENARIOS[0]
    ctx = SpecRagContext(added_retrieval_latency_s=0.0)
    kept = scenario_context(ctx, remote, given=["added_retrieval_latency_s"])
    assert remote.describe(kept).startswith("A remote vector store (0 s of injected")
    assert remote.describe(scenario_context(ctx, remote)).startswith(
        "A remote vector store (1.5 s of injected"
    )


def test_the_demos_rapid_line_counts_its_accepted_and_drafted_tokens():
    """A mutation review, 2026-12-08: the RAPID line showing the drafted count as the accepted
    one ("9/9 drafted tokens accepted" for 7 of 9) passed every test."""
    from specrag.demo import savings

    stats = {"new_tokens": 12, "target_forward_passes": 5, "accepted_tokens": 7}
    rapid = {"route": "rapid_generate", "stats": {"rapid_generate": stats | {"draft_tokens": 9}}}
    assert savings(rapid) == "12 tokens in 5 target passes (7/9 drafted tokens accepted)"
    speedup = {"ratio": 1.5, "plain_step_s": 0.1, "basis": "3 plain steps"}
    stats = {"new_tokens": 12, "forward_passes": 7, "decode_speedup_vs_plain": speedup}
    line = savings({"route": "generate", "stats": {"generate": stats}})
    assert (
        line
        == "12 tokens in 7 target passes (tokens from: none); decode 1.50x plain (3 plain steps)"
    )
