"""The engine-step view on real vLLM 0.26 torch traces (H100): every step, moved onto the GPU by the correlation ids
of what it launched, has the GPU busy time of an independent brute-force union of the trace's own GPU events inside
it."""

from __future__ import annotations

import json
import re

import pytest

from profkit.evidence.folder import CaptureFolder
from profkit.report import ReportOptions, build_report
from profkit.traces import open_trace
from tests.conftest import FIXTURES, REPO
from tests.steps_by_hand import place, union

TRACES = {"vllm_torch_profile": FIXTURES / "h100_vllm" / "torch_profile",
          "capture_thr_torch": REPO / "samples" / "capture_thr_torch"}
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def brute_force(path) -> tuple[list[tuple[int, int, bool]], list[int]]:
    """(cycle, GPU busy, prefill) per step from the raw events, in plain Python: each annotated step moved onto the
    GPU (from the first kernel or memory operation its CUDA calls launched, the calls made from its annotation's
    start to the next one's, joined by correlation id; one that launched nothing kept: its host start moved by the
    median lag, between its neighbours), its cycle to the next step's GPU start, its busy time the union of the GPU's
    operations inside that cycle; a step the trace cut (holding its first or last operation, or launching nothing
    kept while the GPU worked) left out, its time given to none.
    And each step's wait: the GPU's idle time just before its first operation, within the step before's cycle."""
    with open_trace(CaptureFolder(path).traces()[0]) as trace:
        marks = [(s, e, n) for s, e, n in trace.query("SELECT start, end, name FROM nvtx WHERE style = 'CPU' "
                                                      "ORDER BY start") if STEP.search(n)]
        calls = trace.query("SELECT start, correlation FROM api WHERE correlation IS NOT NULL")
        ops = sorted(trace.query("SELECT start, end, correlation FROM kernels UNION ALL "
                                 "SELECT start, end, correlation FROM memops"))
    placed = place([(a, e) for a, e, _ in marks], calls, ops, (min(s for s, _, _ in ops), max(e for _, e, _ in ops)))
    starts, ends, kept, first = placed.starts, placed.ends, placed.kept, placed.first
    out = []
    for i in kept:
        name = marks[i][2]
        a, b = starts[i], ends[i]
        busy = union([(max(s, a), min(e, b)) for s, e, _ in ops if min(e, b) > max(s, a)])
        out.append((b - a, busy, int(STEP.search(name).group(1)) > 0))
    waits = []
    for k, i in enumerate(kept):
        # (a step that launched nothing the trace kept has no first operation to wait for)
        idle = starts[i] - max((e for s, e, _ in ops if s < starts[i]), default=starts[i]) if i in first else 0
        waits.append(min(max(idle, 0), starts[i] - starts[kept[k - 1]] if k else 0))
    return out, waits


@pytest.mark.parametrize("name", sorted(TRACES))
def test_steps_equal_a_brute_force_union(name: str) -> None:
    doc = build_report(TRACES[name], options=ReportOptions(window="all")).document()
    steps = doc["steps"]
    expected, waits = brute_force(TRACES[name])
    assert steps["count"] == len(expected) > 30
    assert [(s["cycle_ns"], s["gpu_busy_ns"], s["prefill"]) for s in steps["series"]] == expected
    assert steps["gpu_share"] == pytest.approx(sum(b for _, b, _ in expected) / sum(c for c, _, _ in expected))
    assert steps["wait_share"] == pytest.approx(sum(waits) / sum(c for c, _, _ in expected))
    assert steps["prefill"]["count"] == sum(p for _, _, p in expected) >= 1
    f = doc["facts"]
    assert f["steps.count"] == len(expected) and 0 < f["steps.gpu_share"] < 1
    json.dumps(doc)  # serialisable


def test_no_annotations_no_steps(sqlite_path) -> None:
    doc = build_report(sqlite_path("graphs_b1")).document()
    assert doc["steps"] is None and doc["facts"]["steps.count"] is None


