"""Benchmarks: bootstrap intervals, pass counting, warm-up, and resuming an interrupted run.

Heavy parts (models, datasets, generation) are replaced by tiny fakes, so these run in seconds
without model downloads.
"""

from __future__ import annotations

import asyncio
import io
import json
import statistics
import time
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
from langchain_core.messages import AIMessage
from rich.console import Console

import specrag.decoding.state as state_module
from specrag.data.datasets import Paragraph, QAExample
from specrag.evaluation import bench_rag, bench_rapid, metrics
from specrag.evaluation.hf import hf_generate

# --- metrics.bootstrap_ci / ratio_ci -------------------------------------------------------


def test_bootstrap_ci_is_seeded_and_brackets_the_estimate():
    values = [0.8, 1.1, 0.9, 1.4, 1.0, 1.2, 0.7, 1.3, 1.05, 0.95]
    ci = metrics.bootstrap_ci(values, metrics.mean, seed=3)
    assert ci == metrics.bootstrap_ci(values, metrics.mean, seed=3)  # reproducible
    assert ci != metrics.bootstrap_ci(values, metrics.mean, seed=4)
    lo, hi = ci
    assert min(values) <= lo < metrics.mean(values) < hi <= max(values)
    # close to the normal-theory interval of a mean
    half = 1.96 * statistics.stdev(values) / len(values) ** 0.5
    assert hi - lo == pytest.approx(2 * half, rel=0.3)


def test_bootstrap_ci_edge_cases():
    assert metrics.bootstrap_ci([], metrics.mean) is None
    # one question: no interval (it printed [x, x], as if the ratio were certain)
    assert metrics.bootstrap_ci([2.5], metrics.mean) is None
    assert metrics.ratio_ci({"q": 2.0}, {"q": 1.0}, metrics.mean) == (2.0, None)
    assert metrics.bootstrap_ci([1.0, 2.0], lambda _: None) is None  # never defined


def test_bootstrap_ci_takes_the_levels_percentiles_of_the_resampled_statistic():
    """A 95% interval cuts 2.5% off each tail of the resampled values (a 90% one passed the
    width check above), and percentiles interpolate between the sorted values."""
    drawn = iter(range(2000))
    ci = metrics.bootstrap_ci([1.0, 2.0], lambda _: float(next(drawn)), n_boot=2000)
    assert ci == [pytest.approx(49.975), pytest.approx(1949.025)]
    assert metrics.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert metrics.percentile([0.0, 10.0], 25) == 2.5
    assert metrics.percentile([float(v) for v in range(101)], 97.5) == pytest.approx(97.5)


def test_answer_metrics_follow_the_official_squad_rules():
    """Articles, case and punctuation do not count; any gold answer may match; contains-gold
    needs whole words; F1 counts the tokens both share."""
    assert metrics.normalize("The Eiffel  Tower!") == "eiffel tower"
    assert metrics.exact_match("the Eiffel Tower.", ["an Eiffel tower"]) == 1.0
    assert metrics.exact_match("Paris", ["Paris", "the city of Paris"]) == 1.0  # any gold
    assert metrics.exact_match("Lyon", ["Paris"]) == 0.0
    assert metrics.contains("It was ninety years.", ["nine"]) == 0.0  # not inside a word
    assert metrics.contains("It was nine years.", ["ninety", "nine"]) == 1.0
    assert metrics.f1("Paris France", ["Paris"]) == pytest.approx(2 / 3)
    assert metrics.f1("Paris Paris", ["Paris"]) == pytest.approx(2 / 3)  # counted, not set
    assert metrics.f1("Lyon", ["Paris"]) == 0.0


def test_json_ready_makes_summaries_valid_json():
    """A mean of no values (every run of a system timed out) is nan; --json must stay JSON."""
    summary = {"long": {"spec_verify": {"ttft_s_median": metrics.median([]), "n": 3}}}
    with pytest.raises(ValueError):
        json.dumps(summary, allow_nan=False)
    ready = metrics.json_ready({**summary, "ci": (1.0, float("inf")), "ok": [0.5, "x", None]})
    assert json.loads(json.dumps(ready, allow_nan=False)) == {
        "long": {"spec_verify": {"ttft_s_median": None, "n": 3}},
        "ci": [1.0, None],
        "ok": [0.5, "x", None],
    }


def test_ratio_ci_resamples_questions_paired():
    den = {f"q{i}": 1.0 + i for i in range(12)}
    num = {q: 2.0 * v for q, v in den.items()}
    point, ci = metrics.ratio_ci(num, den, metrics.mean)
    assert point == pytest.approx(2.0)
    # both sides are drawn with the same questions: an exact 2x stays exactly 2x
    assert ci == pytest.approx([2.0, 2.0])
    point, ci = metrics.ratio_ci({"a": 1.0, "b": 3.0}, {"a": 1.0, "b": 1.0}, metrics.median)
    assert point == pytest.approx(2.0) and ci[0] <= point <= ci[1]
    assert metrics.ratio_ci({"a": 1.0}, {"a": 0.0}, metrics.mean) == (None, None)
    assert metrics.ratio_ci({}, {"a": 1.0}, metrics.mean) == (None, None)
    # a question only one side has (the other had no value for it) is left out of both: a
    # system whose fast question dropped out must not compare its slow ones with all of ours
    point, ci = metrics.ratio_ci(
        {"a": 2.0, "b": 4.0}, {"a": 1.0, "b": 2.0, "c": 100.0}, metrics.mean
    )
    assert point == pytest.approx(2.0) and ci == pytest.approx([2.0, 2.0])


def test_per_token_pools_seconds_and_tokens():
    assert metrics.per_token([(1.0, 10), (3.0, 10)]) == pytest.approx(0.2)
    assert metrics.per_token([(1.0, 0)]) != metrics.per_token([(1.0, 0)])  # nan


# --- hf_generate: assistant passes counted apart (item 17) ---------------------------------


class _Tok:
    """A tokenizer for a tiny model: token i reads ``fmt.format(i)``."""

    eos_token_id = 0

    def __init__(self, fmt=" t{}"):
        self.fmt = fmt

    def decode(self, ids, **_):
        return "".join(self.fmt.format(int(i)) for i in ids)


def _tiny_loaded(fmt=" t{}"):
    """A tiny random Llama as ``hf_generate`` takes it (no end token: it runs to the limit)."""
    from tests.tiny import tiny_llama

    model = tiny_llama(
        sharpen=1.0,
        hidden_size=16,
        intermediate_size=32,
        num_attention_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return types.SimpleNamespace(model=model, tokenizer=_Tok(fmt), device=torch.device("cpu"))


def test_hf_assisted_counts_assistant_passes_apart_from_target_passes():
    loaded = _tiny_loaded()
    model = loaded.model
    seen = [0]
    handle = model.register_forward_pre_hook(lambda *_: seen.__setitem__(0, seen[0] + 1))
    try:
        res = hf_generate(loaded, list(range(1, 20)), max_new_tokens=16, assistant_model=model)
    finally:
        handle.remove()
    assert res["new_tokens"] == 16
    assert res["assistant_forward_passes"] > 0
    assert res["forward_passes"] + res["assistant_forward_passes"] == seen[0]
    assert res["forward_passes"] < res["new_tokens"]  # the target verified several at once
    assert "generate" not in vars(model)  # the counting wrapper is gone
    # decode speed: the tokens after the first step (the prefill pass) over the time after it
    decoded = res["new_tokens"] - res["first_step_tokens"]
    if decoded and res["decode_s"] > 0:
        assert res["tokens_per_s"] == pytest.approx(decoded / res["decode_s"])
    # the graph-comparable decode time: all but the target's own prefill pass, so the
    # assistant's prefill and first drafts (HF's first step) are in it
    assert 0 < res["target_prefill_s"] < res["total_s"]
    assert res["decode_all_s"] == pytest.approx(res["total_s"] - res["target_prefill_s"])
    assert res["decode_all_s"] > res["decode_s"]
    plain = hf_generate(loaded, list(range(1, 20)), max_new_tokens=8)
    assert plain["forward_passes"] == 8 and plain["assistant_forward_passes"] == 0
    assert plain["first_step_tokens"] == 1


def test_hf_assisted_target_prefill_is_the_targets_own_pass():
    """A mutation review (2026-12-08): the target's prefill clock started at any first pass,
    the assistant's included, and passed every test (the assistant there is the target
    itself). HF's assistant drafts first, so ``target_prefill_s`` took in its prefill and
    drafts, and ``decode_all_s`` lost them. Here a second model assists, its first pass
    held 0.5 s (a sleep in a hook after HF's counters): the target's own prefill pass of a
    tiny model is far shorter."""
    loaded, assistant = _tiny_loaded(), _tiny_loaded().model
    slept: list[int] = []

    def hold(*_):
        if not slept:
            slept.append(1)
            time.sleep(0.5)

    handle = assistant.register_forward_hook(hold)
    try:
        res = hf_generate(loaded, list(range(1, 20)), max_new_tokens=8, assistant_model=assistant)
    finally:
        handle.remove()
    assert slept and res["assistant_forward_passes"] > 0
    assert res["target_prefill_s"] < 0.5 <= res["decode_all_s"]


def test_hf_baselines_stop_at_the_graphs_stop_sequences():
    """The graph's answers end at its stop sequences; HF baselines ran on past them (more
    tokens, a longer time), assisted generation's multi-token steps included."""
    from specrag.evaluation.hf import stop_on_text

    loaded = _tiny_loaded("<{}>")
    model, tok = loaded.model, loaded.tokenizer
    prompt = list(range(1, 20))
    free = hf_generate(loaded, prompt, max_new_tokens=16)["answer"]
    tokens = free[1:-1].split("><")
    k = next(i for i in range(3, 16) if tokens[i] not in tokens[:i])  # a first occurrence
    stop = (f"<{tokens[k]}>",)
    plain = hf_generate(
        loaded,
        prompt,
        max_new_tokens=16,
        stopping_criteria=[stop_on_text(tok, len(prompt), stop)],
    )
    assert plain["new_tokens"] == k + 1 and plain["answer"].endswith(stop[0])
    assisted = hf_generate(
        loaded,
        prompt,
        max_new_tokens=16,
        assistant_model=model,
        stopping_criteria=[stop_on_text(tok, len(prompt), stop)],
    )
    assert assisted["forward_passes"] < assisted["new_tokens"]  # it did speculate
    assert k + 1 <= assisted["new_tokens"] < 16 and stop[0] in assisted["answer"]


# --- bench rapid: resume after an interruption (item 8), warm-up (item 15) -----------------


class Interrupted(BaseException):
    """Stands in for Ctrl-C in the middle of a run."""


def _hotpot_pool() -> list[QAExample]:
    pool = []
    for i in range(12):
        paras = tuple(
            Paragraph(f"p{i}-{j}", f"Title {i} {j}", " ".join(f"w{i}x{j}x{k}" for k in range(60)))
            for j in range(3)
        )
        pool.append(
            QAExample(f"q{i}", f"Question {i}?", (f"w{i}x0x1",), (f"p{i}-0",), paragraphs=paras)
        )
    return pool


class _FakeTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1] * len(text.split())}


