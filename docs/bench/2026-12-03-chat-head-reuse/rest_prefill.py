import time, torch, statistics
from specrag.models.loading import load_lm
from specrag.decoding.state import LMState
from specrag.decoding.speculative import prefill
lm = load_lm()
ids = [int(x) for x in torch.randint(100, 40000, (946,), generator=torch.Generator().manual_seed(0))]
head = LMState(lm.model, lm.device); head.extend(ids[:72], all_logits=False)
def full():
    s = LMState(lm.model, lm.device); t=time.perf_counter(); prefill(s, ids); return time.perf_counter()-t
def cached():
    t0=time.perf_counter(); s = head.clone(); t=time.perf_counter(); prefill(s, ids); e=time.perf_counter(); return e-t, t-t0
full(); cached()
F, C, K = [], [], []
for i in range(8):
    F.append(full()); c, k = cached(); C.append(c); K.append(k)
print("full", statistics.median(F), "rest", statistics.median(C), "clone", statistics.median(K))