def brute_force_kernel_steps(path) -> list[tuple[int, int, int, bool]]:
    """(cycle, GPU busy, wait at the start, prefill) per step of an nsys trace without step annotations,
    from the raw events in plain Python: a step starts at the longest GPU idle time between the previous
    `_post_update_kernel`'s end and its `_prepare_pos_seq_lens_kernel`."""
    with open_trace(path) as trace:
        named = trace.query("SELECT k.start, k.end, s.value FROM kernels k JOIN strings s ON s.id = k.name_id "
                            "WHERE s.value IN ('_prepare_pos_seq_lens_kernel', '_prepare_prefill_inputs_kernel', "
                            "'_post_update_kernel') AND k.device = 0 ORDER BY k.start")
        ops = sorted(trace.query("SELECT start, end FROM kernels WHERE device = 0 UNION ALL "
                                 "SELECT start, end FROM memops WHERE device = 0"))
    idle, reach = [], ops[0][1]  # (start, end) of every GPU idle interval
    for s, e in ops[1:]:
        if s > reach:
            idle.append((reach, s))
        reach = max(reach, e)
    marks = [s for s, _, n in named if n == "_prepare_pos_seq_lens_kernel"]
    starts, prefill = [], []
    for i, mark in enumerate(marks):
        prev_end = max((e for s, e, n in named if n == "_post_update_kernel" and e < mark), default=mark)
        inside = [g for g in idle if prev_end <= g[0] < mark]
        straddle = [g for g in idle if g[0] < mark <= g[1]]
        gap = max(inside, key=lambda g: g[1] - g[0]) if inside else (straddle[-1] if straddle else (mark, mark))
        starts.append(gap)
        lo = marks[i - 1] if i else -1
        prefill.append(any(n == "_prepare_prefill_inputs_kernel" and lo < s <= mark for s, _, n in named))
    out = []
    for i, (a, gap_end) in enumerate(starts):
        b = starts[i + 1][0] if i + 1 < len(starts) else max(marks[i], a + 1)
        lo_op, hi_op = max(a, ops[0][0]), min(b, reach)
        gaps = sum(max(0, min(e, hi_op) - max(s, lo_op)) for s, e in idle)
        busy = max(0, hi_op - lo_op) - gaps
        wait = min(b - a, max(0, min(gap_end, b) - a) + max(0, ops[0][0] - a))
        out.append((b - a, busy, wait, prefill[i]))
    return out


def test_nsys_steps_from_vllms_own_kernels(sqlite_path) -> None:
    """An nsys trace of `vllm serve` (1 s of the frontend-bound H100 run) has no step annotations: the steps
    come from vLLM's per-step kernels, each with the host's scheduling gap before it, checked against a
    brute-force pass over the raw events. The offline throughput trace gives its prefill steps too."""
    for name, count, prefills in (("serve_frontend", 23, 23), ("thr_graphs", 139, 11)):
        doc = build_report(sqlite_path(name), options=ReportOptions(window="all")).document()
        steps = doc["steps"]
        expected = brute_force_kernel_steps(sqlite_path(name))
        assert steps["source"].startswith("vLLM's per-step input kernels")
        assert steps["count"] == len(expected) == count
        assert steps["prefill"]["count"] == sum(p for *_, p in expected) == prefills
        assert [(s["cycle_ns"], s["gpu_busy_ns"], s["prefill"]) for s in steps["series"]] == \
            [(c, b, p) for c, b, _, p in expected]
        assert steps["wait_share"] == pytest.approx(sum(w for _, _, w, _ in expected) / sum(c for c, *_ in expected))
    # the frontend-bound server: each step starts after a ~2.5 ms GPU wait while the host schedules it
    doc = build_report(sqlite_path("serve_frontend"), options=ReportOptions(window="all")).document()
    assert 2_000_000 < doc["steps"]["wait_p50_ns"] < 3_000_000 and doc["facts"]["steps.wait_share"] > 0.1


