"""The model of the run (issue 35): each part against a hand computation, the calibration against the run it was
fitted on, and predictions against measured (run, change) pairs recorded on the H100 (tests/data).

Tolerances are the ones the validation measured (scripts/validate_model.py; the note of issue 35): a GPU-bound
pair within 20 % and inside its range, a change the model says does nothing within the runs' noise."""

from __future__ import annotations

import json
import math
import statistics
import tarfile
from pathlib import Path

import pytest

from profkit.evidence.record import Evidence
from profkit.model.observe import Unobservable, observe
from profkit.model.predict import calibrate, predict
from profkit.model.simulate import Engine, StepCost, Workload, arrivals, simulate, simulate_latencies
from profkit.report import build_report
from tests.cli import one_error_line, profkit
from tests.conftest import script, unpack

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("model")
    for name in ("bf16", "fp8"):
        with tarfile.open(DATA / "h100_phases" / f"{name}.tar.xz") as tar:
            tar.extractall(out, filter="data")
    with tarfile.open(DATA / "h100_tune.tar.xz") as tar:
        tar.extractall(out, filter="data")
    return {"bf16": out / "bf16", "fp8": out / "fp8", "tune": out / "h100_tune"}


@pytest.fixture(scope="module")
def bf16(runs: dict[str, Path]):
    return calibrate(observe(build_report(runs["bf16"]).document()))


def _bench(folder: Path) -> dict:
    return json.loads((folder / "bench.json").read_text())


# ------------------------------------------------------------------------------------- the simulation, by hand

FLAT = StepCost(overhead_s=0.0, weights_s=0.010, token_s=0.0, kv_token_s=0.0, pair_s=0.0)


def test_one_request_by_hand() -> None:
    """Prompt 4 (one step, its first token with it), then 2 more decode steps for 3 output tokens: 3 steps of 10 ms
    each: TTFT 10 ms, TPOT (30 - 10) / 2 = 10 ms."""
    r = simulate(Workload(1, 4, 3), Engine(1_000, 8, 64), FLAT)
    assert r.steps == 3 and math.isclose(r.elapsed_s, 0.030)
    assert math.isclose(r.ttft_mean_s, 0.010) and math.isclose(r.tpot_mean_s, 0.010)
    assert r.preemptions == 0 and r.batch_max == 1


def test_the_token_budget_chunks_prompts_by_hand() -> None:
    """Two prompts of 100 tokens under a budget of 64 tokens a step: 64, 64 (36 + 28), 8 + 2 decodes...: request 0
    completes its prompt in step 2, request 1 in step 3."""
    r = simulate(Workload(2, 100, 2), Engine(10_000, 8, 64), FLAT)
    # step 1: r0 64; step 2: r0 36 (first token) + r1 28; step 3: r0 decodes (finishes), r1 72 -> capped 63
    # step 4: r1 9 (first token); step 5: r1 decodes
    assert r.steps == 5
    assert math.isclose(r.ttft_mean_s, (0.020 + 0.040) / 2)


def test_max_num_seqs_caps_the_batch() -> None:
    r = simulate(Workload(64, 16, 32), Engine(1 << 20, 8, 8192), FLAT)
    assert r.batch_max == 8 and r.preemptions == 0
    # 8 at a time, 8 waves of (1 prompt step + 31 decode steps), prompts of the next wave with the last decode
    assert r.steps <= 8 * 32 + 1



def test_a_request_held_back_by_the_client_starts_its_ttft_when_sent() -> None:
    """--max-concurrency 1, two requests of prompt 4 and 3 output tokens, 10 ms steps: the second is sent when the
    first finishes (30 ms) and takes the same 10 ms to its first token, as vllm bench measures it (not 40 ms)."""
    r = simulate(Workload(2, 4, 3, max_concurrency=1), Engine(1_000, 8, 64), FLAT)
    assert r.steps == 6 and math.isclose(r.elapsed_s, 0.060)
    assert math.isclose(r.ttft_mean_s, 0.010) and math.isclose(r.tpot_mean_s, 0.010)

def test_under_asynchronous_scheduling_a_request_joins_the_step_after_the_next() -> None:
    """Steps of 10 ms; the second request arrives at 18 ms, during the second step. Scheduled as it comes (vLLM's
    --no-async-scheduling), its prompt runs in the step from 20 ms: first token at 30 ms. With vLLM's default
    asynchronous scheduling the step from 20 ms was chosen at 10 ms, before it came: it runs in the step from 30 ms,
    first token at 40 ms. The latencies a run keeps for the process are read-only."""
    work = Workload(2, 1, 50, request_rate=1 / 0.015)
    came = float(arrivals(work)[1])
    assert 0.01 < came < 0.02  # during the second step
    sync = simulate_latencies(work, Engine(100_000, 8, 64), FLAT)[1]
    assert sync.ttft_s[1] == pytest.approx(0.030 - came)
    lat = simulate_latencies(work, Engine(100_000, 8, 64, async_scheduling=True), FLAT)[1]
    assert lat.ttft_s[0] == pytest.approx(0.010) and lat.ttft_s[1] == pytest.approx(0.040 - came)
    with pytest.raises(ValueError):
        lat.ttft_s[0] = 0.0


