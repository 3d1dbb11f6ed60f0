"""The ranges' held-out errors: profkit/model/validation.json (written by `scripts/validate_model.py --write` from
the recorded pairs in tests/data) agrees with today's model, its leave-one-recording-out coverage is what the rows
say and meets the issue's 80 %, and every prediction says what its range carries, or that it is extrapolated."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from profkit.model import validation
from tests.cli import profkit
from tests.conftest import script

SAMPLE = Path(__file__).parent.parent / "samples" / "vllm_14b_kv_bound"


def served_runs(root: Path, folder: str) -> list[float]:
    """Each replicate's request throughput in a recorded capture folder (`r*/bench.json`), in replicate order."""
    return [json.loads(b.read_text())["request_throughput"] for b in sorted((root / folder).glob("r*/bench.json"))]


def measured_means(root: Path, folder: str) -> dict[str, float]:
    """The request throughput, mean TTFT and mean TPOT of a capture folder's three replicates, each their mean."""
    runs = [json.loads(b.read_text()) for b in sorted((root / folder).glob("r*/bench.json"))]
    assert len(runs) == 3
    return {k: sum(r[k] for r in runs) / 3 for k in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms")}


def served(root: Path, folder: str) -> float:
    """The mean request throughput of a capture folder's three replicates."""
    runs = served_runs(root, folder)
    assert len(runs) == 3
    return sum(runs) / 3


def test_the_shipped_rows_are_todays_models(tmp_path: Path) -> None:
    """Two pairs predicted afresh (a 14B FP8 KV cache on the H100, an 8B FP8 pair on the H200) give the rows the
    file holds: the file is not left behind by a change of the model."""
    fresh = script("validate_model").validate(tmp_path, only={"P12", "Q6"})
    shipped = {(r["pair"], r["baseline"], r["metric"]): r for r in validation.recorded_rows()}
    assert len(fresh) == 18
    for row in fresh:
        kept = shipped[(row["pair"], row["baseline"], row["metric"])]
        for key in ("predicted", "low", "high", "measured"):
            assert row[key] == pytest.approx(kept[key], rel=1e-9), (row["pair"], key)
        assert row["families"] == kept["families"] and row["provenance"] == kept["provenance"] == "held-out"


def test_held_out_coverage_is_the_rows_own_and_meets_the_target() -> None:
    rows = validation.recorded_rows()
    for row in rows:
        assert row["inside_held_out"] == validation.inside_held_out(row, rows), (row["pair"], row["metric"])
    held = [r for r in rows if r["provenance"] == validation.HELD_OUT and r["metric"] == "request_throughput"]
    assert len({r["pair"] for r in held}) >= 20
    assert sum(r["inside_held_out"] for r in held) >= 0.8 * len(held)


def test_a_band_is_the_percentiles_of_its_classes_errors_and_leaves_a_recording_out() -> None:
    rows = validation.recorded_rows()
    precision = [r for r in rows if "precision" in r["families"] and r["metric"] == "request_throughput"
                 and r["provenance"] == "held-out"]
    errors = np.log([r["measured"] / r["predicted"] for r in precision])
    assert len(errors) >= validation.QUANTILE_ROWS
    assert validation.band_of(rows, ["precision"], "output_throughput") == pytest.approx(
        (np.percentile(errors, 10), np.percentile(errors, 90)))
    q2 = [r for r in rows if r["pair"] == "Q2" and r["metric"] == "request_throughput"]
    own = frozenset(q2[0]["recordings"])  # start A's baseline, which Q1 shares: both left out
    left = [r for r in rows if "API servers" in r["families"] and r["metric"] == "request_throughput"
            and r["provenance"] == "held-out" and not own & set(r["recordings"])]
    assert {r["pair"] for r in left} == {"Q11", "Q13", "Q14", "Q16", "Q17", "Q18", *(f"Q{i}" for i in range(19, 30)),
                                         "Q31", *(f"Q{i}" for i in range(34, 39))}
    low, high = validation.band_of(rows, ["API servers"], "request_throughput", own)
    left_errors = list(map(validation.residual, left))
    assert len(left_errors) >= validation.QUANTILE_ROWS  # Q18's rows (lease 5) made it percentiles, not extremes
    assert (low, high) == pytest.approx((np.percentile(left_errors, 10), np.percentile(left_errors, 90)))


def test_a_prediction_says_what_its_range_carries_in_every_format() -> None:
    """The 14B KV-bound sample given an FP8 KV cache: its range is at least as wide as its class's held-out errors,
    and says how often they covered; a change of a class nothing held-out validates is called extrapolated."""
    doc = json.loads(profkit("predict", SAMPLE, "--format", "json", "--", "--kv-cache-dtype", "fp8").stdout)
    v = doc["validation"]
    rows = [r for r in validation.recorded_rows() if "precision" in r["families"] and r["provenance"] == "held-out"]
    assert v["classes"] == ["precision"] and v["extrapolated"] == []
    assert v["pairs"] == len({r["pair"] for r in rows})
    held = [r for r in rows if r["metric"] == "request_throughput"]
    assert v["coverage"] == {"inside": sum(r["inside_held_out"] for r in held), "rows": len(held)}
    for name, m in doc["metrics"].items():
        low, high = validation.band_of(validation.recorded_rows(), ["precision"], name)
        assert m["low"] <= m["predicted"] * math.exp(low) * (1 + 1e-12)
        assert m["high"] >= m["predicted"] * math.exp(high) * (1 - 1e-12)
    said = f"{v['coverage']['inside']} of {v['coverage']['rows']} held-out predictions fell inside"
    both = ("--", "--kv-cache-dtype", "fp8", "--max-model-len", "8192")
    for fmt in ("text", "md", "html"):
        out = profkit("predict", SAMPLE, "--format", fmt, *both).stdout
        assert said in out and "extrapolated: no held-out recording validates a change of workload" in out
    doc = json.loads(profkit("predict", SAMPLE, "--format", "json", *both).stdout)
    assert doc["validation"]["extrapolated"] == ["workload"] and doc["validation"]["coverage"] == v["coverage"]


def test_the_reports_prescription_says_what_its_range_carries() -> None:
    doc = json.loads(profkit("report", SAMPLE, "--format", "json").stdout)
    v = doc["prescription"]["predicted"]["validation"]
    assert set(v["classes"]) <= {"scheduler caps", "KV cache size", "precision", "CUDA graphs", "API servers"}
    assert v["pairs"] > 0
    text = profkit("report", SAMPLE).stdout
    assert f"{v['coverage']['inside']} of {v['coverage']['rows']} held-out predictions fell inside" in text


def test_the_pairs_predicted_before_they_ran(h200_model_led: Path) -> None:
    """Lease 4 (tests/data/h200_model_led: lease4-predicted): the model of 1207f25 predicted C's FP8 pair and FP8
    weights at 4 API servers from recorded runs before either ran; measured, both fell inside the ranges it gave
    (+8.3 %, -12.9 %). The validation rows mark those pairs, and those of leases 6, 8, 9 and 10 (predicted before
    they ran), and hold them with the other held-out ones."""
    root = h200_model_led
    for name, folder, error in (("C-fp8pair-from-C-defaults", "C/fp8pair", 0.083),
                                ("api4-from-A3-03-model", "api/api4", -0.129)):
        said = json.loads((root / "lease4-predicted" / f"{name}.json").read_text())["metrics"]["request_throughput"]
        runs = served_runs(root, folder)
        measured = sum(runs) / len(runs)
        assert said["predicted"] / measured - 1 == pytest.approx(error, abs=0.001)
        assert said["low"] <= measured <= said["high"]
    after = [r for r in validation.recorded_rows() if r.get("recorded_after_model")]
    assert {r["pair"] for r in after} == {"Q15", "Q16", "Q17", *(f"Q{i}" for i in range(19, 32)),
                                          *(f"Q{i}" for i in range(34, 62))}
    assert all(r["provenance"] == validation.HELD_OUT for r in after)


def test_the_api_server_ladder_predicted_before_it_ran_missed(h200_model_led: Path) -> None:
    """Lease 6 (lease6-predicted): the model of 243a8c4 predicted 4 API servers at the 8B's 128/256 shape from its
    1-API-server runs, 73.35 req/s (61.26-87.81); measured 57.96, 55.31, 56.44: +29.7 %, outside. 6a072aa's model
    missed by more, +37 % to +38 % (the GPU's prior step corrected by the runs that could be fitted lifted the engine's
    limit, so the API servers' ceiling bound higher); today's, shaped after lease 10 (the engine core's CPU read off the
    run into a step whose CPU and GPU overlap only in part with requests waiting), +2 % to +7 %."""
    root = h200_model_led
    said = json.loads((root / "lease6-predicted" / "s2_api4.json").read_text())["metrics"]["request_throughput"]
    benches = sorted((root / "api" / "s2_api4").glob("r*/bench.json"))
    runs = [json.loads(b.read_text())["request_throughput"] for b in benches]
    measured = sum(runs) / len(runs)
    assert said["predicted"] / measured - 1 == pytest.approx(0.297, abs=0.001)
    assert not said["low"] <= measured <= said["high"]
    rows = [r for r in validation.recorded_rows() if r["pair"] == "Q20" and r["metric"] == "request_throughput"]
    assert len(rows) == 3 and all(r["measured"] == pytest.approx(measured) for r in rows)
    assert all(0.01 < r["predicted"] / measured - 1 < 0.08 and r["inside_held_out"] for r in rows)


def test_the_ladder_on_a_third_shape_and_a_second_model_size_predicted_first(
        h200_model_led: Path) -> None:
    """Lease 9 (lease9-predicted): 9e4b3d9's model predicted 4 and 2 API servers on the GPU box, from each
    configuration's 1-API-server runs before the others ran: the 8B at 64/512 and the 1.1B at 128/256. That model took
    a run paced by its frontend to have its engine core's CPU at the factor the engine-core-bound runs fitted (1.96x
    the prior's per request); it under-predicted all four, -20 % to -28 % (inside the ranges it gave), and was
    dropped. 66ba1f7's model (committed before the lease) from each of the three replicates: the 8B within -24 to
    +10 %, the 1.1B at 4 API servers -4 to -16 %, at 2 -20 to -34 % (one outside): the 1.1B served 2.06x its
    1-API-server rate with 2, more than the API servers' ceiling says. Today's (the imbalance read per count, 2 API
    servers leaving less to their busiest, among lease 10's changes): -25 % to -0 %, two outside; since lease 12's
    runs joined the imbalance of 2 (0.17 -> 0.20, read leaving each pair's own runs out), -29 % to -0 %, two outside;
    since lease 17's (0.20 -> 0.22; its own 1.55x on a sixth box: Q31), -30 % to -0 %; since lease 22's four with
    data parallelism (0.23 -> 0.20, lease 21's six having moved it to 0.23), -29 % to -0 %, two outside; with lease
    23's three (the range's end 0.51 -> 0.50), -28 % to -0 %, two outside; with lease 24's six (0.20 -> 0.21, the
    end 0.50 -> 0.53) and the API servers' queue (7a23ad0), -29 % to +0 %, two outside."""
    root = h200_model_led

    for name, error in (("s3_api4", -0.202), ("s3_api2", -0.261), ("t1_api4", -0.243), ("t1_api2", -0.282)):
        said = json.loads((root / "lease9-predicted" / f"{name}-predicted.json").read_text())["metrics"][
            "request_throughput"]
        measured = served(root, f"api/{name}")
        assert said["predicted"] / measured - 1 == pytest.approx(error, abs=0.001)
        assert said["low"] <= measured <= said["high"]
    assert served(root, "api/t1_api2") / served(root, "api/t1_api1") == pytest.approx(2.06, abs=0.01)
    rows = [r for r in validation.recorded_rows() if r["metric"] == "request_throughput"
            and r["pair"] in ("Q22", "Q23", "Q24", "Q25")]
    assert len(rows) == 12 and all(r["recorded_after_model"] and r["provenance"] == "held-out" for r in rows)
    errors = {p: sorted(r["predicted"] / r["measured"] - 1 for r in rows if r["pair"] == p)
              for p in ("Q22", "Q23", "Q24", "Q25")}
    for pair, expected in (("Q22", [-0.117, -0.089, 0.000]), ("Q23", [-0.197, -0.182, -0.073]),
                           ("Q24", [-0.160, -0.097, -0.045]), ("Q25", [-0.292, -0.187, -0.148])):
        assert errors[pair] == pytest.approx(expected, abs=0.001)
    assert [r["inside_held_out"] for r in rows].count(False) == 2


def test_the_ladder_measured_again_with_two_api_servers_and_four(h200_model_led: Path) -> None:
    """Lease 8 (lease8-predicted): 93afb36's model predicted 2 API servers at the 8B's 128/256 shape on the GPU box,
    from each of the 1-API-server runs, before they ran: 73.34, 66.30, 69.83 req/s; measured 67.09, 59.26, 59.40
    (+18 %, +7 %, +13 % of the mean, inside every range). 4 API servers run again (Q20's configuration, whose
    prediction validation.json held): 50.80, 45.97, 59.43 (+49 % from 6a072aa's model, outside the range it had then;
    +11 % from today's; lease 6 measured 56.57):
    at full load the busiest of the four took 55-86 % of the requests and the engine core's CPU, not the API servers',
    capped the run (in the sweep at a rate, lease 8, it saturated from 46.65 req/s)."""
    root = h200_model_led
    runs = served_runs(root, "api/s2_api2")
    measured = sum(runs) / len(runs)
    assert measured == pytest.approx(61.92, abs=0.01)
    for r, error in ((1, 0.184), (2, 0.071), (3, 0.128)):
        said = json.loads((root / "lease8-predicted" / f"s2_api2-predicted-r{r}.json").read_text())["metrics"][
            "request_throughput"]
        assert said["predicted"] / measured - 1 == pytest.approx(error, abs=0.001)
        assert said["low"] <= measured <= said["high"]
    rows = {r["pair"]: r for r in validation.recorded_rows() if r["metric"] == "request_throughput"
            and r["baseline"].endswith("s2_api1/r1")}
    assert rows["Q19"]["inside_held_out"] and rows["Q19"]["recorded_after_model"]
    again = served_runs(root, "api/s2_api4b")
    assert rows["Q21"]["measured"] == pytest.approx(sum(again) / 3) and max(again) / min(again) > 1.25
    assert rows["Q21"]["predicted"] / rows["Q21"]["measured"] - 1 == pytest.approx(0.106, abs=0.01)
    assert rows["Q21"]["inside_held_out"]


def test_two_api_servers_and_four_on_a_third_box_predicted_first(h200_model_led: Path) -> None:
    """Lease 10 (lease10-predicted): 6a072aa predicted, from lease 6's three 1-API-server runs, 2 and 4 API servers at
    full load and at 40 and 48 req/s before they ran on a third box. At full load it over-predicted, +12 % to +24 %
    with 2 and +42 % to +44 % with 4 (inside its ranges); 4 served less than 2, as on every shape before, with 870-910
    requests running and hundreds waiting (vLLM's gauges): the engine set the pace. At the rates the throughput came
    within 0.3 % and TPOT p50 within 1.5 %. Today's model, shaped on these runs after they ran (not pre-registered
    for it), -4 % to +11 % (Q26, Q27)."""
    root = h200_model_led

    said = json.loads((root / "lease10-predicted" / "lease10-predicted.json").read_text())
    assert said["commit"].startswith("6a072aa")
    two, four = served(root, "api/s2_api2c"), served(root, "api/s2_api4c")
    assert two == pytest.approx(59.90, abs=0.01) and four == pytest.approx(54.52, abs=0.01) and four < two
    for p in said["predictions"]:
        m = p["metrics"]["request_throughput"]
        if p["rate"] is None:
            measured = two if p["api_server_count"] == 2 else four
            assert (0.12 < m["predicted"] / measured - 1 < 0.25) if p["api_server_count"] == 2 else \
                (0.42 < m["predicted"] / measured - 1 < 0.45)
            assert m["low"] <= measured <= m["high"]
        else:
            measured = served(root, f"sweep8s{p['api_server_count']}b/rate-{p['rate']:g}")
            assert abs(m["predicted"] / measured - 1) < 0.003
    gauges = (root / "lease10-gauges" / "gauges-full-api4.txt").read_text().split()
    waiting = [float(w) for w in gauges[2::3]]
    assert max(waiting) > 300  # requests queued for the engine at full load
    rows = [r for r in validation.recorded_rows() if r["metric"] == "request_throughput"
            and r["pair"] in ("Q26", "Q27")]
    assert len(rows) == 6 and all(r["recorded_after_model"] and r["inside_held_out"] for r in rows)
    assert all(-0.05 < r["predicted"] / r["measured"] - 1 < 0.11 for r in rows)


def test_three_api_servers_predicted_first_measured_once(h200_model_led: Path) -> None:
    """Lease 11 (lease11-predicted): c317a82, lease 10's model, predicted 3 API servers (a count never recorded: the
    nearest recorded count's imbalance) from lease 6's 1-API-server runs; the device time left ran one replicate,
    63.08 req/s: -9 % to -4 %, inside every range. One replicate is under what a claim needs: not a validation pair."""
    root = h200_model_led
    said = json.loads((root / "lease11-predicted" / "lease11-predicted.json").read_text())
    assert said["commit"].startswith("c317a82") and said["change"] == "--api-server-count 3"
    benches = sorted((root / "api" / "s2_api3").glob("r*/bench.json"))
    assert len(benches) == 1
    measured = json.loads(benches[0].read_text())["request_throughput"]
    assert measured == pytest.approx(63.08, abs=0.01)
    for p in said["predictions"]:
        m = p["metrics"]["request_throughput"]
        assert -0.09 < m["predicted"] / measured - 1 < -0.04 and m["low"] <= measured <= m["high"]
    assert not [r for r in validation.recorded_rows() if any(x.endswith("/s2_api3/r1") for x in r["recordings"])]


def test_three_api_servers_and_a_fourth_shape_predicted_first(h200_model_led: Path) -> None:
    """Lease 12 (lease12-predicted, made-by.txt): 9b10439 predicted 3 API servers on the 8B at 128/256 from lease 6's
    1-API-server runs before the lease (-4 % to +1 % of the 3 replicates' mean, inside: Q28), and on the GPU box, from a
    fourth shape's 1-API-server runs (512/128, lengths +-50 %, the GPU busy ~0.9 of the time), that 2 API servers
    change nothing (-4 % to +2 %, inside: Q29)."""
    root = h200_model_led
    said = root / "lease12-predicted"
    assert "9b10439" in (said / "made-by.txt").read_text()

    three, one, two = served(root, "api/s2_api3b"), served(root, "api/s4_api1"), served(root, "api/s4_api2")
    assert three == pytest.approx(59.90, abs=0.01) and one == pytest.approx(51.29, abs=0.01)
    assert two == pytest.approx(51.94, abs=0.01)
    for name, measured, low, high in (("s2_api3-from-s2_api1", three, -0.05, 0.01),
                                      ("s4_api2-from-s4_api1", two, -0.05, 0.03)):
        files = sorted(said.glob(f"{name}*.json"))
        assert len(files) == 4  # the folder's and each replicate's
        for f in files:
            m = json.loads(f.read_text())["metrics"]["request_throughput"]
            assert low < m["predicted"] / measured - 1 < high and m["low"] <= measured <= m["high"]
    rows = [r for r in validation.recorded_rows() if r["metric"] == "request_throughput"
            and r["pair"] in ("Q28", "Q29")]
    assert len(rows) == 6 and all(r["recorded_after_model"] and r["inside_held_out"] for r in rows)
    assert all(abs(r["predicted"] / r["measured"] - 1) < 0.05 for r in rows)


def test_four_api_servers_on_the_fourth_shape_predicted_first_measured_twice(
        h200_model_led: Path) -> None:
    """Lease 13: the fourth shape (the 8B at 512/128, lengths +-50 %, a busy GPU) with 4 API servers, predicted first by
    9b10439 on lease 12's box and by 420f359 before this lease (no change: 49.67-53.03 req/s); the device time left
    ran two replicates, 52.28 and 50.97: -4 % to +3 %, inside. Two replicates: a recording, not a validation pair."""
    root = h200_model_led
    runs = served_runs(root, "api/s4_api4")
    assert [round(r, 2) for r in runs] == [52.28, 50.97]
    measured = sum(runs) / 2
    for folder in ("lease12-predicted", "lease13-predicted"):
        files = sorted((root / folder).glob("s4_api4-from-s4_api1*.json"))
        assert len(files) == 4
        for f in files:
            m = json.loads(f.read_text())["metrics"]["request_throughput"]
            assert -0.04 < m["predicted"] / measured - 1 < 0.03 and m["low"] <= measured <= m["high"]
            assert m["predicted"] == pytest.approx(m["before"])  # no change: the GPU set the pace
    assert not [r for r in validation.recorded_rows() if any("/s4_api4/" in x for x in r["recordings"])]


def test_smaller_prompt_chunks_on_the_fourth_shape_predicted_first_on_a_fifth_box(
        h200_model_led: Path) -> None:
    """Lease 14 (lease14-predicted, made by bda68c2 before the lease): the fourth shape with --max-num-batched-tokens
    2048, from lease 12's 1-API-server runs on another box: request throughput -4 % (49.07 from the folder), mean TPOT
    -55 % (121.7 -> 55.0 ms: a step carries a quarter of the prompt tokens), mean TTFT +13 %. Measured, 3 replicates:
    50.87 req/s (49.56-51.58), TPOT 55.5 ms, TTFT 23.4 s: each of the 12 stored predictions inside its range (Q30)."""
    root = h200_model_led
    said = root / "lease14-predicted"
    assert "bda68c2" in (said / "made-by.txt").read_text()
    measured = measured_means(root, "api/s4_mnbt2048")
    assert measured["request_throughput"] == pytest.approx(50.87, abs=0.01)
    files = sorted(said.glob("s4_mnbt2048-from-s4_api1-*.json"))
    assert len(files) == 4  # the folder's and each replicate's
    for f in files:
        metrics = json.loads(f.read_text())["metrics"]
        for key, worst in (("request_throughput", 0.07), ("mean_tpot_ms", 0.03), ("mean_ttft_ms", 0.05)):
            m = metrics[key]
            assert abs(m["predicted"] / measured[key] - 1) < worst and m["low"] <= measured[key] <= m["high"]
        assert metrics["mean_tpot_ms"]["predicted"] / metrics["mean_tpot_ms"]["before"] < 0.5
    rows = [r for r in validation.recorded_rows() if r["pair"] == "Q30"]
    assert len(rows) == 9 and all(r["recorded_after_model"] and r["inside_held_out"] for r in rows)


def test_two_api_servers_on_the_small_model_predicted_first_on_a_sixth_box(
        h200_model_led: Path) -> None:
    """Lease 17 (lease17-predicted, made by 62d33ec on the GPU box after the 1-API-server runs, before either
    2-API-server server started): Q25's configuration (the 1.1B at 128/256, 3,000 prompts at once), whose 2.06x on
    lease 9's box is the validation's worst miss, again on a sixth box. 1 API server 48.10 req/s (43.53-50.80); 2 API
    servers on two servers, 3 replicates each, 74.49 (64.56-92.38): 1.55x, not 2.06x. Predicted 83.09 from the folder
    (+11.5 %), 84.44 and 72.38 from r2 and r3: every stored prediction inside its range (Q31). The 2-API-server runs'
    throughput falls as their busiest API server's share of the CPU rises (0.52 -> 92.38 req/s, 0.74 -> 64.56): the
    imbalance the model's range spans; at that share the busiest carried what one API server carried alone."""
    root = h200_model_led
    said = root / "lease17-predicted"
    assert "62d33ec" in (said / "made-by.txt").read_text()
    one = [json.loads(b.read_text()) for b in sorted((root / "api" / "t1b_api1").glob("r*/bench.json"))]
    two = [json.loads(b.read_text()) for side in ("t1b_api2", "t1b_api2b")
           for b in sorted((root / "api" / side).glob("r*/bench.json"))]
    assert len(one) == 3 and len(two) == 6
    measured = {k: sum(r[k] for r in two) / 6 for k in ("request_throughput", "mean_tpot_ms", "mean_ttft_ms")}
    assert measured["request_throughput"] == pytest.approx(74.49, abs=0.01)
    ratio = measured["request_throughput"] / (sum(r["request_throughput"] for r in one) / 3)
    assert 1.5 < ratio < 1.6
    files = sorted(said.glob("t1b_api2-predicted*.json"))
    assert len(files) == 4  # the folder's and each replicate's
    errors = []
    for f in files:
        metrics = json.loads(f.read_text())["metrics"]
        for key in measured:
            m = metrics[key]
            assert m["low"] <= measured[key] <= m["high"]
        errors.append(metrics["request_throughput"]["predicted"] / measured["request_throughput"] - 1)
    assert min(errors) > -0.03 and max(errors) < 0.14
    rows = [r for r in validation.recorded_rows() if r["pair"] == "Q31"]
    assert len(rows) == 9 and all(r["recorded_after_model"] for r in rows)
    throughput = [r for r in rows if r["metric"] == "request_throughput"]
    assert all(r["inside_held_out"] for r in throughput)
    # the model's ceiling: the busiest API server carries what one carried alone. Here it did (0.86-1.00 of the
    # 1-API-server mean, at its share of the two's CPU); on lease 9's box 1.12-1.27 (Q25: its 1-API-server runs slow)
    from profkit.report import build_report

    for one, twos, low, high in (("t1b_api1", ("t1b_api2", "t1b_api2b"), 0.85, 1.0),
                                 ("t1_api1", ("t1_api2",), 1.1, 1.3)):
        alone = served(root, f"api/{one}")
        for side in twos:
            runs = sorted((root / "api" / side).glob("r*"))
            for run, rate in zip(runs, served_runs(root, f"api/{side}"), strict=True):
                share = build_report(run).document()["facts"]["host.api_server_busiest_share"]
                assert low < share * rate / alone < high


def test_cuda_graphs_off_and_the_schedulers_caps_predicted_first_on_a_ninth_box(h200_model_led: Path) -> None:
    """Lease 25 (lease25-predicted, made by 3518ece): from lease 21's one-GPU 8B at 1,024/128, lengths +-50 % (another
    box), --enforce-eager and --max-num-seqs 64 before their servers started, --max-num-batched-tokens 2048 before
    its runs were read. Measured, 3 replicates each: 29.63, 25.69 and 29.28 req/s; every one of the 36 stored
    predictions (throughput, TTFT and TPOT from the folder and each replicate) inside its range, the throughput -1.9 to
    +0.9 %. On the same box the defaults served 29.81 (lease 21's box 30.72): the pairs from it (Q42-Q47, by the same
    model after the lease) are -4.7 to +5.6 %."""
    root = h200_model_led
    said = root / "lease25-predicted"
    made = (said / "made-by.txt").read_text()
    assert made.startswith("predict_lease25.py with profkit at 3518ece") and "mnbt2048" in made
    errors = []
    for name, folder, change in (("eager", "k_8b_eager", {"enforce_eager": True}),
                                 ("mns64", "k_8b_mns64", {"max_num_seqs": 64}),
                                 ("mnbt2048", "k_8b_mnbt2048", {"max_num_batched_tokens": 2048})):
        measured = measured_means(root, f"api/{folder}")
        files = sorted(said.glob(f"d1_8b*-{name}.json"))
        assert len(files) == 4  # the folder's and each replicate's
        for f in files:
            doc = json.loads(f.read_text())
            assert doc["changes"] == change
            for key, value in measured.items():
                m = doc["metrics"][key]
                assert m["low"] <= value <= m["high"], (f.name, key)
            errors.append(round(doc["metrics"]["request_throughput"]["predicted"] / measured["request_throughput"] - 1,
                                3))
    assert min(errors) == -0.019 and max(errors) == 0.009
    assert served(root, "api/k_8b_default") == pytest.approx(29.81, abs=0.01)
    assert served(root, "api/d1_8b") == pytest.approx(30.72, abs=0.01)
    rows = [r for r in validation.recorded_rows() if r["pair"] in {f"Q{i}" for i in range(39, 48)}
            and r["metric"] == "request_throughput"]
    assert len(rows) == 27 and all(r["recorded_after_model"] and r["provenance"] == "held-out" for r in rows)
    same_box = [r["predicted"] / r["measured"] - 1 for r in rows if r["pair"] not in ("Q39", "Q40", "Q41")]
    assert round(min(same_box), 3) == -0.047 and round(max(same_box), 3) == 0.056


def test_tensor_parallelism_predicted_first_from_data_parallelism_on_a_tenth_box(h200_model_led: Path) -> None:
    """Lease 26 (lease26-predicted, made by b17e3b1 before the server started): the 8B at 1,024/128 as TP=2 (one
    engine, one API server) from its DP=2 runs on two other boxes (lease 21's and lease 24's): 43.66-47.83 req/s.
    Measured, 3 replicates: 46.68 req/s; every one of the 24 stored predictions (throughput, TTFT, TPOT from each
    folder and replicate) inside its range, the throughput -6.5 to +2.4 %."""
    root = h200_model_led
    said = root / "lease26-predicted"
    assert (said / "made-by.txt").read_text().startswith("predict_lease26.py with profkit at b17e3b1")
    measured = measured_means(root, "api/m_8b_tp2")
    assert measured["request_throughput"] == pytest.approx(46.68, abs=0.01)
    files = sorted(said.glob("*-tp2.json"))
    assert len(files) == 8  # each of the two folders' and their replicates'
    errors = []
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["changes"] == {"tensor_parallel_size": 2, "data_parallel_size": 1}
        for key, value in measured.items():
            m = doc["metrics"][key]
            assert m["low"] <= value <= m["high"], (f.name, key)
        errors.append(round(doc["metrics"]["request_throughput"]["predicted"] / measured["request_throughput"] - 1, 3))
    assert min(errors) == -0.065 and max(errors) == 0.024
    rows = [r for r in validation.recorded_rows() if r["pair"] in ("Q48", "Q49", "Q50")
            and r["metric"] == "request_throughput"]
    assert len(rows) == 9 and all(r["recorded_after_model"] and r["inside_held_out"] for r in rows)
    assert all(r["families"] == ["GPU layout"] for r in rows)


def test_half_the_memory_on_a_fifth_shape_predicted_first_on_an_eleventh_box(h200_model_led: Path) -> None:
    """Lease 27 (lease27-predicted, made by 8dbc6f4 before the change's runs were read): Qwen2-7B's layers at
    1,024/256, lengths +-50 %, a shape and a workload no recording had; `--gpu-memory-utilization 0.5` from vLLM's
    defaults run beside it. vLLM's KV cache 1,046,080 tokens (predicted 1,046,050); measured 25.61 req/s, 3
    replicates: every one of the 12 stored predictions (throughput, TTFT, TPOT from the folder and each replicate)
    inside its range, the throughput 0.0 to +5.7 %."""
    root = h200_model_led
    said = root / "lease27-predicted"
    assert (said / "made-by.txt").read_text().startswith("predict_lease27.py with profkit at 8dbc6f4")
    measured = measured_means(root, "api/q_gmu05")
    assert measured["request_throughput"] == pytest.approx(25.61, abs=0.01)
    assert "GPU KV cache size: 1,046,080 tokens" in (root / "api" / "q_gmu05" / "server.log").read_text()
    files = sorted(said.glob("q_base*-gmu05.json"))
    assert len(files) == 4  # the folder's and each replicate's
    errors = []
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["changes"] == {"gpu_memory_utilization": 0.5}
        assert "KV cache 2,145,504 → 1,046,050 tokens" in doc["reasoning"]  # vLLM's: 1,046,080
        for key, value in measured.items():
            m = doc["metrics"][key]
            assert m["low"] <= value <= m["high"], (f.name, key)
        errors.append(round(doc["metrics"]["request_throughput"]["predicted"] / measured["request_throughput"] - 1, 3))
    assert min(errors) == 0.0 and max(errors) == 0.057
    rows = [r for r in validation.recorded_rows() if r["pair"] in ("Q51", "Q52")
            and r["metric"] == "request_throughput"]
    assert len(rows) == 6 and all(r["recorded_after_model"] and r["provenance"] == "held-out" for r in rows)
    assert all(r["families"] == ["KV cache size"] for r in rows)


def test_lease_27s_three_changes_predicted_on_a_thirteenth_box_before_they_ran(h200_model_led: Path) -> None:
    """Lease 29 (lease29-predicted, made by 127e787 on the box after vLLM's defaults ran and before any changed server
    started): the three changes lease 27 pre-registered, on its shape and workload. The FP8 KV cache and CUDA graphs
    off fell inside every throughput range the four stored predictions gave; --max-num-seqs 128 is the model's miss:
    predicted to lose 12-16 %, it measured 26.19 req/s against the defaults' 24.64, its time per output token outside
    every range (the defaults' decode of 1,000 requests kept the host at a full core and the GPU at 71-73 %)."""
    root = h200_model_led
    said = root / "lease29-predicted"
    assert (said / "made-by.txt").read_text().startswith("predict_lease29.py with profkit at 127e787")
    assert measured_means(root, "api/q29_base")["request_throughput"] == pytest.approx(24.64, abs=0.01)
    expected = {"kvfp8": ("api/q29_kvfp8", 26.27, (-0.104, 0.006)),
                "mns128": ("api/q29_mns128", 26.19, (-0.233, -0.116)),
                "eager": ("api/q29_eager", 23.79, (-0.129, 0.047))}
    for name, (folder, mean, (lowest, highest)) in expected.items():
        measured = measured_means(root, folder)
        assert measured["request_throughput"] == pytest.approx(mean, abs=0.01)
        files = sorted(said.glob(f"q_base*-{name}.json"))
        assert len(files) == 4  # the folder's and each replicate's
        docs = [json.loads(f.read_text()) for f in files]
        throughput = [d["metrics"]["request_throughput"] for d in docs]
        errors = [round(m["predicted"] / measured["request_throughput"] - 1, 3) for m in throughput]
        assert (min(errors), max(errors)) == (lowest, highest)
        inside = [m["low"] <= measured["request_throughput"] <= m["high"] for m in throughput]
        tpot = [d["metrics"]["mean_tpot_ms"] for d in docs]
        if name == "mns128":
            assert inside.count(False) == 1  # the fast replicate's: -11.6 %, above 20.93-25.62
            assert not any(m["low"] <= measured["mean_tpot_ms"] <= m["high"] for m in tpot)
        else:
            assert all(inside)
    rows = [r for r in validation.recorded_rows() if r["pair"] in {f"Q{i}" for i in range(53, 62)}
            and r["metric"] == "request_throughput"]
    assert len(rows) == 27 and all(r["recorded_after_model"] and r["provenance"] == "held-out" for r in rows)
    caps = [validation.residual(r) for r in rows if r["pair"] in ("Q54", "Q57", "Q60")]
    assert max(map(abs, caps)) > 0.2  # the miss stays in the table the ranges are drawn from


def test_a_batch_cap_on_a_run_whose_gpu_waited_for_the_host_says_the_model_does_not_see_it(
        h200_model_led: Path) -> None:
    """Lease 29's defaults waited 3.0-4.9 s outside the drain with the API server at a full core in 40-47 % of the
    samples: r3, fitted (the GPU busy 84 % of the run), takes the waits as the GPU's step, which is how
    --max-num-seqs 128 came out x0.88 against x1.06 measured; the folder's median run (r1, not fitted) does not place
    them and came out x0.84. `predict` says so beside a change of the batch's caps, not beside one of precision; the
    runs at 128 (the API server at a full core in 9-13 %, the engine core as often as at the defaults) and a run that
    did not wait (lease 25's 8B defaults) say nothing."""
    def reasoning(run: str, *changes: str) -> list[str]:
        doc = json.loads(profkit("predict", str(h200_model_led / run), "--format", "json", "--", *changes).stdout)
        return [line for line in doc["reasoning"] if line.startswith("the GPU waited")]

    tail = ("so what a change of the host's work per step (the batch's size) wins back or adds is not in this "
            "prediction")
    assert reasoning("api/q29_base/r3", "--max-num-seqs", "128") == [
        "the GPU waited 4.0 s (11%) of the run outside its drain, the API server at a full core in 40% of the "
        f"samples: the fit takes those waits as the GPU's step, {tail}"]
    assert reasoning("api/q29_base", "--max-num-seqs", "128") == [
        "the GPU waited 4.9 s (12%) of the run outside its drain, the API server at a full core in 45% of the "
        f"samples: the model does not place them, {tail}"]
    assert reasoning("api/q29_base/r3", "--kv-cache-dtype", "fp8") == []
    for run in ("api/q29_mns128/r2", "api/q29_mns128/r3"):
        assert reasoning(run, "--max-num-seqs", "1024") == []
    assert reasoning("api/k_8b_default/r1", "--max-num-seqs", "64") == []
