import torch
from torch import nn
from specrag.models.loading import load_lm
d=load_lm("qwen2.5-coder-0.5b","cpu","float32")
m=d.model.model.layers[0]
for name in ['self_attn.q_proj','self_attn.v_proj','mlp.gate_proj','mlp.down_proj']:
    W=m.get_submodule(name).weight.detach()
    N,K=W.shape
    for gs in (32,16):
        g=W.reshape(N,K//gs,gs)
        nun=[len(torch.unique(g[i,j])) for i in range(4) for j in range(3)]
        print(name, gs, nun)
    # along columns?
    g=W.T.reshape(K, N//32, 32)
    print(name,'T32',[len(torch.unique(g[i,j])) for i in range(3) for j in range(3)])
