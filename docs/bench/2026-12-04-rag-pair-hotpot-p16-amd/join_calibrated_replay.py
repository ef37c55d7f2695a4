"""Would a join rule that learns the drafter's prefill ratio pay? An estimate from run logs.

    python docs/bench/2026-12-04-rag-pair-hotpot-p16-amd/join_calibrated_replay.py

Today's rule (`MergedProposer._may_draft`): the drafter joins once the answer has decoded for
2x its estimated prefill, the estimate being the target's prefill time of this prompt x the
prefill ratio measured at load on a 64-token block. The replayed rule multiplies that estimate
by the mean of (real drafter prefill / estimate) over the joins before it in the same run
(1.0 before the first), as a process could learn it. Each spec_verify record of the three
2026-12-04 afternoon runs is replayed in its run's order:
- the new wait is the old one x that factor;
- if the answer, without the drafter (its prefill and its rounds' net gain over plain steps
  taken out), ends before the new wait, the drafter never joins;
- else it joins later and loses the share of its net gain made before the new wait.
An estimate from logs, not a run; prints one JSON document.
"""

import json
import re
import statistics as st
from pathlib import Path

RUNS = {
    "hotpot": "docs/bench/2026-12-04-rag-pair-hotpot-p16-amd/runs.jsonl",
    "squad": "docs/bench/2026-12-04-rag-pair-squad-p16-steps-packed/runs.jsonl",
    "long": "docs/bench/2026-12-04-rag-pair-long-p17-steps-packed/runs.jsonl",
}
JOIN = re.compile(
    r"joined at token (\d+) after ([\d.]+)s of decoding \(estimated drafter prefill ([\d.]+)s\)"
)


def replay(path: str) -> dict:
    """Today's and the calibrated rule's ratios to serial RAG over one run's records."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    serial = {r["qid"]: r["e2e_s"] for r in rows if r["system"] == "serial_plain"}
    factors: list[float] = []
    old_r, new_r, never, later = [], [], 0, 0
    saved = 0.0
    for r in rows:
        if r["system"] != "spec_verify":
            continue
        old = new = r["e2e_s"]
        pr = r["proposer"]
        m = JOIN.search(" ".join(pr.get("drafter_events") or []))
        if m:
            waited, estimate = float(m.group(2)), float(m.group(3))
            factor = st.mean(factors) if factors else 1.0
            ledger = pr.get("cost_ledger") or {}
            plain = ledger.get("plain") or {}
            step = plain["s"] / plain["tokens"] if plain.get("tokens") else 0.0
            drafter = ledger.get("drafter") or {"s": 0.0, "tokens": 0}
            gain = drafter["tokens"] * step - drafter["s"]  # > 0: its rounds beat plain steps
            prefill = pr.get("drafter_prefill_s", 0.0)
            without = r["decode_s"] - prefill + gain  # the decode had it never joined
            wait = waited * factor
            if wait >= without:
                new, never = old - prefill + gain, never + 1
            elif wait > waited:
                share = min(1.0, (wait - waited) / max(without - waited, 1e-6))
                new, later = old + gain * share, later + 1
            factors.append(prefill / estimate)
        old_r.append(old / serial[r["qid"]])
        new_r.append(new / serial[r["qid"]])
        saved += old - new

    def both(f):
        return {"today": f(old_r), "calibrated": f(new_r)}

    return {
        "answers": len(old_r),
        "e2e_vs_serial_median": both(lambda xs: round(st.median(xs), 3)),
        "e2e_vs_serial_mean": both(lambda xs: round(st.mean(xs), 3)),
        "answers_slower_than_1.02x": both(lambda xs: sum(x > 1.02 for x in xs)),
        "would_not_join": never,
        "would_join_later": later,
        "seconds_saved": round(saved, 2),
        "learned_factor_at_end": round(st.mean(factors), 3) if factors else None,
    }


print(json.dumps({name: replay(path) for name, path in RUNS.items()}, indent=1))
