"""The GPU identity check's harness (:mod:`specrag.evaluation.identity`) on tiny models, CPU.

In float32 every method must give the plain decode's tokens - themselves checked against an
independent argmax loop - while really speculating (proposals made, some rejected, the
drafters' partly accepted); and when a method's tokens DO differ, the harness must say so,
with the first differing position and the reference's logits there, recomputed here.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from specrag.decoding.speculative import Token
from specrag.evaluation import identity
from tests.unit.test_drafter import tiny_pair


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    target, drafter = tiny_pair()
    target.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(0, 64, (n,), generator=g).tolist()  # noqa: E731
    cases = [{"id": f"q{i}", "kind": "squad", "prompt": ids(40), "max_new": 40} for i in range(2)]
    haystack = {"id": "h", "prefix": ids(300), "tail": ids(8), "drafter_prompt": ids(50)}
    haystack["drafter_vocab"] = 16  # ChatRapid's trimmed drafter (its 32768 rows of 64 here)
    return {
        "target": str(root / "target"),
        "drafter": str(root / "drafter"),
        "eos_ids": [],
        "cases": cases,
        "haystacks": [{**haystack, "max_new": 30}],
    }


def full_logits(model, ids):
    """Next-token logits after ``ids``, one forward pass over all of them (no cache)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].float()


def argmax_loop(model, prompt, n):
    out = []
    for _ in range(n):
        out.append(int(full_logits(model, prompt + out).argmax()))
    return out


def test_float32_identity_holds_and_the_check_speculates(spec, monkeypatch):
    # every decode's timing as plain's twice over: each method's time per token vs plain is
    # 0.5 (a mutation review, 2026-12-08: the ratio inverted, the warm-up dropped and the
    # first step's tokens counted in the decode's all passed); the calls in order
    calls: list[str] = []
    real_case, real_rapid = identity._decode_case, identity._rapid_case

    def timed(info, plain):
        tokens = info["timed"][1]
        return {**info, "timed": (2.0 * tokens if plain else 1.0 * tokens, tokens)}

    def decode_case(method, *args):
        calls.append(method)
        toks, info = real_case(method, *args)
        return toks, timed(info, method == "plain")

    def rapid_case(*args):
        calls.append("rapid" if args[-1] else "target")
        toks, info = real_rapid(*args)
        return toks, timed(info, not args[-1])

    monkeypatch.setattr(identity, "_decode_case", decode_case)
    monkeypatch.setattr(identity, "_rapid_case", rapid_case)
    result = identity.run(spec, "cpu", ["float32"])
    warm = [*identity.METHODS, "target", "rapid"]  # one untimed run of each, first
    assert calls == warm + [*identity.METHODS] * len(spec["cases"]) + ["target", "rapid"]
    rows = result["dtypes"]["float32"]
    for method, n in (("ngram", 2), ("merged", 2), ("gpu_plan", 2), ("rapid_eta0", 1)):
        row = rows[method]
        proposed, accepted = sum(row["proposed"].values()), sum(row["accepted"].values())
        assert row["identical"] == f"{n}/{n}", (method, row)
        assert row["rejected"] == proposed - accepted > 0, (method, row)
        # random prompts hold no n-gram the tiny model continues; the models' proposals land
        assert method == "ngram" or accepted > 0, (method, row)
        assert row["time_per_token_vs_plain"] == pytest.approx(0.5), row
        # each target pass but the prefill's gives its accepted tokens and one of its own
        new = sum(map(len, result["tokens"]["float32"][method].values()))
        if method != "rapid_eta0":
            assert row["target_passes_per_token"] == pytest.approx((new - accepted) / new), row
    assert rows["merged"]["proposed"].get("drafter", 0) > 0, rows["merged"]
    assert rows["gpu_plan"]["proposed"].get("drafter", 0) > 0, rows["gpu_plan"]
    assert rows["divergences"] == []
    # the reference is the target's own greedy decode
    target = AutoModelForCausalLM.from_pretrained(spec["target"]).eval()
    plain = result["tokens"]["float32"]["plain"]
    case, hay = spec["cases"][0], spec["haystacks"][0]
    assert plain["squad:q0"] == argmax_loop(target, case["prompt"], case["max_new"])
    assert plain["haystack:h"] == argmax_loop(target, hay["prefix"] + hay["tail"], hay["max_new"])
    assert "| float32 | merged | 2/2 |" in identity.markdown(result)


def test_decode_time_counts_the_tokens_after_the_first_step():
    """The timed span starts once the first step is out: its tokens are not in the count."""
    tok = Token(1, 0.0, "target")
    run = identity._collect(iter([[tok, tok], [tok], [tok, tok, tok]]), torch.device("cpu"))
    assert len(run.tokens) == 6 and run.decode_tokens == 4 and run.decode_s >= 0.0


def corrupting(real, at, when):
    """``real`` decoder whose output token ``at`` is changed when ``when(kwargs)`` holds."""

    def wrapped(*args, **kwargs):
        n = 0
        for step in real(*args, **kwargs):
            out = []
            for token in step:
                if n == at and when(kwargs):
                    token = identity.Token((token.id + 1) % 64, token.logprob, token.source)
                out.append(token)
                n += 1
            yield out

    return wrapped


