"""profkit's breakdowns equal NVIDIA's own `nsys stats` on the same file, to the nanosecond.

Ground truth: the CSVs of `nsys stats` / `nsys analyze` (Nsight Systems 2025.3.1) run on exactly
these SQLite files, kept in tests/ground_truth/. Every CSV shipped beside the fixtures is
byte-identical to ours (checked below; eager_b1's and graphs_b1's were regenerated in shared/ on
2026-11-23, the earlier ones came from another recording).
"""

from __future__ import annotations

import csv
import filecmp

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
def test_utilization_equals_gpu_time_util(name: str, sqlite_path) -> None:
    """Every low-utilization region `nsys analyze gpu_time_util` reports has, over the same time
    range, our utilization (union of kernel and memory-op intervals): In-Use % sums op time
    clipped to the range, which equals the union where operations do not overlap, as here."""
    from profkit.analysis import timeline
    from profkit.analysis.window import Window
    from profkit.traces import open_trace

    rows = nsys_csv(name, "gpu_time_util")
    if not rows:
        pytest.skip("gpu_time_util found no region under 50 % in this trace")
    with open_trace(sqlite_path(name)) as trace:
        timeline.build_gap_table(trace)
        for row in rows:
            start = int(row["Start (ns)"])
            win = Window(start, start + int(row["Duration (ns)"]), "explicit")
            tl = timeline.gpu_timeline(trace, win)
            assert round(tl.utilization * 100, 1) == float(row["In-Use (%)"]), row


@pytest.mark.parametrize("name", ALL + SERVE)
def test_whole_window_equals_gpu_time_util_range(name: str, report_all) -> None:
    """Window `all` spans first GPU op start to last GPU op end, like gpu_time_util's range."""
    report = report_all(name)
    for row in nsys_csv(name, "gpu_time_util"):
        assert int(row["Start (ns)"]) >= report["window"]["start_ns"]
        assert int(row["Start (ns)"]) + int(row["Duration (ns)"]) <= report["window"]["end_ns"]


@pytest.mark.parametrize("name", ALL)
def test_long_gaps_equal_gpu_gaps_rule(name: str, sqlite_path) -> None:
    """Gaps >= 500 ms (the `nsys analyze gpu_gaps` default) match that rule's rows exactly."""
    from profkit.report import build_report

    theirs = {(int(r["Start (ns)"]), int(r["Duration (ns)"])) for r in nsys_csv(name, "gpu_gaps")}
    report = build_report(sqlite_path(name), window="all", gap_threshold_ns=500_000_000).document()
    ours = {(g["start_ns"], g["duration_ns"]) for g in report["gaps"]}
    assert len(ours) == min(50, len(theirs))  # the report lists the 50 longest
    assert ours <= theirs
    if len(theirs) > 50:
        assert min(d for _, d in ours) >= sorted((d for _, d in theirs), reverse=True)[49]
