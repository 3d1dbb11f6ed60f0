"""`host.json` (written by `profkit capture`, schema `profkit.host/1`) -> `HostSamples`.

Every sample is checked here: a process without a text role or whose pid is not a positive integer, a sample
that is not [seconds, value] of two finite numbers, a negative CPU value or a GPU utilization outside 0..1 is left
out and counted."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec

from profkit.errors import ProfkitError
from profkit.inputs import read_json
from profkit.numbers import json_int

SCHEMA = "profkit.host/1"


class ProcessSamples(msgspec.Struct, frozen=True):
    pid: int | None
    role: str
    name: str
    cpu: list[tuple[float, float]]  # (seconds, cores used)


class HostSamples(msgspec.Struct, frozen=True):
    path: str
    cores: int | None  # the machine's CPU cores, when plausible
    duration_s: Any  # as written
    interval_s: Any
    processes: list[ProcessSamples]
    gpu_util: list[tuple[float, float]]  # (seconds, 0..1), every GPU's samples together
    skipped_samples: int
    gpu_names: list[str] = []  # every GPU NVML saw on the machine
    gpus_used: list[int] | None = None  # the GPUs the run's processes held (gpu_util is theirs); None: all GPUs
    left_out: dict[str, int] = {}  # what was not used, by why: "processes whose pid is no process id": 4


def _used(gpus: list[Any], pids: set[Any]) -> list[int] | None:
    """The GPUs the sampled processes held: NVML listed one of their pids on the GPU; else the GPUs the server's
    CUDA_VISIBLE_DEVICES named. None when neither was recorded (every GPU counts, as before profkit recorded it)."""
    held = [g.get("index") for g in gpus if isinstance(g, dict) and isinstance(g.get("pids"), list)
            and pids.intersection(p for p in g["pids"] if isinstance(p, int) and not isinstance(p, bool))]
    index = [i for i in held if isinstance(i, int) and not isinstance(i, bool)]
    if index:
        return index
    named = [g.get("index") for g in gpus if isinstance(g, dict) and g.get("visible") is True]
    return [i for i in named if isinstance(i, int) and not isinstance(i, bool)] or None


def number_pair(pair: Any) -> bool:
    """A sample: [seconds, value], both finite numbers."""
    return (isinstance(pair, list) and len(pair) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in pair))


def _pid(value: Any) -> bool:
    """A process id: a positive integer of the kernel's range, or none given (a NaN or a list printed as a pid is
    no process)."""
    return value is None or 0 < (json_int(value) or 0) < 1 << 31


def parse_host(data: Any, path: str) -> HostSamples:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ProfkitError(f"{path}: not a {SCHEMA} document")
    listed: list[Any] = data["processes"] if isinstance(data.get("processes"), list) else []
    processes: list[ProcessSamples] = []
    skipped = 0
    left_out: dict[str, int] = {}

    def leave(why: str, n: int = 1) -> None:
        if n:
            left_out[why] = left_out.get(why, 0) + n

    for p in listed:
        why = ("processes that are not objects" if not isinstance(p, dict) else
               "processes without a role" if not isinstance(p.get("role"), str) else
               "processes whose pid is no process id" if not _pid(p.get("pid")) else None)
        if why:
            skipped += 1
            leave(why)
            continue
        raw: list[Any] = p["cpu"] if isinstance(p.get("cpu"), list) else []
        valid = [(pair[0], pair[1]) for pair in raw if number_pair(pair) and pair[1] >= 0]
        skipped += len(raw) - len(valid)
        leave("CPU samples that are not [seconds, cores used] of finite numbers, cores >= 0", len(raw) - len(valid))
        processes.append(ProcessSamples(p.get("pid"), p["role"], str(p.get("name", ""))[:200], valid))
    gpus: list[Any] = data["gpus"] if isinstance(data.get("gpus"), list) else []
    used = _used(gpus, {p.pid for p in processes})
    util = [(pair[0], pair[1]) for g in gpus if isinstance(g, dict) and isinstance(g.get("util"), list)
            and (used is None or g.get("index") in used)
            for pair in g["util"] if number_pair(pair) and 0 <= pair[1] <= 1]
    cores = data.get("cores")
    names = [str(g.get("name"))[:100] for g in gpus if isinstance(g, dict) and g.get("name") is not None][:64]
    return HostSamples(path, cores if isinstance(cores, int) and not isinstance(cores, bool) and 0 < cores < 1 << 20
                       else None, data.get("duration_s"), data.get("interval_s"), processes, util, skipped, names,
                       used, left_out)


def read_host(path: Path) -> HostSamples:
    return parse_host(read_json(Path(path), "host samples"), str(path))
