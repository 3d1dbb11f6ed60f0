"""The GPU-bound run (issue 28): how far from the hardware's limit, and the levers, on real H100 recordings.

Every number is checked against a source that is not profkit's own code:
- the peak table against NVIDIA's datasheet figures (and torchtitan's dense table) and the export's TARGET_INFO_GPU;
- the GPU metrics of a bf16 GEMM loop and a device copy (tests/data/gpu_metrics/h100_gemm_copy*) against NVIDIA's
  recipe `gpu_metric_util_sum` over the same NVTX ranges, and against the loops' own timing (CUDA events);
- MFU/MBU from vLLM's counters computed here by hand from the metrics text, and the model-shape estimate computed
  here by hand from the config (tests/data/h100_gpu_bound.tar.xz: a 14B-shape model, three replicates);
- the GPU metrics of a decode-heavy serve run against the MBU of vLLM's own counters.
"""

from __future__ import annotations

import csv
import json
import lzma
import shutil
from pathlib import Path

import numpy as np
import pytest

from profkit.analysis.efficiency import gpu_peak
from profkit.analysis.gpu_metrics import summary, within
from profkit.report import ReportOptions, build_report
from profkit.traces.gpu_metrics import open_gpu_metrics
from profkit.tune.loop import allowed_flags
from tests.cli import profkit
from tests.conftest import unpack
from tests.test_tune import env  # noqa: F401 - the fake vLLM and nsys on PATH (a fixture)

DATA = Path(__file__).parent / "data"
GEMM_COPY = DATA / "gpu_metrics" / "h100_gemm_copy"
PRECISION_FLAGS = {"--quantization", "--kv-cache-dtype"}


@pytest.fixture(scope="module")
def gpu_bound(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory, "h100_gpu_bound")


@pytest.fixture(scope="module")
def gemm_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gemm_copy") / "h100_gemm_copy.sqlite"
    with lzma.open(GEMM_COPY.with_suffix(".sqlite.xz")) as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    path.chmod(0o444)
    return path


def recipe(name: str) -> dict[str, dict[str, float]]:
    """NVIDIA's `nsys recipe gpu_metric_util_sum --filter-nvtx NAME` output: {metric: {Count, Mean, ...}}."""
    with (GEMM_COPY.parent / f"h100_gemm_copy.recipe_{name}.csv").open() as f:
        return {row["Metric Name"]: {k: float(v) for k, v in row.items() if k not in ("Metric Name",)}
                for row in csv.DictReader(f)}


# --- the peak table --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("reported", "bf16", "fp8", "tbs"), [
    # NVIDIA datasheets, dense (sparse / 2); torchtitan's get_peak_flops lists the same bf16 figures
    ("NVIDIA H100 80GB HBM3", 989.5, 1979, 3.35),  # H100 SXM5, the name this project's H100 reports
    ("NVIDIA H100 PCIe", 756.5, 1513, 2.0),
    ("NVIDIA H100 NVL", 835.5, 1670.5, 3.9),
    ("NVIDIA H200", 989.5, 1979, 4.8),
    ("NVIDIA H200 NVL", 835.5, 1670.5, 4.8),
    ("NVIDIA A100-SXM4-80GB", 312, None, 2.039),
    ("NVIDIA A100-SXM4-40GB", 312, None, 1.555),
    ("NVIDIA A100 80GB PCIe", 312, None, 1.935),
    ("NVIDIA L40S", 362.05, 733, 0.864),
    ("NVIDIA L4", 121, 242.5, 0.3),
    ("NVIDIA B200", 2250, 4500, 7.7),
    ("NVIDIA GB200", 2500, 5000, 8.0),
])
def test_peaks_by_the_name_the_gpu_reports(reported: str, bf16: float, fp8: float | None, tbs: float) -> None:
    peak = gpu_peak(reported)
    assert peak is not None
    assert (peak["bf16_tflops"], peak["fp8_tflops"], peak["bandwidth_tbs"]) == (bf16, fp8, tbs)
    assert peak["source"].startswith("https://")


def test_unknown_gpus_have_no_peak_and_lookalikes_are_not_taken() -> None:
    assert gpu_peak("NVIDIA GeForce RTX 4090") is None and gpu_peak(None) is None
    assert gpu_peak("NVIDIA L40") is None  # not the L4 (whole-name match), not the L40S
    assert "GB200" in gpu_peak("NVIDIA GB200")["name"] and "GB200" not in gpu_peak("NVIDIA B200")["name"]  # type: ignore[index]


