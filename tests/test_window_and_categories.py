"""Automatic steady-state window on a real whole-process vLLM trace; kernel categories on real names."""

from __future__ import annotations

import csv
import json

import pandas as pd
import pytest

from profkit.analysis.categories import categorize
from profkit.report import ReportOptions, build_report
from tests.conftest import FIXTURES, GROUND_TRUTH


@pytest.fixture(scope="module")
def vllm_auto(sqlite_path) -> dict:
    return build_report(sqlite_path("thr_graphs"), options=ReportOptions(window="auto")).document()


def test_auto_window_finds_the_benchmark_phase(vllm_auto: dict, report_all) -> None:
    bench = json.loads((FIXTURES / "h100_vllm" / "thr_graphs.json").read_text())
    win = vllm_auto["window"]
    whole = report_all("thr_graphs")["window"]
    assert win["how"] == "steady-state"
    assert len(win["phases"]) > 5  # start-up: loading, profiling run, compile, graph capture, warm-up
    # The benchmark's own elapsed time (1.77 s) against a 157 s whole-process trace.
    assert abs(win["duration_ns"] / 1e9 - bench["elapsed_time"]) < 0.15 * bench["elapsed_time"]
    assert win["end_ns"] == whole["end_ns"]  # the benchmark runs last
    # Inside the benchmark vLLM replays CUDA graphs; over the whole trace most kernels are start-up.
    assert vllm_auto["facts"]["kernels.graph_share"] > 0.8
    assert report_all("thr_graphs")["facts"]["kernels.graph_share"] < vllm_auto["facts"]["kernels.graph_share"]
    assert vllm_auto["gpu"]["utilization"] > 5 * report_all("thr_graphs")["gpu"]["utilization"]


def test_auto_window_on_a_capture_range_trace_is_the_whole_gpu_span(report_all, sqlite_path) -> None:
    auto = build_report(sqlite_path("hostgap_b16"), options=ReportOptions(window="auto")).document()
    assert auto["window"]["start_ns"] == report_all("hostgap_b16")["window"]["start_ns"]
    assert auto["window"]["duration_ns"] == report_all("hostgap_b16")["window"]["duration_ns"]


REAL_NAMES = {
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN": "gemm",
    "void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16, float>": "gemm",
    "triton_poi_fused_mul_silu_slice_1": "activation/elementwise",
    "triton_red_fused_fused_add_rms_norm_2": "norm",
    "_gumbel_sample_kernel": "sampling",
    "_combine_sampled_and_draft_tokens_kernel": "sampling",
    "_gather_block_tables_kernel": "memory",
    "void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<int>, "
    "std::array<char *, (unsigned long)1>>(int, T2, T3)": "memory",
}


# From traces nobody here wrote (tests/data/foreign and the survey of public traces)
REAL_NAMES.update({
    # AMD Tensile/hipBLASLt GEMM on an MI300X (TraceLens bert-small trace)
    "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1": "gemm",
    # a plain CUTLASS GEMM whose layout argument is `NoPermute`: not MoE (nsys 2023.2 export, A100)
    "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<cutlass::gemm::threadblock::MmaPipelined<"
    "cutlass::gemm::GemmShape<(int)128, (int)128, (int)32>, (bool)0, cutlass::layout::NoPermute>>>": "gemm",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "communication",
    # real kernel names from public profiles (found with the code search): DeepEP, Blackwell FP8 batched GEMM,
    # TensorRT-LLM's MoE finalize (it names cutlass types yet combines expert outputs)
    "void deep_ep::internode::dispatch<false, 4, false, 7, 4>(int4*, float*, long*, float*, "
    "deep_ep::internode::SourceMeta*, int4 const*, ...)": "communication",
    "bmm_E4m3_E4m3E4m3_Fp32_t128x8x128u2_s8_et64x8_m64x8x32_c1x1x1_rM_TN_transOut_noShfl_dsFp8_schPd4x2x2x3_bN_tma_"
    "tmaSf_rgTma_clmp_lbW2_dynB_sm100f": "gemm",
    "void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, "
    "cutlass::bfloat16_t, 4": "moe",
})


@pytest.mark.parametrize(("name", "category"), REAL_NAMES.items())
def test_category_of_real_vllm_names(name: str, category: str) -> None:
    assert categorize(name) == category


def test_categories_over_the_real_vllm_kernels() -> None:
    rows = list(csv.DictReader((GROUND_TRUTH / "thr_graphs_cuda_gpu_kern_sum.csv").open()))
    by_name = {r["Name"]: categorize(r["Name"]) for r in rows}
    flash = [n for n in by_name if "FlashAttnFwd" in n]
    assert flash and all(by_name[n] == "attention" for n in flash)  # FA3 cutlass::device_kernel, not gemm
    cache = [n for n in by_name if "reshape_and_cache_flash" in n]
    assert cache and all(by_name[n] == "memory" for n in cache)  # a KV-cache write, though named "flash"
    other = sum(float(r["Time (%)"]) for r in rows if by_name[r["Name"]] == "other")
    assert other < 1.0  # the table names where (almost) all of vLLM's GPU time goes


