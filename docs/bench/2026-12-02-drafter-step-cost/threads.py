"""Linear layers of the 1.5B (fp32, 28 blocks): one pass on 2 threads vs 1."""
import torch, time, threading
# target-like: 28 layers of 1.5B fp32 (q,k,v,o,gate,up,down)
T=[(1536,1536),(1536,256),(1536,256),(1536,1536),(1536,8960),(1536,8960),(8960,1536)]
tw=[torch.randn(N,K) for _ in range(28) for K,N in T]
def target_pass(M=8):
    xs={K:torch.randn(M,K) for K in (1536,8960)}
    for W in tw: torch.nn.functional.linear(xs[W.shape[1]],W)
def timeit(f,n=3):
    f(); t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n
for th in (2,1):
    torch.set_num_threads(th)
    print(f"threads={th}: target 8-row pass {timeit(target_pass):.3f}s, M=1 {timeit(lambda: target_pass(1)):.3f}s")
