"""fp32 linear layers of the 1.5B's shapes on 2 threads: time per call by input rows."""
import torch, time
torch.set_num_threads(2)
print(torch.__version__, torch.backends.mkldnn.is_available(), torch.backends.cpu.get_cpu_capability())
for (K,N) in [(1536,8960),(8960,1536),(1536,1536)]:
    W=torch.randn(N,K)
    for M in [1,2,4,8,16]:
        x=torch.randn(M,K)
        for _ in range(3): torch.nn.functional.linear(x,W)
        t=time.perf_counter(); n=20
        for _ in range(n): torch.nn.functional.linear(x,W)
        dt=(time.perf_counter()-t)/n
        print(K,N,M,f"{dt*1e3:.2f} ms  {2*M*K*N/dt/1e9:.1f} GFLOP/s  {K*N*4/dt/1e9:.1f} GB/s")
