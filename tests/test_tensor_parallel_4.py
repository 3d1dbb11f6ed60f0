"""Tensor parallelism on four real GPUs (issue 38): a `profkit capture` of vLLM serving a 14B-shape model with
`-tp 4` on 4 H200s under nsys, each rank's report checked against nsys's own kernel summary of the same slice and
its NCCL recipes on the whole capture (tests/data/h200_tp4.README.md)."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import pytest

from tests.cli import profkit
from tests.conftest import unpack

# vLLM's all-reduce kernels on this machine: NCCL's, and its own custom all-reduce over NVLink
COMMUNICATION = ("nccl", "cross_device_reduce")


@pytest.fixture(scope="module")
def tp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory, "h200_tp4")


@pytest.fixture(scope="module")
def capture(tp4: Path) -> dict:
    out = profkit("report", tp4 / "capture", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _kern_sum(tp4: Path) -> list[dict[str, str]]:
    with open(tp4 / "stats" / "slice_cuda_gpu_kern_sum.csv", newline="") as f:
        return list(csv.DictReader(f))


def _communication(name: str) -> bool:
    return any(word in name.split("(")[0] for word in COMMUNICATION)


def test_four_ranks_add_up_to_nsys_kernel_summary(tp4: Path, capture: dict) -> None:
    """nsys's cuda_gpu_kern_sum sums the four GPUs: the ranks' kernels, and their communication kernels, add up to
    it exactly; each GPU ran the same number of kernels and of collectives."""
    rows = _kern_sum(tp4)
    ranks = sorted(capture["ranks"], key=lambda r: r["device"])
    assert [r["device"] for r in ranks] == [0, 1, 2, 3] and capture["facts"]["ranks.count"] == 4
    assert sum(r["kernels"]["count"] for r in ranks) == sum(int(r["Instances"]) for r in rows) == 126_292
    assert sum(r["kernels"]["total_ns"] for r in ranks) == sum(int(r["Total Time (ns)"]) for r in rows)
    comm = [r for r in rows if _communication(r["Name"])]
    assert {r["Name"].split("(")[0].split("<")[0].removeprefix("void ").strip() for r in comm} == {
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL",
        "vllm::cross_device_reduce_2stage"}
    assert sum(r["communication"]["count"] for r in ranks) == sum(int(r["Instances"]) for r in comm) == 19_068
    assert sum(r["communication"]["total_ns"] for r in ranks) == sum(int(r["Total Time (ns)"]) for r in comm)
    assert len({r["kernels"]["count"] for r in ranks}) == 1 and len({r["communication"]["count"] for r in ranks}) == 1
    for r in ranks:
        assert r["communication"]["share"] == pytest.approx(r["communication"]["total_ns"] / r["kernels"]["total_ns"])
    # a quarter of each GPU's kernel time is all-reduce at TP=4 (14 % at TP=2): the rule says so
    assert all(0.25 < r["communication"]["share"] < 0.32 for r in ranks)
    assert "tp-communication" in {f["rule"] for f in capture["findings"]}


def test_each_gpu_timeline_is_its_own(tp4: Path, capture: dict) -> None:
    """Each rank's busy time is its own GPU's: the union of its kernels and memory operations, merged here from the
    trace with SQL, to the nanosecond."""
    conn = sqlite3.connect(f"file:{tp4 / 'capture' / 'trace.sqlite'}?mode=ro", uri=True)
    per_device = dict(conn.execute("SELECT deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1").fetchall())
    assert per_device == {0: 31_573, 1: 31_573, 2: 31_573, 3: 31_573}
    for r in capture["ranks"]:
        assert r["kernels"]["count"] == per_device[r["device"]]
        rows = conn.execute(
            "SELECT start, end FROM (SELECT start, end, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
            "SELECT start, end, deviceId FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, end, deviceId "
            "FROM CUPTI_ACTIVITY_KIND_MEMSET) WHERE deviceId = ? ORDER BY start", (r["device"],)).fetchall()
        busy, (lo, hi) = 0, rows[0]
        for start, end in rows[1:]:
            if start > hi:
                busy, lo, hi = busy + hi - lo, start, end
            else:
                hi = max(hi, end)
        assert r["gpu"]["busy_ns"] == busy + hi - lo
    conn.close()


def test_the_whole_capture_agrees_with_nsys_recipes(tp4: Path) -> None:
    """nsys's nccl_gpu_overlap_trace on the whole capture counts the four GPUs' communication kernels; profkit's
    report of the same capture (made on the GPU machine) counts a quarter of them on each GPU, and finds NCCL's
    kernels overlapping no compute, as the recipe does."""
    whole = json.loads((tp4 / "recipes" / "profkit_report_whole_capture.json").read_text())
    with open(tp4 / "recipes" / "nccl_gpu_overlap_trace_grouped.csv", newline="") as f:
        grouped = {r["Name"]: r for r in csv.DictReader(f)}
    comm = {n: r for n, r in grouped.items() if _communication(n)}
    assert sum(int(r["Count"]) for r in comm.values()) == 124_264
    assert [r["communication"]["count"] for r in whole["ranks"]] == [124_264 // 4] * 4
    assert all(float(r["Compute Overlap"]) == 0 for n, r in comm.items() if n.startswith("nccl"))
    # the custom all-reduce overlaps compute by a fraction of a nanosecond on average in the recipe: profkit's
    # overlap is as small a share
    assert all(r["communication"]["overlap_share"] < 0.01 for r in whole["ranks"])
    with open(tp4 / "recipes" / "nccl_gpu_proj_sum_all_stats.csv", newline="") as f:
        nccl = {r["Text"]: int(r["Count"]) for r in csv.DictReader(f)}
    assert nccl == {"ncclAllGather": 1268, "ncclAllReduce": 10864}
    assert nccl["ncclAllReduce"] == int(comm["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]["Count"])


def test_the_last_arriving_rank_and_steps_from_one_rank(tp4: Path, capture: dict) -> None:
    """The k-th collective of each GPU is the same all-reduce: the rank that starts it last is counted per rank, and
    the shares sum to one. vLLM names its steps on one rank; MFU and MBU are per GPU (weights and KV heads / 4)."""
    coll = capture["imbalance"]["collectives"]
    assert coll["collectives"] == 4767 and coll["names_agree"] == 1.0
    assert sum(r["last_share"] for r in coll["ranks"]) == pytest.approx(1.0, abs=0.01)
    assert coll["straggler"] is None  # no rank last in most of them
    assert "rank-imbalance" not in {f["rule"] for f in capture["findings"]}
    model = capture["efficiency"]["model"]
    config = json.loads((tp4 / "capture" / "model-config.json").read_text())
    kv_heads, head_dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    assert model["kv_bytes_per_token"] == 48 * kv_heads * head_dim * 2 * 2 // 4
    assert model["weight_bytes"] == model["matmul_params"] * 2 // 4
    assert capture["steps"]["count"] > 0 and capture["steps"]["device"] == 0


def test_eager_tp2_started_and_served(tp4: Path) -> None:
    """TP=2 in eager mode starts with vLLM's defaults (nothing compiled, no fusion); its folder without the lost
    trace is still a run profkit reads: two GPUs, eager, the benchmark's 200 requests; the tp-or-dp rule and the
    model weigh the other layout."""
    folder = tp4 / "tp2_eager"
    log = (folder / "server.log").read_text()
    assert "enforce_eager=True" in log and "tensor_parallel_size=2" in log
    doc = json.loads(profkit("report", folder, "--format", "json").stdout)
    bench = json.loads((folder / "bench.json").read_text())
    assert doc["vllm"]["config"]["tensor_parallel_size"]["value"] == 2
    assert doc["vllm"]["config"]["enforce_eager"]["value"] is True
    assert doc["facts"]["vllm.requests_per_second"] == bench["request_throughput"] and bench["completed"] == 200
    assert doc["facts"]["vllm.kv_cache_tokens"] == 1_258_176
