"""The SLO frontier from one run, held against sweeps measured on H200s that it never saw
(tests/data/h200_model_led.tar.xz: an 8B at 1,024/256 and a 14B at 512/512, each captured at full load, then
`vllm bench serve` at 5-7 request rates against one server; each shape's FP8 pair swept as well, the 14B's (lease 5)
read only after the model of f9c7120 had predicted it; the 8B at 128/256 with one API server, swept at the 7
rates `profkit sweep --from` chose and predicted on the GPU box before it ran, lease 6; and the same 8B with 2 API
servers, predicted from the one's run, 5 rates x 3 replicates, lease 7).

What holds and what does not is measured here (scripts/validate_frontier.py prints every point): the throughput
the server keeps up with is predicted within 5 % (the 8B FP8 pair's, from the bf16 run, up to +15 % past its knee);
the goodput under TPOT and end-to-end bounds within 10 % in 13 of 17 cases (the misses -12 %, -18 %, -10 %, -14 %).
TTFT below the knee carries the frontend's time (1.6 steps of the engine's, stretched by its load, read off the three
sweeps with vLLM's histograms): the goodput under a p99 TTFT bound within -0 % to +10 % on the five sweeps that decide
it (was -39 % to +23 % with a fixed 15 ms); p50 over-predicted near the knees (to +86 %), the FP8 pairs'
under-predicted below them (to -45 %); on lease 7's 2-API-server sweep, held out, over-predicted (p99 +32 % to
+339 %); docs/prediction.md says so."""

from __future__ import annotations

import functools
import html
import json
import math
from pathlib import Path

import numpy as np
import pytest

from profkit.compare.sweep import measured_goodput
from profkit.model.frontier import canonical_metric, frontier, keeps_up, point_at
from profkit.model.observe import observe
from profkit.model.predict import DEFAULT_NOISE, calibrate, configured
from profkit.model.search import Bound
from profkit.model.simulate import StepCost
from profkit.render.frontier_words import ANCHORED
from tests.cli import one_error_line, profkit
from tests.conftest import script

SAMPLE_RUN = "samples/vllm_14b_kv_bound"

SWEEPS = {  # the sweep: the full-load capture it is predicted from, the changes from it, the throughput's error
    "8b_defaults": ("sweep/capture", "sweep/defaults", {}, 0.05),
    # the FP8 pair predicted from the bf16 run over-predicts its capacity: at 33.27 and 39.92 req/s offered it
    # served 30.16 and 30.98 (a queue growing), predicted 32.34 and 35.51
    "8b_fp8pair": ("sweep/capture", "sweep/fp8pair", {"quantization": "fp8", "kv_cache_dtype": "fp8"}, 0.15),
    "14b_defaults": ("sweep14/capture", "sweep14/defaults", {}, 0.05),
    "14b_fp8pair": ("sweep14/capture", "sweep14fp8", {"quantization": "fp8", "kv_cache_dtype": "fp8"}, 0.05),
    # lease 6: one API server, frontend-bound at full load; its 46.27 req/s, the last below the knee with the API
    # server at 0.95 of its ceiling, -4.7 % before the API servers' queue (7a23ad0) and -5.0 % since
    "8b_128_256": ("api/s2_api1", "sweep8s", {}, 0.06),
    # lease 7: two API servers, predicted from lease 6's one (the frontier of a change), 3 replicates a rate
    "8b_128_256_api2": ("api/s2_api1", "sweep8s2", {"api_server_count": 2}, 0.05),
    # lease 12: three API servers, from their own full-load run on the same box (neither side set its pace)
    "8b_128_256_api3": ("api/s2_api3b", "sweep8s3", {}, 0.05),
    # lease 14: a GPU-bound shape (512/128, lengths +-50 %) from lease 12's run on another box, and a change from it
    "8b_512_128": ("api/s4_api1", "sweep4s", {}, 0.05),
    "8b_512_128_mnbt2048": ("api/s4_api1", "sweep4s_mnbt2048", {"max_num_batched_tokens": 2048}, 0.05),
    # lease 18: two new shapes, each from its own full-load run (swept on another box, one run a rate)
    "14b_512_128": ("api/s14_512_128", "sweep14_512_128", {}, 0.05),
    "8b_1024_128": ("api/s8_1024_128", "sweep8_1024_128", {}, 0.05),
    # lease 19: the same two, swept again on a third box at six of the predicted frontier's rates, 3 replicates each
    "14b_512_128_x3": ("api/s14_512_128", "sweep14_512_128b", {}, 0.05),
    "8b_1024_128_x3": ("api/s8_1024_128", "sweep8_1024_128b", {}, 0.05),
}


@pytest.fixture(scope="module")
def recorded(h200_model_led: Path) -> Path:
    return h200_model_led


@functools.lru_cache(maxsize=8)
def calibrated(folder: Path):
    from profkit.report import build_report

    return calibrate(observe(build_report(folder).document()))


# a sweep's points by rate as scripts/validate_frontier.py reads them (`rate-R.json`, lease 2's; or a `profkit sweep`
# folder's runs, averaged over a rate's replicates): one reader for the docs' tables and these tests
sweep_points = script("validate_frontier").sweep_points


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_the_throughput_each_rate_is_served_at_is_predicted(recorded: Path, name: str) -> None:
    capture, sweep, changes, error = SWEEPS[name]
    cal = calibrated(recorded / capture / "r2")
    conf = configured(cal, changes)
    spread = DEFAULT_NOISE + max(cal.fit_error.values(), default=0.0)  # none: a frontend set the run's pace
    served = 0
    for m in sweep_points(recorded / sweep):
        p = point_at(cal, conf, m["request_rate"], m["num_prompts"], spread)
        # served where both kept up: a finite run at the rate lasts its sending time and about one request more
        kept = m["request_throughput"] >= 0.9 * m["num_prompts"] / (m["num_prompts"] / m["request_rate"]
                                                                    + m["mean_e2el_ms"] / 1e3)
        if keeps_up(p) and kept:
            served += 1
            assert p.predicted["request_throughput"] == pytest.approx(m["request_throughput"], rel=error)
    assert served >= 3


@pytest.mark.parametrize(("name", "bound"), [
    ("8b_defaults", Bound("p99_tpot_ms", "<=", 30)), ("8b_defaults", Bound("p99_e2el_ms", "<=", 5000)),
    ("8b_defaults", Bound("p99_tpot_ms", "<=", 15)), ("8b_fp8pair", Bound("p99_e2el_ms", "<=", 5000)),
    ("14b_defaults", Bound("p99_tpot_ms", "<=", 15)), ("14b_defaults", Bound("p99_e2el_ms", "<=", 8000)),
    ("14b_fp8pair", Bound("p99_tpot_ms", "<=", 15)), ("14b_fp8pair", Bound("p99_tpot_ms", "<=", 20)),
    ("8b_512_128_mnbt2048", Bound("p99_e2el_ms", "<=", 3000)),
    ("14b_512_128_x3", Bound("p99_tpot_ms", "<=", 30)), ("14b_512_128_x3", Bound("p99_e2el_ms", "<=", 3000)),
    ("8b_1024_128_x3", Bound("p99_tpot_ms", "<=", 30)), ("8b_1024_128_x3", Bound("p99_e2el_ms", "<=", 3000))])
