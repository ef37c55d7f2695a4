import torch, time
torch.set_num_threads(2)
from torch.ao.nn.quantized.dynamic import Linear as DL
from torch.ao.quantization import per_channel_dynamic_qconfig
shapes=[(896,896),(896,128),(896,128),(896,896),(896,4864),(896,4864),(4864,896)]
L=24
fp=[];q8=[];w8=[];w4=[]
for l in range(L):
    for K,N in shapes:
        lin=torch.nn.Linear(K,N,bias=False); W=lin.weight.detach()
        fp.append(W)
        lin.qconfig=per_channel_dynamic_qconfig; q8.append(DL.from_float(lin))
        s=W.abs().amax(1)/127
        w8.append(((W/s[:,None]).round().clamp(-127,127).to(torch.int8).contiguous(), s.to(torch.bfloat16)))
        # int4 group 64
        try:
            gs=64
            Wg=W.reshape(N,K//gs,gs) if K%gs==0 else None
            mn=Wg.amin(-1,keepdim=True); mx=Wg.amax(-1,keepdim=True)
            scale=((mx-mn)/15).clamp_min(1e-6); zero=mn
            qi=((Wg-mn)/scale).round().clamp(0,15).to(torch.int32).reshape(N,K)
            packed=torch.ops.aten._convert_weight_to_int4pack_for_cpu(qi, 1) if hasattr(torch.ops.aten,'_convert_weight_to_int4pack_for_cpu') else None
            sz=torch.stack([scale.reshape(N,K//gs), (zero+8*scale).reshape(N,K//gs)],-1).transpose(0,1).contiguous().to(torch.bfloat16)
            w4.append((packed,gs,sz))
        except Exception as e:
            print('int4 prep', e); w4=None
def run(name,f,n=5):
    f()
    t=time.perf_counter()
    for _ in range(n): f()
    print(name, f"{(time.perf_counter()-t)/n*1e3:.1f} ms per step")
x={K:torch.randn(1,K) for K in (896,4864)}
xb={K:v.to(torch.bfloat16) for K,v in x.items()}
run('fp32', lambda: [torch.nn.functional.linear(x[W.shape[1]],W) for W in fp])
run('int8dyn', lambda: [m(x[m.in_features] if hasattr(m,'in_features') else x[m.weight().shape[1]]) for m in q8])
run('w8 bf16', lambda: [torch.ops.aten._weight_int8pack_mm(xb[w.shape[1]],w,s) for w,s in w8])
if w4:
    try:
        run('w4 bf16', lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(xb[p.shape[1]*2] if False else xb[896 if sz.shape[0]==896//gs else 4864],p,gs,sz) for p,gs,sz in w4])
    except Exception as e: print('w4 run', e)
