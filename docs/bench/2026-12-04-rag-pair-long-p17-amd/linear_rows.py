"""One of the 1.5B's linear shapes, 1-16 rows: MKL (nn.Linear's weight) vs oneDNN's packed weight.

Run from the repository root: `.venv/bin/python docs/bench/2026-12-04-rag-pair-long-p17-amd/linear_rows.py`
(2 threads, random weights; ms per product, mean of 200 after 20 warm-up calls).
"""

import time

import torch

torch.set_num_threads(2)


def ms(fn, n=200):
    with torch.inference_mode():
        for _ in range(20):
            fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return round((time.perf_counter() - start) / n * 1e3, 3)


for out_f, in_f in ((8960, 1536), (1536, 1536), (256, 1536), (1536, 8960)):
    weight = torch.randn(out_f, in_f)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    for rows in (1, 2, 3, 4, 8, 16):
        x = torch.randn(rows, in_f)
        mkl = ms(lambda: torch.nn.functional.linear(x, weight))
        onednn = ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))
        print(f"{out_f}x{in_f} rows {rows}: MKL {mkl} ms, oneDNN packed {onednn} ms")
