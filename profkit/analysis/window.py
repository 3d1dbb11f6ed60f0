"""Which slice of the trace the report covers, and how it was chosen.

`all` is what `nsys stats` covers (every event). `auto` (the default) finds the benchmark phase
of a whole-process vLLM trace: start-up (weight loading, torch.compile, CUDA-graph capture) and
the benchmark are separated by long GPU-idle stretches, and the benchmark runs last. The phases
are split at GPU gaps of at least 500 ms, the default gap threshold of NVIDIA's `nsys analyze
gpu_gaps` rule; the window is the last phase holding a real share of the GPU work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from profkit.analysis.seq import seq_range
from profkit.errors import ProfkitError
from profkit.traces.schema import Trace

PHASE_GAP_NS = 500_000_000  # nsys analyze gpu_gaps default threshold
# A phase must hold this share of the busiest phase's GPU time to count as "the benchmark";
# smaller late phases are shutdown or warm-up blips.
PHASE_MIN_BUSY_SHARE = 0.10


@dataclass(frozen=True)
class Window:
    """A time window in trace nanoseconds; `bounded` False means every event (window `all`)."""

    start_ns: int
    end_ns: int
    how: str
    detail: str = ""
    bounded: bool = True
    # (relation, first seq, last seq) for the start-ordered relations: see `with_seq_ranges`.
    seq_ranges: tuple[tuple[str, int, int], ...] = ()

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    def where(self, relation: str | None = None) -> str:
        """SQL condition selecting events that start inside the window (named params :w0, :w1).

        For `kernels` and `api` the condition starts with the window's seq range, so SQLite reads only
        the rows around the window (a rowid range) instead of testing every row of the table.
        """
        if not self.bounded:
            return "1"
        for name, lo, hi in self.seq_ranges:
            if name == relation:
                return f"(seq BETWEEN {int(lo)} AND {int(hi)} AND start >= :w0 AND start < :w1)"
        return "(start >= :w0 AND start < :w1)"

    @property
    def params(self) -> dict[str, int]:
        return {"w0": self.start_ns, "w1": self.end_ns}


def with_seq_ranges(trace: Trace, window: Window) -> Window:
    """`window` with the seq ranges of the kernel and API rows that start inside it."""
    if not window.bounded:
        return window
    ranges = []
    for relation in ("kernels", "api"):
        if relation == "kernels" or trace.has(relation):
            found = seq_range(trace, relation, window.start_ns, window.end_ns)
            if found is not None:
                ranges.append((relation, *found))
    return replace(window, seq_ranges=tuple(ranges))


def gpu_span(trace: Trace) -> tuple[int, int]:
    """First GPU operation start and last GPU operation end over the whole trace."""
    from profkit.analysis.gaps import gpu_gaps  # the gaps hold each device's span: no scan of its own

    gaps = gpu_gaps(trace)
    return gaps.first, gaps.last


def choose_window(trace: Trace, spec: str, phases: list[dict] | None = None) -> Window:
    """Parse a window (all | auto | nvtx:NAME | START_NS:END_NS; the command line turns START:END with units
    into nanoseconds) into a `Window`."""
    spec = (spec or "auto").strip()
    if spec == "all":
        first, last = gpu_span(trace)
        return Window(first, last, "whole", "every event in the trace, as nsys stats counts them",
                      bounded=False)
    if spec == "auto":
        return _auto_window(*gpu_span(trace), phases or [])
    if spec.startswith("nvtx:"):
        return _nvtx_window(trace, spec[5:])
    m = re.fullmatch(r"(\d+)\s*:\s*(\d+)", spec)
    if m:
        start, end = int(m.group(1)), int(m.group(2))
        if end <= start:
            raise ProfkitError(f"--window {spec}: the end must come after the start")
        if end >= 1 << 63:
            raise ProfkitError(f"--window {spec}: past any trace timestamp (nanoseconds fit in 63 bits)")
        return Window(start, end, "explicit", f"{start} ns to {end} ns as given")
    raise ProfkitError(f"--window {spec!r}: expected all, auto, nvtx:NAME or START_NS:END_NS")


def _auto_window(first: int, last: int, phases: list[dict]) -> Window:
    if len(phases) <= 1:
        return Window(first, last, "steady-state",
                      "one GPU-active phase: from the first to the last GPU operation")
    top = max(p["busy_ns"] for p in phases)
    real = [p for p in phases if p["busy_ns"] >= PHASE_MIN_BUSY_SHARE * top]
    chosen = real[-1]
    skipped = phases.index(chosen)
    return Window(
        chosen["start_ns"], chosen["end_ns"], "steady-state",
        f"last GPU-active phase ({skipped} earlier phase(s) of start-up skipped; phases split at GPU "
        f"gaps >= {PHASE_GAP_NS // 1_000_000} ms, the nsys analyze gpu_gaps default)",
    )


def _nvtx_window(trace: Trace, name: str) -> Window:
    if not name:
        raise ProfkitError("--window nvtx:NAME needs a range name")
    # Accept both "decode_step" and nsys's "domain:decode_step" spelling.
    row = trace.query(
        "SELECT min(start), max(end), count(*) FROM nvtx WHERE name = :n OR name = ':' || :n",
        {"n": name},
    )[0]
    if not row[2]:
        raise ProfkitError(f"--window nvtx:{name}: no NVTX range of that name in the trace")
    return Window(int(row[0]), int(row[1]), f"nvtx:{name}",
                  f"from the first to the last of {row[2]} NVTX range(s) named {name!r}")