def test_categories_over_the_toy_engine(report_all) -> None:
    cats = {c["category"]: c["share"] for c in report_all("prefill_long")["categories"]}
    assert cats["gemm"] > 0.4 and cats["attention"] > 0.05
    names = {k["name"]: k["category"] for k in report_all("eager_b1")["kernels"]}
    sdpa = [n for n in names if "sdpa" in n]
    assert sdpa and all(names[n] == "attention" for n in sdpa)
    assert all(names[n] == "norm" for n in names if "layer_norm" in n)


@pytest.mark.parametrize("name", ["eager_b1", "hostgap_b16", "swap_b16", "thr_graphs"])
def test_timeline_pieces_add_up(name: str, report_all) -> None:
    """Gap classes, utilization-over-time buckets and per-device busy/idle describe the same idle time."""
    r = report_all(name)
    idle = r["gpu"]["idle_ns"]
    assert sum(c["idle_ns"] for c in r["gap_classes"].values()) == idle  # window `all` = the GPU span
    t = r["timeline"]
    width, series = t["bucket_ns"], t["busy_fraction"]["0"]
    busy_from_buckets = sum(f * min(width, r["window"]["end_ns"] - (t["start_ns"] + i * width))
                            for i, f in enumerate(series))
    assert busy_from_buckets == pytest.approx(r["gpu"]["busy_ns"], rel=1e-3)
    assert r["gpu"]["busy_ns"] + idle == r["window"]["duration_ns"]


@pytest.mark.parametrize("name", ["hostgap_b16", "sync_b16", "swap_b16"])
def test_gap_neighbours_and_host_api_from_the_raw_tables(name: str, report_all, sqlite_path) -> None:
    """Each listed gap's before/after operations and host API calls, checked against the raw export."""
    import sqlite3

    conn = sqlite3.connect(f"file:{sqlite_path(name)}?mode=ro", uri=True)
    ops = """SELECT s.value AS label, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k
             JOIN StringIds s ON s.id = k.demangledName
             UNION ALL SELECT '[CUDA memcpy ' || e.label || ']', m.start, m.end FROM CUPTI_ACTIVITY_KIND_MEMCPY m
             JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind
             UNION ALL SELECT '[CUDA memset]', start, end FROM CUPTI_ACTIVITY_KIND_MEMSET"""
    for gap in report_all(name)["gaps"][:10]:
        g0, g1 = gap["start_ns"], gap["start_ns"] + gap["duration_ns"]
        ended = {r[0] for r in conn.execute(f"SELECT label FROM ({ops}) WHERE end = ?", (g0,))}
        started = {r[0] for r in conn.execute(f"SELECT label FROM ({ops}) WHERE start = ?", (g1,))}
        assert gap["before"] in ended and gap["after"] in started
        # Nothing ran on the GPU inside the gap.
        assert conn.execute(f"SELECT count(*) FROM ({ops}) WHERE start < ? AND end > ?", (g1, g0)).fetchone()[0] == 0
        calls = conn.execute(
            """SELECT s.value, sum(min(r.end, ?) - max(r.start, ?)) AS o FROM CUPTI_ACTIVITY_KIND_RUNTIME r
               JOIN StringIds s ON s.id = r.nameId WHERE r.start < ? AND r.end > ? GROUP BY r.nameId
               ORDER BY o DESC LIMIT 1""", (g1, g0, g1, g0)).fetchall()
        if calls:
            assert gap["host_api"][0]["overlap_ns"] == calls[0][1]
        else:
            assert gap["host_api"] == []


@pytest.mark.parametrize("value", ["end - start", "start - end", "end * 1000000"], ids=["dur", "negative", "huge"])
def test_id_histogram_equals_the_group_by(sqlite_path, value: str) -> None:
    # The packed-key upsert must give the GROUP BY's histogram row for row, and fall back to it for
    # values the packing cannot hold (negative durations, timestamps far beyond the value range).
    from profkit.analysis.stats import histogram, id_histogram
    from profkit.traces import open_trace

    with open_trace(sqlite_path("thr_graphs")) as trace:
        src = f"SELECT name_id, {value} AS dur, graph_node IS NOT NULL AS graph FROM kernels"
        fast = id_histogram(trace, src, "name_id", extras={"graph": "graph"})
        plain = histogram(trace, src, ["name_id"], extras={"graph": "graph"})
    assert len(fast) > 1000
    assert sorted(tuple(map(int, r)) for r in fast) == sorted(tuple(map(int, r)) for r in plain)


def _raw_launch_latencies(path) -> pd.Series:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return pd.read_sql_query(
        """SELECT k.start - r.start AS latency FROM CUPTI_ACTIVITY_KIND_KERNEL k
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
           WHERE k.graphNodeId IS NULL""", conn)["latency"]


