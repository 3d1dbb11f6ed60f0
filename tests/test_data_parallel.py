"""Data parallelism recorded on 2 H200s (issue 51; tests/data/h200_model_led.README.md, lease 21): one GPU's capture of
two shapes, then the same with --data-parallel-size 2 on both GPUs. What the report got wrong of such runs: a GPU's MFU
and MBU are its share of the engines' summed counters (it read one GPU's peak against both GPUs' work: 97 % MFU where
each GPU did 49 %)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.report import build_report
from tests.conftest import unpack
from tests.test_gpu_bound import counter_delta

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
