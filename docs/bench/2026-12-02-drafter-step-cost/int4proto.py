import time, torch, sys, copy
torch.set_num_threads(2)
from torch import nn
import torch.nn.functional as F
from specrag.models.loading import load_lm
from specrag.models import int8
from specrag.decoding.state import LMState

class _PackedLinear(nn.Module):
    """A linear layer with packed weights for 1-3 rows and a bf16 copy for wider passes."""
    def __init__(self, layer):
        super().__init__()
        W=layer.weight.detach().float(); N,K=W.shape
        self.in_features,self.out_features=K,N
        self.bias=None if layer.bias is None else layer.bias.detach().float()
        self.wide=W.to(torch.bfloat16); self.wide_bias=None if layer.bias is None else layer.bias.detach().to(torch.bfloat16)
        self.pack(W)
    def forward(self,x):
        rows=x.reshape(-1,self.in_features)
        if rows.shape[0]>=4:
            y=F.linear(rows.to(torch.bfloat16),self.wide,self.wide_bias).to(x.dtype)
        else:
            y=self.narrow(rows.to(torch.bfloat16)).to(x.dtype)
            if self.bias is not None: y=y+self.bias
        return y.view(*x.shape[:-1],self.out_features)

class W8Linear(_PackedLinear):
    def pack(self, W):
        s=(W.abs().amax(1)/127).clamp_min(1e-12)
        self.wq=(W/s[:,None]).round().clamp(-127,127).to(torch.int8).contiguous()
        self.s=s.to(torch.bfloat16)
    def narrow(self, rows):
        return torch.ops.aten._weight_int8pack_mm(rows,self.wq,self.s)

class Int4Linear(_PackedLinear):
    gs=32
    def pack(self, W):
        N,K=W.shape; gs=self.gs
        Wg=W.reshape(N,K//gs,gs)
        mn=Wg.amin(-1,keepdim=True); mx=Wg.amax(-1,keepdim=True)
        scale=((mx-mn)/15).clamp_min(1e-8)
        q=((Wg-mn)/scale).round().clamp(0,15).to(torch.int32).reshape(N,K)
        self.packed=torch.ops.aten._convert_weight_to_int4pack_for_cpu(q,1)
        self.sz=torch.stack([scale.reshape(N,K//gs),(mn+8*scale).reshape(N,K//gs)],-1).transpose(0,1).contiguous().to(torch.bfloat16)
    def narrow(self, rows):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows,self.packed,self.gs,self.sz)

def to_int4(model, head):
    named=[(n,m) for n,m in model.named_modules() if isinstance(m, nn.Linear)]
    for name,layer in named:
        if name=='lm_head' and head!='int4':
            if head=='int8':
                plain=nn.Linear(layer.in_features,layer.out_features,bias=layer.bias is not None)
                plain.weight=layer.weight
                setattr(model,'lm_head',int8.Int8Linear(plain, True))
            continue
        parent,_,attr=name.rpartition('.')
        setattr(model.get_submodule(parent),attr,(W8Linear if W8 else Int4Linear)(layer))

mode=sys.argv[1]
W8=mode.startswith('w8')
if W8: mode=mode.replace('w8','int4')
if mode=='int8':
    d=load_lm("qwen2.5-coder-0.5b","cpu","int8")
else:
    d=load_lm("qwen2.5-coder-0.5b","cpu","float32")
    if mode.startswith('int4'):
        to_int4(d.model, mode.split('-')[1])
vocab=int(d.model.config.vocab_size)
tok=d.tokenizer
from specrag.data.datasets import squad_paragraphs
text=" ".join(p.text for p in squad_paragraphs()[:6])
ids=tok(text)["input_ids"][:700]
with torch.inference_mode():
    lm=LMState(d.model,d.device)
    lm.extend(ids[:600],all_logits=False)
    for _ in range(5): lm.extend([300]); lm.crop(600)
    ts=[]
    for _ in range(20):
        t=time.perf_counter(); lm.extend([300]); ts.append(time.perf_counter()-t); lm.crop(600)
    ts.sort(); print(mode,"step median %.4f min %.4f"%(ts[10],ts[0]))
    # teacher-forced argmax with single steps over the next 100 tokens
    am=[]
    for t_ in ids[600:700]:
        am.append(int(lm.extend([t_])[-1].argmax()))
    torch.save(am, f"/tmp/prof/am_{sys.argv[1]}.pt")
    if 'prof' in sys.argv:
        lm.crop(600)
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(10): lm.extend([300]); lm.crop(600)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
