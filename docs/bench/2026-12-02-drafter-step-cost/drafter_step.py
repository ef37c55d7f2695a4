import time, torch, sys
torch.set_num_threads(2)
from specrag.models.loading import load_lm
from specrag.decoding.state import LMState
d = load_lm("qwen2.5-coder-0.5b", "cpu", "int8")
print(d.dtype, d.layout, file=sys.stderr)
vocab = int(d.model.config.vocab_size)
with torch.inference_mode():
    lm = LMState(d.model, d.device)
    if "restrict" in sys.argv:
        lm.restrict(32768, list(range(600)))
    lm.extend([(40 + i) % vocab for i in range(600)], all_logits=False)
    for _ in range(5): lm.extend([300]); lm.crop(600)
    ts=[]
    for _ in range(20):
        t=time.perf_counter(); lm.extend([300]); ts.append(time.perf_counter()-t); lm.crop(600)
    ts.sort(); print("step median %.4f min %.4f" % (ts[10], ts[0]))
    if "prof" in sys.argv:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(10): lm.extend([300]); lm.crop(600)
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
