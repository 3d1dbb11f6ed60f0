"""Data parallelism recorded on 2 H200s (issue 51; tests/data/h200_model_led.README.md, lease 21): one GPU's capture of
two shapes, then the same with --data-parallel-size 2 on both GPUs. What the report got wrong of such runs: a GPU's MFU
and MBU are its share of the engines' summed counters (it read one GPU's peak against both GPUs' work: 97 % MFU where
each GPU did 49 %), and no peak is read off the idle server's scrape after the benchmark (several API servers: one
per engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from profkit.api import render
from profkit.report import build_report
from tests.conftest import unpack
from tests.test_gpu_bound import counter, counter_delta

H200_BF16, H200_BANDWIDTH = 989.5e12, 4.8e12  # profkit's peak table, NVIDIA's dense figures


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory, "h200_model_led")


@pytest.mark.parametrize("run", ["r1", "r2", "r3"])
def test_each_gpus_mfu_and_mbu_under_data_parallelism_by_hand(recorded: Path, run: str) -> None:
    folder = recorded / "api" / "d2_14b" / run
    seconds = json.loads((folder / "bench.json").read_text())["duration"]
    flops = counter_delta(folder, "vllm:estimated_flops_per_gpu_total")  # both engines' (labelled by engine), summed
    moved = (counter_delta(folder, "vllm:estimated_read_bytes_per_gpu_total")
             + counter_delta(folder, "vllm:estimated_write_bytes_per_gpu_total"))
    eff = build_report(folder).document()["efficiency"]
    assert eff["vllm_counters"]["mfu"] == pytest.approx(flops / 2 / seconds / H200_BF16, rel=1e-9)
    assert eff["vllm_counters"]["mbu"] == pytest.approx(moved / 2 / seconds / H200_BANDWIDTH, rel=1e-9)
    # the model's shape and vLLM's counters count the same work per GPU (within 2 %, as on one GPU)
    assert eff["model_shape"]["flops"] == pytest.approx(eff["vllm_counters"]["flops"], rel=0.02)
    # the two engines' counters, summed, are the work of the same prompts (the same seed) on one GPU
    alone = counter_delta(recorded / "api" / "d1_14b" / run, "vllm:estimated_flops_per_gpu_total")
    assert flops == pytest.approx(alone, rel=0.02)


@pytest.mark.parametrize("run", ["api/d2_14b/r1", "api/s2_api2/r1"])
def test_no_peak_is_read_off_the_scrape_after_the_benchmark(recorded: Path, run: str) -> None:
    """Several API servers (data parallelism runs one per engine): vLLM logs no stats lines, and /metrics after the
    benchmark reads an idle server though every prompt was sent at once. The report had said "peak KV usage 0.0%"
    and 0 waiting from that scrape; it says no peak now, and the running peak is the client's in flight."""
    folder = recorded / run
    log = folder / "server.log"
    assert not log.is_file() or "GPU KV cache usage" not in log.read_text()
    after = (folder / "metrics-after.txt").read_text()
    assert counter(after, "vllm:kv_cache_usage_perc") == 0 and counter(after, "vllm:num_requests_waiting") == 0
    bench = json.loads((folder / "bench.json").read_text())
    doc = build_report(folder).document()
    facts = doc["facts"]
    assert facts["vllm.kv_cache_usage_max"] is None and facts["vllm.waiting_max"] is None
    assert facts["vllm.running_max"] == bench["max_concurrent_requests"] == bench["num_prompts"]
    assert "peak KV usage" not in render(doc, "text")


def test_the_peak_kv_usage_of_a_run_with_stats_lines_is_the_logs(recorded: Path) -> None:
    folder = recorded / "api" / "s2_api1" / "r1"
    logged = [float(x) for x in re.findall(r"GPU KV cache usage: ([0-9.]+)%", (folder / "server.log").read_text())]
    assert len(logged) == 6
    assert build_report(folder).document()["facts"]["vllm.kv_cache_usage_max"] == pytest.approx(max(logged) / 100)


def test_preemptions_without_a_recorded_peak_say_so(recorded: Path) -> None:
    """A run that preempted (vLLM's counter) whose peak usage nothing recorded (lease 21's folders keep no server.log):
    the finding says the peak was not recorded where it had said "peaked at 0.0 %"."""
    folder = recorded / "api" / "d1_14b" / "r1"
    preempted = counter_delta(folder, "vllm:num_preemptions_total")
    doc = build_report(folder).document()
    finding = next(f for f in doc["findings"] if f["rule"] == "kv-preemption")
    assert finding["summary"].startswith(f"{preempted:.0f} preemptions; the KV cache's peak usage was not recorded")
