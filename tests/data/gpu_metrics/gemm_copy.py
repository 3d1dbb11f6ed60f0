"""The workload of h100_gemm_copy: a bf16 GEMM loop and a device-to-device copy loop, each timed by CUDA events
and held in an NVTX range (`gemm`, `copy`): the known-peak work the GPU metrics are checked against.

    nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --gpu-metrics-devices=all \
        --gpu-metrics-frequency=2000 -o gemm python gemm_copy.py      # prints h100_gemm_copy.json's numbers
"""

import json
import sys
import time

import torch

SIZE = 8192


def timed(name: str, step, n: int) -> tuple[float, int, int]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.nvtx.range_push(name)
    t0 = time.perf_counter_ns()
    start.record()
    for _ in range(n):
        step()
    end.record()
    torch.cuda.synchronize()
    t1 = time.perf_counter_ns()
    torch.cuda.nvtx.range_pop()
    return start.elapsed_time(end) / 1e3, t0, t1


def main() -> None:
    n_mm, n_cp = (200, 400) if "--short" in sys.argv else (1000, 2000)
    a = torch.randn(SIZE, SIZE, device="cuda", dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    x = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    for _ in range(20):  # warm-up: cuBLAS heuristics, clocks
        torch.mm(a, b, out=c)
        y.copy_(x)
    torch.cuda.synchronize()
    time.sleep(0.3)
    t_mm, g0, g1 = timed("gemm", lambda: torch.mm(a, b, out=c), n_mm)
    time.sleep(0.3)
    t_cp, c0, c1 = timed("copy", lambda: y.copy_(x), n_cp)
    time.sleep(0.2)
    print(json.dumps({
        "gpu": torch.cuda.get_device_name(),
        "gemm": {"n": n_mm, "m": SIZE, "seconds": t_mm, "tflops": 2 * SIZE**3 * n_mm / t_mm / 1e12},
        "copy": {"n": n_cp, "bytes": x.numel(), "seconds": t_cp, "tbs_read_write": 2 * x.numel() * n_cp / t_cp / 1e12},
        "clock_ns": {"gemm": [g0, g1], "copy": [c0, c1]}}))


if __name__ == "__main__":
    main()
