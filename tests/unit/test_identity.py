"""The GPU identity check's harness (:mod:`specrag.evaluation.identity`) on tiny models, CPU.

In float32 every method must give the plain decode's tokens while really speculating
(proposals made, some rejected, the drafters' partly accepted); and when a method's tokens DO
differ, the harness must say so, with the first differing position and the plain decode's
top-2 logit gap there.
"""

import torch

from specrag.evaluation import identity
from tests.unit.test_drafter import tiny_pair


def _spec(tmp_path, n_cases=3):
    target, drafter = tiny_pair()
    target.save_pretrained(tmp_path / "target")
    drafter.save_pretrained(tmp_path / "drafter")
    g = torch.Generator().manual_seed(3)
    ids = lambda n: torch.randint(0, 64, (n,), generator=g).tolist()  # noqa: E731
    cases = [
        {"id": f"q{i}", "kind": "squad", "prompt": ids(40), "max_new": 40} for i in range(n_cases)
    ]
    haystack = {"id": "h", "prefix": ids(300), "tail": ids(8), "drafter_prompt": ids(50)}
    return {
        "target": str(tmp_path / "target"),
        "drafter": str(tmp_path / "drafter"),
        "eos_ids": [],
        "cases": cases,
        "haystacks": [{**haystack, "max_new": 30}],
    }


def test_float32_identity_holds_and_the_check_speculates(tmp_path):
    result = identity.run(_spec(tmp_path), "cpu", ["float32"])
    rows = result["dtypes"]["float32"]
    for method, n in (("ngram", 3), ("merged", 3), ("rapid_eta0", 1)):
        row = rows[method]
        proposed, accepted = sum(row["proposed"].values()), sum(row["accepted"].values())
        assert row["identical"] == f"{n}/{n}", (method, row)
        assert row["rejected"] == proposed - accepted > 0, (method, row)
        # random prompts hold no n-gram the tiny model continues; the models' proposals land
        assert method == "ngram" or accepted > 0, (method, row)
    assert rows["merged"]["proposed"].get("drafter", 0) > 0, rows["merged"]
    assert rows["divergences"] == []
    assert "| float32 | merged | 3/3 |" in identity.markdown(result)


def test_a_method_that_changes_a_token_is_reported(tmp_path, monkeypatch):
    real = identity.decode

    def corrupt_fifth_token(*args, **kwargs):
        n = 0
        for step in real(*args, **kwargs):
            out = []
            for token in step:
                if n == 5 and kwargs.get("proposer") is not None:
                    token = identity.Token((token.id + 1) % 64, token.logprob, token.source)
                out.append(token)
                n += 1
            yield out

    monkeypatch.setattr(identity, "decode", corrupt_fifth_token)
    result = identity.run(_spec(tmp_path, n_cases=2), "cpu", ["float32"])
    rows = result["dtypes"]["float32"]
    assert rows["ngram"]["identical"] == "0/2" and rows["merged"]["identical"] == "0/2"
    assert rows["rapid_eta0"]["identical"] == "1/1"  # RAPID does not go through decode()
    found = {(d["method"], d["position"]) for d in rows["divergences"]}
    assert found == {("ngram", 5), ("merged", 5)}
    assert all(d["plain_top2_logit_gap"] >= 0 for d in rows["divergences"])
