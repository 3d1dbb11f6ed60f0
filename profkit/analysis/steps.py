"""Engine steps: each vLLM scheduler step's cycle time, the GPU busy time inside it, and the GPU's wait
at its start; prefill-bearing vs decode-only steps, and what each phase's steps processed.

Step boundaries come from vLLM's own step annotations (`execute_context_N(T)_generation_M(G)`: N requests with T
prompt tokens, M decoding G tokens; the torch profiler records them, and nsys where vLLM's cuda profiler runs:
NVTX ranges). With `detailed_trace_annotation` (vLLM 0.26) each phase also carries its requests' sequence
lengths and query x key products (`execute_X_context_N(sqT skS sqsqQ sqskK)_generation_...`: what a step's
attention computes and its KV reads), so each phase's work is known step by step (`work`, read by
analysis/efficiency.py for MFU and MBU per phase). Without them (an nsys trace of vLLM has no NVTX by default),
from the kernel vLLM's GPU model runner launches once per step to prepare its inputs
(`_prepare_pos_seq_lens_kernel`, vLLM 0.2x; prefill-bearing where `_prepare_prefill_inputs_kernel` runs in the
step): a step starts at the longest GPU idle time between the previous step's last kernel (`_post_update_kernel`)
and that one, where the host schedules the next step and stages its inputs. An annotated step is then moved onto
the GPU's timeline (`_on_gpu`): it starts at the first kernel or memory operation its CUDA calls launched (joined by
correlation id), since with asynchronous scheduling vLLM names a step on the host while the GPU still runs the one
before. A step's cycle runs from its start to the next step's start; its GPU busy time is the cycle less the GPU's
idle time in it, summed from the GPU's gaps (analysis/gaps.py; the steps are disjoint, so all of them together read
each gap of the window once). A step belongs to the window when its range overlaps it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, NamedTuple

import numpy as np

from profkit.analysis.gaps import DeviceGaps, gpu_gaps
from profkit.analysis.scans import KERNEL_SCAN
from profkit.analysis.seq import seq_bounds, seq_range
from profkit.analysis.window import Window
from profkit.traces import Trace
from profkit.traces.columns import read_columns

STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_PHASE = r"(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
DETAILED_STEP = re.compile(rf"execute_\d+_context_{_PHASE}_generation_{_PHASE}")
# A step's row: start, end, then per phase (context, generation) requests, tokens (sq), sequence lengths (sk),
# sum of query_len^2 (sqsq), sum of query_len x seq_len (sqsk); UNKNOWN where the trace does not say (the short
# annotation has no sk/sqsq/sqsk; kernel-derived steps know only whether prompt tokens ran: context requests 1/0).
COLUMNS = ("start", "end", "context_requests", "context_tokens", "context_seq", "context_qq", "context_qk",
           "generation_requests", "generation_tokens", "generation_seq", "generation_qq", "generation_qk")
UNKNOWN = -1
MAX_FIELD = 1 << 40  # a step's sums of query x sequence lengths stay far below (8192 tokens x 128k context: 1e9)
CONTEXT_REQUESTS = COLUMNS.index("context_requests")
SERIES_MAX = 400  # steps kept for the chart (evenly spaced)
STEP_KERNEL = "_prepare_pos_seq_lens_kernel"  # once per step, first of the step's own kernels (H100 traces)
PREFILL_KERNEL = "_prepare_prefill_inputs_kernel"  # only in steps that carry prompt tokens
END_KERNEL = "_post_update_kernel"  # the last of a step's own kernels, after sampling
NVTX_SOURCE = "vLLM step annotations (execute_context_N(T)_generation_M(M))"
ON_GPU = "each from the first GPU operation it launched"
# how far behind its annotation a step's GPU work may run (recorded: decode steps 7-27 ms, a prompt's step behind
# queued prompts up to 0.6 s on the 14B)
LAG_MAX_NS = 2_000_000_000
KERNEL_SOURCE = f"vLLM's per-step input kernels ({STEP_KERNEL}; prefill: {PREFILL_KERNEL})"


def _quantile(values: np.ndarray, q: float) -> int | None:
    if not len(values):
        return None
    return int(np.partition(values, k := min(len(values) - 1, int(q * len(values))))[k])


class Found(NamedTuple):
    """A window's engine steps: the first GPU's gaps, the steps (an int64 array, a row per step: COLUMNS), where
    they came from, and whether they were moved onto the GPU's timeline (`_on_gpu`: each row then ends where the
    next step starts)."""

    gaps: DeviceGaps
    steps: np.ndarray
    source: str
    on_gpu: bool


def _steps(trace: Trace, win: Window) -> Found | None:
    """The window's steps (`Found`); None without steps. Read once per trace and window: the step view and the GPU
    metrics by phase both ask."""
    lo, hi = (win.start_ns, win.end_ns) if win.bounded else (-(1 << 62), 1 << 62)  # `all`: every step
    key = f"steps {lo} {hi}"
    if key not in trace.cache:
        trace.cache[key] = _read_steps(trace, lo, hi)
    return trace.cache[key]


def _read_steps(trace: Trace, lo: int, hi: int) -> Found | None:
    all_gaps = gpu_gaps(trace)
    if not all_gaps.devices:
        return None
    gaps = all_gaps.devices[min(all_gaps.devices)]
    # the annotations from a while before the window too: a step named on the host before it may run inside it
    steps, pid = _nvtx_steps(trace, lo - LAG_MAX_NS, hi, gaps.device, counted_from=lo)
    source, on_gpu = NVTX_SOURCE, False
    if len(steps) and (placed := _on_gpu(trace, steps, pid, gaps)) is not None:
        steps, source, on_gpu = placed, f"{NVTX_SOURCE}, {ON_GPU}", True
        steps = steps[(steps[:, 1] > lo) & (steps[:, 0] < hi)]
    elif len(steps):
        steps = steps[steps[:, 1] > lo]
    if not len(steps):
        steps, source, on_gpu = _kernel_steps(trace, lo, hi, gaps), KERNEL_SOURCE, False
    return Found(gaps, steps, source, on_gpu) if len(steps) else None


def _on_gpu(trace: Trace, steps: np.ndarray, pid: int | None, gaps: DeviceGaps) -> np.ndarray | None:
    """The annotated steps moved onto GPU `gaps.device`'s timeline: each from the first GPU operation it launched
    (the CUDA calls its process made from its annotation's start to the next one's, joined to kernels and memory
    operations by correlation id) to the next step's first. vLLM names a step on the host while the GPU still runs
    the ones before (asynchronous scheduling: decode steps 7-27 ms behind on the recorded 14B traces, a prompt's
    step up to 0.6 s behind the prompts queued before it), so the host's ranges put one step's GPU time on its
    neighbour at every change of phase. A step that launched nothing the trace kept sits at its host start moved
    by the median lag, between its neighbours. Left out, their time not given to another step (a row's end is the
    next step's start): a step the trace cut, whose work holds the GPU's first or last operation in the trace, or
    that launched nothing the trace kept yet spans some of the GPU's work (launched before the trace's calls
    begin). None where no step's launches are in the trace (no CUDA calls or correlation ids), or several processes
    made calls and the annotations do not say whose: the host's ranges stay."""
    if not {"api", "kernels"} <= trace.present:
        return None
    device = gaps.device
    host = steps[:, 0]
    lo, hi = int(host[0]), int(max(steps[-1, 1], host[-1] + 1))
    if pid is None and len(trace.query("SELECT DISTINCT pid FROM api LIMIT 2")) > 1:
        return None
    mine = f" AND pid = {int(pid)}" if pid is not None else ""
    span = seq_range(trace, "api", lo, hi)
    api = read_columns(trace, "api", {"s": "start", "c": "correlation"}, seq_span=span,
                       where=f"correlation IS NOT NULL{mine} AND start >= {lo} AND start < {hi}"
                             + (f" AND seq >= {span[0]} AND seq <= {span[1]}" if span else ""))
    if not len(api["c"]):
        return None
    launched_by = np.searchsorted(host, api["s"], side="right") - 1  # the step whose range the call is in
    order = np.argsort(api["c"], kind="stable")
    calls, by = api["c"][order], launched_by[order]
    first = np.full(len(steps), np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(len(steps), np.iinfo(np.int64).min, dtype=np.int64)
    # kernels and copies of this process (torch traces leave a kernel's pid empty) whose ids its calls made
    ours = f"device = {int(device)} AND correlation BETWEEN {int(calls[0])} AND {int(calls[-1])}" + \
        (f" AND (pid = {int(pid)} OR pid IS NULL)" if pid is not None else "")
    kernels = seq_range(trace, "kernels", lo, hi + LAG_MAX_NS)
    copies = trace.query("SELECT count(*) FROM memops")[0][0] if "memops" in trace.present else 0
    for relation, where, seq, rows in (
            ("kernels", ours + (f" AND seq >= {kernels[0]} AND seq <= {kernels[1]}" if kernels else ""), kernels, 0),
            ("memops", ours + f" AND start >= {lo} AND start < {hi + LAG_MAX_NS}", None, copies)):
        if relation == "memops" and not copies:
            continue
        ops = read_columns(trace, relation, {"s": "start", "e": "end", "c": "correlation"}, where=where,
                           seq_span=seq, rows_hint=rows, arrow=rows > 0)
        at = np.clip(np.searchsorted(calls, ops["c"]), 0, len(calls) - 1)
        hit = calls[at] == ops["c"]
        step = by[at[hit]]
        np.minimum.at(first, step, ops["s"][hit])
        np.maximum.at(last, step, ops["e"][hit])
    known = last >= first
    if not known.any():
        return None
    lag = int(np.median(first[known] - host[known]))
    big = np.iinfo(np.int64).max
    # an unknown step between its known neighbours' starts (the GPU runs the steps in order)
    after = np.maximum.accumulate(np.where(known, first, -big))
    before = np.minimum.accumulate(np.where(known, first, big)[::-1])[::-1]
    start = np.where(known, first, np.clip(host + lag, after, before))
    start = np.maximum.accumulate(start)
    out = steps.copy()
    out[:, 0] = start
    # a row's end: the next step's start (the last: its work's end), so that leaving a step out gives its time to none
    own_end = np.maximum(start + 1, np.where(known, last, steps[:, 1] + lag))
    out[:, 1] = np.append(np.maximum(start[1:], start[:-1] + 1), own_end[-1])
    # cut by the trace: holding its first or last GPU operation, or launching nothing it kept while the GPU worked
    cut = np.where(known, (first <= gaps.first) | (last >= gaps.last), (start < gaps.last) & (out[:, 1] > gaps.first))
    return out[~cut]


def _bounds(steps: np.ndarray, on_gpu: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends): each step from its start to the next step's start (the last one to its own end); steps on
    the GPU to their row's end, the next step's start whether or not that step was left out (`_on_gpu`)."""
    starts = steps[:, 0]
    if on_gpu:
        return starts, np.maximum(steps[:, 1], starts + 1)
    last = max(int(steps[-1, 1]), int(steps[-1, 0]) + 1)
    return starts, np.append(starts[1:], np.int64(last))


def step_spans(trace: Trace, win: Window) -> tuple[int, dict[str, tuple[np.ndarray, np.ndarray]]] | None:
    """(GPU, {"prefill-bearing": (starts, ends), "decode-only": (starts, ends)}): the engine steps as engine_steps
    cuts them, to split per-sample data (nsys GPU metrics) by phase; None when the trace shows no steps."""
    found = _steps(trace, win)
    if found is None:
        return None
    gaps, steps, _, on_gpu = found
    a, b = _bounds(steps, on_gpu)
    prefill = steps[:, CONTEXT_REQUESTS] > 0
    return gaps.device, {"prefill-bearing": (a[prefill], b[prefill]), "decode-only": (a[~prefill], b[~prefill])}


def engine_steps(trace: Trace, win: Window) -> dict[str, Any] | None:
    """The step view, or None when the trace shows no step boundaries (then the report says so)."""
    found = _steps(trace, win)
    if found is None:
        return None
    gaps, steps, source, on_gpu = found
    device, first, last = gaps.device, gaps.first, gaps.last
    a, b = _bounds(steps, on_gpu)
    # The gaps are idle time between GPU operations only: clip each step to the GPU's active span.
    ca = np.maximum(a, first)
    cb = np.maximum(ca, np.minimum(b, last))
    idle_ns = gaps.idle_in(ca, cb)  # inside the GPU's span: the gaps clipped to the step
    cycles = b - a
    busy = np.maximum(0, (cb - ca) - idle_ns)
    n = len(gaps.start)
    if on_gpu and n:
        # a step on the GPU starts at its first operation: its wait is the idle time just before it (the host
        # launching it), which ends the previous step's cycle
        k = np.clip(np.searchsorted(gaps.end, ca, side="left"), 0, n - 1)
        before = np.where(gaps.end[k] == ca, ca - gaps.start[k], 0)
        waits = np.minimum(before, np.append(np.int64(0), np.diff(a)))
    else:
        # the GPU's wait at the step's start: idle from the start to its next operation, the gap starting at or
        # before it (before the first operation of the trace, the time until it)
        j = np.searchsorted(gaps.start, ca, side="right") - 1
        j_end = gaps.end[np.clip(j, 0, max(n - 1, 0))] if n else np.zeros_like(ca)
        wait_ns = np.where((j >= 0) & (j_end > ca), j_end - ca, 0)
        waits = np.minimum(cycles, wait_ns + (ca - a))
    prefill = steps[:, CONTEXT_REQUESTS] > 0
    total = int(cycles.sum())
    stride = max(1, len(steps) // SERIES_MAX)

    def summary(mask: np.ndarray) -> dict[str, Any]:
        c, g = cycles[mask], busy[mask]
        c_sum, g_sum = int(c.sum()), int(g.sum())
        return {"count": len(c), "cycle_p50_ns": _quantile(c, 0.5), "cycle_p90_ns": _quantile(c, 0.9),
                "gpu_busy_p50_ns": _quantile(g, 0.5), "gpu_share": g_sum / c_sum if c_sum else None,
                "cycle_ns": c_sum, "gpu_busy_ns": g_sum, "work": _work(steps[mask])}

    shown = slice(0, len(steps), stride)
    lo, hi = (win.start_ns, win.end_ns) if win.bounded else (-(1 << 62), 1 << 62)
    dropped = trace.cache.get(f"steps dropped {lo} {hi}") or {}
    return {
        **({"dropped": {f"annotations {why}": n for why, n in sorted(dropped.items())}} if dropped else {}),
        "source": source,
        "device": device,
        "count": len(steps),
        "total_ns": total,
        "gpu_share": int(busy.sum()) / total if total else None,
        "wait_share": int(waits.sum()) / total if total else None,
        "wait_p50_ns": _quantile(waits, 0.5),
        "all": summary(np.ones(len(steps), dtype=bool)),
        "prefill": summary(prefill),
        "decode": summary(~prefill),
        "series": [{"cycle_ns": c, "gpu_busy_ns": g, "prefill": p} for c, g, p in
                   zip(cycles[shown].tolist(), busy[shown].tolist(), prefill[shown].tolist(), strict=True)],
    }


def _nvtx_steps(trace: Trace, lo: int, hi: int, device: int, counted_from: int) -> tuple[np.ndarray, int | None]:
    """A row (COLUMNS) per annotated step of GPU `device`, on the host's timeline, and the process that annotated
    them; the annotations left out are counted from those ending after `counted_from` (the window's start). Names
    repeat (decode steps of one batch size), so each distinct name is parsed once."""
    if "nvtx" not in trace.present:
        return _NO_STEPS, None
    rows = trace.query(
        "SELECT start, end, name, pid FROM nvtx WHERE name LIKE '%execute\\_%context\\_%' ESCAPE '\\' "
        "AND style != 'GPU' AND end > ? AND start < ? ORDER BY start", (lo, hi))
    rows = _of_process(trace, rows, device)
    pids = {pid for *_, pid in rows if isinstance(pid, int)}
    parsed: dict[str, tuple[int, ...] | None] = {}
    steps = []
    dropped: Counter[str] = Counter()
    seen: set[tuple[int, str]] = set()
    for start, end, name, _ in rows:
        if name not in parsed:
            parsed[name] = parse_step_name(name or "")
        fields = parsed[name]
        if fields is None:
            continue
        why = _inconsistent(fields) if end is not None and end > start else "of no length"
        if why is None and (start, name) in seen:
            why = "written twice in one process"
        if why is not None:
            if end is None or end > counted_from:
                dropped[why] += 1
            continue
        seen.add((start, name))
        steps.append((int(start), int(end), *fields))
    trace.cache[f"steps dropped {counted_from} {hi}"] = dict(dropped)
    return np.array(steps, dtype=np.int64).reshape(-1, len(COLUMNS)), (pids.pop() if len(pids) == 1 else None)


def _inconsistent(fields: tuple[int, ...]) -> str | None:
    """Why a step annotation cannot be what vLLM wrote, or None. Per phase (requests N, query tokens T, sequence
    lengths S, sum of query^2 QQ, sum of query x sequence QK), every request has a query of at least one token
    within its sequence: T >= N; S >= T (a context never shorter than its query); T <= QQ <= T^2 and QQ <= QK <=
    T x S (Cauchy-Schwarz bounds on the sums); no request, no tokens. (vLLM does annotate steps of no token: they
    stay, as steps.)"""
    for n, t, seq, qq, qk in (fields[0:5], fields[5:10]):
        if n == 0 and t > 0 or t < n:
            return "with more requests than tokens, or tokens without a request"
        if seq == UNKNOWN:
            continue
        if seq < t:
            return "with a context shorter than its query"
        if n and not (t <= qq <= t * t and qq <= qk <= t * seq):
            return "whose sums of squares cannot come from its token counts"
    return None


def _of_process(trace: Trace, rows: list[tuple], device: int) -> list[tuple]:
    """The annotations of the process that ran GPU `device`'s kernels: with tensor parallelism every rank's worker
    names the same steps. Where no kernel of the GPU names its process, the process that annotated most."""
    owner = [pid if isinstance(pid, int) else None for *_, pid in rows]
    owners = Counter(o for o in owner if o is not None)
    if len(owners) < 2:
        return rows
    found = trace.query("SELECT pid FROM kernels WHERE device = ? LIMIT 1", (device,))
    pid = found[0][0] if found and found[0][0] in owners else owners.most_common(1)[0][0]
    return [row for row, o in zip(rows, owner, strict=True) if o == pid]


def parse_step_name(name: str) -> tuple[int, ...] | None:
    """COLUMNS[2:] of a step annotation, short or detailed (None: not a step's name, or a number past what a step
    holds: MAX_FIELD keeps a million steps' sums inside int64)."""
    m = DETAILED_STEP.search(name)
    if m:
        fields = tuple(int(g) if len(g) < 16 else MAX_FIELD for g in m.groups())
    elif m := STEP.search(name):
        n, t, g_n, g_t = (int(g) if len(g) < 16 else MAX_FIELD for g in m.groups())
        fields = (n, t, UNKNOWN, UNKNOWN, UNKNOWN, g_n, g_t, UNKNOWN, UNKNOWN, UNKNOWN)
    else:
        return None
    return None if max(fields) >= MAX_FIELD else fields


def _work(rows: np.ndarray) -> dict[str, int | None] | None:
    """What a set of steps processed, summed per COLUMNS field (context_requests ... generation_qk); a field
    unknown for any step is None; None when the steps carry no token counts (kernel-derived steps)."""
    if not len(rows):
        return None
    out: dict[str, int | None] = {}
    for i, name in enumerate(COLUMNS[2:], start=2):
        column = rows[:, i]
        out[name] = None if (column == UNKNOWN).any() else int(column.sum())
    return out if out["context_tokens"] is not None and out["generation_tokens"] is not None else None


_NO_STEPS = np.zeros((0, len(COLUMNS)), dtype=np.int64)


def marker_ids(trace: Trace) -> dict[str, int]:
    """The string ids of the engine-step marker kernels the trace names ({name: id}; those it lacks left out)."""
    return dict(trace.query("SELECT value, id FROM strings WHERE value IN (?, ?, ?)",
                            (STEP_KERNEL, PREFILL_KERNEL, END_KERNEL)))


def _kernel_steps(trace: Trace, lo: int, hi: int, gaps: DeviceGaps) -> np.ndarray:
    """Steps from vLLM's per-step input kernel on the first GPU: each starts at the longest GPU idle time since
    the previous step's last kernel (binary searches over the gap arrays); prefill-bearing when the
    prefill-input kernel runs just before it. Token counts are not on the trace (UNKNOWN); context requests is 1
    for a prefill-bearing step, else 0."""
    device = gaps.device
    ids = marker_ids(trace)
    if STEP_KERNEL not in ids:
        return _NO_STEPS

    # the three marker kernels of the window in one columnar read (no query per kernel name or per step), or from
    # the kernel table's one read where it was made (analysis/scans.py)
    wanted = [ids[n] for n in (STEP_KERNEL, PREFILL_KERNEL, END_KERNEL) if n in ids]
    scan = trace.cache.get(KERNEL_SCAN)
    k = scan.marker_rows(wanted, int(device), int(lo), int(hi)) if scan is not None else None
    if k is None:
        k = read_columns(trace, "kernels", {"n": "name_id", "s": "start", "e": "end"},
                         where=f"name_id IN ({', '.join(str(int(i)) for i in wanted)}) AND device = {int(device)} "
                               f"AND start >= {int(lo)} AND start < {int(hi)}", seq_span=seq_bounds(trace, "kernels"))
    order = np.argsort(k["s"], kind="stable")
    name, start, end = k["n"][order], k["s"][order], k["e"][order]
    marks = start[name == ids[STEP_KERNEL]]
    if len(marks) < 2:
        return _NO_STEPS
    prefill = start[name == ids.get(PREFILL_KERNEL, -1)]
    ends = end[name == ids.get(END_KERNEL, -1)]
    # the prefill-input kernel runs just before its step's kernel: it belongs to the next mark at or after it
    flags = np.zeros(len(marks), dtype=np.int64)
    owner = np.searchsorted(marks, prefill, side="left")
    flags[owner[owner < len(marks)]] = 1
    # the previous step's end (else the mark itself: only the gap right before it counts)
    k_end = np.searchsorted(ends, marks, side="left")
    since = np.where(k_end > 0, ends[np.maximum(k_end - 1, 0)] if len(ends) else marks, marks)
    g_start, g_len = gaps.start, gaps.end - gaps.start
    a = np.searchsorted(g_start, since, side="left")
    b = np.searchsorted(g_start, marks, side="left")
    chosen = np.full(len(marks), -1, dtype=np.int64)
    # the longest gap starting between the previous step's end and the mark: a sparse-table range argmax
    has = (since < marks) & (b > a)
    if has.any() and len(g_len):
        chosen[has] = _range_argmax(g_len, a[has], b[has])
    # else the idle time straddling or ending at the mark
    i = np.searchsorted(g_start, marks, side="left") - 1
    straddle = (chosen < 0) & (i >= 0) & (gaps.end[np.maximum(i, 0)] >= marks if len(g_len) else False)
    chosen[straddle] = i[straddle]
    step_start = np.where(chosen >= 0, g_start[np.maximum(chosen, 0)] if len(g_len) else marks, marks)
    out = np.full((len(marks), len(COLUMNS)), UNKNOWN, dtype=np.int64)
    out[:, 0], out[:, 1], out[:, CONTEXT_REQUESTS] = step_start, marks, flags
    return out


def _range_argmax(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Index of the first maximum of values[lo:hi] for each (lo, hi), hi > lo, as np.argmax gives. The ranges
    between engine steps barely overlap, so their indexes laid end to end are about len(values): one
    maximum.reduceat over them, then the first index per range that reaches it. Ranges that overlap much
    (more than 4x the values in all) use a sparse table of argmaxes instead (O(n log n) memory)."""
    lengths = hi - lo
    total = int(lengths.sum())
    if total > 4 * len(values) + len(lo):
        return _sparse_argmax(values, lo, hi)
    offsets = np.cumsum(lengths) - lengths
    owner = np.repeat(np.arange(len(lo)), lengths)
    index = np.arange(total, dtype=np.int64) - offsets[owner] + lo[owner]
    v = values[index]
    peak = np.maximum.reduceat(v, offsets)
    hits = np.flatnonzero(v == peak[owner])
    return index[hits[np.searchsorted(owner[hits], np.arange(len(lo)))]]


def _sparse_argmax(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    n = len(values)
    table = [np.arange(n, dtype=np.int64)]
    width = 1
    while 2 * width <= n:
        prev = table[-1]
        left, right = prev[: n - 2 * width + 1], prev[width: n - width + 1]
        table.append(np.where(values[right] > values[left], right, left))
        width *= 2
    level = np.floor(np.log2(hi - lo)).astype(np.int64)
    out = np.empty(len(lo), dtype=np.int64)
    for lv in np.unique(level).tolist():
        sel = level == lv
        first, second = table[lv][lo[sel]], table[lv][hi[sel] - (1 << lv)]
        out[sel] = np.where(values[second] > values[first], second, first)
    return out
