import random, json, sys, warnings
warnings.filterwarnings("ignore")
import torch
from specrag.evaluation import bench_rapid as br
from specrag.models.rapid_chat import ChatRapid
from specrag.data.datasets import hotpot_questions, sample
from specrag.models.loading import load_lm
class NoEvidence(ChatRapid):
    evidence_ngram: int = 0
Orig = br.ChatRapid
torch.manual_seed(br.SEED)
target = load_lm("qwen2.5-coder-1.5b", "auto", "auto")
d = load_lm("qwen2.5-coder-0.5b", "auto", "int8")
pool = hotpot_questions(); n = int(sys.argv[1]); length = int(sys.argv[2])
picked = sample(pool, 5, br.SEED)[:n]; dpool = sample(pool, 300, br.SEED + 1)
br.warm_up(picked[0], dpool, target, 0.0, d)
for ex in picked:
    rng = random.Random(f"{br.SEED}:{ex.id}:{length}")
    doc = br.build_document(ex, dpool, length, target, rng)
    res = {}
    for name, cls in (("ev", Orig), ("off", NoEvidence)):
        br.ChatRapid = cls
        r = br.run_case(ex, doc, target, 0.0, "rapid_eta0", drafter=d)
        res[name] = r
        print(ex.id, name, round(r["tokens_per_s"], 3), r["decode_s"], r["new_tokens"], r["draft_forward_passes"], r["target_forward_passes"], r["acceptance_rate"], flush=True)
    print("same", res["ev"]["answer"] == res["off"]["answer"], flush=True)
