"""Decisions led by the model, against real runs on H200s (tests/data/h200_model_led.tar.xz; its README says what
ran). Three misconfigured starts the other fixtures do not hold, each tuned on the GPU and measured in a small grid:
- A: an 8B decoding 768 tokens a request, CUDA graphs off and 128 sequences at most;
- B: an 8B prefilling 3,072-token prompts on a quarter of the GPU's memory and 2,048 batched tokens;
- C: a 14B at 30 requests/s of mixed lengths, 96 sequences and 1,024 batched tokens at most.

Today's tune runs against the stand-in `vllm` replaying those recordings (FAKE_VLLM_RECORDED): the stand-in serves
a recorded configuration's runs and refuses any other, so each choice and the stop are the code's under test. The
recorded tune.json files are read as what was measured, never as what today's code would do."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from statistics import mean

import pytest

from tests.cli import profkit
from tests.test_capture import FAKES, free_port


@pytest.fixture(scope="module")
def recorded(h200_model_led: Path) -> Path:
    return h200_model_led


def measured(folder: Path) -> float:
    """A configuration's mean request throughput over its recorded replicates."""
    return mean(json.loads(b.read_text())["request_throughput"] for b in sorted(folder.glob("r[0-9]*/bench.json")))


def grid_best(start: Path) -> float:
    """The best configuration measured from a start: its grid (captures beside the tune) and tune's own."""
    configs = [p.parent for p in start.rglob("session.json")]
    return max(measured(c) for c in configs if list(c.glob("r[0-9]*/bench.json")))


