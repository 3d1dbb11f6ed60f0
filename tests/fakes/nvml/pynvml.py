"""A stand-in for nvidia-ml-py's `pynvml` (what profkit's host sampler imports on the GPU box): FAKE_NVML_GPUS
names the GPUs ("NAME;NAME"), FAKE_NVML_UTIL the utilization (%) the n-th reading of every GPU returns, cycling
("30,60,90"); FAKE_NVML_CALLS, a file where each init and shutdown is written. Without FAKE_NVML_GPUS, no driver."""

from __future__ import annotations

import os
from types import SimpleNamespace


class NVMLError(Exception):
    pass


_reads: dict[int, int] = {}


def _record(what: str) -> None:
    if os.environ.get("FAKE_NVML_CALLS"):
        with open(os.environ["FAKE_NVML_CALLS"], "a") as f:
            f.write(what + "\n")


def _gpus() -> list[str]:
    return [g for g in os.environ.get("FAKE_NVML_GPUS", "").split(";") if g]


def nvmlInit() -> None:
    if not _gpus():
        raise NVMLError("NVML Shared Library Not Found")
    _record("init")


def nvmlShutdown() -> None:
    _record("shutdown")


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < len(_gpus()):
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetName(handle: int) -> bytes:  # older pynvml returns bytes
    return _gpus()[handle].encode()


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    values = [int(v) for v in os.environ.get("FAKE_NVML_UTIL", "50").split(",")]
    n = _reads.get(handle, 0)
    _reads[handle] = n + 1
    return SimpleNamespace(gpu=values[n % len(values)], memory=0)
