"""What the analyses of one trace produce: its report sections, typed once (`Sections`, which the trace's part and the
report both hold), and each GPU's own part (a rank).

Tables stay rows of plain values (as `nsys stats` prints them: one dict per kernel, API call, gap, ...); the
shapes facts read (the window, the GPU's busy time, the gap classes, the launch latency, a rank's communication,
the imbalance across ranks) are structs. The report joins these sections with vLLM's evidence, facts and findings
(`profkit.report`)."""

from __future__ import annotations

from typing import Any

import msgspec


class WindowSection(msgspec.Struct, frozen=True):
    """The analysed window: its bounds, how it was chosen, and the trace's GPU-active phases (`auto` splits on
    them; other windows list none)."""

    start_ns: int
    end_ns: int
    duration_ns: int
    how: str
    detail: str
    phases: list[dict[str, Any]]


class GpuSection(msgspec.Struct, frozen=True):
    """The window's GPU busy and idle time: summed over the devices, and per device."""

    busy_ns: int
    idle_ns: int
    utilization: float  # mean over the devices
    devices: list[dict[str, Any]]  # per device: device, busy_ns, idle_ns, utilization


class GapClass(msgspec.Struct, frozen=True):
    count: int
    idle_ns: int


class GapClasses(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """The window's GPU idle time by gap length, shortest first (the upper bounds:
    `profkit.analysis.timeline.GAP_UPPER_BOUNDS`); no classes ({}) without a trace."""

    lt_20us: GapClass | None = None  # launch spacing
    from_20us_to_1ms: GapClass | None = msgspec.field(default=None, name="20us_1ms")
    from_1ms_to_100ms: GapClass | None = msgspec.field(default=None, name="1ms_100ms")
    ge_100ms: GapClass | None = None


class LaunchLatency(msgspec.Struct, frozen=True, omit_defaults=True):
    """Launch call start -> kernel start of the eager kernels, over a uniform sample of them; without a trace
    nothing ({}), and only `sampled` (0) where no launch call could be joined to its kernel."""

    sampled: int | None = None
    sample_step: int | None = None  # every n-th launch (by correlation id) was joined
    median_ns: float | None = None
    p90_ns: float | None = None
    call_median_ns: float | None = None  # the launch call's own length


class Sections(msgspec.Struct, kw_only=True, frozen=True):
    """A trace's report sections, in the report's order: the one list of them. Without a trace (vLLM's evidence
    alone) each is empty: `Sections()`."""

    window: WindowSection | None = None
    gpu: GpuSection | None = None
    timeline: dict[str, Any] | list[Any] = []  # utilization over time, in buckets of the window
    kernels: list[dict[str, Any]] = []
    categories: list[dict[str, Any]] = []
    memops: list[dict[str, Any]] = []
    memory_kinds: list[dict[str, Any]] = []
    api: list[dict[str, Any]] = []
    sync: list[dict[str, Any]] = []
    nvtx: list[dict[str, Any]] = []
    cpu_ops: list[dict[str, Any]] = []
    gaps: list[dict[str, Any]] = []  # the longest GPU gaps, with what the host did in them
    gap_classes: GapClasses = msgspec.field(default_factory=GapClasses)
    steps: dict[str, Any] | None = None  # vLLM's engine steps (profkit.analysis.steps)
    sched: dict[str, Any] | None = None  # the processes' CPU time (profkit.analysis.sched)
    launch: LaunchLatency = msgspec.field(default_factory=LaunchLatency)


class Communication(msgspec.Struct, frozen=True):
    """One GPU's communication kernels: their time, its share of the GPU's kernel time, and how much of it compute
    overlapped."""

    count: int
    total_ns: int
    share: float | None
    busy_ns: int  # the kernels merged into intervals (concurrent ones counted once)
    overlap_ns: int
    overlap_share: float | None


class Rank(msgspec.Struct, frozen=True):
    """One GPU of a multi-GPU run, as the report's `ranks` lists it."""

    rank: Any  # the trace's distributedInfo rank, else the device id, else the file name
    source: str
    device: int
    gpu: dict[str, Any]  # name, busy_ns, idle_ns, utilization
    kernels: dict[str, Any]  # count, total_ns
    categories: list[dict[str, Any]]
    communication: Communication


class RankPart(msgspec.Struct, frozen=True):
    """A rank with what the cross-rank join needs and the report does not show: its collectives (the
    communication kernels' starts, in order, and names) and its window's length."""

    entry: Rank
    comm_starts: Any  # numpy int64 array
    comm_names: list[str]
    window_ns: int


class BusySpread(msgspec.Struct, frozen=True):
    min: int
    max: int
    spread_share: float | None  # (max - min) / max


class Straggler(msgspec.Struct, frozen=True):
    rank: Any
    last_share: float  # of the collectives, the share it arrived last


class CollectiveWait(msgspec.Struct, frozen=True):
    """The wait inside collectives across the ranks (`profkit.analysis.communication.collective_imbalance`)."""

    collectives: int  # matched across the ranks
    names_agree: float
    spread_ns: dict[str, Any]  # median, p90, max, total of the start spread
    ranks: list[dict[str, Any]]  # per rank: rank, wait_ns, wait_share, last_share, collectives
    straggler: Straggler | None  # the rank most often last, when more than chance


class Imbalance(msgspec.Struct, frozen=True):
    """The report's `imbalance`: busy time across the ranks, and the wait inside collectives."""

    busy_ns: BusySpread
    collectives: CollectiveWait | None


class TraceSections(msgspec.Struct, kw_only=True, frozen=True):
    """One trace's part of the report: where it came from, its sections, and what the report takes from it
    beside them."""

    source: dict[str, Any]
    sections: Sections
    ranks: list[RankPart] | None = None  # the per-GPU parts (several GPUs, or one rank of several)
    gpu_metrics: dict[str, Any] | None = None  # the trace's nsys GPU metrics, by phase and kernel category
