"""Tensor parallelism recorded on real GPUs (issue 38): a `profkit capture` of vLLM serving a 14B-shape model with
`-tp 2` on 2 H200s under nsys, its per-rank report checked against NVIDIA's own numbers; the start-up failure of
vLLM's default all-reduce fusion named with the flag that avoids it; and TP=2 against DP=2 measured on two loads,
with the model of the run and the tp-or-dp rule held to what was measured (tests/data/h200_tp2.README.md)."""

from __future__ import annotations

import csv
import json
import sqlite3
import statistics
from pathlib import Path

import pytest

from profkit.api import predict, report
from tests.cli import one_error_line, profkit
from tests.conftest import unpack
from tests.test_capture import free_port


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory, "h200_tp2")


@pytest.fixture(scope="module")
def capture(tp2: Path) -> dict:
    out = profkit("report", str(tp2 / "capture"), "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _gpu_trace(tp2: Path) -> list[dict[str, str]]:
    """nsys stats -r cuda_gpu_trace on the trace: its kernels (rows with a grid), each with its device."""
    with open(tp2 / "stats" / "slice_cuda_gpu_trace.csv", newline="") as f:
        return [r for r in csv.DictReader(f) if r["GrdX"]]


def test_each_gpu_of_the_tp2_capture_matches_nsys(tp2: Path, capture: dict) -> None:
    kernels = _gpu_trace(tp2)
    devices = sorted({r["Device"] for r in kernels})
    assert devices == ["NVIDIA H200 (0)", "NVIDIA H200 (1)"]
    ranks = {r["device"]: r for r in capture["ranks"]}
    assert sorted(ranks) == [0, 1]
    for device, name in enumerate(devices):
        mine = [r for r in kernels if r["Device"] == name]
        nccl = [r for r in mine if r["Name"].startswith("nccl")]
        rank = ranks[device]
        assert rank["kernels"] == {"count": len(mine), "total_ns": sum(int(r["Duration (ns)"]) for r in mine)}
        comm = rank["communication"]
        assert (comm["count"], comm["total_ns"]) == (len(nccl), sum(int(r["Duration (ns)"]) for r in nccl))
        assert comm["share"] == pytest.approx(comm["total_ns"] / rank["kernels"]["total_ns"])
        # nsys's nccl_gpu_overlap_trace on the whole capture: no NCCL kernel of a TP=2 vLLM step overlaps compute
        assert comm["overlap_ns"] == 0
    with open(tp2 / "recipes" / "nccl_gpu_overlap_trace_by_device_and_kernel.csv", newline="") as f:
        recipe = [r for r in csv.DictReader(f) if r["Name"].startswith("nccl")]
    assert recipe and all(float(r["compute_overlap_ns"]) == 0 for r in recipe)
    assert capture["facts"]["ranks.count"] == 2
    assert capture["gpu"]["devices"][0]["busy_ns"] == ranks[0]["gpu"]["busy_ns"]


def test_the_last_arriving_rank_is_read_off_the_collectives(tp2: Path, capture: dict) -> None:
    """The k-th NCCL kernel of each GPU is the same all-reduce: the rank that starts it later is the one the other
    waited for; counted here from nsys's kernel trace."""
    starts: dict[str, list[int]] = {}
    for r in _gpu_trace(tp2):
        if r["Name"].startswith("nccl"):
            starts.setdefault(r["Device"], []).append(int(r["Start (ns)"]))
    first, second = (sorted(v) for _, v in sorted(starts.items()))
    last_1 = sum(b > a for a, b in zip(first, second, strict=True)) / len(first)
    coll = capture["imbalance"]["collectives"]
    assert coll["collectives"] == len(first) == 862
    by_rank = {r["rank"]: r for r in coll["ranks"]}
    assert by_rank[1]["last_share"] == pytest.approx(last_1)
    assert coll["straggler"] == {"rank": 1, "last_share": pytest.approx(last_1)}
    # rank 0 waits for rank 1 in 86 % of the all-reduces, but only 4.3 % of its window: not a finding
    assert "rank-imbalance" not in {f["rule"] for f in capture["findings"]}


def test_steps_come_from_one_rank_and_efficiency_is_per_gpu(tp2: Path, capture: dict) -> None:
    """vLLM names each step on both workers; the step view counts one rank's. Weights and KV bytes per token are a
    GPU's share (TP=2: half of the 14B shape's 26.75 GB and 196,608 bytes)."""
    win = capture["window"]
    conn = sqlite3.connect(f"file:{tp2 / 'capture' / 'trace.sqlite'}?mode=ro", uri=True)
    per_process = dict(conn.execute(
        "SELECT n.globalTid >> 24 & 16777215, count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id "
        "WHERE coalesce(s.value, n.text) LIKE 'execute!_%' ESCAPE '!' AND n.start >= ? AND n.end <= ? GROUP BY 1",
        (win["start_ns"], win["end_ns"])).fetchall())
    conn.close()
    assert len(per_process) == 2 and len(set(per_process.values())) == 1
    assert capture["steps"]["count"] == next(iter(per_process.values())) == 9
    model = capture["efficiency"]["model"]
    config = json.loads((tp2 / "capture" / "model-config.json").read_text())
    assert config["num_hidden_layers"] == model["layers"] == 48
    kv_heads, head_dim = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    assert model["kv_bytes_per_token"] == 48 * kv_heads * head_dim * 2 * 2 // 2
    assert model["weight_bytes"] == model["matmul_params"] * 2 // 2


def test_the_default_tp2_start_failure_names_its_cause_and_the_flag(tp2: Path) -> None:
    from profkit.evidence.vllm_log import start_failure

    why = start_failure(tp2 / "tp2_default" / "server.log")
    assert why is not None
    assert why.startswith("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED")
    assert "--compilation-config '{\"pass_config\": {\"fuse_allreduce_rms\": false}}'" in why
    # the run that started with the fusion off, and the data-parallel one, name nothing
    assert start_failure(tp2 / "capture" / "server.log") is None
    assert start_failure(tp2 / "ab" / "dp2" / "T_s11" / "server.log") is None


def test_capture_names_the_cause_of_a_server_that_died_at_start(tp2: Path, tmp_path: Path) -> None:
    """Through the CLI: a `vllm` that prints the recorded start-up log and exits 1, as the real one's API server
    does once the engine core fails."""
    fake = tmp_path / "vllm"
    fake.write_text(f"#!/bin/sh\ncat '{tp2 / 'tp2_default' / 'server.log'}'\nexit 1\n")
    fake.chmod(0o755)
    r = profkit("capture", "--tool", "none", "--vllm", str(fake), "--out", str(tmp_path / "cap"), "serve",
                "--model", "/m", "--port", free_port(), "--server-args", "-tp 2")
    line = one_error_line(r, "vllm serve exited with code 1 before it was healthy: RuntimeError: CUDA error: "
                             "CUBLAS_STATUS_EXECUTION_FAILED", progress=True)
    assert "try --compilation-config" in line and "fuse_allreduce_rms" in line


MEASURED = {("tp2", "T"): 21.39, ("dp2", "T"): 26.79, ("tp2", "L"): 2.441, ("dp2", "L"): 1.747}


def _mean(tp2: Path, config: str, load: str, metric: str) -> float:
    return statistics.fmean(json.loads((f / "bench.json").read_text())[metric]
                            for f in sorted((tp2 / "ab" / config).glob(f"{load}_s*")))


@pytest.mark.parametrize("load", ["T", "L"])
@pytest.mark.parametrize(("before", "after", "flags"), [
    ("tp2", "dp2", "--tensor-parallel-size 1 --data-parallel-size 2"),
    ("dp2", "tp2", "--tensor-parallel-size 2 --data-parallel-size 1")])
def test_the_model_predicts_tp_against_dp_within_its_measured_error(tp2: Path, before: str, after: str, flags: str,
                                                                     load: str) -> None:
    """Each replicate of one layout predicts the other; measured: the other's mean over 3 replicates. The error the
    validation measured (docs/prediction.md, P20-P23): median 4.4 %, at most 13.7 % on request throughput (from the
    slowest TP=2 replicate; 11.4 % before f9c7120 added the weights' read to every step), the measured mean inside
    10 of the 12 ranges (two TP=2 replicates' for DP=2 at full load end just below it), the direction always right."""
    measured = _mean(tp2, after, load, "request_throughput")
    assert measured == pytest.approx(MEASURED[(after, load)], abs=0.005)
    inside = 0
    for run in sorted((tp2 / "ab" / before).glob(f"{load}_s*")):
        m = predict(run, flags)["metrics"]["request_throughput"]
        assert abs(m["predicted"] / measured - 1) <= 0.14, (run.name, m["predicted"], measured)
        inside += m["low"] <= measured <= m["high"]
        assert (m["predicted"] > m["before"]) == (measured > m["before"])
    # the misses, said: the TP=2 replicates' ranges for DP=2 at full load end at 25.90 and 26.77; measured 26.79
    assert inside == (1 if (before, load) == ("tp2", "T") else 3)


def test_the_prescription_follows_the_measured_layout(tp2: Path) -> None:
    """800 requests at once on TP=2: engines side by side (measured +25 %); 4 in flight on DP=2: one sharded engine
    (measured +40 %). The layouts that were measured faster get no prescription to change."""
    for run, to in (("tp2/T_s11", {"--tensor-parallel-size": 1, "--data-parallel-size": 2}),
                    ("dp2/L_s21", {"--tensor-parallel-size": 2, "--data-parallel-size": 1})):
        doc = report(tp2 / "ab" / run)
        assert "tp-or-dp" in {f["rule"] for f in doc["findings"]}
        # the best adds the FP8 pair (a precision change, named as such); the best without it is the layout alone
        p = doc["prescription"]
        assert {c["flag"]: c["to"] for c in p["changes"] if not c["trades"]} == to
        assert {c["flag"] for c in p["changes"] if c["trades"]} <= {"--quantization", "--kv-cache-dtype"}
        if any(c["trades"] for c in p["changes"]):
            assert {c["flag"]: c["to"] for c in p["alternative"]["changes"]} == to
            # what precision adds over the layout alone: the two predictions' ratio, not their gains' difference
            best, alone = (x["request_throughput"]["predicted"]
                           for x in (p["predicted"], p["alternative"]["predicted"]))
            assert p["alternative"]["trade"] == f"{(best / alone - 1) * 100:+.0f}% request throughput for a change " \
                                                "of the model's precision"
        assert "tp-or-dp" in p["answers"]
        suggested = doc["command"]["suggested"][0]
        assert f"--data-parallel-size {to['--data-parallel-size']}" in suggested
    for run in ("tp2/L_s21", "dp2/T_s11"):
        doc = report(tp2 / "ab" / run)
        assert "tp-or-dp" not in {f["rule"] for f in doc["findings"]}
        # no change of the layout; the model's best there changes precision alone (FP8), named as the trade
        changes = (doc.get("prescription") or {}).get("changes") or []
        assert not {"--tensor-parallel-size", "--data-parallel-size"} & {c["flag"] for c in changes}
        assert all(c["trades"] for c in changes)


def test_tune_tries_the_other_layout_on_the_same_gpus(tp2: Path) -> None:
    """tune's first candidate (the model's ranking, precision unchanged) changes both sizes: it never asks for more
    GPUs than the run had. Measured: DP=2 +25 % on this load."""
    from profkit.tune.loop import Config, Run, allowed_flags, model_candidates
    from profkit.vllm.command import UserCommand

    run = tp2 / "ab" / "tp2" / "T_s11"
    best = Config(UserCommand([], "test"), [Run(run, "ok", False, report=report(run))])
    ranking, fitted = model_candidates(best, [best], "request_throughput", [], False,
                                       set(allowed_flags(None, allow_precision=False)), 0.02)
    assert ranking is not None and fitted == "calibrated on 1 measured configuration(s)"
    changes = {c["flag"]: c["to"] for c in ranking[0]["changes"]}
    assert changes == {"--data-parallel-size": 2, "--tensor-parallel-size": 1}
    assert ranking[0]["predicted"]["gain"] > 0.1 and not ranking[0]["skip"]


def test_the_kv_cache_of_the_other_layout_is_what_vllm_allocated(tp2: Path) -> None:
    """TP=2 -> DP=2: each GPU then holds the whole model (12.78 -> 25.6 GiB of weights) and every KV head; the
    memory left is what vLLM gave each DP engine's cache (its log: 557,936 tokens), and back."""
    import re

    for run, measured_log in (("tp2/T_s11", "dp2/T_s11"), ("dp2/T_s11", "tp2/T_s11")):
        reasoning = predict(tp2 / "ab" / run, "--tensor-parallel-size {} --data-parallel-size {}".format(
            *((1, 2) if run.startswith("tp2") else (2, 1))))["reasoning"]
        tokens = next(int(m.group(2).replace(",", "")) for line in reasoning
                      if (m := re.match(r"KV cache ([\d,]+) → ([\d,]+) tokens", line)))
        logged = re.search(r"GPU KV cache size: ([\d,]+) tokens",
                           (tp2 / "ab" / measured_log / "server.log").read_text())
        assert logged is not None
        assert tokens == pytest.approx(int(logged.group(1).replace(",", "")), rel=0.005)


def test_data_parallel_engines_each_serve_their_share() -> None:
    """Hand check of the simulation: 2 engines serving 800 requests and 4 client slots are 1 engine serving 400 with
    2 slots, throughputs doubled and latencies the same."""
    from profkit.model.simulate import Engine, StepCost, Workload, simulate, simulate_engines

    engine, cost = Engine(200_000, 256, 8192), StepCost(4e-4, 0.01, 1e-5, 1e-7, 1e-9)
    for work in (Workload(800, 1024, 256), Workload(56, 1024, 256, max_concurrency=4)):
        two = simulate_engines(work, engine, cost, 2)
        half = Workload(work.requests // 2, 1024, 256,
                        max_concurrency=work.max_concurrency // 2 if work.max_concurrency else None)
        one = simulate(half, engine, cost)
        assert two.request_throughput == pytest.approx(2 * one.request_throughput)
        assert two.output_throughput == pytest.approx(2 * one.output_throughput)
        assert (two.ttft_mean_s, two.tpot_mean_s, two.elapsed_s) == (one.ttft_mean_s, one.tpot_mean_s, one.elapsed_s)


def test_every_split_of_the_runs_gpus_is_a_candidate_layout() -> None:
    """Planned for any GPU count: a run on 4 GPUs as TP=4 is offered 1x4 and 2x2; as 2x2, 1x4 and 4x1."""
    from types import SimpleNamespace

    from profkit.model.levers import layouts

    def splits(tp: int, dp: int) -> list[tuple[int, int]]:
        obs = SimpleNamespace(tensor_parallel=tp, data_parallel=dp)
        return [(c["tensor_parallel_size"], c["data_parallel_size"]) for c in layouts(obs)]  # type: ignore[arg-type]

    assert splits(4, 1) == [(1, 4), (2, 2)]
    assert splits(2, 2) == [(1, 4), (4, 1)]
    assert splits(8, 1) == [(1, 8), (2, 4), (4, 2)]
    assert splits(1, 1) == []