def test_every_gpu_that_gpu_names_has_its_peaks() -> None:
    """`--gpu` resolves a user's words to a row's name, which the table must find again: the A100s' matches are
    nvidia-smi's hyphenated spelling (A100-SXM4-80GB), so their names once resolved to no peaks ("not in the peak
    table" for a GPU --gpu had just accepted)."""
    from profkit.analysis.efficiency import _table, known_gpu

    for row in _table():
        assert gpu_peak(known_gpu(row["name"].removeprefix("NVIDIA ")))["name"] == row["name"]  # type: ignore[index]
    assert gpu_peak(known_gpu("A100 SXM4 80GB"))["bandwidth_tbs"] == 2.039  # type: ignore[index]


def test_the_h100_bandwidth_agrees_with_the_exports_target_info(gemm_copy: Path) -> None:
    """TARGET_INFO_GPU.memoryBandwidth of the real export (bytes/s) is the table's 3.35 TB/s."""
    doc = build_report(gemm_copy, options=ReportOptions(window="all")).document()
    gpu = doc["efficiency"]["gpu"]
    assert gpu["export_bandwidth_tbs"] == pytest.approx(gpu["bandwidth_tbs"], rel=0.001)


# --- the GPU metrics against NVIDIA's recipe and the loops' own timing -----------------------------------------

