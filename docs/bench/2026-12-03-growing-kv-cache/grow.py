import time, torch, sys
torch.set_num_threads(2)
from transformers.cache_utils import DynamicLayer
import specrag.decoding.state as st
from specrag.models.loading import load_lm

class GrowingLayer(DynamicLayer):
    _kb = _vb = None
    def update(self, k, v, *a, **kw):
        if not self.is_initialized:
            self.lazy_initialization(k, v)
        n = self.keys.shape[-2] if self.keys.numel() else 0
        need = n + k.shape[-2]
        kb = self._kb
        if kb is None or need > kb.shape[-2] or (n and self.keys.data_ptr() != kb.data_ptr()):
            cap = need + max(256, need // 2)
            nk = k.new_empty(*k.shape[:-2], cap, k.shape[-1]); nv = v.new_empty(*v.shape[:-2], cap, v.shape[-1])
            if n:
                nk[..., :n, :].copy_(self.keys); nv[..., :n, :].copy_(self.values)
            self._kb, self._vb = kb, vb = nk, nv
        self._kb[..., n:need, :].copy_(k); self._vb[..., n:need, :].copy_(v)
        self.keys = self._kb[..., :need, :]; self.values = self._vb[..., :need, :]
        return self.keys, self.values

name = sys.argv[1]; mode = sys.argv[2]; dtype = sys.argv[3] if len(sys.argv) > 3 else None
d = load_lm(name, "cpu", dtype) if dtype else load_lm(name, "cpu")
print(d.dtype, d.layout, file=sys.stderr)
orig = st.rollback_cache
def grow_cache(model):
    c = orig(model)
    for i, l in enumerate(c.layers):
        if type(l) is DynamicLayer:
            c.layers[i] = GrowingLayer()
    return c
vocab = int(d.model.config.vocab_size)
N = int(sys.argv[4]) if len(sys.argv) > 4 else 600
with torch.inference_mode():
    for m in mode.split(","):
        st.rollback_cache = grow_cache if m == "grow" else orig
        lm = st.LMState(d.model, d.device)
        lm.extend([(40 + i) % vocab for i in range(N)], all_logits=False)
        for _ in range(5): lm.extend([300]); lm.crop(N)
        ts=[]
        for _ in range(30):
            t=time.perf_counter(); lm.extend([300]); ts.append(time.perf_counter()-t); lm.crop(N)
        ts.sort(); print(m, "step median %.4f min %.4f" % (ts[15], ts[0]), flush=True)
        # multi-token step
        ts=[]
        for _ in range(10):
            t=time.perf_counter(); lm.extend([300,301,302,303]); ts.append(time.perf_counter()-t); lm.crop(N)
        ts.sort(); print(m, "4tok median %.4f" % ts[5], flush=True)
