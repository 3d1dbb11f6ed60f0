"""The engine-step view on real vLLM 0.26 torch traces (H100): every step's GPU busy time equals an
independent brute-force union of the trace's own GPU events inside the step."""

from __future__ import annotations

import json
import re

import pytest

from profkit.report import build_report
from profkit.traces import open_trace
from tests.conftest import FIXTURES, REPO

TRACES = {"vllm_torch_profile": FIXTURES / "h100_vllm" / "torch_profile",
          "capture_thr_torch": REPO / "samples" / "capture_thr_torch"}
STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def brute_force(path) -> list[tuple[int, int, bool]]:
    """(cycle, GPU busy, prefill) per step from the raw events: a plain Python union per step."""
    with open_trace(path) as trace:
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
    doc = build_report(TRACES[name], window="all")
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
    doc = build_report(sqlite_path("graphs_b1"))
    assert doc["steps"] is None and doc["facts"]["steps.count"] is None
