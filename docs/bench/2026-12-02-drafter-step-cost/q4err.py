import torch
from torch import nn
from specrag.models.loading import load_lm
d=load_lm("qwen2.5-coder-0.5b","cpu","float32")
import collections
agg=collections.defaultdict(list)
for n,m in d.model.named_modules():
    if isinstance(m, nn.Linear):
        W=m.weight.detach().float(); N,K=W.shape; gs=32
        Wg=W.reshape(N,K//gs,gs); mn=Wg.amin(-1,keepdim=True); mx=Wg.amax(-1,keepdim=True)
        sc=((mx-mn)/15).clamp_min(1e-12); q=((Wg-mn)/sc).round().clamp(0,15)
        err=((q*sc+mn-Wg).abs()/sc).amax().item()  # in units of the step
        rel=((q*sc+mn-Wg).norm()/Wg.norm()).item()
        kind=n.split('.')[-1]
        agg[kind].append((n, round(err,3), f"{rel:.2e}"))
for k,v in agg.items():
    print(k, [x[1:] for x in v[:6]], '...', sum(x[1]<0.05 for x in v), '/', len(v), 'on-grid')