def test_a_14b_trace_steps_take_the_gpu_time_of_what_they_launched(tmp_path) -> None:
    """The 14B on the H100 (tests/data/h100_phases/bf16, nsys, asynchronous scheduling): the GPU runs behind vLLM's
    step annotations (decode steps 7-27 ms, a prompt's step up to 0.6 s), so a step's host range holds the end of
    the step before it. Read with raw SQL on the nsys export: each prompt-bearing step's own kernels (launched from
    its annotation's start to the next one's, joined by correlation id) against the step view's GPU busy time. The
    host's ranges had given the step of 1,024 prompt tokens 437 ms of GPU time; its kernels took 93."""
    import sqlite3
    import tarfile

    import numpy as np

    with tarfile.open(REPO / "tests" / "data" / "h100_phases" / "bf16.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "bf16"
    conn = sqlite3.connect(f"file:{folder / 'trace.sqlite'}?mode=ro", uri=True)
    marks = [(s, t, g >> 24) for s, t, g in conn.execute(
        "SELECT n.start, coalesce(s.value, n.text), n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s "
        "ON n.textId = s.id ORDER BY n.start") if t and re.match(r"execute_\d+_context_\d+\(", t)]
    pid = marks[0][2]
    calls = np.array(conn.execute("SELECT start, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE "
                                  "globalTid >> 24 = ?", (pid,)).fetchall(), dtype=np.int64)
    kernels = np.array(conn.execute("SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall(),
                       dtype=np.int64)
    conn.close()
    starts = np.array([s for s, _, _ in marks])
    step_of = dict(zip(calls[:, 1].tolist(), (np.searchsorted(starts, calls[:, 0], side="right") - 1).tolist(),
                       strict=True))
    own: dict[int, list[tuple[int, int]]] = {}
    for s, e, c in kernels.tolist():
        if (i := step_of.get(c, -1)) >= 0:
            own.setdefault(i, []).append((s, e))
    first, last = int(kernels[:, 0].min()), int(kernels[:, 1].max())

    # prompt-bearing steps whose kernels the trace holds whole (not its first or last kernel's)
    prompted = [union(own[i]) for i, (_, t, _) in enumerate(marks)
                if i in own and not re.match(r"execute_\d+_context_0\(", t)
                and min(s for s, _ in own[i]) > first and max(e for _, e in own[i]) < last]
    doc = build_report(folder).document()  # the window: the GPU's active span, which the trace's kernels cover
    assert doc["steps"]["source"].endswith("each from the first GPU operation it launched")
    busy = [s["gpu_busy_ns"] for s in doc["steps"]["series"] if s["prefill"]]
    assert len(busy) == len(prompted) == 4
    for measured, truth in zip(busy, prompted, strict=True):
        assert measured == pytest.approx(truth, rel=0.01)  # the cycle's busy time: its own kernels and copies
    assert min(prompted) == pytest.approx(93e6, rel=0.02)


def test_a_trace_whose_calls_name_no_kernel_keeps_the_host_ranges(tmp_path) -> None:
    """A trace whose CUDA calls carry no correlation id (NULL): nothing joins a step to its kernels, so the steps
    stay on the host's ranges; the report runs and the trace is not written."""
    import hashlib
    import sqlite3
    import tarfile

    with tarfile.open(REPO / "tests" / "data" / "h100_phases" / "bf16.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "bf16"
    conn = sqlite3.connect(folder / "trace.sqlite")
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = NULL")
    conn.commit()
    conn.close()
    digest = hashlib.sha256((folder / "trace.sqlite").read_bytes()).hexdigest()
    steps = build_report(folder, options=ReportOptions(window="all")).document()["steps"]
    assert not steps["source"].endswith("each from the first GPU operation it launched")
    # the annotations as the trace holds them (the host's ranges): every one of the 543
    assert steps["count"] == 543
    assert hashlib.sha256((folder / "trace.sqlite").read_bytes()).hexdigest() == digest
