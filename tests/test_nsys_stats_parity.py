"""profkit's breakdowns equal NVIDIA's own `nsys stats` on the same file, to the nanosecond.

Ground truth: the CSVs of `nsys stats` / `nsys analyze` (Nsight Systems 2025.3.1) run on exactly
these SQLite files, kept in tests/ground_truth/. Every CSV shipped beside the fixtures is
byte-identical to ours (checked below; eager_b1's and graphs_b1's were regenerated in shared/ on
2026-11-23, the earlier ones came from another recording).
"""

from __future__ import annotations

import csv
import filecmp
import re

import pytest

from tests.conftest import FIXTURES, GROUND_TRUTH, TOY

ALL = TOY + ["thr_graphs"]
# 1 s of a real `vllm serve` under nsys (its nsys stats: kernels, API, memory-op time, gpu_time_util)
SERVE = ["serve_frontend"]


def nsys_csv(name: str, report: str) -> list[dict[str, str]]:
    with (GROUND_TRUTH / f"{name}_{report}.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def r1(x: float) -> float:
    # nsys prints round(x, 1) computed by SQLite; compare at that precision.
    return round(float(x) + 0.0, 1)


def assert_stats(ours: dict, theirs: dict, count_col: str) -> None:
    assert ours["count"] == int(theirs[count_col])
    assert ours["total_ns"] == int(theirs["Total Time (ns)"])
    assert ours["min_ns"] == int(theirs["Min (ns)"])
    assert ours["max_ns"] == int(theirs["Max (ns)"])
    assert r1(ours["median_ns"]) == float(theirs["Med (ns)"])
    assert abs(ours["avg_ns"] - float(theirs["Avg (ns)"])) <= 0.05 + 1e-9
    assert abs(ours["stddev_ns"] - float(theirs["StdDev (ns)"])) <= 0.05 + 1e-6 * ours["stddev_ns"]


@pytest.mark.parametrize("name", TOY)
def test_shipped_fixture_csvs_match_regenerated(name: str) -> None:
    shipped = sorted((FIXTURES / "h100_toy" / name).glob(f"{name}_*.csv"))
    assert any(p.name == f"{name}_cuda_gpu_kern_sum.csv" for p in shipped)
    for path in shipped:
        assert filecmp.cmp(path, GROUND_TRUTH / path.name, shallow=False), path.name


@pytest.mark.parametrize("name", ALL + SERVE)
def test_kernel_summary_equals_cuda_gpu_kern_sum(name: str, report_all) -> None:
    ours = {k["name"]: k for k in report_all(name)["kernels"]}
    theirs = nsys_csv(name, "cuda_gpu_kern_sum")
    assert len(ours) == len(theirs)
    for row in theirs:
        assert_stats(ours[row["Name"]], row, "Instances")
    # Same order as nsys: total time descending.
    assert [k["name"] for k in report_all(name)["kernels"][:5]] == [r["Name"] for r in theirs[:5]]


@pytest.mark.parametrize("name", ALL + SERVE)
def test_api_summary_equals_cuda_api_sum(name: str, report_all) -> None:
    ours = {a["name"]: a for a in report_all(name)["api"]}
    theirs = nsys_csv(name, "cuda_api_sum")
    assert len(ours) == len(theirs)
    for row in theirs:
        assert_stats(ours[row["Name"]], row, "Num Calls")


@pytest.mark.parametrize("name", ALL + SERVE)
def test_memop_time_equals_cuda_gpu_mem_time_sum(name: str, report_all) -> None:
    ours = {m["operation"]: m for m in report_all(name)["memops"]}
    theirs = nsys_csv(name, "cuda_gpu_mem_time_sum")
    assert set(ours) == {r["Operation"] for r in theirs}
    for row in theirs:
        assert_stats(ours[row["Operation"]], row, "Count")


@pytest.mark.parametrize("name", ALL)
def test_memop_size_equals_cuda_gpu_mem_size_sum(name: str, report_all) -> None:
    ours = {m["operation"]: m for m in report_all(name)["memops"]}
    theirs = nsys_csv(name, "cuda_gpu_mem_size_sum")
    for row in theirs:
        m = ours[row["Operation"]]
        # nsys prints sizes in MB (10^6 bytes) with three decimals.
        assert round(m["bytes"] / 1e6, 3) == pytest.approx(float(row["Total (MB)"]), abs=0.0005)
        assert m["count"] == int(row["Count"])
        assert round(m["bytes_max"] / 1e6, 3) == pytest.approx(float(row["Max (MB)"]), abs=0.0005)
        assert round(m["bytes_median"] / 1e6, 3) == pytest.approx(float(row["Med (MB)"]), abs=0.0005)


@pytest.mark.parametrize("name", ALL)
def test_nvtx_summary_equals_nvtx_sum(name: str, report_all) -> None:
    ours = {(n["range"], n["style"]): n for n in report_all(name)["nvtx"]}
    theirs = nsys_csv(name, "nvtx_sum")
    assert len(ours) == len(theirs)
    for row in theirs:
        assert_stats(ours[(row["Range"], row["Style"])], row, "Instances")


@pytest.mark.parametrize("name", ALL + SERVE)
def test_utilization_equals_gpu_time_util(name: str, sqlite_path, report_all) -> None:
    """Every low-utilization region `nsys analyze gpu_time_util` reports has, over the same time
    range, our utilization (union of kernel and memory-op intervals): In-Use % sums op time
    clipped to the range, which equals the union where operations do not overlap, as here.
    Where it reports none, each of its equal chunks of the range was at 50 % or more, and so is the whole."""
    from profkit.analysis import timeline
    from profkit.analysis.window import Window
    from profkit.traces import open_trace

    rows = nsys_csv(name, "gpu_time_util")
    if not rows:
        assert report_all(name)["gpu"]["utilization"] >= 0.5
        return
    with open_trace(sqlite_path(name)) as trace:
        timeline.gpu_gaps(trace)
        for row in rows:
            start = int(row["Start (ns)"])
            win = Window(start, start + int(row["Duration (ns)"]), "explicit")
            tl = timeline.gpu_timeline(trace, win)
            assert round(tl.utilization * 100, 1) == float(row["In-Use (%)"]), row


# `nsys analyze gpu_time_util` cuts its range (first GPU operation's start to the last one's end) into 30 chunks
# of ceil(range / 30) ns, the last one ending at the range's end, and lists the chunks under 50 % busy, neighbours
# merged: every row starts on a chunk boundary and ends on one or at the range's end. graphs_b64 and swap_b16 list
# none (test_utilization_equals_gpu_time_util checks those).
GPU_TIME_UTIL_CHUNKS = 30


@pytest.mark.parametrize("name", [n for n in ALL + SERVE if nsys_csv(n, "gpu_time_util")])
def test_whole_window_equals_gpu_time_util_range(name: str, report_all) -> None:
    """Window `all` is gpu_time_util's range, not merely around its rows: the rows fall on the chunk grid the
    window gives, a row from the first chunk starts at the window's start and one to the last ends at its end."""
    window = report_all(name)["window"]
    start, end = window["start_ns"], window["end_ns"]
    chunk = -(-(end - start) // GPU_TIME_UTIL_CHUNKS)
    for row in nsys_csv(name, "gpu_time_util"):
        row_start = int(row["Start (ns)"])
        row_end = row_start + int(row["Duration (ns)"])
        assert start <= row_start < row_end <= end and (row_start - start) % chunk == 0, (row, start, end)
        assert row_end == end or (row_end - start) % chunk == 0, (row, start, end)


# `nsys analyze gpu_gaps` (default: gaps of 500 ms and more, the whole trace) found rows only in thr_graphs (the
# whole vLLM process: start-up and compilation pauses); raising the threshold keeps its rows at or above it. Two
# thresholds are the exact length of one of its rows (the shortest, the tenth longest): that row is "at least" it.
_THR_GAPS = sorted((int(r["Duration (ns)"]) for r in nsys_csv("thr_graphs", "gpu_gaps")), reverse=True)
GAP_THRESHOLDS_NS = [ms * 1_000_000 for ms in (500, 1000, 2000, 10000)] + [_THR_GAPS[-1], _THR_GAPS[9]]


@pytest.mark.parametrize("threshold", GAP_THRESHOLDS_NS)
def test_long_gaps_equal_gpu_gaps_rule(threshold: int, sqlite_path) -> None:
    """The report's gaps at a threshold are exactly nsys's gpu_gaps rows at or above it (start and length)."""
    from profkit.report import ReportOptions, build_report

    theirs = {(int(r["Start (ns)"]), int(r["Duration (ns)"])) for r in nsys_csv("thr_graphs", "gpu_gaps")
              if int(r["Duration (ns)"]) >= threshold}
    assert 0 < len(theirs) <= 50  # the report lists the 50 longest
    options = ReportOptions(window="all", gap_threshold_ns=threshold)
    report = build_report(sqlite_path("thr_graphs"), options=options).document()
    assert {(g["start_ns"], g["duration_ns"]) for g in report["gaps"]} == theirs


@pytest.mark.parametrize("name", TOY)
def test_no_gap_of_500ms_where_gpu_gaps_found_none(name: str, report_all) -> None:
    """nsys's gpu_gaps found no gap of 500 ms or more in the toy traces (an empty CSV): profkit's longest gap
    there is shorter, though there are gaps (the report lists them at its 100 us threshold)."""
    assert nsys_csv(name, "gpu_gaps") == []
    report = report_all(name)
    assert report["gaps"] and 0 < report["facts"]["gaps.max_ns"] < 500_000_000


# `nsys analyze` rules list at most 50 rows (their `rows` option's default), longest first: a CSV of 50 rows
# holds the 50 longest, a shorter one every row. cuda_api_sync lists cudaDeviceSynchronize and
# cudaStreamSynchronize calls (thr_graphs' 30 ms cudaEventSynchronize is not among its rows); cuda_memcpy_async
# lists copies from cudaMemcpyAsync calls with pageable host memory on either side.
NSYS_ROWS = 50
NSYS_SYNC_APIS = ("cudaDeviceSynchronize", "cudaStreamSynchronize")
# What the sync-stall facts count, by this test's own pattern (not profkit's list): device, stream, event and
# context synchronizes and a stream waiting on an event, runtime (cuda) or driver (cu) API.
SYNC_CALL = re.compile(r"cu(da)?(Device|Stream|Event|Ctx)Synchronize|cu(da)?StreamWaitEvent")


def _base(api: str) -> str:
    return api.rsplit("_v", 1)[0] if re.search(r"_v\d+$", api) else api


def assert_listed(ours: list[tuple], theirs: list[tuple]) -> None:
    """`theirs` (an nsys rule's rows, duration first) is our list as nsys lists it: all of it when shorter than
    the row limit, else its longest rows (equal durations; ties at the cut may list either copy)."""
    ours, theirs = sorted(ours, reverse=True), sorted(theirs, reverse=True)
    if len(theirs) < NSYS_ROWS:
        assert ours == theirs
    else:
        assert [row[0] for row in ours[:NSYS_ROWS]] == [row[0] for row in theirs]
        assert set(theirs) <= set(ours)


def _in(window: dict, start: int) -> bool:
    """Whether the report's window counts an event starting at `start` (window `all`: every event)."""
    return window["how"] == "whole" or window["start_ns"] <= start < window["end_ns"]


@pytest.mark.parametrize("name", ALL)
def test_sync_calls_equal_cuda_api_sync(name: str, sqlite_path, report_all) -> None:
    """Every synchronizing call `nsys analyze cuda_api_sync` lists is one of the trace's, with its start and
    length; the sync-stall rule's evidence (sync.calls, sync.api_ns) counts each of them in the window."""
    from profkit.traces import open_trace

    theirs = [(int(r["Duration (ns)"]), int(r["Start (ns)"]), r["API Name"]) for r in nsys_csv(name, "cuda_api_sync")]
    with open_trace(sqlite_path(name)) as trace:
        calls = trace.query("SELECT a.end - a.start, a.start, s.value FROM api a JOIN strings s ON s.id = a.name_id")
    sync = [c for c in calls if SYNC_CALL.fullmatch(_base(c[2]))]
    assert_listed([c for c in sync if _base(c[2]) in NSYS_SYNC_APIS], theirs)
    report = report_all(name)
    counted = [c for c in sync if _in(report["window"], c[1])]
    facts = report["facts"]
    assert (facts["sync.calls"], facts["sync.api_ns"]) == (len(counted), sum(c[0] for c in counted))
    listed_here = [t for t in theirs if _in(report["window"], t[1])]
    assert set(listed_here) <= set(counted) and listed_here
    if len(theirs) < NSYS_ROWS and all(_base(c[2]) in NSYS_SYNC_APIS for c in sync):  # nsys's list is complete
        assert (facts["sync.calls"], facts["sync.api_ns"]) == (len(theirs), sum(t[0] for t in theirs))


@pytest.mark.parametrize("name", ALL)
def test_pageable_copies_equal_cuda_memcpy_async(name: str, sqlite_path, report_all) -> None:
    """The copies profkit classifies as pageable are the ones `nsys analyze cuda_memcpy_async` lists (start,
    length, source and destination kind, size), and the pageable-transfer facts count each of them: none where
    nsys lists none (thr_graphs' pinned copies are not among them)."""
    from profkit.traces import open_trace

    theirs = [(int(r["Duration (ns)"]), int(r["Start (ns)"]), r["Src Kind"], r["Dst Kind"], float(r["Bytes (MB)"]))
              for r in nsys_csv(name, "cuda_memcpy_async")]
    with open_trace(sqlite_path(name)) as trace:
        copies = trace.query("SELECT end - start, start, src_kind, dst_kind, bytes FROM memops "
                             "WHERE operation != '[CUDA memset]'")
    pageable = [c for c in copies if "Pageable" in (c[2], c[3])]
    assert_listed([(*c[:4], round(c[4] / 1e6, 3)) for c in pageable], theirs)
    report = report_all(name)
    counted = [c for c in pageable if _in(report["window"], c[1])]
    facts = report["facts"]
    assert (facts["memops.pageable_count"], facts["memops.pageable_ns"], facts["memops.pageable_bytes"]) == (
        len(counted), sum(c[0] for c in counted), sum(c[4] for c in counted))
    assert facts["memops.pageable_count"] >= sum(_in(report["window"], t[1]) for t in theirs)
    kinds = [k for k in report["memory_kinds"] if "Pageable" in (k["src_kind"], k["dst_kind"])]
    assert sum(k["count"] for k in kinds) == facts["memops.pageable_count"]
    if not theirs:
        assert facts["memops.pageable_count"] == 0 and not kinds