@pytest.mark.parametrize("name", ["eager_b1", "thr_graphs"])
def test_launch_latency_equals_the_raw_join(name: str, report_all, sqlite_path) -> None:
    # Under the sample size every eager kernel is joined to its launch call: exact quantiles.
    raw = _raw_launch_latencies(sqlite_path(name))
    launch = report_all(name)["launch"]
    assert launch["sampled"] == len(raw) > 1000
    assert launch["median_ns"] == raw.quantile(0.5)
    assert launch["p90_ns"] == raw.quantile(0.9)


def test_launch_latency_sampled_uniformly(sqlite_path, monkeypatch) -> None:
    # Above the sample size every n-th eager kernel (by correlation id) is joined: about the sample
    # size of them, spread over the window, with a median close to the exact one.
    from profkit.analysis import launch
    from profkit.analysis.window import choose_window
    from profkit.traces import open_trace

    raw = _raw_launch_latencies(sqlite_path("eager_b1"))
    monkeypatch.setattr(launch, "LATENCY_SAMPLE", 2000)
    with open_trace(sqlite_path("eager_b1")) as trace:
        got = launch.launch_latency(trace, choose_window(trace, "all"), eager_kernels=len(raw))
    assert got.sample_step == len(raw) // 2000
    assert 1500 < got.sampled < 2500
    assert got.median_ns == pytest.approx(raw.quantile(0.5), rel=0.05)


@pytest.mark.parametrize("name", ["thr_graphs", "hostgap_b16"])
def test_window_seq_ranges_select_the_same_rows(name: str, sqlite_path) -> None:
    # A bounded window reads kernels and API calls by seq range (the tables are in start order);
    # the summaries must equal those of the plain start-time condition over every row.
    from dataclasses import replace

    from profkit.analysis import timeline
    from profkit.analysis.api import api_summary
    from profkit.analysis.kernels import kernel_summary
    from profkit.analysis.window import choose_window, with_seq_ranges
    from profkit.traces import open_trace

    with open_trace(sqlite_path(name)) as trace:
        timeline.gpu_gaps(trace)
        auto = choose_window(trace, "auto", timeline.phases(trace))
        mid = (auto.start_ns + auto.end_ns) // 2
        for win in (auto, choose_window(trace, f"{auto.start_ns + 1}:{mid}")):
            ranged = with_seq_ranges(trace, win)
            ranges = {r: (lo, hi) for r, lo, hi in ranged.seq_ranges}
            assert set(ranges) == {"kernels", "api"}
            if win is not auto:  # the first half of the window: about half of its kernels' rows
                in_window = trace.query("SELECT count(*) FROM kernels WHERE start >= ? AND start < ?",
                                        (win.start_ns, win.end_ns))[0][0]
                assert ranges["kernels"][1] - ranges["kernels"][0] <= in_window + 2 * 256 + 1
            plain = replace(ranged, seq_ranges=())
            assert kernel_summary(trace, ranged) == kernel_summary(trace, plain)
            assert api_summary(trace, ranged) == api_summary(trace, plain)
            assert kernel_summary(trace, ranged)


def test_launch_latency_in_a_bounded_window_equals_the_raw_join(sqlite_path) -> None:
    # The API rows are read by seq range (from 100 ms before the window): no launch call is lost.
    import sqlite3

    from profkit.analysis import timeline
    from profkit.analysis.launch import launch_latency
    from profkit.analysis.window import choose_window, with_seq_ranges
    from profkit.traces import open_trace

    with open_trace(sqlite_path("thr_graphs")) as trace:
        timeline.gpu_gaps(trace)
        win = with_seq_ranges(trace, choose_window(trace, "auto", timeline.phases(trace)))
        got = launch_latency(trace, win, eager_kernels=1)
    conn = sqlite3.connect(f"file:{sqlite_path('thr_graphs')}?mode=ro", uri=True)
    raw = pd.read_sql_query(
        """SELECT k.start - r.start AS latency FROM CUPTI_ACTIVITY_KIND_KERNEL k
           JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
           WHERE k.graphNodeId IS NULL AND k.start >= ? AND k.start < ?""", conn,
        params=(win.start_ns, win.end_ns))["latency"]
    assert got.sampled == len(raw) > 1000
    assert got.median_ns == raw.quantile(0.5) and got.p90_ns == raw.quantile(0.9)


def test_a_window_that_misses_the_gpus_work_is_one_line() -> None:
    """`--window 100s:200s` on the torch sample (its GPU work: 412 ms at timestamps near 4.5e15 ns) reported the GPU
    0 % busy over 100 s and fired low-gpu-utilization: a window in the wrong units or of another trace is a mistake,
    said with the span the trace has; one that overlaps the work is the report's window."""
    from tests.cli import one_error_line, profkit

    sample = "samples/capture_thr_torch"
    line = one_error_line(profkit("report", sample, "--window", "100s:200s"), "holds none of the trace's GPU work")
    assert line.endswith("--window 100000000000ns:200000000000ns holds none of the trace's GPU work, which runs over "
                         "4537953373925961ns:4537953785731149ns (412 ms; the trace's own timestamps)")
    r = profkit("report", sample, "--window", "0ns:4537953400000000ns", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["window"]["how"] == "explicit"