def test_the_goodput_under_tpot_and_end_to_end_bounds_is_within_10_percent(recorded: Path, name: str,
                                                                          bound: Bound) -> None:
    """Measured 21.27, 19.28 and 17.35 req/s (8B: p99 TPOT <= 30 ms, E2E <= 5 s, TPOT <= 15 ms), 27.41 (its FP8 pair,
    predicted from the 16-bit run), 7.86 and 8.22 (14B), 12.96 and 15.15 (its FP8 pair, lease 5), 41.28 (lease 14's
    --max-num-batched-tokens 2048, p99 E2E <= 3 s), 22.27 and 16.42 (lease 19's 14B at 512/128: p99 TPOT <= 30 ms,
    E2E <= 3 s), 25.62 and 21.36 (its 8B at 1,024/128); predicted from r2's full-load run -2 %, -2 %, -5 %, +1 %,
    +7 %, +6 %, -6 %, -3 %, -5 %, +1 %, +0 %, +1 %, +5 % (lease 19's predicted before it ran). The 8B's TPOT
    <= 15 ms (-12 % before) and lease 14's (-17 % predicted first) are here since a step at a rate takes the GPU's
    busy time (`predict._Fit.busy_share`), which was chosen after lease 14's sweeps ran: in-sample for them."""
    capture, sweep, changes, _ = SWEEPS[name]
    cal = calibrated(recorded / capture / "r2")
    f = frontier(cal, changes, [bound])
    measured = measured_goodput(sweep_points(recorded / sweep), bound)
    assert f.goodput["rate"] == pytest.approx(measured, rel=0.10)
    assert f.goodput["low"] <= f.goodput["rate"] <= f.goodput["high"]


@pytest.mark.parametrize(("name", "bound", "low", "high", "inside"), [
    ("8b_fp8pair", Bound("p99_tpot_ms", "<=", 15), 1.10, 1.15, True),
    ("14b_fp8pair", Bound("p99_e2el_ms", "<=", 8000), 0.85, 0.90, True),
    ("8b_128_256_api2", Bound("p99_e2el_ms", "<=", 3000), 0.80, 0.90, False)])
def test_the_goodput_the_frontier_misses_by_more_is_said(recorded: Path, name: str, bound: Bound, low: float,
                                                         high: float, inside: bool) -> None:
    """Where the prediction misses by more than 10 %, inside its range: the 8B FP8 pair's p99 TPOT <= 15 ms (measured
    22.85 req/s, predicted from the 16-bit run +12 %; +5 % before a step at a rate took the GPU's busy time, which
    brought the 16-bit run's own from -12 % to -5 %), the 14B FP8 pair's p99 E2E <= 8 s (13.93, -10.3 %) and,
    since lease 10's changes, lease 7's 2 API servers under p99 E2E <= 3 s (58.56,
    -13 % from r2: the engine core's CPU per request read off lease 6's 1-API-server run, 48 us, is more than lease
    7's box spent at a rate, about 37; -1 % before). That one's range held it until lease 12's runs moved 2 API
    servers' imbalance (0.17 -> 0.20, 0.05-0.51 -> 0.06-0.50): its high end, 57.46 from r2, is now 2 % short."""
    capture, sweep, changes, _ = SWEEPS[name]
    cal = calibrated(recorded / capture / "r2")
    f = frontier(cal, changes, [bound])
    measured = measured_goodput(sweep_points(recorded / sweep), bound)
    assert low < f.goodput["rate"] / measured < high
    assert (f.goodput["low"] <= measured <= f.goodput["high"]) is inside
    assert inside or 0.95 < f.goodput["high"] / measured < 1.0


def test_the_sweep_predicted_on_the_gpu_box_before_it_ran(recorded: Path) -> None:
    """Lease 6: `profkit sweep --from api/s2_api1` chose its rates and wrote each point's prediction (243a8c4's model)
    before measuring it. Throughput within 2 % at all 7 rates; TTFT over-predicted (p99 by 84-235 %: the frontend's
    time read off the 14B's 512-token prompts is too long, its tail too heavy, for 128-token prompts), so the goodput
    under p99 TTFT <= 150 ms came out -39 %, outside its range; under p99 TPOT <= 15 ms every rate met it, as the
    model said (52.31 predicted)."""
    doc = json.loads((recorded / "sweep8s" / "sweep.json").read_text())
    assert len(doc["points"]) == 7
    for p in doc["points"]:
        assert abs(p["error"]["request_throughput"]) < 0.02
        assert 0.8 < p["error"]["p99_ttft_ms"] < 2.7
    tpot, ttft = doc["goodput"]
    assert tpot["at_least"] == 46.27 and tpot["predicted"]["rate"] > 46.27 and tpot["inside_range"]
    assert ttft["bound"] == "p99_ttft_ms<=150" and ttft["error"] == pytest.approx(-0.388, abs=0.001)
    assert not ttft["inside_range"]


def test_the_frontier_of_a_change_measured_by_a_replicated_sweep(recorded: Path) -> None:
    """Lease 7: the 8B at 128/256 with 2 API servers, swept at 5 rates x 3 replicates, each point predicted on the GPU
    box before it ran from lease 6's 1-API-server capture with the change (`profkit sweep --from api/s2_api1 --changes
    --api-server-count=2`, 5d1f19b's model). Held out. Throughput within 2 % at every rate (60.2 req/s served at 63);
    TPOT over-predicted, p50 +15 % at 28 req/s to +82 % at 63 (the full-load run was paced by its API server, so the
    step costs are the GPU's priors, not fitted: their cost per sequence in the batch runs ahead of the measured), so
    the goodput under p99 TPOT <= 10 ms came out -28 % (40.13 against 55.79, outside its range; each replicate's runs
    alone measured 43.74-57.05) and under p99 TTFT <= 150 ms every rate met it where 30.45 was predicted. Today's model
    (the frontend's time 1.6 steps of the engine's, first committed before these results were read, 60b4e34; the GPU's
    prior step corrected by the H200 runs that could be fitted, made after this miss; at a rate the API servers' more
    even share read off this sweep's own runs: in-sample) gives the TTFT bound 52.55 (-17 % or more) and the TPOT
    bound 51.9 (-7 %); since lease 10's changes (a queued step's partial overlap, the engine core's CPU per request
    read off the 1-API-server run: 48 us, where lease 7's box spent about 37 at a rate) 51.35 and 48.99 (-12 %)."""
    doc = json.loads((recorded / "sweep8s2" / "sweep.json").read_text())
    assert [p["rate"] for p in doc["points"]] == [28, 38, 46, 54, 63]
    assert all(p["replicates"] == 3 for p in doc["points"])
    for p in doc["points"]:
        assert abs(p["error"]["request_throughput"]) < 0.02 and p["spread"]["request_throughput"] < 0.01
    tpot = [p["error"]["p50_tpot_ms"] for p in doc["points"]]
    assert tpot == sorted(tpot) and 0.14 < tpot[0] < 0.16 and 0.8 < tpot[-1] < 0.84
    g_tpot, g_ttft = doc["goodput"]
    assert g_tpot["error"] == pytest.approx(-0.281, abs=0.001) and not g_tpot["inside_range"]
    assert g_ttft["at_least"] == 63 and g_ttft["predicted"]["rate"] == pytest.approx(30.45, abs=0.01)
    shown = profkit("sweep", "--show", recorded / "sweep8s2", "--from", recorded / "api" / "s2_api1", "--changes",
                    "--api-server-count 2", "--slo", "p99_tpot_ms<=10", "--slo", "p99_ttft_ms<=150",
                    "--format", "json")
    assert shown.returncode == 0, shown.stderr
    now = {g["bound"]: g for g in json.loads(shown.stdout)["goodput"]}
    assert [r["measured"] for r in now["p99_tpot_ms<=10"]["per_replicate"]] == pytest.approx([43.74, 55.54, 57.05],
                                                                                           abs=0.01)
    assert now["p99_ttft_ms<=150"]["per_replicate"] == [{"at_least": 63}] * 3
    assert now["p99_ttft_ms<=150"]["at_least"] == 63
    assert now["p99_ttft_ms<=150"]["predicted"]["rate"] == pytest.approx(51.35, abs=0.05)
    # today's model: the goodput under p99 TPOT <= 10 ms -12 %, inside a range widened by the sweeps of its class of
    # change (API servers: this one, lease 8's and lease 10's; lease 8's TPOT the engine core's saturation put above
    # the prediction: the range reaches down further than up)
    tpot_now = now["p99_tpot_ms<=10"]
    assert tpot_now["error"] == pytest.approx(-0.122, abs=0.005) and tpot_now["inside_range"]
    assert tpot_now["predicted"]["rate"] < tpot_now["measured"] < tpot_now["predicted"]["high"]


