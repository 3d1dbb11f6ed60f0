"""What the analyses of one trace produce: its report sections, typed, and each GPU's own part (a rank).

Tables stay rows of plain values (as `nsys stats` prints them: one dict per kernel, API call, gap, ...); the
report joins these sections with vLLM's evidence, facts and findings (`profkit.report`)."""

from __future__ import annotations

from typing import Any

import msgspec


class Rank(msgspec.Struct, frozen=True):
    """One GPU of a multi-GPU run, as the report's `ranks` lists it."""

    rank: Any  # the trace's distributedInfo rank, else the device id, else the file name
    source: str
    device: int
    gpu: dict[str, Any]  # name, busy_ns, idle_ns, utilization
    kernels: dict[str, Any]  # count, total_ns
    categories: list[dict[str, Any]]
    communication: dict[str, Any]


class RankPart(msgspec.Struct, frozen=True):
    """A rank with what the cross-rank join needs and the report does not show: its collectives (the
    communication kernels' starts, in order, and names) and its window's length."""

    entry: Rank
    comm_starts: Any  # numpy int64 array
    comm_names: list[str]
    window_ns: int


class TraceSections(msgspec.Struct, kw_only=True, frozen=True):
    """One trace's sections, in the report's order."""

    source: dict[str, Any]
    window: dict[str, Any]
    gpu: dict[str, Any]
    timeline: Any
    kernels: list[dict[str, Any]]
    categories: list[dict[str, Any]]
    memops: list[dict[str, Any]]
    memory_kinds: list[dict[str, Any]]
    api: list[dict[str, Any]]
    sync: list[dict[str, Any]]
    nvtx: list[dict[str, Any]]
    cpu_ops: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    gap_classes: dict[str, Any]
    steps: dict[str, Any] | None
    sched: dict[str, Any] | None
    launch: dict[str, Any]
    ranks: list[RankPart] | None = None  # the per-GPU parts (several GPUs, or one rank of several)
    gpu_metrics: dict[str, Any] | None = None  # the trace's nsys GPU metrics, by phase and kernel category
