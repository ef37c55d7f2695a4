import torch, time
torch.set_num_threads(2)
shapes=[(896,896),(896,128),(896,128),(896,896),(896,4864),(896,4864),(4864,896)]
L=24
def mk(K,N,gs):
    W=torch.randn(N,K); Wg=W.reshape(N,K//gs,gs)
    mn=Wg.amin(-1,keepdim=True); mx=Wg.amax(-1,keepdim=True)
    scale=((mx-mn)/15).clamp_min(1e-8); q=((Wg-mn)/scale).round().clamp(0,15).to(torch.int32).reshape(N,K)
    p=torch.ops.aten._convert_weight_to_int4pack_for_cpu(q,1)
    sz=torch.stack([scale.reshape(N,K//gs),(mn+8*scale).reshape(N,K//gs)],-1).transpose(0,1).contiguous()
    return K,p,sz
for gs in (32,64):
    ws=[mk(K,N,gs) for l in range(L) for K,N in shapes]
    for dt in (torch.float32, torch.bfloat16):
        x={K:torch.randn(1,K).to(dt) for K in (896,4864)}
        w=[(K,p,sz.to(dt)) for K,p,sz in ws]
        f=lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(x[K],p,gs,sz) for K,p,sz in w]
        f(); t=time.perf_counter()
        for _ in range(5): f()
        print(gs, dt, f"{(time.perf_counter()-t)/5*1e3:.1f} ms")
        for M in (4,16):
            xm={K:torch.randn(M,K).to(dt) for K in (896,4864)}
            g=lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(xm[K],p,gs,sz) for K,p,sz in w]
            g(); t=time.perf_counter(); g(); print('  M',M, f"{(time.perf_counter()-t)*1e3:.1f} ms")