def test_a_small_cache_preempts_and_recomputes() -> None:
    """A cache of 40 blocks (640 tokens) for 16 requests of 64 + 64: they cannot all hold their KV at once."""
    small = simulate(Workload(16, 64, 64), Engine(640, 64, 8192), FLAT)
    ample = simulate(Workload(16, 64, 64), Engine(1 << 20, 64, 8192), FLAT)
    assert small.preemptions > 0 and ample.preemptions == 0
    assert ample.prompt_tokens_computed == 16 * 64
    # a preempted request computes again what it had computed (vLLM V1 recomputes): more than the prompts
    assert small.prompt_tokens_computed > 16 * 64
    assert small.batch_max < 16 == ample.batch_max
    assert small.elapsed_s > ample.elapsed_s


def test_a_step_costs_reading_the_weights_plus_the_arithmetic() -> None:
    """Linear in the step's tokens with an intercept (the weights' read), as measured step times are: the larger of
    the two alone under-predicted the 14B's TPOT below full load by 16-40 % on its recorded sweeps."""
    cost = StepCost(overhead_s=0.001, weights_s=0.010, token_s=1e-5, kv_token_s=1e-8, pair_s=0.0)
    assert math.isclose(cost.step_s(100, 0, 0), 0.001 + 0.010 + 0.001)  # a small batch: mostly the weights' read
    assert math.isclose(cost.step_s(4096, 0, 0), 0.001 + 0.010 + 0.04096)  # a prefill chunk: mostly arithmetic
    assert math.isclose(cost.step_s(1, 1_000_000, 0), 0.001 + 0.010 + 1e-5 + 0.010)  # + the KV read
    cpu = StepCost(overhead_s=0.0, weights_s=0.001, token_s=0.0, kv_token_s=0.0, pair_s=0.0, cpu_step_s=0.002,
                   cpu_seq_s=1e-5)
    assert math.isclose(cpu.step_s(8, 0, 0, seqs=8), 0.002 + 8e-5)  # the engine core's CPU, where longer


# ------------------------------------------------------------------------------------------ the run's inputs

def test_the_observation_is_the_runs_own(runs: dict[str, Path]) -> None:
    obs = observe(build_report(runs["bf16"]).document())
    bench = _bench(runs["bf16"])
    assert obs.requests == bench["num_prompts"] == 300
    assert obs.prompt_tokens == 1024 and obs.output_tokens == 256
    assert obs.memory.kv_tokens == 253_392  # "GPU KV cache size: 253,392 tokens"
    assert math.isclose(obs.memory.kv_bytes, 46.4 * (1 << 30), rel_tol=1e-9)  # "Available KV cache memory: 46.4 GiB"
    # 14B shape (hidden 5120, 48 layers, GQA 40/8, head dim 128): K and V of a token in every layer, bf16
    assert math.isclose(obs.memory.kv_bytes_per_token, 2 * 48 * 8 * 128 * 2, rel_tol=0.01)
    assert obs.layers_heads_dim == pytest.approx(48 * 40 * 128, rel=1e-6)
    assert obs.measured.preemptions == 43


def test_a_run_without_a_benchmark_cannot_be_modelled(sqlite_path) -> None:
    with pytest.raises(Unobservable, match="no benchmark result"):
        observe(build_report(sqlite_path("eager_b1")).document())
    one_error_line(profkit("predict", sqlite_path("eager_b1"), "--", "--max-num-seqs", "64"), "cannot model this run")


# ------------------------------------------------------------------------------------ calibration and changes

def test_the_calibration_reproduces_the_measured_run(bf16) -> None:
    m = bf16.observation.measured
    assert bf16.baseline.elapsed_s == pytest.approx(m.elapsed_s, rel=0.01)  # fitted
    assert bf16.baseline.preemptions == m.preemptions  # the admission slack fitted to them
    # not fitted: the model's own error. TTFT's was under 10 % while the steps were read on the host's timeline; read
    # on the GPU's (analysis/steps.py: each step from the first kernel it launched) the prefill-bearing steps' MFU is
    # 0.77, not 0.47 (the host's ranges gave them the decode steps' GPU time behind them), and the prior's split of
    # a step between the weights' read and the arithmetic moved with it
    assert bf16.fit_error["tpot"] < 0.10 and bf16.fit_error["ttft"] < 0.135


def test_no_change_predicts_the_measured_run(bf16) -> None:
    p = predict(bf16, {"max_model_len": 2048})
    for m in p.metrics.values():
        assert m["predicted"] == pytest.approx(m["before"], rel=1e-9)
        assert m["low"] < m["before"] < m["high"]


def test_the_kv_cache_arithmetic_by_hand(bf16) -> None:
    """FP8 KV cache: half the bytes per token, twice the tokens in the same memory; FP8 weights free half the weights'
    bytes for the cache; --kv-cache-memory-bytes sets it."""
    mem = bf16.observation.memory
    kv = predict(bf16, {"kv_cache_dtype": "fp8"}).reasoning[0]
    assert kv == f"KV cache {mem.kv_tokens:,} → {2 * mem.kv_tokens:,} tokens (FP8 KV cache: half the bytes per token)"
    both = predict(bf16, {"kv_cache_dtype": "fp8", "quantization": "fp8"}).reasoning
    expected = round((mem.kv_bytes + mem.weights_bytes / 2) / (mem.kv_bytes_per_token / 2))
    assert f"→ {expected:,} tokens" in both[1]
    # the recorded FP8 run's log: 632,112 tokens; the model's arithmetic from the bf16 run: within 2.5 %
    assert expected == pytest.approx(632_112, rel=0.025)
    fixed = predict(bf16, {"kv_cache_memory_bytes": 10 * mem.kv_bytes_per_token * 1000})
    assert fixed.reasoning[0].startswith(f"KV cache {mem.kv_tokens:,} → 10,000 tokens")


