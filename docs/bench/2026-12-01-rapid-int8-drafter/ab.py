import random, json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
from specrag.evaluation import bench_rapid as br
from specrag.data.datasets import hotpot_questions, sample
from specrag.models.loading import load_lm
torch.manual_seed(br.SEED)
target = load_lm("qwen2.5-coder-1.5b", "auto", "auto")
drafters = {d: load_lm("qwen2.5-coder-0.5b", "auto", d) for d in ("bfloat16", "int8")}
print({d: (l.step_s, l.layout) for d, l in drafters.items()}, file=sys.stderr)
pool = hotpot_questions(); n = int(sys.argv[1]); length = int(sys.argv[2])
picked = sample(pool, 5, br.SEED)[:n]; dpool = sample(pool, 300, br.SEED + 1)
for d in drafters.values():
    br.warm_up(picked[0], dpool, target, 0.0, d)
out = []
for ex in picked:
    rng = random.Random(f"{br.SEED}:{ex.id}:{length}")
    doc = br.build_document(ex, dpool, length, target, rng)
    rows = {}
    for name, d in [("bf16", drafters["bfloat16"]), ("int8", drafters["int8"])]:
        r = br.run_case(ex, doc, target, 0.0, "rapid_eta0", drafter=d)
        rows[name] = {k: r[k] for k in ("answer", "new_tokens", "decode_s", "tokens_per_s", "acceptance_rate", "draft_forward_passes", "target_forward_passes", "drafter_prefill_s")}
        print(ex.id, name, json.dumps({k: v for k, v in rows[name].items() if k != "answer"}), file=sys.stderr)
    out.append({"qid": ex.id, **rows, "same": rows["bf16"]["answer"] == rows["int8"]["answer"]})
json.dump(out, open(f"/tmp/q8r/cmp-{length}.json", "w"), indent=1)
for o in out:
    print(o["qid"], o["same"], [round(o[k]["tokens_per_s"], 3) for k in ("bf16", "int8")], [o[k]["acceptance_rate"] for k in ("bf16", "int8")])
