"""The engine-step view on real vLLM 0.26 torch traces (H100): every step's GPU busy time equals an
independent brute-force union of the trace's own GPU events inside the step."""

from __future__ import annotations

import json
import re

import pytest

from profkit.evidence.folder import CaptureFolder
from profkit.report import ReportOptions, build_report
from profkit.traces import open_trace
from tests.conftest import FIXTURES, REPO

TRACES = {"vllm_torch_profile": FIXTURES / "h100_vllm" / "torch_profile",
          "capture_thr_torch": REPO / "samples" / "capture_thr_torch"}
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def brute_force(path) -> list[tuple[int, int, bool]]:
    """(cycle, GPU busy, prefill) per step from the raw events: a plain Python union per step."""
    with open_trace(CaptureFolder(path).traces()[0]) as trace:
        marks = [(s, e, n) for s, e, n in trace.query("SELECT start, end, name FROM nvtx WHERE style = 'CPU' "
                                                      "ORDER BY start") if STEP.search(n)]
        ops = sorted(trace.query("SELECT start, end FROM kernels UNION ALL SELECT start, end FROM memops"))
    out = []
    for i, (a, end, name) in enumerate(marks):
        b = marks[i + 1][0] if i + 1 < len(marks) else max(end, a + 1)
        busy, cur_s, cur_e = 0, None, None
        for s, e in ops:
            s, e = max(s, a), min(e, b)
            if e <= s:
                continue
            if cur_e is None or s > cur_e:
                busy += (cur_e - cur_s) if cur_e is not None else 0
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        busy += (cur_e - cur_s) if cur_e is not None else 0
        out.append((b - a, busy, int(STEP.search(name).group(1)) > 0))
    return out


@pytest.mark.parametrize("name", sorted(TRACES))
def test_steps_equal_a_brute_force_union(name: str) -> None:
    doc = build_report(TRACES[name], options=ReportOptions(window="all")).document()
    steps = doc["steps"]
    expected = brute_force(TRACES[name])
    assert steps["count"] == len(expected) > 30
    assert [(s["cycle_ns"], s["gpu_busy_ns"], s["prefill"]) for s in steps["series"]] == expected
    assert steps["gpu_share"] == pytest.approx(sum(b for _, b, _ in expected) / sum(c for c, _, _ in expected))
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