def test_the_fp8_pair_is_predicted_within_its_range(runs: dict[str, Path], bf16) -> None:
    """bf16 -> FP8 weights and KV cache, measured on the H100 (tests/data/h100_phases): 10.56 -> 16.69 req/s
    (unprofiled replicates of the same change: 17.74-18.28). Validated error: +13.5 %."""
    p = predict(bf16, {"quantization": "fp8", "kv_cache_dtype": "fp8"})
    measured = _bench(runs["fp8"])
    rt = p.metrics["request_throughput"]
    assert rt["low"] <= measured["request_throughput"] <= rt["high"]
    assert abs(rt["predicted"] / measured["request_throughput"] - 1) < 0.20
    assert p.limit_before.startswith("the KV cache") and "every request is running" in p.limit_after
    assert any("precision" in t for t in p.trades)


def test_a_change_within_the_noise_is_predicted_within_it(runs: dict[str, Path]) -> None:
    """The tiny model at vLLM's defaults, its API server saturated, given --max-num-batched-tokens 16384: measured
    32.44 -> 32.92 req/s. The frontend's ceiling does not move: the prediction stays within the noise."""
    folder = runs["tune"] / "s1" / "runs" / "03-kv-preemption"
    config = folder.parent / "tiny-config.json"
    config.write_text(json.dumps(script("validate_model").TINY))
    cal = calibrate(observe(build_report(folder, Evidence.read(model_config=config)).document()))
    p = predict(cal, {"max_num_batched_tokens": 16384})
    measured = _bench(runs["tune"] / "s1" / "runs" / "04-engine-core-bound")["request_throughput"]
    rt = p.metrics["request_throughput"]
    assert abs(rt["predicted"] / rt["before"] - 1) < 0.03
    assert rt["low"] <= measured <= rt["high"]
    assert "API server" in p.limit_before


# ------------------------------------------------------------------------------------------------- the command

def test_predict_in_every_format(runs: dict[str, Path], tmp_path: Path) -> None:
    args = ("predict", runs["bf16"], "--format")
    doc = json.loads(profkit(*args, "json", "--", "--kv-cache-dtype", "fp8").stdout)
    assert doc["schema"] == "profkit.prediction/1"
    assert set(doc["metrics"]) == {"request_throughput", "output_throughput", "mean_ttft_ms", "mean_tpot_ms"}
    for m in doc["metrics"].values():
        assert m["low"] <= m["predicted"] <= m["high"] and m["before"] > 0
    assert doc["unmodelled"] == []  # a flag the model does not know is refused (tests/test_refusals.py)
    assert doc["limit"]["before"] and doc["limit"]["after"] and doc["reasoning"]
    for fmt in ("text", "md", "html"):
        out = profkit(*args, fmt, "--", "--kv-cache-dtype", "fp8").stdout
        assert "requests/s" in out and "10.56" in out and "FP8 KV cache" in out


def test_predict_refuses_changes_it_cannot_model(runs: dict[str, Path]) -> None:
    one_error_line(profkit("predict", runs["bf16"], "--", "--bogus", "3"),
                   "changes: not predicted: the model does not know what --bogus would do")
    one_error_line(profkit("predict", runs["bf16"]), "changes: no vLLM flag")


# ------------------------------------------------------------------------------------------------------- tune

def _ranking(run: Path, allow_precision: bool) -> list[dict]:
    from profkit.tune.loop import Config, Run, allowed_flags, model_candidates
    from profkit.vllm.command import UserCommand

    best = Config(UserCommand([], "test"), [Run(run, "ok", False, report=build_report(run).document())])
    ranking, fitted = model_candidates(best, [best], "request_throughput", [], allow_precision,
                                       set(allowed_flags(None, allow_precision=allow_precision)), 0.02)
    assert ranking is not None, fitted
    return ranking