def replay_tune(start: Path, tmp: Path) -> dict:
    """Today's `profkit tune` from the recorded start, with the recorded options, against the stand-in replaying
    what this start's folder recorded."""
    rec = json.loads((start / "tune" / "tune.json").read_text())
    server, bench = (shlex.split(c) for c in rec["baseline_commands"])
    model_dir = tmp / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(next(start.rglob("model-config.json")).read_text())
    flags = [w for i, w in enumerate(server[3:]) if "--port" not in (w, server[3:][i - 1] if i else "")]
    bench_args = bench[bench.index("--port") + 2:]
    # no live host samples: the stand-in's processes' CPU on this machine is not the recording's (it varied with the
    # machine's load, and with it the model's reading of what paced the run)
    env = {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_VLLM_RECORDED": str(start),
           "FAKE_VLLM_STATE": str(tmp), "FAKE_GPU": "NVIDIA H200, 580.159.04",
           "PYTHONPATH": os.pathsep.join([str(FAKES / "nohost"), os.environ.get("PYTHONPATH", "")])}
    r = profkit("tune", "--out", tmp / "t", "--profile", "never", "--replicates", rec["replicates"],
                "--budget", rec["budget"], *(["--allow-precision-changes"] if rec["allow_precision"] else []),
                "--port", free_port(), "serve", "--model", model_dir, "--server-args", shlex.join(flags),
                "--bench-args", shlex.join(bench_args), env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((tmp / "t" / "tune.json").read_text())


def steps(doc: dict) -> list[tuple]:
    return [(s["kind"], s["decision"], s["candidate"] and [(c["flag"], c["to"]) for c in s["candidate"]["changes"]])
            for s in doc["steps"]]


@pytest.mark.slow
def test_todays_tune_from_b_asks_first_for_what_the_recording_lacks_and_reaches_95_percent(recorded: Path,
                                                                                          tmp_path: Path) -> None:
    """B replayed with today's tune. Its first candidate is the recorded one less what the model predicts moves it
    less than the noise (the FP8 KV cache, 32,768 batched tokens: f9c7120 and 6a91d96), a configuration the GPU never
    ran: the stand-in, which serves only what was recorded, fails it and tune reverts it (on a GPU it would run:
    predicted 16.91 req/s). Then vLLM's defaults for memory and chunks (recorded, +7 %), then the FP8 pair on them
    (recorded: 16.75, 97.3 % of the best B's grid measured, 17.22) until the budget of 9 runs is spent. C's replay
    asks likewise for the cap lifted with FP8 weights alone, which the recording lacks, and stops at its baseline:
    not replayable, so not replayed here."""
    start = recorded / "B"
    doc = replay_tune(start, tmp_path)
    first = doc["steps"][1]
    rec = json.loads((start / "tune" / "tune.json").read_text())["steps"][1]["candidate"]
    today = {c["flag"]: c["to"] for c in first["candidate"]["changes"]}
    assert today == {"--max-num-batched-tokens": None, "--gpu-memory-utilization": None, "--quantization": "fp8"}
    assert set(today) <= {c["flag"] for c in rec["changes"]} and first["decision"] == "revert"
    assert "exited with code 1 before it was healthy" in first["why"]
    assert [s["decision"] for s in doc["steps"][2:]] == ["keep", "keep"]
    assert doc["stopped"].startswith("the budget of 9 runs is spent")
    assert doc["best"]["best"] == pytest.approx(measured(start / "fp8pair"))
    assert doc["best"]["best"] >= 0.95 * grid_best(start)


def test_the_recorded_tune_from_the_eager_capped_start(recorded: Path) -> None:
    """A as recorded (the stand-in cannot replay it: the first candidate's API servers depend on host samples the
    replay does not reproduce). tune's first candidate, the model's best (caps and eager mode undone, FP8 weights, 2
    API servers), measured 3.3x the start but below its predicted range: the API server's ceiling is over-predicted
    (issue 51). The budget was spent; the second candidate (4 API servers, FP8 KV cache) measured +6.6 %."""
    rec = json.loads((recorded / "A" / "tune" / "tune.json").read_text())
    assert [s["decision"] for s in rec["steps"]] == ["baseline", "keep", "keep"]
    first = rec["steps"][1]["candidate"]
    assert {c["flag"]: c["to"] for c in first["changes"]} == {
        "--max-num-seqs": None, "--enforce-eager": None, "--quantization": "fp8", "--api-server-count": 2}
    base, one = (measured(recorded / "A" / "tune" / "runs" / r) for r in ("01-baseline", "04-model"))
    assert one / base == pytest.approx(3.30, abs=0.01)
    assert one < first["predicted"]["low"]  # the range missed: 22.26 against 22.76-30.06
    assert rec["runs_used"] == rec["budget"] == 9


def test_the_recorded_tune_from_the_eager_capped_start_at_800_prompts(recorded: Path) -> None:
    """A again with runs of 35-154 s (800 prompts; lease 3, another host: 16 cores), tune with 2 replicates and a
    budget of 6: its first candidate, the same as A's, measured 21.01 in runs 3-4: 98 % of the best of A2's grid at
    800 prompts (its prescription, 21.44; lease 2's host had 32 cores). The second (the FP8 KV cache added) measured
    16.44, far below its range (19.99-33.64), and was reverted."""
    rec = json.loads((recorded / "A3" / "tune" / "tune.json").read_text())
    assert [s["decision"] for s in rec["steps"]] == ["baseline", "keep", "revert"]
    first, second = (rec["steps"][i]["candidate"] for i in (1, 2))
    assert {c["flag"]: c["to"] for c in first["changes"]} == {
        "--max-num-seqs": None, "--enforce-eager": None, "--quantization": "fp8", "--api-server-count": 2}
    runs = recorded / "A3" / "tune" / "runs"
    one, two = measured(runs / "03-model"), measured(runs / "05-model")
    assert one >= 0.95 * grid_best(recorded / "A2") and rec["steps"][1]["runs"][-1]["seed"] == 1  # runs 3 and 4
    assert {c["flag"]: c["to"] for c in second["changes"]} == {"--kv-cache-dtype": "fp8"}
    assert two < second["predicted"]["low"]
    assert all(json.loads(b.read_text())["duration"] >= 30 for b in runs.glob("*/r*/bench.json"))


def prescribed(replicate: Path) -> tuple[dict, dict]:
    """Today's report on a recorded run: its prescription's changes ({flag: to}) and predicted request throughput."""
    from profkit.report import build_report

    p = build_report(replicate).document()["prescription"]
    return {c["flag"]: c["to"] for c in p["changes"]}, p["predicted"]["request_throughput"]


def test_the_reports_prescription_applied_in_one_restart_reaches_the_grids_best(recorded: Path) -> None:
    """Each start's report (its third baseline replicate) prescribes a configuration that was then measured, or one
    the model cannot tell from a measured one (an FP8 KV cache it predicts to move the outcome < 3 %, left out):
    B's: vLLM's defaults for the cache's memory and the prompt chunks with FP8 weights (not measured as such: B's
    defaults with the FP8 pair, which the model predicts within 0.1 % of it, measured 16.75 req/s, 97.3 % of the
    17.22 tune found, inside its range; until f9c7120 the FP8 pair alone, 16.43); C's the cap lifted with FP8
    weights (tune's first candidate had the FP8 KV cache too: 17.24, 99.3 % of the FP8 pair alone, 17.37); A's the
    caps and eager mode undone with FP8 weights and 2 API servers (tune's first candidate: 22.26 at the recorded 320
    prompts, inside its range; 21.44 at 800 prompts, where vLLM's defaults measured 16.47 and the FP8 pair 18.93)."""
    changes, rt = prescribed(recorded / "B" / "tune" / "runs" / "01-baseline" / "r3")
    assert changes == {"--max-num-batched-tokens": None, "--gpu-memory-utilization": None, "--quantization": "fp8"}
    b = measured(recorded / "B" / "fp8pair")  # the same with an FP8 KV cache, which the model says moves it 0.1 %
    assert b >= 0.95 * grid_best(recorded / "B") and rt["low"] <= b <= rt["high"]

    changes, rt = prescribed(recorded / "C" / "tune" / "runs" / "01-baseline" / "r3")
    c_tune = json.loads((recorded / "C" / "tune" / "tune.json").read_text())
    tried = {c["flag"]: c["to"] for c in c_tune["steps"][1]["candidate"]["changes"]}
    assert changes == {k: v for k, v in tried.items() if k != "--kv-cache-dtype"}  # the model: FP8 KV moves it < 3 %
    c = measured(recorded / "C" / "tune" / "runs" / "04-model")
    assert c >= 0.95 * grid_best(recorded / "C") and rt["low"] <= c <= rt["high"]

    changes, rt = prescribed(recorded / "A" / "tune" / "runs" / "01-baseline" / "r3")
    assert changes == {"--max-num-seqs": None, "--enforce-eager": None, "--quantization": "fp8",
                       "--api-server-count": 2}
    a = measured(recorded / "A2" / "prescribed")
    assert a >= 0.95 * grid_best(recorded / "A2")
    # at the recorded 320 prompts: 22.26 measured, predicted +1 % from this replicate and inside its range (until
    # f9c7120, +22.5 % and below its range: the engine's steps at A's batch, not the API servers, were mis-costed)
    a320 = measured(recorded / "A" / "tune" / "runs" / "04-model")
    assert a320 == pytest.approx(rt["predicted"], rel=0.05) and rt["low"] <= a320 <= rt["high"]


def test_the_model_draws_the_lengths_the_benchmark_drew(recorded: Path) -> None:
    """Start C's benchmark ran `--random-range-ratio 0.5`: its report carries it (workload.length_spread) and the
    model draws each request's lengths within it. Calibrated on C's defaults, the simulated mean TTFT misses the
    measured by 53 % (log); with every request at the mean lengths it missed by 100 %."""
    from profkit.model.observe import observe
    from profkit.model.predict import calibrate
    from profkit.report import build_report

    doc = build_report(recorded / "C" / "defaults" / "r1").document()
    assert doc["facts"]["workload.length_spread"] == 0.5
    obs = observe(doc)
    assert obs.length_spread == 0.5 and calibrate(obs).fit_error["ttft"] < 0.6
    fixed = build_report(recorded / "sweep14" / "capture" / "r1").document()
    assert fixed["facts"]["workload.length_spread"] == 0.0 and observe(fixed).length_spread == 0.0