def nvtx_range(path: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    import sqlite3

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = conn.execute("SELECT start, end FROM NVTX_EVENTS WHERE text = ?", (name,)).fetchall()
    conn.close()
    assert len(rows) == 1
    return np.array([rows[0][0]], np.int64), np.array([rows[0][1]], np.int64)


@pytest.mark.parametrize("name", ["gemm", "copy"])
def test_metrics_over_an_nvtx_range_match_nvidias_recipe(gemm_copy: Path, name: str) -> None:
    """Same samples (the recipe's count) and means within its printed rounding (0.1 point)."""
    metrics = open_gpu_metrics(gemm_copy)
    got = summary(within(metrics, *nvtx_range(gemm_copy, name)), 0)
    want = recipe(name)
    for metric, recipe_name in (("sm_active", "SMs Active"), ("tensor_active", "Tensor Active"),
                                ("dram_read", "DRAM Read Bandwidth [Throughput %]"),
                                ("dram_write", "DRAM Write Bandwidth [Throughput %]"),
                                ("gr_active", "GR Active [Throughput %]")):
        assert got[metric]["samples"] == want[recipe_name]["Count"]
        assert got[metric]["mean"] == pytest.approx(want[recipe_name]["Mean"], abs=0.051)
        assert got[metric]["median"] == pytest.approx(want[recipe_name]["Median"], abs=0.051)


def test_tensor_active_under_the_gemm_is_the_share_of_the_peak_at_the_sampled_clock(gemm_copy: Path) -> None:
    """The loop's own 8192^3 bf16 GEMMs (CUDA events): 685 TFLOP/s while the GPU ran at ~1.37 GHz (power-capped).
    NVIDIA's 989.5 TFLOP/s is 132 SMs x 4096 dense bf16 FLOP per clock at 1830 MHz; at the sampled clock (the
    recipe's GPC Clock mean, the same samples) the peak is 989.5 x f / 1830, and Tensor Active (the share of
    cycles the tensor pipes were busy) is the loop's share of it, within 3 points."""
    loop = json.loads(GEMM_COPY.with_suffix(".json").read_text())
    clock_hz = recipe("gemm")["GPC Clock Frequency [MHz]"]["Mean"]  # nsys 2025.3 stores Hz under the MHz label
    assert 1.0e9 < clock_hz < 1.99e9
    peak_at_clock = gpu_peak(loop["gpu"])["bf16_tflops"] * clock_hz / 1.83e9  # type: ignore[index]
    doc = build_report(gemm_copy, options=ReportOptions(window="all")).document()
    gemm = doc["efficiency"]["gpu_metrics"]["categories"]["gemm"]
    assert gemm["tensor_active"]["mean"] == pytest.approx(100 * loop["gemm"]["tflops"] / peak_at_clock, abs=3)
    # and the datasheet peak is not reached at that clock: the report's MFU-style reading must not read 93 %
    assert loop["gemm"]["tflops"] / 989.5 < 0.75


def test_dram_read_plus_write_under_the_copy_is_its_share_of_the_bandwidth_peak(gemm_copy: Path) -> None:
    """A 1 GiB device copy reads and writes every byte: 3.01 TB/s by CUDA events, 90 % of 3.35 TB/s; the DRAM
    read + write metrics under the copies say the same within 1 point."""
    loop = json.loads(GEMM_COPY.with_suffix(".json").read_text())
    doc = build_report(gemm_copy, options=ReportOptions(window="all")).document()
    copy = doc["efficiency"]["gpu_metrics"]["categories"]["memory copy/set"]
    dram = copy["dram_read"]["mean"] + copy["dram_write"]["mean"]
    assert dram == pytest.approx(100 * loop["copy"]["tbs_read_write"] / 3.35, abs=1.0)
    assert copy["tensor_active"]["mean"] < 1.0


def test_the_report_shows_the_gpu_metrics_by_kernel_category_in_every_format(gemm_copy: Path, tmp_path: Path) -> None:
    text = profkit("report", gemm_copy).stdout
    assert "How far from the hardware's limit" in text and "under gemm" in text and "93.6%" in text
    for fmt in ("md", "html"):
        out = tmp_path / f"r.{fmt}"
        assert profkit("report", gemm_copy, "--format", fmt, "-o", out).returncode == 0
        page = out.read_text()
        assert "How far from the hardware" in page and "93.6%" in page and "90.0%" in page


# --- MFU and MBU of a real GPU-bound run -----------------------------------------------------------------------

def counter(text: str, name: str) -> float:
    """The sum over labels of one sample name, read from the Prometheus text by hand."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def counter_delta(folder: Path, name: str) -> float:
    return (counter((folder / "metrics-after.txt").read_text(), name)
            - counter((folder / "metrics-before.txt").read_text(), name))


@pytest.mark.parametrize("run", ["r1", "r2", "r3"])
def test_mfu_and_mbu_from_vllms_counters_by_hand(gpu_bound: Path, run: str) -> None:
    folder = gpu_bound / "tune" / "runs" / "01-baseline" / run
    seconds = json.loads((folder / "bench.json").read_text())["duration"]
    flops = counter_delta(folder, "vllm:estimated_flops_per_gpu_total")
    moved = (counter_delta(folder, "vllm:estimated_read_bytes_per_gpu_total")
             + counter_delta(folder, "vllm:estimated_write_bytes_per_gpu_total"))
    eff = build_report(folder).document()["efficiency"]
    counters = eff["vllm_counters"]
    assert counters["mfu"] == pytest.approx(flops / seconds / 989.5e12, rel=1e-9)
    assert counters["mbu"] == pytest.approx(moved / seconds / 3.35e12, rel=1e-9)
    assert 0.40 < counters["mfu"] < 0.46 and 0.36 < counters["mbu"] < 0.42  # 43 % and 39 % on all three
    assert eff["window"]["from"] == "vLLM's counters"


def test_the_model_shape_estimate_by_hand_and_against_vllms_counters(gpu_bound: Path) -> None:
    """The 14B config by hand: per layer q,k,v,o (5120 x (40 + 2 x 8) x 128 + 5120 x 5120) and the MLP
    (3 x 5120 x 13824), 48 layers, plus the LM head 5120 x 32000. FLOPs agree with vLLM's own estimate within 2 %
    on each replicate (both count 2 x weights per token, attention, and preempted requests recomputed); bytes
    within 10 % (vLLM also counts norms and other small tensors)."""
    config = json.loads((gpu_bound / "tune/runs/01-baseline/r1/model-config.json").read_text())
    h, layers, inter, vocab = (config[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                    "vocab_size"))
    head_dim = h // config["num_attention_heads"]
    params = layers * (h * (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
                       + h * h + 3 * h * inter) + h * vocab
    assert params == 13_375_897_600
    for run in ("r1", "r2", "r3"):
        folder = gpu_bound / "tune" / "runs" / "01-baseline" / run
        eff = build_report(folder).document()["efficiency"]
        shape, counters = eff["model_shape"], eff["vllm_counters"]
        tokens = shape["tokens"]
        computed = (counter_delta(folder, "vllm:prompt_tokens_total")
                    - counter_delta(folder, "vllm:prompt_tokens_cached_total"))
        assert tokens["prompt_computed"] == computed
        assert tokens["generated"] == counter_delta(folder, "vllm:generation_tokens_total")
        steps = counter_delta(folder, "vllm:iteration_tokens_total_count")
        assert shape["parts"]["weights_bytes"] == pytest.approx(steps * params * 2, rel=1e-12)
        assert shape["flops"] == pytest.approx(counters["flops"], rel=0.02)
        assert shape["bytes"] == pytest.approx(counters["bytes"], rel=0.10)


def test_the_gpus_dram_metrics_and_vllms_mbu_agree_on_a_decode_heavy_run(gpu_bound: Path) -> None:
    """small_kv: ~10 requests at a time (a KV cache of 12,656 tokens). nsys measures the DRAM interface busy
    (read + write, the whole device), vLLM estimates the model's bytes: within 10 points of each other."""
    doc = build_report(gpu_bound / "small_kv").document()
    eff = doc["efficiency"]
    window = eff["gpu_metrics"]["window"]
    dram = (window["dram_read"] + window["dram_write"]) / 100
    assert eff["vllm_counters"]["mbu"] == pytest.approx(dram, abs=0.10)
    assert eff["vllm_counters"]["mbu"] > 0.5 and eff["vllm_counters"]["mfu"] < 0.15  # memory-bound decode
    assert doc["facts"]["gpu_metrics.dram_bandwidth"] == pytest.approx(dram)


# --- the levers, their precision caveat, and tune's gate -------------------------------------------------------

def changes_of(doc: dict, rule: str) -> dict[str, dict]:
    finding = next((f for f in doc["findings"] if f["rule"] == rule), None)
    assert finding is not None, [f["rule"] for f in doc["findings"]]
    return {c["flag"]: c for c in finding["changes"]}


def test_kv_capacity_bound_proposes_both_fp8_levers_marked_as_precision_changes(gpu_bound: Path, tmp_path: Path
                                                                               ) -> None:
    folder = gpu_bound / "tune" / "runs" / "01-baseline" / "r1"
    doc = build_report(folder).document()
    changes = changes_of(doc, "kv-capacity-bound")
    assert changes["--kv-cache-dtype"]["to"] == "fp8" and changes["--quantization"]["to"] == "fp8"
    assert all(changes[f].get("changes_precision") for f in PRECISION_FLAGS)
    assert doc["findings"][0]["rule"] == "kv-capacity-bound"  # before +3 % memory (kv-preemption)
    assert "MBU 38.7%" in doc["findings"][0]["summary"]
    # the caveat in every format
    assert "changes model precision: check accuracy before shipping" in profkit("report", folder).stdout
    for fmt in ("md", "html"):
        out = tmp_path / f"r.{fmt}"
        profkit("report", folder, "--format", fmt, "-o", out)
        assert out.read_text().count("check accuracy before shipping") >= 2
    assert '"changes_precision": true' in profkit("report", folder, "--format", "json").stdout


def test_tune_chose_the_fp8_levers_first_on_the_real_run(gpu_bound: Path) -> None:
    """The recorded tune (interrupted by the lease's end while the candidate's server compiled): its first
    candidate is kv-capacity-bound's FP8 pair, its server started with both flags, precision allowed."""
    tune = json.loads((gpu_bound / "tune" / "tune.json").read_text())
    assert tune["allow_precision"] is True and set(tune["allowed_flags"]) >= PRECISION_FLAGS
    session = json.loads((gpu_bound / "tune/runs/04-kv-capacity-bound/session.json").read_text())
    assert "--kv-cache-dtype fp8 --quantization fp8" in session["server_command"]
    runs = tune["noise"]["baseline_runs"]
    assert len(runs) == 3 and (max(runs) - min(runs)) / np.mean(runs) < 0.01


def test_precision_flags_need_the_users_permission() -> None:
    assert not PRECISION_FLAGS & set(allowed_flags(allow_precision=False))
    assert set(allowed_flags(allow_precision=True)) >= PRECISION_FLAGS


def test_the_frontend_bound_control_is_not_told_to_quantize(h100_host: Path) -> None:
    """(c) The 1.1B frontend-bound runs (the API server saturated, the GPU waiting): no finding changes the
    model's precision, in any of the recorded runs."""
    folders = [p.parent for p in sorted(h100_host.rglob("bench.json"))
               if "ctl" not in p.parts]  # ctl is the GPU-bound 14B control
    assert len(folders) >= 6
    for folder in folders:
        doc = build_report(folder).document()
        flags = {c["flag"] for f in doc["findings"] for c in f.get("changes", [])}
        assert not flags & PRECISION_FLAGS, (folder, flags)
        assert "kv-capacity-bound" not in {f["rule"] for f in doc["findings"]}


def test_without_permission_tune_passes_over_the_precision_levers(gpu_bound: Path) -> None:
    """tune's candidates from the recorded 14B diagnosis: with --allow-precision-changes the FP8 pair comes first;
    without it kv-capacity-bound offers nothing tune may apply and the next lever (more memory) comes first."""
    from types import SimpleNamespace

    from profkit.tune.loop import candidates

    doc = build_report(gpu_bound / "tune" / "runs" / "01-baseline" / "r1").document()
    best = SimpleNamespace(diagnosis=[doc])
    allowed = candidates(best, [], set(allowed_flags(allow_precision=True)))  # type: ignore[arg-type]
    assert allowed[0]["rule"] == "kv-capacity-bound"
    assert {c["flag"] for c in allowed[0]["changes"]} == PRECISION_FLAGS
    held = candidates(best, [], set(allowed_flags(allow_precision=False)))  # type: ignore[arg-type]
    assert "kv-capacity-bound" not in {c["rule"] for c in held}
    assert not {ch["flag"] for c in held for ch in c["changes"]} & PRECISION_FLAGS
    assert held[0]["changes"][0]["flag"] == "--gpu-memory-utilization"


def test_dry_run_says_which_changes_need_the_option(tmp_path: Path) -> None:
    args = ["tune", "--dry-run", "--out", tmp_path / "t", "serve", "--model", "/models/big",
            "--server-args", "--max-model-len 2048", "--bench-args", "--dataset-name random --num-prompts 400"]
    held = profkit(*args).stdout
    line = next(x for x in held.splitlines() if "model precision" in x)
    assert "tried only with --allow-precision-changes" in line and "--quantization" in line \
        and "--kv-cache-dtype" in line
    allowed_line = next(x for x in held.splitlines() if x.startswith("flags tune may change"))
    assert "--quantization" not in allowed_line
    allowed = profkit(*args[:2], "--allow-precision-changes", *args[2:]).stdout
    assert "--quantization" in next(x for x in allowed.splitlines() if x.startswith("flags tune may change"))


def test_capture_turns_on_the_counters_samples_the_gpu_and_keeps_the_models_config(
        env: dict[str, str], gpu_bound: Path, tmp_path: Path) -> None:  # noqa: F811
    """`capture --gpu-metrics serve` through the fake vLLM and nsys (its export: the recorded small_kv GPU
    metrics): the server runs with --enable-mfu-metrics, the client under nsys sampling the GPU, the model's
    config.json lands in the folder, and the report reads all three."""
    from tests.test_capture import free_port

    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(gpu_bound / "small_kv" / "model-config.json", model / "config.json")
    out = tmp_path / "cap"
    r = profkit("capture", "--tool", "none", "--gpu-metrics", "--out", out, "serve", "--model", model,
                "--port", free_port(), "--server-args", "--max-model-len 2048",
                "--bench-args", "--dataset-name random --random-input-len 1024 --random-output-len 256 "
                "--num-prompts 200 --seed 0",
                env={**env, "FAKE_NSYS_SQLITE": str(gpu_bound / "small_kv" / "gpu-metrics.sqlite")})
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    server, client = manifest["commands"][:2]
    assert "--enable-mfu-metrics" in server
    assert client.startswith("nsys profile -t none") and "--gpu-metrics-devices=all" in client \
        and "--gpu-metrics-frequency=1000" in client
    assert json.loads((out / "model-config.json").read_text()) == json.loads((model / "config.json").read_text())
    eff = build_report(out).document()["efficiency"]
    assert eff["model"]["matmul_params"] == 13_375_897_600
    assert eff["gpu_metrics"]["window"]["dram_read"] == pytest.approx(51.58, abs=0.01)


def test_decode_and_speculative_rules_on_the_real_runs_facts(gpu_bound: Path) -> None:
    """The recorded 14B run's facts as they are (232 running: speculation stays quiet at high concurrency; no
    --max-num-seqs cap reached: no larger batch), then with the batch capped by the user at 128 (decode-memory-bound
    proposes 2x, bounded by what the KV cache holds) and with two requests running (speculative decoding)."""
    from profkit.diagnose.engine import evaluate
    from profkit.diagnose.rule_files import load_rules

    doc = build_report(gpu_bound / "tune" / "runs" / "01-baseline" / "r1").document()
    facts = dict(doc["facts"])
    rules = load_rules()
    fired = {f.rule for f in evaluate(rules, facts)[0]}
    assert "speculative-decoding" not in fired and "decode-memory-bound" not in fired
    assert facts["vllm.running_mean"] > 4 and facts["efficiency.mbu"] < 0.5
    capped = {**facts, "config.max_num_seqs": 128, "vllm.running_max": 128.0}
    finding = next(f for f in evaluate(rules, capped)[0] if f.rule == "decode-memory-bound")
    assert finding.changes[0].to == min(256, int(facts["vllm.kv_capacity_requests"]))
    idle = {**capped, "gpu.busy": 0.40}  # the GPU waiting: the host is the lever, not the batch
    assert "decode-memory-bound" not in {f.rule for f in evaluate(rules, idle)[0]}
    small = {**facts, "vllm.running_mean": 2.0}
    spec = next(f for f in evaluate(rules, small)[0] if f.rule == "speculative-decoding")
    assert '"ngram"' in spec.changes[0].to