def test_tune_tries_the_lever_worth_most_first_and_skips_the_nudges(tmp_path: Path) -> None:
    """The 14B baseline tune started from (tests/data/h100_gpu_bound/tune, bf16 at vLLM's defaults). With leave to
    change precision, tune's first candidate is the FP8 pair (measured on the H100 at 17.74-18.28 req/s against 11.10,
    +62 %), inside its range; without it, nothing the model knows is worth more than a few per cent (the run is
    GPU-bound at vLLM's defaults), and no memory nudge is offered."""
    with tarfile.open(DATA / "h100_gpu_bound.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    run = tmp_path / "h100_gpu_bound" / "tune" / "runs" / "01-baseline" / "r1"
    first = _ranking(run, allow_precision=True)[0]
    assert {c["flag"]: c["to"] for c in first["changes"]} == {"--quantization": "fp8", "--kv-cache-dtype": "fp8"}
    assert first["predicted"]["low"] <= 17.74 and first["predicted"]["high"] >= 18.28 and not first["skip"]
    safe = _ranking(run, allow_precision=False)
    assert all(c["predicted"]["gain"] < 0.05 for c in safe)
    assert not any(c["flag"] == "--gpu-memory-utilization" for cand in safe for c in cand["changes"])


def test_tune_jumps_to_the_prescription_from_a_misconfigured_start(tmp_path: Path) -> None:
    """The 14B run with --gpu-memory-utilization 0.6 (9.16 req/s; h100_model). Tune's first candidate is the report's
    own prescription, every lever combined in one restart: the memory share back to vLLM's default and the FP8 pair.
    Without leave to change precision, the memory, predicted inside what vLLM's default measured (11.10 req/s, the
    `default` configuration)."""
    with tarfile.open(DATA / "h100_model.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    run = tmp_path / "h100_model" / "gpu06" / "r1"
    doc = build_report(run).document()
    first = _ranking(run, allow_precision=True)[0]
    assert {c["flag"]: c["to"] for c in first["changes"]} == \
        {c["flag"]: c["to"] for c in doc["prescription"]["changes"]}
    assert {c["flag"] for c in first["changes"]} == {"--gpu-memory-utilization", "--quantization", "--kv-cache-dtype"}
    assert first["undoes"] is None and first["predicted"]["gain"] > 0.5
    safe = _ranking(run, allow_precision=False)[0]
    # the memory back to vLLM's default (since the GPU's memory is read off vLLM's log, with 2,048 batched tokens
    # beside it: +1.4 % more, within the noise and not measured)
    flags = [c["flag"] for c in safe["changes"]]
    assert flags[0] == "--gpu-memory-utilization" and set(flags) <= {"--gpu-memory-utilization",
                                                                     "--max-num-batched-tokens"}
    measured = statistics.fmean(json.loads((tmp_path / "h100_model" / "default" / r / "bench.json").read_text())
                                ["request_throughput"] for r in ("r1", "r2", "r3"))
    assert safe["predicted"]["low"] <= measured <= safe["predicted"]["high"]


# ------------------------------------------------------------------- out of sample: recorded after the model

@pytest.mark.parametrize(("base", "after", "changes", "tolerance"), [
    ("gpu06", "default", {"gpu_memory_utilization": 0.92}, 0.05),   # validated: -0.2 %
    ("default", "kvfp8", {"kv_cache_dtype": "fp8"}, 0.10),          # validated: -5.2 %
    ("default", "seqs64", {"max_num_seqs": 64}, 0.06),              # validated: +2.9 %
])
def test_pairs_recorded_after_the_model(tmp_path: Path, base: str, after: str, changes: dict, tolerance: float) -> None:
    """The 14B shape on the H100, 3 replicates a side, each its own seed (tests/data/h100_model.README.md): the
    prediction from a baseline replicate is within the validated error of the changed side's mean and its range
    holds that mean."""
    with tarfile.open(DATA / "h100_model.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "h100_model"
    measured = [_bench(root / after / r)["request_throughput"] for r in ("r1", "r2", "r3")]
    truth = sum(measured) / len(measured)
    cal = calibrate(observe(build_report(root / base / "r1").document()))
    rt = predict(cal, changes).metrics["request_throughput"]
    assert abs(rt["predicted"] / truth - 1) < tolerance
    assert rt["low"] <= truth <= rt["high"]



@pytest.fixture(scope="module")
def tune_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory, "h100_tune_model")


def _mean_rate(folder: Path) -> float:
    values = [_bench(r)["request_throughput"] for r in sorted(folder.glob("r[0-9]"))]
    return sum(values) / len(values)


def test_tune_reached_the_grids_best_from_a_misconfigured_start(tune_model: Path) -> None:
    """The recorded tune on the H100 (h100_tune_model.README.md): from --gpu-memory-utilization 0.6 (9.10 req/s) it
    spent 4 of its 6 runs and kept the prescription (18.07 req/s), at least 95 % of every configuration measured on
    this workload: the same day's grid on the same machine (FP8 pair at vLLM's default memory, and with 16,384
    batched tokens) and the earlier one (h100_model: the default, FP8 KV cache, 64 sequences)."""
    doc = json.loads((tune_model / "tune" / "tune.json").read_text())
    assert doc["runs_used"] <= 6 and doc["allow_precision"]
    kept = [s for s in doc["steps"] if s["decision"] == "keep"]
    assert [s["candidate"]["rule"] for s in kept] == ["prescription"]
    best = _mean_rate(tune_model / "tune" / "runs" / "03-prescription")
    assert math.isclose(doc["best"]["best"], best, rel_tol=1e-6) and doc["best"]["best_step"] == kept[0]["step"]
    baseline = _mean_rate(tune_model / "tune" / "runs" / "01-baseline")
    grid = [_mean_rate(tune_model / name) for name in ("fp8_092", "fp8_mbt16k")]
    assert best >= 0.95 * max(grid) and best > 1.9 * baseline
    # its prediction, recorded before the run, held what was measured
    p = kept[0]["candidate"]["predicted"]
    assert p["low"] <= best <= p["high"] and abs(p["predicted"] / best - 1) < 0.10


@pytest.mark.parametrize(("after", "changes"), [
    ("fp8_092", {"gpu_memory_utilization": 0.92, "quantization": "fp8", "kv_cache_dtype": "fp8"}),  # +9.7 %
    ("fp8_mbt16k", {"gpu_memory_utilization": 0.92, "quantization": "fp8", "kv_cache_dtype": "fp8",
                    "max_num_batched_tokens": 16384}),                                               # +8.2 %
])
def test_the_grid_from_the_misconfigured_start(tune_model: Path, after: str, changes: dict) -> None:
    """Out of sample (P17, P18 in docs/prediction.md): within the validated 10 % and inside the range."""
    cal = calibrate(observe(build_report(tune_model / "tune" / "runs" / "01-baseline" / "r1").document()))
    rt = predict(cal, changes).metrics["request_throughput"]
    truth = _mean_rate(tune_model / after)
    assert abs(rt["predicted"] / truth - 1) < 0.11 and rt["low"] <= truth <= rt["high"]


def test_cuda_graphs_on_a_launch_bound_run(tune_model: Path) -> None:
    """P19: the 1.1B shape eager at 8 requests in flight, the engine core saturated issuing kernels (2.2-3.1 req/s,
    TPOT 9.9-13.7 ms) against CUDA graphs (11.43 req/s, TPOT 2.55 ms). The engine core's CPU per step keeps its
    fitted factor and loses the launches: by hand, fitted x (2.5 ms) / (2.5 ms + 16 layers x 0.55 ms). Each
    replicate's range holds the measured mean; their mean prediction is within 5 % (the eager replicates
    themselves spread 30 %)."""
    from profkit.model.predict import CPU_STEP_S, EAGER_CPU_PER_LAYER_S

    truth = _mean_rate(tune_model / "lb_graphs")
    predicted = []
    for r in ("r1", "r2", "r3"):
        cal = calibrate(observe(build_report(tune_model / "lb_eager" / r).document()))
        assert cal.observation.layers == 16 and cal.observation.config.get("enforce_eager")
        p = predict(cal, {"enforce_eager": False})
        ratio = CPU_STEP_S / (CPU_STEP_S + 16 * EAGER_CPU_PER_LAYER_S[1])
        assert f"the engine core's CPU per step {cal.cost.cpu_step_s * 1e3:.2f} → " \
               f"{cal.cost.cpu_step_s * ratio * 1e3:.2f} ms" in " ".join(p.reasoning)
        rt = p.metrics["request_throughput"]
        assert rt["low"] <= truth <= rt["high"]
        predicted.append(rt["predicted"])
    assert abs(sum(predicted) / 3 / truth - 1) < 0.05

def test_search_finds_the_fp8_pair_only_where_precision_may_change(runs: dict[str, Path]) -> None:
    base = ("predict", runs["bf16"], "--search", "--top", "3", "--format", "json")
    found = json.loads(profkit(*base, "--allow-precision-changes").stdout)["search"]
    assert found and found[0]["changes"]["quantization"] == "fp8" and found[0]["changes"]["kv_cache_dtype"] == "fp8"
    rates = [p["metrics"]["request_throughput"]["predicted"] for p in found]
    assert rates == sorted(rates, reverse=True) and rates[0] > 1.3 * found[0]["metrics"]["request_throughput"]["before"]
    without = json.loads(profkit(*base).stdout)["search"]
    assert all("fp8" not in json.dumps(p["changes"]) for p in without)
    # an SLO no configuration meets: none is proposed; the one that misses it least is said as such
    strict = json.loads(profkit(*base, "--allow-precision-changes", "--slo", "mean_ttft_ms<=100").stdout)
    assert strict["search"] == [] and strict["bounds"] == ["mean_ttft_ms<=100"]
    assert not strict["closest"]["meets_bounds"] and strict["closest"]["metrics"]["mean_ttft_ms"]["predicted"] > 100
    text = profkit(*base[:-2], "--slo", "mean_ttft_ms<=100").stdout
    assert "none meets mean_ttft_ms<=100" in text and "the closest: " in text
    # an SLO the run misses (its mean TTFT is 9.5 s): every configuration listed is predicted to meet it
    met = json.loads(profkit(*base, "--allow-precision-changes", "--slo", "ttft_mean_ms<=8000").stdout)["search"]
    assert met and all(p["metrics"]["mean_ttft_ms"]["predicted"] <= 8000 and p["meets_bounds"] for p in met)


def test_tune_shows_each_candidates_prediction_beside_its_measurement() -> None:
    from profkit.render import render

    step = {"step": 1, "kind": "candidate", "objective": 17.9, "decision": "keep", "why": "+58 %",
            "candidate": {"rule": "kv-capacity-bound", "changes": [{"flag": "--kv-cache-dtype", "to": "fp8"}],
                          "predicted": {"before": 11.0, "predicted": 18.9, "low": 13.8, "high": 27.5, "gain": 0.72}}}
    doc = {"schema": "profkit.tune/1", "objective": {"name": "request_throughput", "better": "higher"}, "slos": [],
           "budget": 6, "runs_used": 4, "profile": "never", "noise": {}, "steps": [step], "best": None,
           "stopped": "done", "diff": None}
    for fmt in ("text", "md"):
        out = render(doc, fmt)
        assert "predicted 18.9, range 13.8-27.5, +72 %" in out and "17.9" in out


def test_a_prescription_keeps_only_changes_a_measurement_could_tell_apart() -> None:
    """minimal() on the README sample (14B at --gpu-memory-utilization 0.6): `--max-num-batched-tokens 32768` beside
    the FP8 pair is predicted to add 1.6 % (18.03 against 17.74 req/s), under the 3 % a benchmark can tell apart of
    the configuration itself: dropped, the FP8 pair and the memory kept; a flag set to what vLLM's default does
    (0.92, the default's value) is the flag removed, at the same prediction."""
    from profkit.model.search import Found, minimal

    cal = calibrate(observe(build_report("samples/vllm_14b_kv_bound").document()))
    pair = {"gpu_memory_utilization": None, "quantization": "fp8", "kv_cache_dtype": "fp8"}
    found = Found({**pair, "max_num_batched_tokens": 32768}, predict(cal, {**pair, "max_num_batched_tokens": 32768}),
                  0.0)
    kept = minimal(cal, found, 0.03, None)
    assert kept.changes == pair
    assert 0.01 < found.loss_to(kept) < 0.03
    assert minimal(cal, found, 0.01, None).changes == found.changes  # a finer threshold keeps it
    default = Found({"gpu_memory_utilization": 0.92, "quantization": "fp8"},
                    predict(cal, {"gpu_memory_utilization": 0.92, "quantization": "fp8"}), 0.0)
    same = minimal(cal, default, 0.03, None)
    assert same.changes == {"gpu_memory_utilization": None, "quantization": "fp8"}
    assert same.prediction.metrics["request_throughput"]["predicted"] == pytest.approx(
        default.prediction.metrics["request_throughput"]["predicted"], rel=1e-9)


@pytest.fixture(scope="module")
def led(h200_model_led: Path) -> Path:
    return h200_model_led


def test_several_api_servers_share_the_load_unevenly(led: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The 8B at 128/256 with 4 API servers (lease 6): over the benchmark the busiest carried 0.83 of their CPU in r2
    (0.53 and 0.73 in the others), near one API server's ceiling while the rest idled, so 4 API servers served 1.22x
    one's. The ceiling the model gives N API servers is the busiest's: 1/N plus the imbalance of the rest, whose
    shipped values and range ends are, per count, the median and 10th-90th percentiles over the runs recorded with
    that many (scripts/validate_model.py reads them): 2 left less to their busiest than 4 did."""
    from profkit.model.predict import (
        API_SERVER_IMBALANCE,
        API_SERVER_IMBALANCE_AT_RATE,
        API_SERVER_IMBALANCE_AT_RATE_ENDS,
        API_SERVER_IMBALANCE_ENDS,
        busiest_share,
    )

    doc = build_report(led / "api" / "s2_api4" / "r2").document()
    facts = doc["facts"]
    assert facts["host.api_server_count"] == 4
    assert facts["host.api_server_busiest_share"] == pytest.approx(0.829, abs=0.001)
    said = next(x["summary"] for x in doc["findings"] if x["rule"] == "frontend-bound")
    assert "(it carried 82.9% of the 4 API servers' CPU, an even split 25.0%:" in said
    one = build_report(led / "api" / "s2_api1" / "r2").document()
    assert one["facts"]["host.api_server_busiest_share"] == 1.0
    assert "API servers' CPU" not in next(x["summary"] for x in one["findings"] if x["rule"] == "frontend-bound")
    validate_model = script("validate_model")
    by_count = validate_model.imbalances_by_count(tmp_path, root=led.parent)
    # 2: lease 17's six, lease 21's six, lease 22's four, lease 23's three and lease 24's six (data parallel 2) too;
    # 3: lease 11's one run and lease 12's three; 4: lease 13's two too
    assert {n: len(v) for n, v in by_count.items()} == {2: 50, 3: 4, 4: 23}
    shares = validate_model.imbalances(tmp_path, root=led.parent)
    assert len(shares) == 77 and min(shares.values()) < 0.1 and max(shares.values()) > 0.75
    read = validate_model.imbalance_constants({n: list(v.values()) for n, v in by_count.items()})
    assert read == (API_SERVER_IMBALANCE, API_SERVER_IMBALANCE_ENDS)
    assert API_SERVER_IMBALANCE[2] < API_SERVER_IMBALANCE[4]
    assert busiest_share(1) == 1.0
    assert busiest_share(2) == pytest.approx(0.5 + 0.5 * API_SERVER_IMBALANCE[2])
    assert busiest_share(3) == pytest.approx(1 / 3 + 2 / 3 * API_SERVER_IMBALANCE[3])
    # a count not recorded: the nearest recorded one's, the larger on a tie (validate_model leaves a pair's own runs
    # out: Q28's 3 then takes 4's, as when it was predicted)
    assert busiest_share(5) == pytest.approx(1 / 5 + 4 / 5 * API_SERVER_IMBALANCE[4])
    without_three = {n: v for n, v in API_SERVER_IMBALANCE.items() if n != 3}
    monkeypatch.setattr("profkit.model.predict.API_SERVER_IMBALANCE", without_three)
    assert busiest_share(3) == pytest.approx(1 / 3 + 2 / 3 * API_SERVER_IMBALANCE[4])
    # at a finite rate (lease 7's 15 runs, 2 API servers) they shared nearly evenly: the frontier's points take these;
    # lease 8's 16 runs with 4 API servers and lease 10's 12 with 2 and 4, recorded after, shared as evenly (their
    # medians inside those ends), as lease 12's 6 with 3
    at_rate = validate_model.imbalances(tmp_path, at_rate=True, root=led.parent)
    two = [v for k, v in at_rate.items() if "/sweep8s2/" in k]
    four = [v for k, v in at_rate.items() if "/sweep8s4/" in k]
    later = [v for k, v in at_rate.items() if "/sweep8s2b/" in k or "/sweep8s4b/" in k]
    three = [v for k, v in at_rate.items() if "/sweep8s3/" in k]
    assert len(two) == 15 and len(four) == 16 and len(later) == 12 and len(three) == 6 and len(at_rate) == 49
    assert max(at_rate.values()) < 0.21 and statistics.median(two) < API_SERVER_IMBALANCE[2]
    cuts = statistics.quantiles(two, n=10, method="inclusive")
    read = round(statistics.median(two), 3), (round(cuts[-1], 2), round(cuts[0], 2))
    assert read == (API_SERVER_IMBALANCE_AT_RATE, API_SERVER_IMBALANCE_AT_RATE_ENDS)
    assert API_SERVER_IMBALANCE_AT_RATE_ENDS[1] < statistics.median(four) < API_SERVER_IMBALANCE_AT_RATE_ENDS[0]
    assert API_SERVER_IMBALANCE_AT_RATE_ENDS[1] < statistics.median(later) < API_SERVER_IMBALANCE_AT_RATE_ENDS[0]
    assert API_SERVER_IMBALANCE_AT_RATE_ENDS[1] < statistics.median(three) < API_SERVER_IMBALANCE_AT_RATE_ENDS[0]
    assert busiest_share(4) == pytest.approx(0.25 + 0.75 * API_SERVER_IMBALANCE[4])


def test_a_run_paced_by_its_frontend_takes_the_gpu_prior_the_fitted_runs_measured(led: Path) -> None:
    """The eight 16-bit configurations recorded on H200s at full load whose step cost could be fitted (the GPU or the
    engine core set their pace) found the prior's step 26 % too slow to 7 % too fast (their r2s, a queued step's CPU and
    GPU overlapping in part), median 0.87: what a run paced by its frontend, which cannot be fitted, takes (lease 6's
    8B at 128/256 with one API server)."""
    from profkit.model.predict import UNFITTED_FACTOR, UNFITTED_FACTOR_ENDS, configured, unfitted_factor

    fitted = ["A/tune/runs/01-baseline", "A3/tune/runs/01-baseline", "B/defaults", "B/tune/runs/01-baseline",
              "api/api1_14b", "api/api4_14b", "sweep/capture", "sweep14/capture"]
    factors = []
    for folder in fitted:
        cal = calibrate(observe(build_report(led / folder / "r2").document()))
        assert cal.fit_error and not cal.observation.config.get("quantization"), folder
        assert "H200" in (cal.observation.gpu or ""), folder
        factors.append(cal.memory_factor)
    assert min(factors) > 0.73 and max(factors) < 1.08
    assert round(statistics.median(factors), 2) == UNFITTED_FACTOR[("H200", False)] == 0.87
    paced = calibrate(observe(build_report(led / "api" / "s2_api1" / "r2").document()))
    assert not paced.fit_error and paced.memory_factor == unfitted_factor(paced.observation) == 0.87
    # and their lowest and highest are the ends a prediction from it simulates the GPU's step at too (a fitted run's
    # change that does not move the step's costs simulates its middle alone)
    assert UNFITTED_FACTOR_ENDS[("H200", False)] == (round(min(factors), 2), round(max(factors), 2))
    unfitted = configured(paced, {"api_server_count": 2}).costs
    assert len(unfitted) == 3 and unfitted[0].weights_s / unfitted[1].weights_s == pytest.approx(1.07 / 0.87)
    assert unfitted[2].token_s / unfitted[1].token_s == pytest.approx(0.74 / 0.87)
    fitted_run = calibrate(observe(build_report(led / "sweep" / "capture" / "r2").document()))
    assert len(configured(fitted_run, {"api_server_count": 2}).costs) == 1


def test_the_engine_cores_cpu_is_named_as_the_limit_where_the_samples_say_it_set_the_pace(led: Path) -> None:
    """Lease 8's 4 API servers at full load, replicate 1: the engine core saturated (its CPU fitted on the run's
    duration), so the simulated steps take its CPU's time and the limit says so, before and after a change that leaves
    it there; the same run without its host samples cannot tell the CPU's time from the GPU's (the fit scales both
    alike) and names what the priors would, not the engine core."""
    from profkit.model.predict import host_bound

    folder = led / "api" / "s2_api4b" / "r1"
    cal = calibrate(observe(build_report(folder).document()))
    assert host_bound(cal.observation) == "engine_core" and cal.fit_error
    p = predict(cal, {"max_num_seqs": 512})
    # its CPU a large share of a step whose GPU time is too (with requests waiting the two overlap only in part)
    assert "the engine core's CPU and the GPU" in p.limit_before and p.limit_after == p.limit_before
    # lease 9's 8B at 64/512 with 4 API servers, its engine core saturated and no drain: the CPU alone
    paced = calibrate(observe(build_report(led / "api" / "s3_api4" / "r1").document()))
    assert host_bound(paced.observation) == "engine_core" and not paced.observation.host["drain_s"]
    assert predict(paced, {"max_num_seqs": 512}).limit_before.startswith("the engine core (its CPU per step")
    # lease 9's 1.1B with 4 API servers, its engine core saturated too, but its busiest API server streamed 4.5 s of
    # its 29.5 after the GPU was done: the steps are fitted to the GPU's 25 s, and the API server's queue sets the end
    small = calibrate(observe(build_report(led / "api" / "t1_api4" / "r3").document()))
    assert host_bound(small.observation) == "engine_core"
    assert small.observation.host["drain_s"] == pytest.approx(4.5, abs=0.05)
    assert predict(small, {"max_num_seqs": 512}).limit_before == "the API server (its CPU)"
    blind = calibrate(observe(build_report(None, Evidence.read(
        bench=folder / "bench.json", log=folder / "server.log", model_config=folder / "model-config.json", gpu="H200"))
        .document()))
    assert not blind.observation.host
    assert "engine core" not in predict(blind, {"max_num_seqs": 512}).limit_before


def test_a_prefill_heavy_run_whose_gpu_was_kept_busy_names_the_gpu(led: Path) -> None:
    """Lease 12's 512/128 with lengths +-50 % (`api/s4_api1`): NVML had the GPU busy 0.88-0.93 and the engine core used
    0.34-0.46 of a core, so the limit is the GPU's step. Its label compared the engine core's CPU with a decode-only
    step (22 ms beside a mean step near 100 ms, most of them carrying a prompt's chunk) and named the engine core;
    and the running batch sits at --max-num-seqs' 1,024 (671 of them decoding on average), where the model predicts
    +1 % for twice it: the GPU's step sets the pace, not the cap."""
    for r in ("r1", "r2", "r3"):
        cal = calibrate(observe(build_report(led / "api" / "s4_api1" / r).document()))
        assert cal.observation.gpu_busy >= 0.87 and cal.observation.host["engine_core_cpu"] <= 0.46
        p = predict(cal, {"max_num_seqs": 2048})
        assert p.limit_before == p.limit_after == "the GPU's step time"
        throughput = p.metrics["request_throughput"]
        assert throughput["predicted"] / throughput["before"] < 1.02


def test_the_limit_names_a_cap_that_binds_and_an_engine_core_that_paced(led: Path) -> None:
    """The limit line's other cases on recorded runs. The 14B at 256/768 (lease 5's 1-API-server runs, 400 requests at
    once) with --max-num-seqs 128: the running batch sits at the cap in waves of 128 (100 decoding on average), and
    the model loses a third of the throughput: the cap is the limit. The 8B at 64/512 with 4 API servers (lease 9,
    r1: the engine core at 0.92 of a core, saturated in 79 % of samples): its decode steps, most of its time, take
    the engine core's CPU."""
    from profkit.model.predict import host_bound

    cal = calibrate(observe(build_report(led / "api" / "api1_14b" / "r1").document()))
    p = predict(cal, {"max_num_seqs": 128})
    throughput = p.metrics["request_throughput"]
    assert throughput["predicted"] / throughput["before"] < 0.75
    assert p.limit_after == "--max-num-seqs (it caps the batch)" and "--max-num-seqs" not in p.limit_before
    core = calibrate(observe(build_report(led / "api" / "s3_api4" / "r1").document()))
    assert host_bound(core.observation) == "engine_core" and core.observation.host["engine_core_cpu"] > 0.9
    assert predict(core, {"max_num_seqs": 512}).limit_before.startswith("the engine core (its CPU per step")


def test_two_api_servers_take_the_imbalance_ends_of_two(led: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lease 9's 1.1B at 128/256, paced by its one API server: 2 API servers are predicted with the imbalance read off
    the runs with 2 (their 10th-90th percentiles at the range's ends), and there the API servers bind, so the ends
    widen the range; without them it is narrower."""
    import profkit.model.predict as model
    from profkit.model.predict import API_SERVER_IMBALANCE_ENDS, configured, imbalance_ends

    cal = calibrate(observe(build_report(led / "api" / "t1_api1" / "r2").document()))
    assert imbalance_ends(2) == API_SERVER_IMBALANCE_ENDS[2] != API_SERVER_IMBALANCE_ENDS[4]
    assert configured(cal, {"api_server_count": 2}).imbalance_ends == API_SERVER_IMBALANCE_ENDS[2]
    p = predict(cal, {"api_server_count": 2}, held_out=False)
    assert p.limit_after == "the API server (its CPU)"
    spanned = p.metrics["request_throughput"]
    monkeypatch.setattr(model, "API_SERVER_IMBALANCE_ENDS", {})
    narrow = predict(cal, {"api_server_count": 2}, held_out=False).metrics["request_throughput"]
    assert spanned["predicted"] == narrow["predicted"] and spanned["low"] < narrow["low"]