def test_the_rapid_row_runs_chat_rapids_drafting_rule(spec, monkeypatch):
    """ChatRapid's drafter scores its first ``drafter_vocab`` ids (+ its prompt's) at eta 0;
    the check ran it over every row, so its ``rapid_eta0`` row was not the product's RAPID."""
    seen = []
    real = identity.rapid_decode

    def spy(*args, **kwargs):
        seen.append(kwargs["cfg"])
        return real(*args, **kwargs)

    monkeypatch.setattr(identity, "rapid_decode", spy)
    target, drafter = (AutoModelForCausalLM.from_pretrained(spec[k]) for k in ("target", "drafter"))
    hay = {**spec["haystacks"][0], "max_new": 4}
    with torch.inference_mode():
        identity._rapid_case(target, drafter, hay, (), rapid=True)
    assert [c.drafter_vocab for c in seen] == [16] and seen[0].lossless


def test_a_method_that_changes_a_token_is_reported(spec, monkeypatch):
    with_proposer = lambda kw: kw.get("proposer") is not None  # noqa: E731
    monkeypatch.setattr(identity, "decode", corrupting(identity.decode, 5, with_proposer))
    monkeypatch.setattr(identity, "rapid_decode", corrupting(identity.rapid_decode, 7, bool))
    result = identity.run(spec, "cpu", ["float32"])
    rows = result["dtypes"]["float32"]
    assert all(rows[m]["identical"] == "0/2" for m in ("ngram", "merged", "gpu_plan"))
    assert rows["rapid_eta0"]["identical"] == "0/1"
    found = {(d["method"], d["case"], d["position"]) for d in rows["divergences"]}
    cases = {"squad:q0", "squad:q1"}
    assert found == {(m, c, 5) for m in ("ngram", "merged", "gpu_plan") for c in cases} | {
        ("rapid_eta0", "haystack:h", 7)
    }
    target = AutoModelForCausalLM.from_pretrained(spec["target"]).eval()
    prompts = {f"squad:{c['id']}": c["prompt"] for c in spec["cases"]}
    prompts["haystack:h"] = spec["haystacks"][0]["prefix"] + spec["haystacks"][0]["tail"]
    for d in rows["divergences"]:
        ref = result["tokens"]["float32"]["plain"][d["case"]]
        logits = full_logits(target, prompts[d["case"]] + ref[: d["position"]])
        top = torch.topk(logits, 2).values
        assert d["replay_reproduced_plain"], d
        assert d["plain"][0] == ref[d["position"]] == int(logits.argmax()), d
        assert d["method_token"][0] == (ref[d["position"]] + 1) % 64, d
        assert d["plain_top2_logit_gap"] == pytest.approx(float(top[0] - top[1]), abs=1e-3)
        gap = float(logits[d["plain"][0]] - logits[d["method_token"][0]])
        assert d["plain_vs_method_token_logit_gap"] == pytest.approx(gap, abs=1e-3)


def test_an_output_cut_short_is_reported_as_a_prefix(spec, monkeypatch):
    real = identity.decode

    def cut(*args, **kwargs):
        n = 0
        for step in real(*args, **kwargs):
            if kwargs.get("proposer") is not None and n + len(step) > 10:
                yield step[: 10 - n]
                return
            n += len(step)
            yield step

    monkeypatch.setattr(identity, "decode", cut)
    result = identity.run({**spec, "haystacks": []}, "cpu", ["float32"])
    rows = result["dtypes"]["float32"]
    assert rows["ngram"]["identical"] == "0/2"
    assert {(d["position"], tuple(d["lengths"])) for d in rows["divergences"]} == {(10, (40, 10))}
    assert "prefix of the other" in identity.markdown(result)


def test_the_gpu_script_refuses_a_bad_prompts_file_in_one_line(tmp_path, capsys):
    """A cut or foreign prompts file gave a JSONDecodeError / KeyError traceback and no JSON."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_identity.py"
    spec = importlib.util.spec_from_file_location("gpu_identity_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cut, foreign = tmp_path / "cut.json", tmp_path / "foreign.json"
    cut.write_text('{"target": ')
    foreign.write_text("{}")
    for bad in (cut, foreign):
        argv = ["run", "--prompts", str(bad), "--device", "cpu", "--json"]
        assert script.cli(argv) == 2
        out, err = capsys.readouterr()
        assert json.loads(out)["error"].startswith(f"--prompts {bad}")
        assert err.startswith("gpu_identity: error: --prompts") and err.count("\n") == 1


# what a bare GPU machine lacks: the package's dependencies beyond torch, transformers and gguf
# (and theirs: typer brings rich, the hub brings requests)
NOT_ON_A_BARE_MACHINE = [
    "platformdirs", "langgraph", "langchain", "langchain_core", "langchain_community",
    "langchain_huggingface", "langchain_chroma", "chromadb", "langsmith", "accelerate",
    "sentence_transformers", "psutil", "pypdf", "bm25s", "pydantic",
]  # fmt: skip


def test_the_gpu_script_runs_where_only_torch_transformers_and_gguf_are(spec, tmp_path):
    """README's second way: ``run --prompts`` on a machine with torch, transformers and gguf
    only. The GGUF helpers came to import ``specrag.paths``, which imported platformdirs at
    the top: a ModuleNotFoundError traceback and nothing on stdout under ``--json``."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({**spec, "haystacks": [], "cases": spec["cases"][:1]}))
    blocked = "".join(f"sys.modules[{m!r}] = None\n" for m in NOT_ON_A_BARE_MACHINE)
    code = (
        "import runpy, sys\n"
        f"{blocked}"
        f"sys.argv = ['gpu_identity', 'run', '--prompts', {str(prompts)!r}, '--device', 'cpu',"
        f" '--dtypes', 'float32', '--out', {str(tmp_path / 'out')!r}, '--json']\n"
        f"runpy.run_path({str(root / 'benchmarks' / 'gpu_identity.py')!r}, run_name='__main__')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPECRAG_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["dtypes"]["float32"], done.stdout[:500]
