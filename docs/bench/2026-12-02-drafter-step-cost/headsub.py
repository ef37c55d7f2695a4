import time, torch, sys
torch.set_num_threads(2)
from torch import nn
from specrag.models.loading import load_lm
from specrag.models import int8
from specrag.decoding.state import LMState
d=load_lm("qwen2.5-coder-0.5b","cpu","int8")
m=d.model
def step_time():
    with torch.inference_mode():
        lm=LMState(m,d.device); lm.extend(list(range(1000,1600)),all_logits=False)
        for _ in range(5): lm.extend([300]); lm.crop(600)
        ts=[]
        for _ in range(30):
            t=time.perf_counter(); lm.extend([300]); ts.append(time.perf_counter()-t); lm.crop(600)
        ts.sort(); return ts[15], ts[0]
print('full int8 head', step_time())
head=m.lm_head
t=time.perf_counter()
W=head.q.weight().dequantize()[:32768+600]
lin=nn.Linear(W.shape[1],W.shape[0],bias=False); lin.weight.data=W.contiguous()
sub=int8.Int8Linear(lin, False)
print('build', time.perf_counter()-t)
m.lm_head=sub
print('32768-row int8 head', step_time())