class _FakeLMState:
    def __init__(self, model, device=None):
        self.cache = "kv"
        self.tokens: list[int] = []

    def extend(self, ids, all_logits=True, **_):
        self.tokens += list(ids)


LONG = 1000  # words; the benchmark's documents are longer, the warm-up's shorter


@pytest.fixture
def fake_rapid(monkeypatch):
    calls: list[tuple[str, int]] = []
    armed = {"crash": False}

    class FakeRapid:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def invoke(self, messages, document):
            calls.append(("rapid", len(document.split())))
            meta = {
                "new_tokens": 6,
                "decode_s": 0.05,
                "ttft_s": 0.02,
                "target_forward_passes": 3,
                "drafter_forward_passes": 9,
                "acceptance_rate": 0.8,
                "mean_accepted_per_step": 2.0,
                "prefix_cache_hit": False,
                "retrieve_s": 0.01,
                "prefix_s": 0.02,
                "target_prefill_s": 0.001,
                "drafter_prefill_s": 0.003,
            }
            return AIMessage(content="w0x0x1", response_metadata=meta)

    def fake_hf_generate(loaded, prompt, *, max_new_tokens, cache=None, **kwargs):
        calls.append(("hf", len(prompt)))
        assert kwargs["eos_token_id"] == [0]  # the end tokens RAPID stops at (the model's)
        if armed["crash"] and len(prompt) > LONG:
            raise Interrupted()
        assisted = "assistant_model" in kwargs
        return {
            "answer": "w0x0x1",
            "new_tokens": 6,
            "ttft_s": 0.03,
            "total_s": 0.13,
            "decode_s": 0.1,
            "forward_passes": 3 if assisted else 6,
            "assistant_forward_passes": 12 if assisted else 0,
            "tokens_per_s": 50.0,
        }

    loaded = types.SimpleNamespace(
        tokenizer=_FakeTokenizer(),
        key="fake",
        model=object(),
        device="cpu",
        dtype=torch.float32,
        name="fake",
        layout="single layout (fake)",
        load_seconds=1.5,
        eos_token_ids=(0,),
    )
    monkeypatch.setattr(bench_rapid, "load_lm", lambda *a, **k: loaded)
    monkeypatch.setattr(bench_rapid, "hotpot_questions", _hotpot_pool)
    monkeypatch.setattr(bench_rapid, "ChatRapid", FakeRapid)
    monkeypatch.setattr(bench_rapid, "hf_generate", fake_hf_generate)
    monkeypatch.setattr(
        bench_rapid, "layout", lambda loaded, instr, doc, q: ([1], [2] * len(doc.split()), [3, 4])
    )
    monkeypatch.setattr(state_module, "LMState", _FakeLMState)
    return calls, armed


def _quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


def test_bench_rapid_resumes_a_part_run_case_whole(fake_rapid, tmp_path):
    calls, armed = fake_rapid
    armed["crash"] = True  # Ctrl-C during the first timed target-only run
    with pytest.raises(Interrupted):
        bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    log_file = tmp_path / "bench_rapid" / "runs-quick.jsonl"
    first = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert sorted(r["method"] for r in first) == ["rapid_eta0", "rapid_kt"]

    armed["crash"] = False
    calls.clear()
    result = bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())  # resume

    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    assert len(records) == (len(bench_rapid.LENGTHS) * len(bench_rapid.METHODS) + len(first))
    assert records[:2] == first  # the log only grows
    # the part-run case ran again whole, its RAPID methods too: every ratio compares methods
    # timed side by side in one session (they were kept and paired with a later session's)
    long_rapid = [c for c in calls if c[0] == "rapid" and c[1] > LONG]
    assert len(long_rapid) == 3 * len(bench_rapid.LENGTHS)  # kt (+ repeat) and eta0
    sessions = {r["session"] for r in records[2:]}
    assert len(sessions) == 1 and sessions != {r["session"] for r in first}
    assert bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet()) == result  # all done
    # warm-up (item 15): every method ran once on a short document before anything timed
    warm = [c for c in calls if c[1] <= LONG]
    assert calls[: len(warm)] == warm and len(warm) == 3 + 3  # rapid kt x2, eta0; 3 HF paths
    json.dumps(result, allow_nan=False)  # one strict JSON document
    assert set(result["layouts"]) == {"target", "drafter"}  # which layout each model ran with
    assert result["layouts"]["target"] == "single layout (fake)"
    # each model's load, reported apart from the timings (it was in no output: a review)
    assert set(result["load_s"]) == {"target", "drafter"}
    assert all(isinstance(v, float) for v in result["load_s"].values())
    per = result["per_context_length"]["2048"]
    for method in bench_rapid.METHODS:
        assert per["decode_speedup_vs_target"][method] is not None
        assert per["e2e_speedup_vs_target"][method] is not None
        # a --quick run asks one question per length: a ratio, and no interval from it
        assert per["decode_speedup_vs_target_ci95"][method] is None
        assert per["e2e_speedup_vs_target_ci95"][method] is None
    # item 17: HF's assistant passes are not target passes
    assert per["target_passes_per_token"]["hf_assisted"] == pytest.approx(3 / 6)
    assert per["draft_passes_per_token"]["hf_assisted"] == pytest.approx(12 / 6)
    assert per["draft_passes_per_token"]["target_only"] == 0
    assert per["repeat_question_speedup_ci95"] is None  # one question: no interval
    # a quick run's files never overwrite a full run's in the same --out
    table = (tmp_path / "bench_rapid" / "table-quick.md").read_text()
    assert not (tmp_path / "bench_rapid" / "table.md").exists()
    assert str(tmp_path / "bench_rapid" / "summary-quick.json") in result["files"]
    assert "e2e speedup vs target [95% CI]" in table


def test_bench_rapid_warms_up_before_the_cases_a_resumed_run_has_left(fake_rapid, tmp_path):
    """A run that resumed some whole cases and had others left skipped the warm-up under a
    mutant (``all`` for ``any``: a mutation review, 2026-12-08), timing its first new case
    cold; the tests covered a log with nothing done and one with everything done."""
    calls, _ = fake_rapid
    bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    log_file = tmp_path / "bench_rapid" / "runs-quick.jsonl"
    lines = log_file.read_text().splitlines()
    kept = [x for x in lines if "|8192|" not in json.loads(x).get("key", "")]
    assert 0 < len(kept) < len(lines)
    log_file.write_text("".join(f"{x}\n" for x in kept))  # the longest length left to run
    calls.clear()
    bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    warm = [c for c in calls if c[1] <= LONG]
    assert len(warm) == 3 + 3 and calls[: len(warm)] == warm  # warmed up first
    assert len(calls) > len(warm)  # then the cases left