def test_four_api_servers_swept_at_six_rates_capped_by_the_engine_core(recorded: Path) -> None:
    """Lease 8: the 8B at 128/256 with 4 API servers, swept at the 6 rates `profkit sweep --runs 18` chose from the
    frontier predicted from lease 6's 1-API-server capture, 3 replicates a rate (the device time ran out in 78.24's
    second: 16 runs), every point predicted on the GPU box before it ran (93afb36's model). Held out. The goodputs
    came inside their ranges, under p99 TPOT <= 10 ms +25 % (51.84 against 41.35), under p99 TTFT <= 150 ms +5 %; the
    throughput within 1 % while the server kept up, then over-predicted: the engine core saturated from 46.65 req/s
    (a full core, where the model put its ceiling far above) and the server served about 50 where the model said
    55-73. With 2 API servers (lease 7) the same server kept up at 63."""
    from profkit.analysis.host import host_section
    from profkit.diagnose.facts import host_facts
    from profkit.evidence.bench import read_bench
    from profkit.evidence.host import read_host

    folder = recorded / "sweep8s4"
    shown = profkit("sweep", "--show", folder, "--from", recorded / "api" / "s2_api1", "--changes",
                    "--api-server-count 4", "--slo", "p99_tpot_ms<=10", "--slo", "p99_ttft_ms<=150", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    points = {p["rate"]: p for p in doc["points"]}
    assert sorted(points) == [39.12, 46.65, 51.84, 57.02, 58.68, 78.24]
    assert [points[r]["replicates"] for r in sorted(points)] == [3, 3, 3, 3, 3, 1]
    served = [points[r]["error"]["request_throughput"] for r in sorted(points)]
    assert all(abs(e) < 0.01 for e in served[:2]) and all(e > 0.035 for e in served[2:])
    goodput = {g["bound"]: g for g in doc["goodput"]}
    assert goodput["p99_tpot_ms<=10"]["measured"] == pytest.approx(41.35, abs=0.01)
    # +25 % and +5 % before lease 10's changes (the engine core's CPU per request read off the 1-API-server run)
    assert goodput["p99_tpot_ms<=10"]["error"] == pytest.approx(0.185, abs=0.005)
    assert goodput["p99_ttft_ms<=150"]["error"] == pytest.approx(0.030, abs=0.005)
    assert all(g["inside_range"] for g in goodput.values())
    for run in sorted(folder.glob("rate-*/r*/bench.json")):
        bench = read_bench(run)
        facts = host_facts(host_section(read_host(run.parent / "host.json"), bench.elapsed_s))
        assert facts["host.api_server_cpu"] < 0.6  # each API server far from a core
        if bench.request_rate > 45:
            assert facts["host.engine_core_saturated_share"] > 0.85 and facts["host.engine_core_cpu"] > 0.97


def test_what_the_frontier_misses_is_measured_not_hidden(recorded: Path) -> None:
    """TTFT below the knee, from the 8B's full-load run against its two sweeps (neither has vLLM's histograms: the
    frontend's 1.6 steps were not read off them, its gamma shape was chosen on all six sweeps): at vLLM's
    defaults the p50 is over-predicted by 4-23 %, the more the nearer the knee (the frontend's time grows with the
    step and with its load, both), and the goodput under p99 TTFT <= 200 ms by 6 % (within 1 % before a step at a
    rate took the GPU's busy time); with the FP8 pair the p50 is under-predicted by 31-42 % at the three lowest rates
    (its prefill measured no faster than 16-bit's at 1,024-token prompts) and the goodput under p99 TTFT <= 300 ms is
    over-predicted (+9 %)."""
    cal = calibrated(recorded / "sweep" / "capture" / "r2")
    spread = DEFAULT_NOISE + max(cal.fit_error.values())
    fp8 = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    for sweep, changes, (low, high), limit, (over_low, over_high) in (
            ("defaults", {}, (1.0, 1.3), 200, (1.0, 1.1)), ("fp8pair", fp8, (0.55, 0.75), 300, (1.03, 1.12))):
        conf = configured(cal, changes)
        points = sweep_points(recorded / "sweep" / sweep)
        for m in points[:3 if changes else 4]:  # below the knee
            p = point_at(cal, conf, m["request_rate"], m["num_prompts"], spread)
            assert low < p.predicted["p50_ttft_ms"] / m["p50_ttft_ms"] < high, (sweep, m["request_rate"])
        bound = Bound("p99_ttft_ms", "<=", limit)
        over = frontier(cal, changes, [bound]).goodput["rate"] / measured_goodput(points, bound)
        assert over_low < over < over_high, sweep


def test_predict_frontier_on_the_readme_sample(tmp_path: Path) -> None:
    r = profkit("predict", "samples/vllm_14b_kv_bound", "--frontier", "--slo", "p99_tpot_ms<=20")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "profkit predict --frontier: samples/vllm_14b_kv_bound"
    assert lines[3].startswith("  goodput within p99_tpot_ms<=20: ") and "beyond it p99_tpot_ms<=20 fails" in lines[3]
    doc = json.loads(profkit("predict", "samples/vllm_14b_kv_bound", "--frontier", "--slo", "median_tpot_ms<=20",
                             "--format", "json").stdout)
    f = doc["frontier"]
    assert f["bounds"] == ["p50_tpot_ms<=20"]
    rates = [p["rate"] for p in f["points"]]
    assert rates == sorted(rates) and f["capacity"]["rate"] is None
    cap = f["capacity"]["metrics"]["request_throughput"]["predicted"]
    # shares of the simulated capacity, which the capacity shown (predict's, anchored to the run) is within the fit's
    # error of: 0.0 % here
    assert rates[0] == pytest.approx(0.1 * cap, rel=1e-4) and rates[-1] == pytest.approx(1.25 * cap, rel=1e-4)
    for p in f["points"]:
        m = p["metrics"]
        assert m["p50_ttft_ms"]["predicted"] <= m["p90_ttft_ms"]["predicted"] <= m["p99_ttft_ms"]["predicted"]
        assert m["p99_tpot_ms"]["low"] <= m["p99_tpot_ms"]["predicted"] <= m["p99_tpot_ms"]["high"]
    md = profkit("predict", "samples/vllm_14b_kv_bound", "--frontier", "-o", tmp_path / "f.md")
    assert md.returncode == 0 and "| rate (req/s) |" in (tmp_path / "f.md").read_text()


def test_a_goodput_the_capacity_binds_has_a_range_on_both_sides() -> None:
    """The README sample under p99 TPOT <= 60 ms: the bound holds up to the capacity, so the goodput is where the queue
    starts to grow (11.0 req/s). Each end of its range is judged with every cost at that end: with costs the spread
    shorter the server keeps up at the next rate past it, so the range reaches past the goodput (its high end had
    been the goodput itself), and with them longer the queue grows sooner, so it reaches below."""
    from profkit.report import build_report

    cal = calibrate(observe(build_report(SAMPLE_RUN).document()))
    f = frontier(cal, {}, [Bound("p99_tpot_ms", "<=", 60)])
    good = f.goodput
    assert good["binding"] == "capacity"
    assert good["low"] < good["rate"] < good["high"]
    past = next(p for p in f.points if p.rate > good["rate"])
    assert not keeps_up(past) and past.growth_ends[0] <= 0.0 < past.growth_ends[1]
    assert good["high"] <= past.rate


def test_a_frontier_bound_on_a_metric_it_does_not_predict_is_one_line() -> None:
    line = one_error_line(profkit("predict", "samples/vllm_14b_kv_bound", "--frontier", "--slo", "p95_ttft_ms<=9"),
                          "p95_ttft_ms")
    assert "p99_ttft_ms" in line  # the known ones named
    assert canonical_metric("median_e2el_ms") == "p50_e2el_ms"
    with pytest.raises(ValueError):
        canonical_metric("p95_ttft_ms")


def test_the_report_shows_the_frontier_before_and_after_its_prescription(tmp_path: Path) -> None:
    """The README sample's prescription (more KV cache, FP8) predicted to move the whole curve: at each share of
    capacity the prescribed configuration serves more, and at about the same rate (its share against the run's next
    one up) at a lower p99 TPOT (at the same share it serves about twice the rate, and since FP8 weights no longer
    read faster at small batches, f9c7120, its TPOT there is not lower); every format shows it, HTML as a chart."""
    doc = json.loads(profkit("report", "samples/vllm_14b_kv_bound", "--format", "json").stdout)
    f = doc["prescription"]["frontier"]
    before, after = f["before"], f["after"]
    assert before["changes"] == {} and after["changes"] == {
        k.lstrip("-").replace("-", "_"): v for k, v in ((c["flag"], c["to"]) for c in doc["prescription"]["changes"])}
    cap = [side["capacity"]["metrics"]["request_throughput"]["predicted"] for side in (before, after)]
    assert cap[0] == pytest.approx(doc["prescription"]["predicted"]["request_throughput"]["before"], rel=0.05)
    assert cap[1] == pytest.approx(doc["prescription"]["predicted"]["request_throughput"]["predicted"], rel=0.05)
    for side, c in ((before, cap[0]), (after, cap[1])):
        assert [p["rate"] for p in side["points"]] == pytest.approx([s * c for s in (0.25, 0.5, 0.75, 0.9)], rel=1e-4)
    for b, a in zip(before["points"], after["points"], strict=True):
        assert a["rate"] > b["rate"]
    for a, b in ((after["points"][0], before["points"][1]), (after["points"][1], before["points"][3])):
        assert a["rate"] >= 0.95 * b["rate"] and a["metrics"]["p99_tpot_ms"]["predicted"] < b["metrics"][
            "p99_tpot_ms"]["predicted"]
    text = profkit("report", "samples/vllm_14b_kv_bound").stdout
    assert "The frontier, as run and prescribed (predicted; every request at once 9.16 → 17.7 req/s" in text
    profkit("report", "samples/vllm_14b_kv_bound", "-o", tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    section = html[html.index('<section id="frontier">'):]
    assert section.index("<svg") < section.index("</section>")
    md = profkit("report", "samples/vllm_14b_kv_bound", "--format", "md").stdout
    assert "| prescribed | all at once | 17.7 |" in md


def test_search_with_a_percentile_bound_ranks_by_goodput() -> None:
    """A bound on a latency percentile is the frontier's: the search's best configurations are ranked by the largest
    rate each serves within it; a mean's bound still bounds the search itself."""
    doc = json.loads(profkit("predict", SAMPLE_RUN, "--search", "--slo", "p99_tpot_ms<=25", "--top", "5",
                             "--format", "json").stdout)
    assert doc["ranked_by"] == "goodput" and doc["bounds"] == ["p99_tpot_ms<=25"]
    rates = [r["goodput"]["rate"] for r in doc["search"]]
    assert rates and rates == sorted(rates, reverse=True) and rates[-1] > 0
    plain = json.loads(profkit("predict", SAMPLE_RUN, "--search", "--format", "json").stdout)
    assert plain["ranked_by"] == "request_throughput" and "goodput" not in plain["search"][0]
    one_error_line(profkit("predict", SAMPLE_RUN, "--search", "--slo", "p95_tpot_ms<=25"),
                   "--slo: the frontier predicts no 'p95_tpot_ms'")


def test_the_shipped_frontier_rows_are_todays_model(recorded: Path) -> None:
    """profkit/model/frontier_validation.json (scripts/validate_frontier.py --write) holds each sweep point as today's
    model predicts it, with the model's own range: the 14B's 8.49 req/s point from its second full-load replicate,
    afresh."""
    from profkit.model import validation
    from profkit.model.predict import spread

    rows = [r for r in validation.frontier_rows() if r["sweep"] == "sweep14/defaults" and r["rate"] == 8.49
            and r["replicate"] == "r2"]
    assert len(rows) >= 14
    cal = calibrated(recorded / "sweep14" / "capture" / "r2")
    p = point_at(cal, configured(cal, {}), 8.49, 339, spread(cal), held_out=False)
    for r in rows:
        assert r["predicted"] == pytest.approx(p.predicted[r["metric"]], rel=1e-9), r["metric"]
        assert (r["low"], r["high"]) == pytest.approx((p.low[r["metric"]], p.high[r["metric"]]), rel=1e-9)


def test_a_rates_range_carries_what_the_sweeps_missed_by_and_its_coverage_is_the_rows_own(recorded: Path) -> None:
    """Below the knee the model's own p99 TPOT ranges held 11 of 51 measured points; widened to the other
    recording's errors (leave-one-recording-out), 33 of 51: the rows' flags are recomputed here, and the product's
    ranges hold the bands of every row."""
    from profkit.model import validation
    from profkit.model.predict import spread

    rows = validation.frontier_rows()
    for r in rows:
        assert r["inside_held_out"] == validation.inside_frontier_held_out(r, rows), (r["sweep"], r["metric"])
    own = [r for r in rows if not r["changed"] and r["metric"] == "p99_tpot_ms"]
    assert sum(r["low"] <= r["measured"] <= r["high"] for r in own) < sum(r["inside_held_out"] for r in own)
    cal = calibrated(recorded / "sweep14" / "capture" / "r2")
    p = point_at(cal, configured(cal, {}), 8.49, 339, spread(cal))
    low, high = validation.frontier_band("p99_tpot_ms", changed=False)
    assert high > 0.1  # the model under-predicts TPOT at some rates below the knee: its range reaches up
    assert p.high["p99_tpot_ms"] >= p.predicted["p99_tpot_ms"] * math.exp(high) * (1 - 1e-12)
    assert p.low["p99_tpot_ms"] <= p.predicted["p99_tpot_ms"] * math.exp(low) * (1 + 1e-12)
    measured = json.loads((recorded / "sweep14" / "defaults" / "rate-8.49.json").read_text())["p99_tpot_ms"]
    assert not p.low["p99_tpot_ms"] <= measured <= p.predicted["p99_tpot_ms"] * math.exp(spread(cal))
    assert p.low["p99_tpot_ms"] <= measured <= p.high["p99_tpot_ms"]


def test_a_change_to_the_runs_own_settings_is_no_change(recorded: Path) -> None:
    """`-- --max-num-seqs N` with the run's own N predicts the run's own frontier: its ranges carry the errors of the
    swept configurations as they ran, not those of a changed one (the FP8 pair's, x3.9 on p99 TPOT)."""
    cal = calibrated(recorded / "sweep14" / "capture" / "r2")
    own = cal.observation.config.get("max_num_seqs")
    assert own is not None
    assert not configured(cal, {"max_num_seqs": own}).changed and configured(cal, {"max_num_seqs": 64}).changed
    same = frontier(cal, {"max_num_seqs": own}, [Bound("p99_tpot_ms", "<=", 15)]).goodput
    assert same == frontier(cal, {}, [Bound("p99_tpot_ms", "<=", 15)]).goodput


def test_the_frontends_time_at_a_rate_is_what_vllms_histograms_measured(recorded: Path) -> None:
    """The time a request spends outside the engine's steps at a rate (the client and HTTP, the API server): 1.6
    steps of the simulated engine's, stretched by the frontend's load, against what vLLM's histograms measured on
    the three sweeps that have them (the client's TTFT less the engine's queue and prefill; the 14B's and its FP8
    pair's, 20-58 ms; the 8B's at 128-token prompts, 15-19 ms below 24 req/s). In-sample: the 1.6 steps were
    read off these points (the median of measured over simulated step, load taken out, over the 17 below a load of
    0.8; 18 since the 8B's saturated API server's ceiling takes in the burst it kept pace with, `kept_pace`, and its
    34.7 req/s fell to 0.79); what this holds is that the constant reproduces them: median predicted/measured 1.00,
    and where it misses (0.50-2.10: the FP8 pair's 16 req/s measured 152 ms, its neighbours 58). The waits about that
    mean are a sum's, not one queue's: their p99 is 2.8x their mean."""
    from dataclasses import replace

    from profkit.model.frontier import _waits
    from profkit.model.predict import FRONTEND, frontend_latency
    from profkit.model.simulate import simulate_latencies
    from profkit.report import build_report

    fp8 = {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    ratios = []
    for capture, swept, changes in (("sweep14/capture/r2", "sweep14p", {}), ("sweep14/capture/r2", "sweep14fp8", fp8),
                                    ("api/s2_api1/r2", "sweep8s", {})):
        cal = calibrated(recorded / capture)
        conf = configured(cal, changes)
        for m in sweep_points(recorded / swept):
            work = replace(cal.workload, requests=m["num_prompts"], request_rate=m["request_rate"])
            r, lat = simulate_latencies(work, conf.engine, conf.costs[len(conf.costs) // 2], conf.engines)
            caps = conf.caps(r)
            if max(r.output_throughput / caps[n] for n in FRONTEND if caps.get(n)) >= 0.8:
                continue
            split = build_report(recorded / swept / f"rate-{m['request_rate']:g}" / "r1").document()["vllm"][
                "ttft_split"]
            ratios.append(frontend_latency(r, caps, float(lat.tpot_s.mean())) * 1e3
                          / (split["client_ms"] + split["api_server_ms"]))
    assert len(ratios) == 18
    assert np.median(ratios) == pytest.approx(1.00, abs=0.01)
    assert 0.45 < min(ratios) < 0.55 and 2.0 < max(ratios) < 2.2
    waits = _waits(1000)
    assert waits.mean() == pytest.approx(1.0) and 2.5 < np.percentile(waits, 99) < 3.1  # gamma(3): p99 2.8x


def test_the_frontier_of_more_api_servers_spans_their_imbalance(recorded: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """Where the API servers' count changes, a point's range spans their ceiling at the imbalance's ends, and the
    capacity's range is as wide as `predict`'s for the same change (the same question, one answer): from lease 6's
    1-API-server 8B at 128/256, 4 API servers measured 56.57 req/s at full load (three replicates), predicted 60.4
    (+7 %; 78.0, +38 %, before lease 10's changes: the engine core's CPU read off the run into a step whose CPU and GPU
    overlap in part with requests waiting, so the engine, not the API servers, caps 4 of them). That run could not be
    fitted (its API server set the pace): the capacity's range also simulates the GPU's step at the ends of what the
    fitted runs found (0.74-1.07 of the prior), which sets its low end and holds the measurement. The imbalance's
    ends (the 10th-90th percentiles over the full-load runs recorded with 4 API servers, these three among them) no
    longer move it. Both were set after Q20 missed: in-sample for this check."""
    import profkit.model.predict as predict
    from profkit.model.predict import predict as predict_change

    cal = calibrated(recorded / "api" / "s2_api1")
    measured = np.mean([json.loads(p.read_text())["request_throughput"]
                        for p in sorted((recorded / "api" / "s2_api4").glob("r*/bench.json"))])
    assert measured == pytest.approx(56.57, abs=0.01)

    def capacity() -> dict[str, float]:
        return frontier(cal, {"api_server_count": 4}, shares=(0.5,)).capacity.document()["metrics"][
            "request_throughput"]

    spanned = capacity()
    assert spanned["low"] <= measured <= spanned["high"]
    said = predict_change(cal, {"api_server_count": 4}).metrics["request_throughput"]
    assert [spanned[k] / said[k] for k in ("predicted", "low", "high")] == pytest.approx([1, 1, 1], abs=0.01)
    assert spanned["predicted"] / measured - 1 == pytest.approx(0.07, abs=0.02)
    monkeypatch.setattr(predict, "UNFITTED_FACTOR_ENDS", {})
    fitted_alike = capacity()
    assert fitted_alike["predicted"] == spanned["predicted"] and spanned["low"] < fitted_alike["low"]
    # the engine's step caps 4 API servers on the mean, but at the full-load imbalance's high end (0.66 of the rest on
    # the busiest) that one's queue outlasts the engine at the run's end (7a23ad0): the ends lower the range's low end
    monkeypatch.setattr(predict, "API_SERVER_IMBALANCE_ENDS", {})
    assert capacity()["low"] > fitted_alike["low"] * 1.04
    # the run's own configuration has no such ends: its range is the model's own
    assert configured(cal, {}).imbalance_ends == ()


def test_a_run_neither_the_gpu_nor_one_process_paced_is_not_fitted(recorded: Path) -> None:
    """Lease 12: the 8B at 128/256 with 3 API servers at full load, then `profkit sweep --from` that run on one box.
    Its GPU was busy 0.67-0.73 of the time and no process saturated in most samples (the engine core in 44-55 %).
    9b10439, on the box before the sweep ran, fitted the run's step costs on its duration: the engine core's share of
    each step went to the GPU, TPOT at the rates came out +41 % to +86 % and the goodputs -32 % and -24 %, outside
    their ranges (sweep.json). Such a run is not fitted since (the GPU at the factor the fitted runs on this GPU found,
    the engine core's CPU off its samples): from r2 and r3, TPOT p50 within 5 % up to 45 req/s and the goodput under
    p99 TPOT <= 10 ms +12 %, inside; r1, whose engine core saturated in 55 % of samples, is fitted on it: -17 %,
    inside its range."""
    doc = json.loads((recorded / "sweep8s3" / "sweep.json").read_text())
    tpot, ttft = doc["goodput"]
    assert tpot["error"] == pytest.approx(-0.324, abs=0.001) and not tpot["inside_range"]
    assert ttft["error"] == pytest.approx(-0.244, abs=0.001) and not ttft["inside_range"]
    points = sweep_points(recorded / "sweep8s3")
    bound = Bound("p99_tpot_ms", "<=", 10)
    measured = measured_goodput(points, bound)
    assert measured == pytest.approx(46.45, abs=0.01)
    for r in ("r2", "r3"):
        cal = calibrated(recorded / "api" / "s2_api3b" / r)
        assert not cal.fit_error
        conf = configured(cal, {})
        for m in points:
            if m["request_rate"] < 46:
                p = point_at(cal, conf, m["request_rate"], m["num_prompts"], DEFAULT_NOISE)
                assert p.predicted["p50_tpot_ms"] == pytest.approx(m["p50_tpot_ms"], rel=0.05)
        f = frontier(cal, {}, [bound])
        assert 0.05 < f.goodput["rate"] / measured - 1 < 0.15 and f.goodput["low"] <= measured <= f.goodput["high"]
    fitted = calibrated(recorded / "api" / "s2_api3b" / "r1")
    assert fitted.fit_error
    f = frontier(fitted, {}, [bound])
    # inside its range since a rate's range carries the step's error through the simulation (its high end was 2 %
    # short): a fitted engine core's step near the knee compounds as the GPU's does
    assert -0.20 < f.goodput["rate"] / measured - 1 < -0.10 and f.goodput["low"] <= measured <= f.goodput["high"]
    # a run whose engine core was not sampled (`vllm bench throughput`: its frontend in one process) is still fitted
    # on its own duration: nothing says its CPU
    offline = calibrated(recorded / "offline" / "tput8_r1")
    assert offline.fit_error["elapsed"] < 0.01
    said = json.loads(profkit("predict", recorded / "api" / "s2_api3b" / "r2", "--format", "json", "--",
                              "--api-server-count", "2").stdout)
    assert said["calibration"]["calibrated_on"].startswith("not calibrated: neither the GPU (not kept busy) nor one")


def test_two_new_shapes_frontiers_predicted_first(recorded: Path) -> None:
    """Lease 18: the 14B at 512/128 and the 8B at 1,024/128 (lengths +-50 %), each captured at full load (GPU busy
    0.92-0.96, no host process saturated), their frontiers under p99 TPOT <= 30 ms and p99 TTFT <= 300 ms predicted
    by 2e2d974 (the step at a rate at the GPU's busy time) before any point ran (lease18-predicted/), then swept from
    those runs on another box at the rates its model chose (4 of 5 finished, one run each). The goodput under both
    bounds: the 14B 24.02 req/s measured, 22.40 predicted (-7 %, its range's high end 24.04); the 8B 23.81, 24.89
    (+5 %). Each bound alone, from the three replicates: the 14B's TPOT -7.5 %, TTFT every rate met (>= 24.64,
    predicted 23.60); the 8B's TPOT every rate met (>= 27.38, 25.71), TTFT +5.4 %. 6cc7b18's model (the step fitted
    on the duration) gave -13.5 %, -9.8 % or more, -15 % or more and -2.0 % (docs/prediction.md)."""
    for name, tpot_bound_met in (("14b_512_128", False), ("8b_1024_128", True)):
        capture, sweep, _, _ = SWEEPS[name]
        said = json.loads((recorded / "lease18-predicted" / f"frontier-{capture.split('/')[1]}.json").read_text())
        stored = said["frontier"]["goodput"]
        bounds = [Bound("p99_tpot_ms", "<=", 30), Bound("p99_ttft_ms", "<=", 300)]
        assert said["frontier"]["bounds"] == ["p99_tpot_ms<=30", "p99_ttft_ms<=300"]
        # today's model is the one that predicted it
        f = frontier(calibrated(recorded / capture), {}, bounds)
        assert f.goodput["rate"] == pytest.approx(stored["rate"], rel=1e-9)
        points = sweep_points(recorded / sweep)
        assert len(points) == 4 and all(len(list((recorded / sweep).glob(f"rate-{m['request_rate']:g}/r*"))) == 1
                                        for m in points)
        measured = min(measured_goodput(points, b) for b in bounds)
        # the bar (within 10 %), not the errors seen
        assert abs(stored["rate"] / measured - 1) < 0.10 and stored["low"] <= measured <= stored["high"]
        assert all(bounds[0].holds(m["p99_tpot_ms"]) for m in points) is tpot_bound_met


def six_rates_run_once_then_again(folder: Path) -> list[str]:
    """A `profkit sweep --replicates 3` folder of six rates: every rate once, then again (each run's seed says when
    it ran). Its rate folders, ascending."""
    seeds = {(r.parent.name, r.name): json.loads((r / "manifest.json").read_text())["session"]["seed"]
             for r in folder.glob("rate-*/r*")}
    rates = sorted({rate for rate, _ in seeds}, key=lambda d: float(d.split("-")[1]))
    assert len(rates) == 6 and len(seeds) == 18
    assert sorted(seeds, key=seeds.get) == [(rate, f"r{k}") for k in (1, 2, 3) for rate in rates]
    return rates


def test_two_new_shapes_swept_at_six_rates_three_replicates_as_predicted_first(recorded: Path) -> None:
    """Lease 19: lease 18's two shapes swept again on a third box, `profkit sweep --rates --replicates 3` at six of the
    frontier points 2e2d974 predicted from lease 18's captures (chosen and predicted before the lease), every rate once
    and then again. Each bound's goodput as `profkit sweep --show FOLDER --from CAPTURE` gives it: the 14B's p99 TPOT
    <= 30 ms 22.27 req/s measured, 22.40 predicted (+1 %), p99 TTFT <= 300 ms 26.06, 23.64 (-9 %); the 8B's 25.62,
    25.45 (-1 %) and 26.25, 24.89 (-5 %): the issue's 10 %, and inside their ranges. Both bounds at once, the stored
    prediction (lease18-predicted/) +1 % and -3 %. Per point up to the goodputs, TPOT p50 and p99 and TTFT p99 within
    25 % (the largest: the 8B's TPOT p50 -17 % at 11.78 req/s, the 14B's TTFT p99 +24 % at 20.61); past them the
    over-prediction near the knee (TPOT p50 +29 % and +49 % at the capacity) is measured, not hidden."""
    from profkit.compare.sweep import predictor, show_sweep

    bounds = [("p99_tpot_ms", "<=", 30.0), ("p99_ttft_ms", "<=", 300.0)]
    for name in ("14b_512_128_x3", "8b_1024_128_x3"):
        capture, sweep, _, _ = SWEEPS[name]
        folder = recorded / sweep
        six_rates_run_once_then_again(folder)
        doc = show_sweep(folder, predictor(recorded / capture, bounds))
        assert all(p["replicates"] == 3 and abs(p["error"]["request_throughput"]) < 0.05 for p in doc["points"])
        goodputs = {g["bound"]: g for g in doc["goodput"]}
        for g in goodputs.values():
            assert abs(g["error"]) < 0.10 and g["inside_range"], g
            assert len(g["per_replicate"]) == 3
        edge = max(g["measured"] for g in goodputs.values())
        for p in doc["points"]:
            if p["rate"] <= edge:
                for metric in ("p50_tpot_ms", "p99_tpot_ms", "p99_ttft_ms"):
                    assert abs(p["error"][metric]) < 0.25, (name, p["rate"], metric)
        assert doc["points"][-1]["error"]["p50_tpot_ms"] > 0.15  # the knee's over-prediction, still there
        said = json.loads((recorded / "lease18-predicted" / f"frontier-{capture.split('/')[1]}.json").read_text())
        stored = said["frontier"]["goodput"]
        both = min(g["measured"] for g in goodputs.values())
        assert abs(stored["rate"] / both - 1) < 0.10 and stored["low"] <= both <= stored["high"]


def test_a_rates_range_carries_the_steps_error_through_the_simulation(recorded: Path) -> None:
    """Lease 19's 8B at 1,024/128 near its knee (26.5 req/s, predicted from lease 18's r2): measured TPOT p50 18.72
    ms, predicted 21.93. The outputs widened by the spread alone (3.6 %) would end at 21.14 and miss it; a step
    whose every cost is the spread shorter gathers fewer tokens and comes out at 18.01, so the model's own range holds
    it. Near the knee the range is lopsided (a longer step compounds more), and its ends are those two simulations'."""
    from dataclasses import replace

    from profkit.model.frontier import _through
    from profkit.model.predict import spread

    cal = calibrated(recorded / "api" / "s8_1024_128" / "r2")
    conf, width = configured(cal, {}), spread(cal)
    m = next(m for m in sweep_points(recorded / "sweep8_1024_128b") if m["request_rate"] == 26.5)
    p = point_at(cal, conf, m["request_rate"], m["num_prompts"], width, held_out=False)
    k, measured = "p50_tpot_ms", m["p50_tpot_ms"]
    assert p.predicted[k] * math.exp(-width) > measured  # widened outputs alone miss it
    assert p.low[k] <= measured <= p.high[k]
    costs = conf.step_costs(m["request_rate"])
    (shorter, _), (longer, _) = _through(cal, conf, replace(cal.workload, requests=m["num_prompts"],
                                                             request_rate=m["request_rate"]),
                                         costs[len(costs) // 2], width)
    assert (p.low[k], p.high[k]) == pytest.approx((shorter[k], longer[k]), rel=1e-12)
    assert p.high[k] - p.predicted[k] > p.predicted[k] - p.low[k] > p.predicted[k] * (1 - math.exp(-width))


def test_a_change_from_each_shape_swept_at_six_rates_three_replicates_as_predicted_first(recorded: Path) -> None:
    """Lease 20, a fourth box: a change from each of lease 18's captures, its frontier predicted on the workstation
    before the lease (lease20-predicted/, 2fed7ae) and swept at six of its points, 3 replicates each. The 14B at
    512/128 with --max-num-seqs 64 (bounds p99 TPOT <= 20 ms, p99 TTFT <= 300 ms): 17.43 req/s measured against
    17.74 predicted (+2 %) and 18.79 against 20.35 (+8 %, below 2fed7ae's range: one replicate's p99 TTFT 678 ms at
    19.24 req/s, the others' 165-172); the 8B at 1,024/128 with --max-num-batched-tokens 2048 (p99 TPOT <= 30 ms,
    p99 TTFT <= 300 ms): 26.44 against 25.47 (-4 %) and 26.69 against 25.34 (-5 %). Under both bounds at once the
    stored prediction is +2 % and -4 %. The cap holds the 14B's TPOT where the model put it: the replicates' mean p99
    under 25 ms at every rate (one run 27.4 ms), the throughput past the capacity the capped one."""
    from profkit.compare.sweep import predictor, show_sweep

    cases = [  # sweep, capture, change, bounds, each bound's measured goodput, the stored first prediction
        ("sweep14_512_128_mns64", "api/s14_512_128", "--max-num-seqs 64",
         [("p99_tpot_ms", "<=", 20.0), ("p99_ttft_ms", "<=", 300.0)], (17.43, 18.79),
         "frontier-s14_512_128-mns64.json"),
        ("sweep8_1024_128_mnbt2048", "api/s8_1024_128", "--max-num-batched-tokens 2048",
         [("p99_tpot_ms", "<=", 30.0), ("p99_ttft_ms", "<=", 300.0)], (26.44, 26.69),
         "frontier-s8_1024_128-mnbt2048.json"),
    ]
    for sweep, capture, change, bounds, measured, stored_at in cases:
        folder = recorded / sweep
        rates = six_rates_run_once_then_again(folder)
        doc = show_sweep(folder, predictor(recorded / capture, bounds, change))
        assert all(p["replicates"] == 3 and abs(p["error"]["request_throughput"]) < 0.05 for p in doc["points"])
        goodputs = doc["goodput"]
        assert [round(g["measured"], 2) for g in goodputs] == list(measured)
        assert all(abs(g["error"]) < 0.10 and len(g["per_replicate"]) == 3 for g in goodputs)
        # the prediction made before the lease, both bounds at once
        said = json.loads((recorded / "lease20-predicted" / stored_at).read_text())["frontier"]
        # the swept rates are six of that frontier's points
        assert {float(r.split("-")[1]) for r in rates} <= {round(p["rate"], 2) for p in said["points"]}
        both = min(g["measured"] for g in goodputs)
        assert abs(said["goodput"]["rate"] / both - 1) < 0.10
        assert said["goodput"]["low"] <= both <= said["goodput"]["high"]
        if "max-num-seqs" in change:
            assert all(p["measured"]["p99_tpot_ms"] < 25 for p in doc["points"])
            assert all(p["metrics"]["p99_tpot_ms"]["predicted"] < 25 for p in said["points"])
            capacity = said["capacity"]["metrics"]["request_throughput"]["predicted"]
            assert abs(doc["points"][-1]["measured"]["request_throughput"] / capacity - 1) < 0.05
            ttft = next(g for g in goodputs if g["bound"].startswith("p99_ttft"))
            assert ttft["measured"] < 0.97 * ttft["predicted"]["rate"]  # the miss: the cap bound sooner


def test_the_step_at_a_rate_takes_the_busy_share_only_where_nvml_says_it(recorded: Path, tmp_path: Path) -> None:
    """Lease 18's 8B capture, r2: the GPU busy 0.916 of its full-load run (NVML), no host process saturated, so at a
    rate every GPU cost is the fit's times 0.916 and every request at once the fit's own. A host.json whose NVML
    samples are not a share (NaN, 7.5, -1) says no busy share: the step at a rate stays the fit's, the frontier is
    still predicted, and the file is not written to."""
    import hashlib
    import shutil

    from profkit.report import build_report

    run = recorded / "api" / "s8_1024_128" / "r2"
    cal = calibrated(run)
    assert cal.gpu_busy_share == pytest.approx(0.9158, abs=1e-4) == cal.observation.gpu_busy
    conf = configured(cal, {})
    assert conf.step_costs(None) == conf.costs
    for full, at_rate in zip(conf.costs, conf.step_costs(20.0), strict=True):
        for k in ("weights_s", "token_s", "kv_token_s", "pair_s"):
            assert getattr(at_rate, k) == pytest.approx(getattr(full, k) * cal.gpu_busy_share, rel=1e-12)
        assert at_rate.overhead_s == full.overhead_s and at_rate.cpu_step_s == full.cpu_step_s
    for bad in (math.nan, 7.5, -1.0):
        copy = tmp_path / f"r2_{bad}"
        shutil.copytree(run, copy)
        host = json.loads((copy / "host.json").read_text())
        for gpu in host["gpus"]:
            gpu["util"] = [[t, bad] for t, _ in gpu["util"]]
        (copy / "host.json").write_text(json.dumps(host))
        digest = hashlib.sha256((copy / "host.json").read_bytes()).hexdigest()
        broken = calibrate(observe(build_report(copy).document()))
        assert broken.observation.gpu_busy is None and broken.gpu_busy_share == 1.0
        assert configured(broken, {}).step_costs(20.0) == configured(broken, {}).costs
        assert frontier(broken, {}, [Bound("p99_tpot_ms", "<=", 30)]).goodput["rate"] > 0
        assert hashlib.sha256((copy / "host.json").read_bytes()).hexdigest() == digest


def test_a_gpu_bound_shapes_frontier_predicted_first_came_out_short(recorded: Path) -> None:
    """Lease 14, on a fifth box: the frontier of the 8B at 512/128 (lengths +-50 %) from lease 12's full-load run on
    another, and of --max-num-batched-tokens 2048 from the same run, predicted by bda68c2 before either sweep ran
    (sweep.json's `predicted`). Throughput within 4 % at every rate; latency near the knee over-predicted (TPOT p50
    +103 % at 44.66 req/s), so the goodputs came out short and outside their ranges. Where: at a rate vLLM's
    counters gave 217-348 tokens a step in 9.8-12.8 ms, the model 290-620 tokens in 12.5-22.1 ms (a longer step
    gathers more tokens, which lengthen it). Today's model takes the GPU's costs times the full-load run's busy share
    at a rate (`predict._Fit.busy_share`, an empirical correction chosen after these sweeps ran: in-sample here;
    what it cancels is the step form's over-count at a few hundred tokens), and since 7a23ad0 fits the steps to the
    run's duration less the 1.6 s its GPU was done before the end (the API server's drain): TPOT p50 within -14 to
    +7 % up to 44.66 req/s and +17 % over the knee (before: +5 to +22 %, +44 %), the goodput under p99 TTFT <= 300 ms
    +2.2 % (before: within 2 %). (A p-norm of the weights' read and the arithmetic,
    fitted to lease 15's and 17's step curves, had moved these goodputs 2-4 points:
    test_the_step_against_its_tokens_as_measured.)"""
    for sweep, floor, ttft_error in (("sweep4s", 51.15, -0.115), ("sweep4s_mnbt2048", 49.06, -0.130)):
        doc = json.loads((recorded / sweep / "sweep.json").read_text())
        tpot, ttft = doc["goodput"]
        assert tpot["at_least"] == floor and tpot["predicted"]["high"] < floor and not tpot["inside_range"]
        assert ttft["error"] == pytest.approx(ttft_error, abs=0.001) and not ttft["inside_range"]
    points = sweep_points(recorded / "sweep4s")
    assert [round(m["request_rate"], 2) for m in points] == [25.58, 36.54, 38.36, 40.6, 44.66, 51.15]
    cal = calibrated(recorded / "api" / "s4_api1" / "r2")
    conf = configured(cal, {})
    for m in points:
        p = point_at(cal, conf, m["request_rate"], m["num_prompts"], DEFAULT_NOISE)
        served = p.predicted["request_throughput"] / m["request_throughput"]
        assert abs(served - 1) < 0.02
        tpot = p.predicted["p50_tpot_ms"] / m["p50_tpot_ms"]
        # within 15 % up to the knee, over it (51.15 req/s) ahead of the measured
        assert 0.85 < tpot < 1.15 if m["request_rate"] < 45 else 1.15 < tpot < 1.25
    bound = Bound("p99_ttft_ms", "<=", 300)
    measured = measured_goodput(points, bound)
    assert measured == pytest.approx(45.86, abs=0.01)
    f = frontier(cal, {}, [bound])
    assert f.goodput["rate"] / measured - 1 == pytest.approx(0.022, abs=0.001)


def test_the_step_against_its_tokens_as_measured(recorded: Path) -> None:
    """Leases 15 and 17 (`steptime/`: vLLM's offline engine, CUDA graphs as served, H200): one prompt of T tokens
    alone in a step, over a one-token step, and B requests decoding, on the 8B and 14B shapes; against the step of the
    model calibrated on each shape's full-load capture (its weights' read plus its arithmetic, `StepCost.step_s`).
    On the 8B the sum over-counts by 2.6-3.9 ms from 256 to 2,000 tokens: the weights' read (3.6 ms), which the
    arithmetic hides. On the 14B by 4.7 ms at 256 tokens, 3.6 at 512, none at 2,000: its step with a prompt costs
    5 ms more than a decode step even at 16 tokens (the 8B's 1.1 ms), which the hidden read's count stands in for. A
    one-request decode step is under-counted on both (13 %, 18 %). No form the model has gives these curves."""
    def curve(name: str) -> tuple[dict[int, float], dict[int, float]]:
        rows = [json.loads(line) for line in (recorded / "steptime" / name).read_text().splitlines()]
        assert rows[-1] == {"kind": "done"}
        return ({r["t"]: r["s"] * 1e3 for r in rows if r["kind"] == "prefill" and r["b"] == 1},
                {r["b"]: r["step"] * 1e3 for r in rows if r["kind"] == "decode"})

    overs = {}
    for name, capture, prompt_step in (("steptime.jsonl", "sweep/capture", 1.1),
                                       ("steptime14.jsonl", "sweep14/capture", 5.0)):
        prompt, decode = curve(name)
        fixed = prompt[1] - decode[1]  # a request's own costs beside its one step
        assert prompt[16] - fixed - decode[1] == pytest.approx(prompt_step, abs=0.1)
        cost = calibrated(recorded / capture / "r1").cost

        def step_ms(t: int, cost: StepCost = cost) -> float:
            return cost.step_s(t, 0, t * (t + 1) / 2) * 1e3  # a prompt alone: no KV read yet

        overs[name] = {t: (step_ms(t) - step_ms(1)) - (prompt[t] - prompt[1]) for t in (256, 512, 1024, 2000)}
        assert step_ms(1) < 0.9 * decode[1]
    assert all(2.5 < over < 4.0 for over in overs["steptime.jsonl"].values())
    fourteen = overs["steptime14.jsonl"]
    assert 4.0 < fourteen[256] < 5.5 and 3.0 < fourteen[512] < 4.5 and abs(fourteen[2000]) < 1.0


def test_the_frontier_says_its_step_at_a_rate_and_what_the_recorded_sweeps_missed_by(recorded: Path) -> None:
    """Beside the curve, in every format: the step at a rate where it is not the fit's (lease 18's 8B capture: its GPU
    busy 0.916 of the run, NVML), and what the recorded sweeps of its class measured against the model, p99 TTFT and
    TPOT (the 10th-90th percentiles of measured / predicted over the shipped rows, recomputed here by hand): the
    run's own configuration, a change whose class was swept (precision), and one whose class was not (the KV cache's
    size: every changed sweep's); the report's frontier before and after its prescription alike. A run the frontend
    paced (lease 6's, not fitted) keeps the fit's step and says nothing of it."""
    import statistics

    from profkit.model import validation

    def by_hand(metric: str, rows: list[dict]) -> tuple[float, float]:
        cuts = statistics.quantiles([math.log(r["measured"] / r["predicted"]) for r in rows if r["metric"] == metric],
                                    n=10, method="inclusive")
        return math.exp(cuts[0]) - 1, math.exp(cuts[-1]) - 1

    shipped = validation.frontier_rows()
    own = [r for r in shipped if not r["changed"]]
    fp8 = [r for r in shipped if "precision" in r.get("families", ())]
    cal = calibrated(recorded / "api" / "s8_1024_128" / "r2")
    for changes, rows, of in (({}, own, "the run's own configuration"),
                              ({"quantization": "fp8"}, fp8, "a change of precision"),
                              ({"gpu_memory_utilization": 0.8}, [r for r in shipped if r["changed"]],
                               "any change (KV cache size not swept)")):
        f = frontier(cal, changes).document()
        assert f["gpu_scale_at_a_rate"] == pytest.approx(0.9158, abs=1e-4)
        missed = f["missed_by"]
        assert missed["of"] == of and missed["sweeps"] == len({r["sweep"] for r in rows})
        for metric in ("p99_ttft_ms", "p99_tpot_ms"):
            band = (missed[metric]["low"], missed[metric]["high"])
            assert band == pytest.approx(by_hand(metric, rows), rel=1e-9)
    assert frontier(cal, {"quantization": "fp8"}).document()["missed_by"]["p99_ttft_ms"]["low"] > 0  # TTFT over
    run = recorded / "api" / "s8_1024_128" / "r2"
    said = {fmt: profkit("predict", run, "--frontier", "--format", fmt).stdout for fmt in ("text", "md", "html")}
    doc = json.loads(profkit("predict", run, "--frontier", "--format", "json").stdout)["frontier"]
    ttft = doc["missed_by"]["p99_ttft_ms"]
    expected = f"{ttft['low'] * 100:+.0f} % to {ttft['high'] * 100:+.0f} %"
    for fmt, out in said.items():
        assert "x 0.92, the run" in out and f"p99 TTFT was {expected}" in out, fmt
        assert f"on {doc['missed_by']['sweeps']} recorded sweep(s) of the run" in out, fmt
    # the report's frontier, before and after its prescription, says the same beside its table
    for fmt in ("text", "md", "html"):
        out = profkit("report", run, "--format", fmt).stdout
        frontier_part = out[out.index("The frontier, as run and prescribed"):]
        assert "x 0.92, the run" in frontier_part and f"p99 TTFT was {expected}" in frontier_part, fmt
    paced = calibrated(recorded / "api" / "s2_api1" / "r2")
    assert paced.gpu_busy_share == 1.0 and frontier(paced, {}).document()["gpu_scale_at_a_rate"] == 1.0
    assert "busy share" not in profkit("predict", recorded / "api" / "s2_api1" / "r2", "--frontier").stdout


def test_the_frontiers_every_request_at_once_is_predicts() -> None:
    """The README sample with an FP8 KV cache, and as it ran: the frontier's every-request-at-once point gives the
    means and ranges `predict` gives (both the simulation times the baseline's measured over simulated). It gave
    58.2 ms mean TPOT where predict said 54.9: the frontier's was the simulation's alone, off by the fit's 5.8 % on
    the run's own TPOT, and its TTFT range left out the fit's error on TTFT. As the run ran, the point's means are the
    measured ones."""
    said = json.loads(profkit("predict", SAMPLE_RUN, "--format", "json", "--", "--kv-cache-dtype", "fp8").stdout)
    doc = json.loads(profkit("predict", SAMPLE_RUN, "--frontier", "--format", "json", "--", "--kv-cache-dtype",
                             "fp8").stdout)
    as_run = json.loads(profkit("predict", SAMPLE_RUN, "--frontier", "--format", "json").stdout)
    point, own = doc["frontier"]["capacity"]["metrics"], as_run["frontier"]["capacity"]["metrics"]
    for name, m in said["metrics"].items():
        for end in ("predicted", "low", "high"):
            assert point[name][end] == pytest.approx(m[end], rel=1e-9), (name, end)
        assert own[name]["predicted"] == pytest.approx(m["before"], rel=1e-9)
    assert round(point["mean_tpot_ms"]["predicted"], 1) == 54.9
    for fmt in ("text", "md", "html"):  # every format says whose that point is
        out = profkit("predict", SAMPLE_RUN, "--frontier", "--format", fmt, "--", "--kv-cache-dtype", "fp8").stdout
        assert ANCHORED in html.unescape(out), fmt