def test_bench_rapid_counts_the_costs_each_method_pays(fake_rapid, tmp_path, monkeypatch):
    """A mutation review (2026-12-08): target-only's clock started after its document
    prefill (its e2e without the prefill every method pays, ``document_prefill_s`` ~0), and
    RAPID cases reusing each other's chunk embeddings (RAPID's retrieval paid once), both
    passed every test. The prefill takes at least 0.05 s here (a sleep); each RAPID case
    (``rapid_kt``, ``rapid_eta0``; not ``rapid_kt``'s repeated question) clears the cache."""
    calls, _ = fake_rapid
    prefill = bench_rapid.prefill_state

    def slow_prefill(*args):
        time.sleep(0.05)
        return prefill(*args)

    monkeypatch.setattr(bench_rapid, "prefill_state", slow_prefill)
    monkeypatch.setattr(
        bench_rapid.document_search, "clear_cache", lambda: calls.append(("clear", 0))
    )
    bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    log_file = tmp_path / "bench_rapid" / "runs-quick.jsonl"
    records = [json.loads(line) for line in log_file.read_text().splitlines()]
    target = [r for r in records if r.get("method") == "target_only"]
    assert target and all(r["document_prefill_s"] >= 0.05 for r in target)
    assert all(r["e2e_s"] >= r["document_prefill_s"] for r in target)
    # each case's first RAPID call comes right after a clear: kt, its repeat, then eta0
    kinds = [c[0] for c in calls if c[0] in ("clear", "rapid")]
    assert kinds == ["clear", "rapid", "rapid", "clear", "rapid"] * (len(kinds) // 5)
    assert len(kinds) == 5 * (1 + len(bench_rapid.LENGTHS))  # the warm-up's case too


def test_bench_rapid_never_resumes_records_of_another_dtype_or_device(
    fake_rapid, tmp_path, monkeypatch
):
    """`auto` is fp32 on a CPU and bf16 on a GPU: a results folder carried between machines
    must not pass one's records off as the other's, nor summarise them with its own (a
    mutation review, 2026-12-08: a summary of every record in the shared log passed)."""
    calls, _ = fake_rapid
    bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    loaded = bench_rapid.load_lm()  # the fixture's one fake model, as loaded
    calls.clear()
    bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    assert calls == []  # resumed: every case was recorded
    loaded.device, loaded.dtype = "cuda", torch.bfloat16  # the same folder on a GPU
    original = bench_rapid.hf_generate
    monkeypatch.setattr(
        bench_rapid, "hf_generate", lambda *a, **k: {**original(*a, **k), "tokens_per_s": 100.0}
    )
    gpu = bench_rapid.run(quick=True, out_dir=tmp_path, log=_quiet())
    assert len([c for c in calls if c[1] > LONG]) > 0  # measured again, not resumed
    # its summary is of its own records: target-only's 100 tokens/s, not a mean with the
    # CPU run's 50
    per = gpu["per_context_length"]["2048"]
    assert per["tokens_per_s"]["target_only"] == pytest.approx(100.0)


def _rapid_row(qid: str, method: str, tokens_per_s: float, e2e_s: float, **fields) -> dict:
    """A bench rapid record at 2048 tokens: 10 new tokens in 10 target passes, no drafter,
    every metric 1.0, the answer ``Answer <qid>``; ``fields`` replace any of it."""
    return {
        "qid": qid,
        "length": 2048,
        "method": method,
        "tokens_per_s": tokens_per_s,
        "e2e_s": e2e_s,
        "new_tokens": 10,
        "target_forward_passes": 10,
        "draft_forward_passes": 0,
        "contains": 1.0,
        "f1": 1.0,
        "document_tokens": 2000,
        "answer": f"Answer {qid}",
        **fields,
    }


def test_bench_rapid_speedups_decode_and_end_to_end_with_intervals():
    rows = []
    for i in range(6):
        scale = 1 + i / 10
        rows.append(
            _rapid_row(
                f"q{i}",
                "target_only",
                10.0 * scale,
                4.0 * scale,
                drafter_prefill_s=None,
                retrieve_s=None,
                answer=f"Answer {i}",
            )
        )
        rows.append(
            _rapid_row(
                f"q{i}",
                "rapid_kt",
                20.0 * scale,
                5.0 * scale,
                target_forward_passes=4,
                draft_forward_passes=12,
                drafter_prefill_s=0.5,
                retrieve_s=0.2,
                # RAPID returns the text unstripped, HF's paths stripped; q5 differs
                answer=f"Answer {i} " + ("!" if i == 5 else ""),
            )
        )
    per = bench_rapid.summarize(rows)["2048"]
    assert per["same_answer_as_target"] == {"target_only": 1.0, "rapid_kt": pytest.approx(5 / 6)}
    assert "same answer as target" in bench_rapid.markdown({"2048": per})
    # decode twice as fast, yet slower end to end once RAPID's own costs count
    assert per["decode_speedup_vs_target"]["rapid_kt"] == pytest.approx(2.0)
    assert per["decode_speedup_vs_target_ci95"]["rapid_kt"] == pytest.approx([2.0, 2.0])
    assert per["e2e_speedup_vs_target"]["rapid_kt"] == pytest.approx(0.8)
    assert per["retrieve_s"]["rapid_kt"] == pytest.approx(0.2)
    assert per["drafter_prefill_s"]["rapid_kt"] == pytest.approx(0.5)
    assert per["draft_passes_per_token"]["rapid_kt"] == pytest.approx(1.2)


def test_bench_rapid_ratios_are_of_totals_and_divide_the_right_way():
    """As the rag and pair benches' (a review, 2026-12-06): bench rapid's speedups are ratios
    of totals over the questions (a mutation review found a ratio of medians passing every
    test: the test above scales both methods alike, where mean and median agree). Target
    e2e 2 / 5 / 20 s, RAPID 1 / 10 / 10 s: 27 / 21 in totals, 0.5 in medians. Decode
    tokens/s 30 / 10 / 10 against 10 each: 50 / 30 (medians 1.0). A question asked again
    on the warm prefix cache takes a quarter of its first time: the repeat speedup is 4x
    (first over repeat; swapped it read 0.25x)."""
    target = {"q1": 2.0, "q2": 5.0, "q3": 20.0}
    rapid = {"q1": 1.0, "q2": 10.0, "q3": 10.0}
    tps = {"q1": 30.0, "q2": 10.0, "q3": 10.0}
    rows = []
    for qid in target:
        rows.append(_rapid_row(qid, "target_only", 10.0, target[qid]))
        rows.append(_rapid_row(qid, "rapid_kt", tps[qid], rapid[qid], repeat_e2e_s=rapid[qid] / 4))
    per = bench_rapid.summarize(rows)["2048"]
    assert per["e2e_speedup_vs_target"]["rapid_kt"] == pytest.approx(27 / 21)
    lo, hi = per["e2e_speedup_vs_target_ci95"]["rapid_kt"]
    assert lo <= 27 / 21 <= hi and lo < hi
    assert per["decode_speedup_vs_target"]["rapid_kt"] == pytest.approx(50 / 30)
    assert per["repeat_question_speedup"] == pytest.approx(4.0)
    assert per["first_question_s"] == pytest.approx(7.0)
    assert per["repeat_question_s"] == pytest.approx(7.0 / 4)


# --- bench rag: warm-up before timing, per-token ratios, intervals (items 15, 16, 18) -------


def test_bench_rag_warms_up_then_reports_ratios_with_intervals(monkeypatch, tmp_path):
    items = [
        {
            "dataset": "squad" if i < 4 else "hotpot",
            "id": f"q{i}",
            "question": f"Question {i}?",
            "answers": ["x"],
            "gold": ["g"],
            "index_dir": str(tmp_path / "index"),
            "collection": "bench_squad" if i < 4 else "bench_hotpot",
        }
        for i in range(6)
    ]
    events: list[tuple] = []

    class FakeIndex:
        def __init__(self, collection):
            self.collection = collection

        def search(self, question, k, mode="dense"):
            events.append(("search", self.collection, mode))
            return []

    async def fake_run_one(item, system, latency, graph, base):
        events.append(("run", item["id"], system, latency))
        i = int(item["id"][1:])
        scale = {"serial_plain": 1.0, "serial_lookup": 0.9, "spec_verify": 0.8}.get(system, 2.0)
        tokens = 20 if system == "spec_rewrite" else 10  # rewrite: twice as long, same pace
        e2e = (1.0 + i / 10) * scale + latency
        return {
            "dataset": item["dataset"],
            "qid": item["id"],
            "system": system,
            "latency": latency,
            "answer": "x" * tokens,
            "route": "generate",
            "retrieved": [],
            "ttft_s": 0.3,
            "draft_ttft_s": 0.1 if system.startswith("spec") else None,
            "passes_per_token": 1.0,
            "new_tokens": tokens,
            "decode_s": e2e / 2,
            "e2e_s": e2e,
            "em": float(i % 2),
            "f1": float(i % 2),
            "contains": 1.0,
            "recall_at_k": 1.0,
        }

    monkeypatch.setattr(bench_rag, "build_datasets", lambda *a, **k: items)
    model = types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
    monkeypatch.setattr(bench_rag, "load_lm", lambda *a, **k: model)
    monkeypatch.setattr(bench_rag, "build_graph", lambda *a, **k: object())
    monkeypatch.setattr(bench_rag, "open_index", lambda ctx: FakeIndex(ctx.collection))
    monkeypatch.setattr(bench_rag, "run_one", fake_run_one)

    result = bench_rag.run(quick=True, out_dir=tmp_path, log=_quiet())
    # what each ratio is (ratios of totals since 2026-12-06; decode: of means)
    stats = result["statistics"]
    assert stats["decode_vs_serial_plain, new_tokens_ratio"].startswith("mean over questions")
    totals = metrics.RATIO_OF_TOTALS
    assert any(k.startswith("e2e_vs_*") and v == totals for k, v in stats.items())
    runs = [e for e in events if e[0] == "run"]
    n_work = len(items) + len(items) * len(bench_rag.LATENCIES) * (len(bench_rag.SYSTEMS) - 1)
    n_work += len(items) * len(bench_rag.STYLE_SYSTEMS)
    first_run = events.index(runs[0])
    # both indexes opened and searched in every retrieval mode (BM25's copy loads on its first
    # search), then one question through every system, all untimed
    assert set(events[:first_run]) == {
        ("search", c, m)
        for c in ("bench_squad", "bench_hotpot")
        for m in ("dense", "bm25", "hybrid")
    }
    warmed = [*bench_rag.SYSTEMS, *bench_rag.STYLE_SYSTEMS]  # the answer settings too
    assert runs[: len(warmed)] == [("run", "q0", s, 0.0) for s in warmed]
    assert len(runs) == len(warmed) + n_work
    # each question's answer settings run right after its systems at 0 s (side by side)
    timed = runs[len(warmed) + len(items) :]
    per_question = len(bench_rag.SYSTEMS) - 1 + len(bench_rag.STYLE_SYSTEMS)
    assert [r[2] for r in timed[:per_question]] == bench_rag.SYSTEMS[1:] + list(
        bench_rag.STYLE_SYSTEMS
    )
    assert {r[1] for r in timed[:per_question]} == {"q0"}
    log_file = tmp_path / "bench_rag" / "runs-quick.jsonl"
    assert len(log_file.read_text().splitlines()) == n_work  # the warm-up is not recorded

    json.dumps(result, allow_nan=False)  # one strict JSON document
    row = result["systems"]["spec_rewrite"]["0.0"]
    assert row["e2e_vs_serial_plain"] == pytest.approx(2.0)
    assert row["e2e_per_token_vs_serial_plain"] == pytest.approx(1.0)  # same pace per token
    assert row["e2e_per_token_vs_serial_plain_ci95"] == pytest.approx([1.0, 1.0])
    assert row["decode_per_token_vs_serial_plain"] is not None
    for name in (
        "e2e_vs_serial_plain",
        "decode_vs_serial_plain",
        "draft_ttft_vs_serial_ttft",
        "e2e_vs_serial_lookup",
        "e2e_per_token_vs_serial_lookup",
        "decode_per_token_vs_serial_plain",
    ):
        lo, hi = row[f"{name}_ci95"]
        assert lo <= row[name] <= hi
    verify = result["systems"]["spec_verify"]["1.0"]  # not proportional: a real interval
    lo, hi = verify["e2e_vs_serial_plain_ci95"]
    assert lo < verify["e2e_vs_serial_plain"] < hi < 1.0
    # README: recall, same answer, contains-gold and F1 with intervals too (a review,
    # 2026-12-07: summary.json had none for recall and same answer, the table only ratios')
    assert verify["recall_at_k_ci95"] == [1.0, 1.0]
    assert verify["same_answer_as_serial_ci95"] is not None
    lo, hi = verify["f1_ci95"]
    assert lo < verify["f1"] < hi
    table = (tmp_path / "bench_rag" / "table-quick.md").read_text()  # quick: its own files
    assert "e2e_per_token_vs_serial_plain" in table and " [" in table
    line = next(x for x in table.splitlines() if x.startswith("| spec_verify | 1.0 |"))
    assert f"{bench_rag._fmt(verify['f1'])} [{bench_rag._fmt(lo)}, {bench_rag._fmt(hi)}]" in line
    assert any(f.endswith("speedup-quick.png") for f in result["files"])
    assert not any(f.endswith(("summary.json", "table.md")) for f in result["files"])

    events.clear()
    bench_rag.run(quick=True, out_dir=tmp_path, log=_quiet())  # all recorded: nothing runs
    assert events == []

    # a mutation review (2026-12-08): a run that resumed part of its questions skipped the
    # warm-up (timing its first new question cold), and a summary of every record in the
    # shared log (another dtype's too) passed every test
    items.append({**items[-1], "id": "q6", "question": "Question 6?"})
    bench_rag.run(quick=True, out_dir=tmp_path, log=_quiet())  # one new question
    runs = [e for e in events if e[0] == "run"]
    assert runs[: len(warmed)] == [("run", "q0", s, 0.0) for s in warmed]  # warmed up first
    assert {r[1] for r in runs[len(warmed) :]} == {"q6"}  # then only the new question timed
    model.dtype = torch.bfloat16  # the same folder, another dtype: its own records

    async def bf16_run_one(*args):
        return {**await fake_run_one(*args), "contains": 0.0}

    monkeypatch.setattr(bench_rag, "run_one", bf16_run_one)
    other = bench_rag.run(quick=True, out_dir=tmp_path, log=_quiet())
    assert other["systems"]["spec_verify"]["0.0"]["contains"] == 0.0  # not a mean with fp32's


def test_answer_settings_are_compared_paired_by_question():
    from specrag.evaluation import bench_rag

    base = [
        {
            "dataset": "squad",
            "qid": f"q{i}",
            "system": "serial_plain",
            "latency": 0.0,
            "contains": 1.0,
            "f1": 0.2,
            "new_tokens": 40,
            "e2e_s": 2.0,
        }
        for i in range(6)
    ]
    brief = [
        {**r, "system": "serial_brief", "f1": 0.5, "new_tokens": 10, "e2e_s": 1.0} for r in base
    ]
    row = bench_rag.compare_settings(base + brief)["serial_brief"]
    assert row["n"] == 6 and abs(row["f1_diff"] - 0.3) < 1e-9
    assert row["contains_diff"] == 0.0 and row["new_tokens_ratio"] == 0.25
    assert row["e2e_s_ratio"] == 0.5 and row["f1_diff_ci95"][0] <= 0.3 <= row["f1_diff_ci95"][1]
    assert "serial_brief | 6 |" in bench_rag.settings_markdown({"serial_brief": row})


def test_run_log_keys_name_each_models_device_dtype_and_weight_layout():
    """A run whose target came up with one layout (a timing that went the other way), or with
    another row count for it, must not resume records made with both, nor records of another
    dtype or device."""
    from specrag.evaluation.store import machine_tag, setup_tag
    from specrag.models import layout

    cpu = torch.device("cpu")
    dual_model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    layout.add(dual_model)
    target = types.SimpleNamespace(model=dual_model, device=cpu, dtype=torch.float32)
    int8 = torch.nn.Sequential(torch.nn.Identity())  # no plain linear layers
    drafter = types.SimpleNamespace(model=int8, device=cpu, dtype=torch.qint8)
    here = machine_tag(target, drafter)  # the CPU model, threads and torch version
    assert setup_tag(target, drafter) == f"cpu:float32:dual+cpu:qint8@{here}"
    layout.set_min_rows(dual_model, 2)  # narrow passes timed faster in the second layout
    assert setup_tag(target, drafter) == f"cpu:float32:dual2+cpu:qint8@{here}"
    layout.set_dual(dual_model, False)  # a timing that went the other way: one layout in use
    assert setup_tag(target, drafter) == f"cpu:float32+cpu:qint8@{here}"
    with mock.patch.object(layout, "machine", return_value="another CPU|2 threads|torch 2"):
        assert machine_tag(target, drafter) != here  # a results folder carried elsewhere


def test_run_log_keys_of_cheap_wide_pass_setups_carry_the_proposer_rules():
    """bf16 or GPU records made before 1-token n-gram matches proposed there are not resumed,
    nor any record made before weak proposals were capped where wide passes are cheap (an
    fp32 CPU setup may be cheap too: its key cannot tell)."""
    from specrag.evaluation import bench_pair

    item = {"dataset": "long", "id": "q1"}
    fp32 = bench_pair.case_key(item, "spec_verify", "cpu:float32:dual+cpu:qint8")
    protocol = bench_pair.PROTOCOL["long"]
    assert fp32 == f"pair|long|q1|spec_verify|p{protocol}|cpu:float32:dual+cpu:qint8~wc~op"
    for setup in ("cpu:bfloat16+cpu:qint8", "cuda:bfloat16+cuda:bfloat16", "cuda:float32"):
        assert bench_pair.case_key(item, "spec_verify", setup).endswith(f"|{setup}~ng1~wc~op")
    old = {"dataset": "squad", "id": "q2"}
    assert bench_rag.case_key(old, "spec_verify", 0.0, "cuda:float32").endswith("~ng1~wc~op")
    assert bench_rag.case_key(old, "spec_verify", 0.0, "cpu:float32").endswith("|cpu:float32~wc~op")


def test_run_log_keys_of_the_embedded_and_rapid_benches_change_with_their_protocol(monkeypatch):
    """A protocol bump (a changed measurement) must not resume the records made before it: a
    mutation review (2026-12-08) dropped the protocol from bench rag's and bench rapid's keys
    and every test passed (only the pair bench's key was pinned whole)."""
    item = {"dataset": "squad", "id": "q2"}
    rag_before = bench_rag.case_key(item, "spec_verify", 0.0, "cpu:float32")
    rapid_before = bench_rapid.case_key("q2", 2048, "rapid_kt", "cpu:float32")
    assert f"|p{bench_rag.PROTOCOL}|" in rag_before
    assert f"|p{bench_rapid.PROTOCOL}|" in rapid_before
    monkeypatch.setattr(bench_rag, "PROTOCOL", bench_rag.PROTOCOL + 1)
    monkeypatch.setattr(bench_rapid, "PROTOCOL", bench_rapid.PROTOCOL + 1)
    assert bench_rag.case_key(item, "spec_verify", 0.0, "cpu:float32") != rag_before
    assert bench_rapid.case_key("q2", 2048, "rapid_kt", "cpu:float32") != rapid_before


def test_bench_retrieval_logs_every_question_and_pairs_modes_against_dense(monkeypatch, tmp_path):
    from specrag.evaluation import bench_retrieval

    paragraphs = [Paragraph(f"squad:T:{i}", "T", f"text {i}") for i in range(4)]
    questions = [QAExample(f"q{i}", f"question {i}", ("a",), (f"squad:T:{i}",)) for i in range(4)]

    class Index:  # dense finds the gold of even questions, bm25 of all, hybrid of none
        def refresh_lexical(self):
            pass

        def search(self, text, k, mode):
            if text == "warm-up":
                return []
            i = int(text.split()[-1])
            gold = {"dense": i % 2 == 0, "bm25": True, "hybrid": False}[mode]
            pick = [i] if gold else []
            pick += [j for j in range(4) if j != i][: k - len(pick)]
            return [types.SimpleNamespace(source=f"squad:T:{j}") for j in pick]

    monkeypatch.setattr(bench_retrieval, "squad_paragraphs", lambda: paragraphs)
    monkeypatch.setattr(bench_retrieval, "squad_questions", lambda: questions)
    monkeypatch.setattr(bench_retrieval, "_index", lambda *a: tmp_path / "index")
    monkeypatch.setattr(bench_retrieval, "open_for_writing", lambda *a: Index())
    result = bench_retrieval.run(quick=False, out_dir=tmp_path, log=_quiet())

    summary = result["summary"]
    assert summary["n"] == 4
    assert [summary[m]["recall_at_3"] for m in ("dense", "bm25", "hybrid")] == [0.5, 1.0, 0.0]
    assert summary["bm25"]["diff_vs_dense"] == pytest.approx(0.5)
    assert summary["hybrid"]["diff_vs_dense"] == pytest.approx(-0.5)
    runs = tmp_path / "bench_retrieval" / "runs.jsonl"
    assert str(runs) in result["files"]
    records = [json.loads(line) for line in runs.read_text().splitlines()]
    assert [r["qid"] for r in records] == ["q0", "q1", "q2", "q3"]
    assert [r["dense"]["hit"] for r in records] == [True, False, True, False]
    assert records[1]["gold"] == ["squad:T:1"] and len(records[1]["bm25"]["found"]) == 3
    assert "squad:T:1" not in records[1]["dense"]["found"]


# one bench question as `run_one` takes it (its index is never opened: the tests stub it)
PUPPY = {
    "dataset": "squad",
    "id": "q1",
    "question": "What is a puppy?",
    "answers": ["a young dog"],
    "index_dir": "/nowhere",
    "collection": "bench_squad",
}


def test_hf_baselines_do_not_answer_from_irrelevant_chunks(monkeypatch):
    """The graph takes its fallback route when no chunk is relevant; the HF baselines
    answered from the best irrelevant chunk instead (another prompt, other work)."""
    from specrag.graph.context import SpecRagContext
    from specrag.indexing.documents import Chunk

    class Index:
        def search(self, question, k, mode="dense"):
            return [Chunk("c1", "squad:T:1", "unrelated text", score=0.05)]

    def never(*_a, **_k):
        raise AssertionError("generated without evidence")

    monkeypatch.setattr(bench_rag, "open_index", lambda ctx: Index())
    monkeypatch.setattr(bench_rag, "run_hf_lookup", never)
    item = {**PUPPY, "gold": ["squad:P:0"]}
    for system in ("serial_lookup", "serial_hf_assisted"):
        rec = asyncio.run(bench_rag.run_one(item, system, 0.0, None, SpecRagContext()))
        assert rec["route"] == "fallback" and rec["answer"] == bench_rag.prompts.NO_EVIDENCE_ANSWER
        # recall counts the evidence a system kept, as the graph's records do (its fallback
        # keeps no chunk): the HF rows counted every chunk found (a bench review)
        assert rec["retrieved"] == [] and rec["recall_at_k"] == 0.0


def test_run_log_keeps_only_whole_groups(tmp_path):
    from specrag.evaluation.store import RunLog

    log = RunLog(tmp_path / "runs.jsonl")
    for key in ("q1|a", "q1|b", "q2|a"):
        log.add(key, {"e2e_s": 1.0})
    again = RunLog(tmp_path / "runs.jsonl")
    assert again.keep_whole([["q1|a", "q1|b"], ["q2|a", "q2|b"], ["q3|a"]]) == 1
    assert set(again.records) == {"q1|a", "q1|b"}  # q2 runs again, both systems
    again.add("q2|a", {"e2e_s": 2.0})
    again.add("q2|b", {"e2e_s": 2.0})
    last = RunLog(tmp_path / "runs.jsonl")  # the later record of a key wins
    assert last.keep_whole([["q2|a", "q2|b"]]) == 0 and last.records["q2|a"]["e2e_s"] == 2.0


def test_a_damaged_run_log_still_resumes(tmp_path):
    """A line cut mid-character (records are written with ensure_ascii=False) or one that is
    not a record made every later run crash; only --fresh, which drops every record, helped."""
    from specrag.evaluation.store import RunLog

    path = tmp_path / "runs.jsonl"
    log = RunLog(path)
    log.add("q1|a", {"answer": "Rollo, duc de Normandie"})
    log.add("q2|a", {"answer": "Caen église"})
    data = path.read_bytes()
    cut = data.rindex("é".encode()) + 1  # inside the two bytes of "é"
    path.write_bytes(data[:cut] + b'\n[1, 2]\n"text"\n{"no key": 1}\n')
    again = RunLog(path)
    assert set(again.records) == {"q1|a"}  # the cut record runs again


def test_a_set_the_sample_has_no_question_of_is_refused_before_anything_loads(tmp_path):
    """`bench rag --models pair --quick --sets hotpot` (the quick sample has no HotpotQA
    question) skipped the warm-up, wrote an empty summary and exited 0."""
    import pytest

    from specrag.errors import InputError
    from specrag.evaluation import bench_pair
    from specrag.runner import err

    with pytest.raises(InputError, match="the quick sample has no such question"):
        bench_pair.run(quick=True, out_dir=tmp_path, log=err, fresh=True, sets=("hotpot",))


def test_hf_answers_count_their_tokens_up_to_the_stop_sequence_as_the_graph_does():
    """HF stops once the stop text is written: its raw count held the stop sequence's
    tokens, the graph's does not, and per-token ratios compared the two (a bench review)."""
    from specrag.evaluation.bench_rag import tokens_before_stop
    from specrag.models.loading import load_lm

    tok = load_lm().tokenizer
    answer = tok("Rollo led them.", add_special_tokens=False)["input_ids"]
    tail = tok("\nQuestion: who?", add_special_tokens=False)["input_ids"]
    assert tokens_before_stop(tok, answer + tail, ["\nQuestion:"]) == len(answer)
    assert tokens_before_stop(tok, answer, ["\nQuestion:"]) == len(answer)  # no stop
    # a character split over byte tokens counts from its start, as the graph's count does
    cjk = tok("Hi 你好", add_special_tokens=False)["input_ids"]
    assert len(tok.decode(cjk[:-1])) > len("Hi 你")  # ends in a broken character (U+FFFD)
    assert tokens_before_stop(tok, cjk + tail, ["\nQuestion:"]) == len(cjk)


def test_warm_up_tries_the_next_question_when_one_warms_no_model(monkeypatch):
    """A warm-up question whose retrieval finds nothing takes the fallback route and never runs
    HF's generate (or the graph's answer model): the next question is tried, at most 3."""
    runs: list[tuple[str, str]] = []
    no_evidence = {"q0", "q1"}

    async def fake_run_one(item, system, latency, graph, base):
        runs.append((item["id"], system))
        stuck = system == "serial_lookup" or item["id"] in no_evidence and system != "no_rag"
        return {"route": "fallback" if stuck else "generate"}

    monkeypatch.setattr(bench_rag, "run_one", fake_run_one)
    items = [{"id": f"q{i}"} for i in range(5)]
    systems = ["no_rag", "serial_plain", "serial_lookup"]
    asyncio.run(bench_rag.warm_systems(items, systems, None, lambda item: None))
    assert runs == [
        ("q0", "no_rag"),
        *[(q, "serial_plain") for q in ("q0", "q1", "q2")],  # q2 reached generation
        *[(q, "serial_lookup") for q in ("q0", "q1", "q2")],  # never: 3 tries, then on
    ]


def test_a_record_after_a_line_cut_by_a_kill_starts_a_line_of_its_own(tmp_path):
    """A kill mid-write leaves the log without its last newline: the next record was glued to
    the cut line, so it was lost too and its group ran again at the next resume."""
    from specrag.evaluation.store import RunLog

    path = tmp_path / "runs.jsonl"
    RunLog(path).add("q1|a", {"e2e_s": 1.0})
    path.write_bytes(path.read_bytes() + b'{"key": "q2|a", "e2e')  # killed mid-record
    RunLog(path).add("q2|a", {"e2e_s": 2.0})
    assert set(RunLog(path).records) == {"q1|a", "q2|a"}


def test_no_rag_decodes_as_the_draft_node_does(monkeypatch):
    """`no_rag` ("the draft alone") read a bare question and ran without the draft's stop
    sequences, so its row measured another decoder (a review, 2026-12-06)."""
    from langchain_core.messages import AIMessageChunk

    from specrag import prompts
    from specrag.evaluation import bench_rag
    from specrag.graph.context import SpecRagContext

    seen = {}

    class Model:
        def __init__(self, **kwargs):
            seen["kwargs"] = kwargs

        async def astream(self, messages):
            seen["messages"] = messages
            yield AIMessageChunk(content="Rollo.")

    monkeypatch.setattr(bench_rag, "ChatLocalLM", Model)
    item = {"dataset": "squad", "id": "q1", "question": "Who led the Norse?"}
    item |= {"index_dir": "", "collection": "c", "answers": ["Rollo"], "gold": ["s1"]}
    ctx = SpecRagContext()
    asyncio.run(bench_rag.run_one(item, "no_rag", 0.0, None, ctx))
    assert seen["kwargs"]["stop"] == list(ctx.stop_sequences()) and seen["kwargs"]["stop"]
    assert seen["messages"] == prompts.draft_messages(item["question"], ctx.draft_prompt)


def test_a_fresh_run_resumes_nothing_and_keeps_the_log(tmp_path):
    """--fresh deleted runs.jsonl: a plain run's --fresh lost hours of another dtype's records."""
    from specrag.evaluation.store import RunLog

    path = tmp_path / "runs.jsonl"
    RunLog(path).add("q1|cpu:bfloat16", {"e2e_s": 1.0})
    fresh = RunLog(path, fresh=True)
    assert not fresh.done("q1|cpu:bfloat16")  # nothing resumed
    fresh.add("q1|cpu:float32", {"e2e_s": 2.0})
    later = RunLog(path)
    assert later.done("q1|cpu:bfloat16") and later.done("q1|cpu:float32")


def test_result_files_of_a_dtype_and_of_a_quick_run_are_apart_and_whole(tmp_path):
    from specrag.evaluation.store import dtype_variant, out_path, write_results

    assert out_path(tmp_path, "summary.json", False) == tmp_path / "summary.json"
    assert out_path(tmp_path, "table.md", True, "bfloat16") == tmp_path / "table-bfloat16-quick.md"
    assert dtype_variant("auto") == "" and dtype_variant("bf16") == "bfloat16"
    files = write_results(tmp_path, False, {"summary.json": "{}"}, "float16")
    assert files == [str(tmp_path / "summary-float16.json")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary-float16.json"]  # no tmp left


def test_rapid_kt_records_name_their_eta():
    """A Python-API run with another eta resumed rapid_kt's records as its own."""
    a = bench_rapid.case_key("q", 2048, "rapid_kt", "cpu:float32", 5.0)
    assert a != bench_rapid.case_key("q", 2048, "rapid_kt", "cpu:float32", 2.0)
    eta0 = bench_rapid.case_key("q", 2048, "rapid_eta0", "cpu:float32", 2.0)
    assert eta0 == bench_rapid.case_key("q", 2048, "rapid_eta0", "cpu:float32", 5.0)


def test_an_interrupted_retrieval_bench_keeps_the_last_whole_log(monkeypatch, tmp_path):
    """runs.jsonl was opened for writing before the work: a run stopped half-way left half a
    log beside the last whole run's summary."""
    from specrag.evaluation import bench_retrieval

    paragraphs = [Paragraph(f"squad:T:{i}", "T", f"text {i}") for i in range(4)]
    questions = [QAExample(f"q{i}", f"question {i}", ("a",), (f"squad:T:{i}",)) for i in range(4)]
    stop_at = [None]

    class Index:
        def refresh_lexical(self):
            pass

        def search(self, text, k, mode):
            if text == stop_at[0]:
                raise KeyboardInterrupt
            return [types.SimpleNamespace(source="squad:T:0")]

    monkeypatch.setattr(bench_retrieval, "squad_paragraphs", lambda: paragraphs)
    monkeypatch.setattr(bench_retrieval, "squad_questions", lambda: questions)
    monkeypatch.setattr(bench_retrieval, "_index", lambda *a: tmp_path / "index")
    monkeypatch.setattr(bench_retrieval, "open_for_writing", lambda *a: Index())
    bench_retrieval.run(quick=False, out_dir=tmp_path, log=_quiet())
    runs = tmp_path / "bench_retrieval" / "runs.jsonl"
    whole = runs.read_text()
    stop_at[0] = "question 2"
    with pytest.raises(KeyboardInterrupt):
        bench_retrieval.run(quick=False, out_dir=tmp_path, log=_quiet())
    assert runs.read_text() == whole and len(whole.splitlines()) == 4
    assert not list(runs.parent.glob(".*.part"))  # the cut run's part is gone


def test_bench_load_warms_up_on_a_question_that_reaches_an_answer_model(monkeypatch):
    """Its warm-up ran the first question only: one that fell back warmed no model."""
    from specrag.evaluation import bench_load

    warmed: list[list[str]] = []

    async def run_level(graph, questions, ctx, concurrency):
        warmed.append(list(questions))
        outs = [
            {"question": q, "answer": "a", "sources": [], "latency_s": 0.1}
            | {"route": "fallback" if q == "q0" else "generate"}
            for q in questions
        ]
        return {"outputs": outs, "wall_s": 0.1}

    monkeypatch.setattr(bench_load, "load_lm", lambda *a: None)
    monkeypatch.setattr(bench_load, "build_graph", lambda: None)
    monkeypatch.setattr(bench_load, "run_level", run_level)
    from specrag.graph.context import SpecRagContext

    bench_load.measure(["q0", "q1", "q2"], SpecRagContext(), [1])
    assert warmed[:2] == [["q0"], ["q1"]] and warmed[2] == ["q0", "q1", "q2"]


def test_bench_load_says_the_answer_length_its_quick_run_changes(monkeypatch, tmp_path):
    """A review (2026-12-07): `bench load --quick` halves the answers' length (the sample is
    the same) and no output said so: a full run's latencies were compared with a table at
    half the length."""

    from specrag.evaluation import bench_load

    def measure(questions, ctx, levels):
        level = {"concurrency": 1, "throughput_qps": 1.0, "p50_s": 1.0, "p90_s": 1.0}
        level |= {"wall_s": 1.0, "runs": 1}
        return {"levels": [level], "cross_talk": 0, "peak_rss_mb": 1.0, "rss_growth_mb": 0.0}

    monkeypatch.setattr(bench_load, "load_questions", lambda n: (["q"], tmp_path))
    monkeypatch.setattr(bench_load, "measure", measure)
    log = Console(file=io.StringIO())
    for quick, tokens in ((True, 32), (False, 64)):
        summary = bench_load.run(quick=quick, out_dir=tmp_path, log=log)
        assert summary["answer_max_tokens"] == tokens
        written = {Path(f).name.split("-")[0].split(".")[0]: Path(f) for f in summary["files"]}
        assert json.loads(written["summary"].read_text())["answer_max_tokens"] == tokens
        table = written["table"].read_text()
        assert f"at most {tokens} new tokens" in table


def test_bench_followup_tells_a_model_rewrite_that_fell_back_to_concat():
    """A late or failed model rewrite searches concat's query: it is counted apart, by the
    same query the retrieve node falls back to."""
    from specrag.evaluation import bench_followup
    from specrag.graph.context import SpecRagContext
    from specrag.graph.services import Services
    from specrag.nodes.retrieve import followup_query

    case = {"followup": "When did he die?", "history": [{"role": "user", "content": "Who?"}]}
    case["history"].append({"role": "assistant", "content": "Rollo."})
    ctx = SpecRagContext(query_rewrite="concat")
    concat = asyncio.run(followup_query(case["followup"], case["history"], ctx, Services()))
    assert bench_followup.concat_query(case) == concat == "Who? When did he die?"


def test_a_fresh_run_cut_short_then_resumed_runs_its_mixed_questions_again(tmp_path):
    """--fresh keeps the log: a fresh run cut after some of a question's systems, then
    resumed, paired them with the earlier run's other systems (two sessions in one ratio)."""
    from specrag.evaluation.store import RunLog

    path = tmp_path / "runs.jsonl"
    first = RunLog(path)
    first.add("q|a", {"s": 1.0})
    first.add("q|b", {"s": 1.0})
    RunLog(path, fresh=True).add("q|a", {"s": 2.0})  # cut before q|b
    resumed = RunLog(path)
    assert resumed.keep_whole([["q|a", "q|b"]]) == 2
    assert not resumed.done("q|a") and not resumed.done("q|b")


def test_pair_ratios_are_of_totals_over_the_same_questions():
    """The pair bench's end-to-end ratio was a ratio of medians: 0.550x on a long set whose
    total was 0.654x with six of its ten answers above 0.6x (a review, 2026-12-06), so the
    goal's verdict hung on which question happened to be the median. Totals count every
    question by its time; the interval resamples questions, paired."""
    from specrag.evaluation import bench_pair

    def rec(system, qid, e2e, draft_ttft=None, answer="same"):
        return {
            "dataset": "long",
            "qid": qid,
            "system": system,
            "answer": answer,
            "contains": 1.0,
            "f1": 1.0,
            "em": 1.0,
            "new_tokens": 10,
            "e2e_s": e2e,
            "ttft_s": e2e / 4,
            "decode_s": e2e / 2,
            **({"draft_ttft_s": draft_ttft} if draft_ttft else {}),
        }

    spec = {"q1": 1.0, "q2": 10.0, "q3": 10.0}
    serial = {"q1": 2.0, "q2": 5.0, "q3": 20.0}  # medians: 10 / 5 = 2.0x; totals: 21 / 27
    records = [rec("serial_plain", q, t) for q, t in serial.items()]
    records += [
        rec("spec_verify", q, t, draft_ttft=0.1, answer="other" if q == "q3" else "same")
        for q, t in spec.items()
    ]
    # the HF baselines: totals 14 and 7 (each ratio is spec_verify's over the baseline's)
    records += [rec("serial_lookup", q, t) for q, t in {"q1": 4.0, "q2": 4.0, "q3": 6.0}.items()]
    records += [
        rec("serial_hf_assisted", q, t) for q, t in {"q1": 3.0, "q2": 3.0, "q3": 1.0}.items()
    ]
    rows = bench_pair.summarize(records)["long"]
    row = rows["spec_verify"]
    assert row["e2e_vs_serial_plain"] == pytest.approx(21 / 27)
    lo, hi = row["e2e_vs_serial_plain_ci95"]
    assert lo <= 21 / 27 <= hi
    assert row["draft_ttft_vs_serial_ttft"] == pytest.approx(0.3 / (27 / 4))
    # a mutation review (2026-12-08): these divided either way, and "same answer" inverted
    # (0% for 100%), passing every test
    assert row["e2e_vs_serial_lookup"] == pytest.approx(21 / 14)
    assert row["e2e_vs_serial_hf_assisted"] == pytest.approx(21 / 7)
    assert row["same_answer_as_serial"] == pytest.approx(2 / 3)
    assert rows["serial_lookup"]["same_answer_as_serial"] == 1.0


def test_a_fresh_run_cut_short_and_resumed_takes_nothing_from_before_it(tmp_path):
    """A `--fresh` run interrupted and then resumed (without --fresh) took the questions it
    had not reached from the records before it - another session, perhaps other code - and
    summed them with its own (a review of the benchmarks, 2026-12-06)."""
    from specrag.evaluation.store import RunLog

    path = tmp_path / "runs.jsonl"
    old = RunLog(path)
    for key in ("q1|a", "q1|b", "q2|a", "q2|b", "other-dtype|a"):
        old.add(key, {"e2e_s": 1.0})
    fresh = RunLog(path, fresh=True)
    assert fresh.keep_whole([["q1|a", "q1|b"], ["q2|a", "q2|b"]]) == 0
    fresh.add("q1|a", {"e2e_s": 2.0})
    fresh.add("q1|b", {"e2e_s": 2.0})  # cut here: q2 never ran in the fresh session
    resumed = RunLog(path)
    resumed.keep_whole([["q1|a", "q1|b"], ["q2|a", "q2|b"]])
    assert not resumed.done("q2|a") and not resumed.done("q2|b")  # runs again
    assert resumed.records["q1|a"]["session"] == fresh.session
    assert resumed.done("other-dtype|a")  # another run's records stay resumable


def test_the_pair_bench_never_cuts_an_answer_the_hf_baselines_would_finish():
    """The terse sets ran under the graph's default 60 s answer and 3 s retrieval budgets
    while the HF baselines have none: a cut answer would have made a graph system look faster
    (a review of the benchmarks, 2026-12-06). Every set now gets budgets no answer reaches,
    and a summary row counts the answers a budget cut."""
    from specrag import prompts
    from specrag.evaluation import bench_pair
    from specrag.graph.context import SpecRagContext

    for dataset in ("squad", "hotpot", "long"):
        ctx = bench_pair.context_for(SpecRagContext(), dataset)
        assert ctx.answer_timeout_s == ctx.retrieval_timeout_s == bench_pair.BUDGET_S
        # the long set asks for detail, of every system alike (a mutation review, 2026-12-08:
        # the long set without its prompts passed every test)
        detailed = (prompts.ANSWER_DETAILED_SYSTEM, prompts.DRAFT_DETAILED_SYSTEM)
        assert ((ctx.answer_prompt, ctx.draft_prompt) == detailed) == (dataset == "long")
    rec = {
        "dataset": "squad",
        "qid": "q",
        "answer": "a",
        "contains": 1.0,
        "f1": 1.0,
        "em": 1.0,
        "new_tokens": 3,
        "e2e_s": 1.0,
        "ttft_s": 0.5,
        "decode_s": 0.2,
    }
    records = [
        {**rec, "system": "serial_plain", "finish_reason": "stop"},
        {**rec, "system": "spec_verify", "finish_reason": "time"},
    ]
    rows = bench_pair.summarize(records)["squad"]
    assert rows["spec_verify"]["cut_by_budget"] == 1 and rows["serial_plain"]["cut_by_budget"] == 0


def test_a_run_of_some_sets_writes_its_summary_apart():
    """`bench rag --models pair --sets long` replaced the whole run's summary.json and table.md
    with its one set's (a review of the benchmarks, 2026-12-06)."""
    from pathlib import Path

    from specrag.evaluation.bench_pair import results_variant
    from specrag.evaluation.store import out_path

    assert results_variant("auto", None) == ""
    assert results_variant("auto", ("long",)) == "long"
    assert results_variant("bf16", ("squad", "hotpot")) == "bfloat16-hotpot+squad"
    assert out_path(Path("o"), "summary.json", False, "long") == Path("o/summary-long.json")


def test_hf_records_say_how_many_tokens_their_first_pass_gave(monkeypatch):
    """HF's first pass can carry several tokens (its candidates ride on the prompt's pass),
    timed before its decode time as the graph's opening is: the per-token decode ratios left
    out only one of them for HF while the graph's records left out all (a review)."""
    from specrag.graph.context import SpecRagContext
    from specrag.indexing.documents import Chunk

    class Index:
        def search(self, question, k, mode="dense"):
            return [Chunk("c1", "squad:T:1", "a puppy is a young dog", score=0.9)]

    def lookup(question, chunks, ctx, assisted):
        return {
            "answer": "a young dog",
            "passes_per_token": 0.5,
            "new_tokens": 10,
            "first_step_at": None,
            "decode_all_s": 1.0,
            "first_step_tokens": 4,
            "assistant_forward_passes": 0,
        }

    monkeypatch.setattr(bench_rag, "open_index", lambda ctx: Index())
    monkeypatch.setattr(bench_rag, "run_hf_lookup", lookup)
    item = {**PUPPY, "gold": ["squad:T:1"]}
    rec = asyncio.run(bench_rag.run_one(item, "serial_lookup", 0.0, None, SpecRagContext()))
    assert rec["first_step_tokens"] == 4
    assert bench_rag._per_token([rec], "decode_s", first=True) == {"squad|q1": (1.0, 6)}


def _rag_record(system: str, qid: str, e2e: float, **fields) -> dict:
    """A bench rag record of a SQuAD question at 0 s added latency: ``e2e`` seconds (a
    quarter of it to the first token, half decoding), 10 tokens, every metric 1.0;
    ``fields`` replace any of it."""
    return {
        "dataset": "squad",
        "qid": qid,
        "system": system,
        "latency": 0.0,
        "answer": "same",
        "contains": 1.0,
        "f1": 1.0,
        "em": 1.0,
        "recall_at_k": 1.0,
        "new_tokens": 10,
        "e2e_s": e2e,
        "ttft_s": e2e / 4,
        "decode_s": e2e / 2,
        "passes_per_token": 1.0,
        "route": "refine",
        **fields,
    }


def test_bench_figures_count_what_their_names_say():
    """Figures a mutation review (2026-12-08) found unchecked: RAPID's decode tokens/s counts
    the tokens after the first (``decode_s`` starts after it), the retracted share is of all
    streamed characters, the interval beside the e2e median is the median's (the mean's
    missed it on a skewed sample), and decode per token leaves out the prefill pass's tokens
    (``first_step_tokens``)."""
    assert bench_rapid.rapid_tokens_per_s(11, 1.0) == pytest.approx(10.0)
    assert bench_rapid.rapid_tokens_per_s(1, 1.0) is None
    assert bench_rag.revised_fraction([(10, 30)]) == pytest.approx(0.25)
    assert bench_rag.revised_fraction([(0, 0)]) is None

    def rec(system, qid, e2e, first_step_tokens=1):  # 1 s per token after the prefill pass's
        fields = {"first_step_tokens": first_step_tokens, "decode_s": 10 - first_step_tokens}
        return _rag_record(system, qid, e2e, ttft_s=0.1, **fields)

    skewed = [1.0] * 10 + [100.0] * 5  # median 1; no resample of 15 without a 100 is likely
    records = [rec("serial_plain", f"q{i}", e2e) for i, e2e in enumerate(skewed)]
    records += [rec("spec_verify", f"q{i}", 1.0, first_step_tokens=4) for i in range(15)]
    summary = bench_rag.summarize(records)
    plain = summary["serial_plain"]["0.0"]
    lo, hi = plain["e2e_s_median_ci95"]
    assert plain["e2e_s_median"] == 1.0 and lo <= 1.0 <= hi
    assert summary["spec_verify"]["0.0"]["decode_per_token_vs_serial_plain"] == pytest.approx(1.0)


def test_embedded_bench_ratios_are_of_totals_too():
    """As the pair bench's (a review, 2026-12-06): the embedded bench's e2e and TTFT ratios
    were ratios of medians, one system's median question against another question of serial
    RAG's; they are ratios of totals over the questions both ran."""
    from specrag.evaluation import bench_rag

    def rec(system, qid, e2e, answer="same"):
        return _rag_record(system, qid, e2e, answer=answer)

    spec = {"q1": 1.0, "q2": 10.0, "q3": 10.0}
    serial = {"q1": 2.0, "q2": 5.0, "q3": 20.0}  # medians: 2.0x; totals: 21 / 27
    records = [rec("serial_plain", q, t) for q, t in serial.items()]
    records += [rec("spec_verify", q, t, "other" if q == "q3" else "same") for q, t in spec.items()]
    records += [rec("serial_brief", q, t) for q, t in spec.items()]
    records += [rec("serial_lookup", q, t) for q, t in {"q1": 4.0, "q2": 4.0, "q3": 6.0}.items()]
    row = bench_rag.summarize(records)["spec_verify"]["0.0"]
    assert row["e2e_vs_serial_plain"] == pytest.approx(21 / 27)
    assert row["ttft_vs_serial"] == pytest.approx(21 / 27)
    # a mutation review (2026-12-08): the lookup ratio divided either way and "identical to
    # serial RAG" inverted, passing every test
    assert row["e2e_vs_serial_lookup"] == pytest.approx(21 / 14)
    assert row["identical_to_serial_plain"] == row["same_answer_as_serial"] == pytest.approx(2 / 3)
    assert bench_rag.compare_settings(records)["serial_brief"]["e2e_s_ratio"] == pytest.approx(
        21 / 27
    )


def test_a_plot_cut_while_saving_keeps_the_last_whole_one(tmp_path):
    """bench rag's plots were written straight to their final names: a kill or a full disk
    mid-write left a cut PNG over the last good one (a review, 2026-12-07)."""
    from specrag.evaluation.bench_rag import save_figure

    class Breaks:
        def savefig(self, path, **kwargs):
            Path(path).write_bytes(b"\x89PNG half")
            raise OSError("No space left on device")

    plot = tmp_path / "speedup.png"
    plot.write_bytes(b"the last whole plot")
    with pytest.raises(OSError, match="No space"):
        save_figure(Breaks(), plot)
    assert plot.read_bytes() == b"the last whole plot"
    assert [p.name for p in tmp_path.iterdir()] == ["speedup.png"]


def test_bench_rag_gives_the_search_a_budget_no_injected_delay_reaches():
    """The 3 s default held a 2 s injected delay with the draft decoding beside it (HF's
    serial_lookup has no budget), and a cut run was not recorded (a review, 2026-12-07)."""
    from specrag.evaluation import bench_rag

    assert bench_rag.RETRIEVAL_BUDGET_S >= 10 * max(bench_rag.LATENCIES)
    assert bench_rag.budget_cut(
        {"errors": ["retrieve: later batches missed the 3.0s retrieval budget; answering"]}
    )
    assert bench_rag.budget_cut({"errors": ["retrieve: no result within 3.0s"]})
    assert bench_rag.budget_cut({"reason": "draft ok; the answer budget cut the answer"})
    assert not bench_rag.budget_cut({"errors": [], "reason": "draft timeout -> generate"})


def test_rapid_acceptance_pools_the_answers_tokens():
    """A mean of per-answer rates read an answer that proposed nothing as 0% accepted (a
    review, 2026-12-07): 8 of 10 proposed tokens accepted is 0.8, not 0.4."""
    from specrag.evaluation.bench_rapid import pooled_acceptance

    rs = [
        {"acceptance_rate": 0.8, "draft_tokens": 10, "accepted_tokens": 8},
        {"acceptance_rate": 0.0, "draft_tokens": 0, "accepted_tokens": 0},
    ]
    assert pooled_acceptance(rs) == 0.8
    assert pooled_acceptance(rs[1:]) is None
    assert pooled_acceptance([{"acceptance_rate": 0.5}, {"acceptance_rate": 0.7}]) == 0.6


def test_bench_rag_without_matplotlib_warns_and_draws_no_plots(tmp_path, monkeypatch, caplog):
    """matplotlib is in the dev extra only: a plain install's `bench rag` raised at its very
    end, before writing summary.json and table.md (a resumed run failed there again)."""
    import sys

    from specrag.evaluation.bench_rag import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with caplog.at_level("WARNING"):
        assert plots({}, tmp_path) == []
    assert "matplotlib is not installed" in caplog.text and not list(tmp_path.iterdir())


def test_the_bench_index_holds_the_runs_own_paragraphs_only(tmp_path, monkeypatch):
    """A review (2026-12-07): the HotpotQA bench index kept every earlier run's paragraphs
    (414 for a quick run, 594 after a full one): a run's distractors hung on run history."""
    from specrag.indexing.store import stored_sources

    monkeypatch.setattr(bench_rag, "cache_dir", lambda: tmp_path)
    log = Console(file=io.StringIO())
    big = [(f"hotpot:T{i}", f"Paragraph {i} about walruses and clams.") for i in range(4)]
    directory = bench_rag._index("bench_hotpot", big, log)
    directory = bench_rag._index("bench_hotpot", big[:2], log)
    assert stored_sources(directory, "bench_hotpot", "") == {"hotpot:T0", "hotpot:T1"}


def test_hf_passes_per_token_count_the_stop_texts_tokens_as_the_graphs_do(monkeypatch):
    """A review (2026-12-07): an HF answer's passes per token divided the passes over every
    decoded token by the tokens before its stop sequence (1.10 for plain decoding that ended
    at a stop; the graph's DecodeStats: 1.0)."""
    from specrag.graph.context import SpecRagContext
    from specrag.models.loading import load_lm

    ctx = SpecRagContext()
    tok = load_lm(ctx.answer_spec, ctx.device, ctx.dtype).tokenizer
    answer = tok("Rollo led the Norse settlers.", add_special_tokens=False)["input_ids"]
    ids = answer + tok("\n<evidence", add_special_tokens=False)["input_ids"]

    def plain(loaded, prompt, **kwargs):  # one pass per decoded token, stop text included
        text = tok.decode(ids)
        return {"answer": text, "new_tokens": len(ids), "forward_passes": len(ids),
                "output_ids": list(ids)}  # fmt: skip

    monkeypatch.setattr(bench_rag, "hf_generate", plain)
    chunk = {"id": "c1", "source": "squad:T:1", "text": "Rollo led the Norse.", "score": 0.9}
    res = bench_rag.run_hf_lookup("Who led the Norse?", [chunk], ctx)
    assert len(answer) <= res["new_tokens"] < len(ids)  # cut at the stop sequence
    assert res["passes_per_token"] == 1.0


def test_no_rag_samples_the_draft_the_graph_samples(monkeypatch):
    """A review (2026-12-07): `no_rag` ("the draft node's decoding") sampled with the run's
    seed, the draft node with its own seed drawn from it since 2026-12-06 (``draft_seed``):
    per question, two unrelated samples."""
    from specrag.graph.context import SpecRagContext
    from specrag.nodes.draft import draft_seed

    made = []

    class Seen(Exception):
        pass

    def chat(**kwargs):
        made.append(kwargs)
        raise Seen

    monkeypatch.setattr(bench_rag, "ChatLocalLM", chat)
    ctx = SpecRagContext(seed=bench_rag.SEED)
    with pytest.raises(Seen):
        asyncio.run(bench_rag.run_one(PUPPY, "no_rag", 0.0, None, ctx))
    assert made[0]["seed"] == draft_seed(bench_rag.SEED) != bench_rag.SEED


def test_where_a_bench_wrote_is_told_as_written():
    """A review (2026-12-07): the line went through rich markup: a folder `o[old]` was told as
    `o/...`, one holding `[/x]` raised after the files were written, and a long list wrapped
    at 80 columns."""
    import io

    from rich.console import Console

    from specrag.evaluation.store import say_written

    log = Console(file=io.StringIO(), width=40)
    files = ["o[old]/bench_retrieval/summary-quick.json", "a[/x]b/" + "long" * 20]
    say_written(log, files)
    assert log.file.getvalue() == f"results written to: {files[0]}, {files[1]}\n"
