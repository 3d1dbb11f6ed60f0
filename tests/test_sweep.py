"""`profkit sweep`, the measured frontier, run through the CLI against the stand-in `vllm` replaying the 8B's recorded
sweep on an H200 (tests/data/h200_model_led: `vllm bench serve` at six request rates against one server): the
stand-in serves a recorded point for a rate it was recorded at and refuses any other, so each run's flags (rate,
prompts, seed) are the code's under test."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from profkit.compare.sweep import chosen_rates, prompts_for
from profkit.model.observe import observe
from profkit.model.predict import calibrate
from tests.cli import one_error_line, profkit
from tests.test_capture import FAKES, free_port

RATES = (6.65, 11.09, 15.52, 18.85, 22.18, 26.61)  # as recorded
BENCH = ("--dataset-name random --random-input-len 1024 --random-output-len 256 --ignore-eos "
         "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99")


@pytest.fixture(scope="module")
def recorded(h200_model_led: Path) -> Path:
    return h200_model_led


def sweep(recorded: Path, tmp: Path, *options: object,
          server_args: str = "--max-model-len 2048 --load-format dummy") -> tuple:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text((recorded / "sweep" / "capture" / "r1" / "model-config.json").read_text())
    env = {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_VLLM_RECORDED": str(recorded / "sweep"),
           "FAKE_VLLM_STATE": str(tmp), "FAKE_GPU": "NVIDIA H200, 580.159.04"}
    return profkit("sweep", *options, "--out", tmp / "out", "--port", free_port(), "serve", "--model", model,
                   "--server-args", server_args, "--bench-args", BENCH, env=env,
                   timeout=300)


def test_the_sweep_measures_each_rate_and_puts_the_prediction_beside_it(recorded: Path, tmp_path: Path) -> None:
    r = sweep(recorded, tmp_path, "--rates", ",".join(map(str, RATES)),
              "--from", recorded / "sweep" / "capture" / "r2")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [p["rate"] for p in doc["points"]] == list(RATES)
    for p in doc["points"]:
        rec = json.loads((recorded / "sweep" / "defaults" / f"rate-{p['rate']}.json").read_text())
        assert p["prompts"] == rec["num_prompts"] == prompts_for(p["rate"])  # 40 s of prompts, as recorded
        assert p["measured"]["p99_ttft_ms"] == rec["p99_ttft_ms"] and p["replicates"] == 1
        assert p["error"]["request_throughput"] == pytest.approx(
            p["predicted"]["request_throughput"]["predicted"] / rec["request_throughput"] - 1)
        run = tmp_path / "out" / f"rate-{p['rate']:g}" / "r1"
        words = json.loads((run / "manifest.json").read_text())["user_commands"][1]
        assert words[words.index("--request-rate") + 1] == f"{p['rate']}"
    seeds = [json.loads((tmp_path / "out" / f"rate-{r:g}" / "r1" / "manifest.json").read_text())["session"]["seed"]
             for r in RATES]
    assert len(set(seeds)) == len(RATES)  # each run its own prompts
    # the throughput served below the knee is predicted within 5 % (tests/test_frontier.py says what is not)
    assert all(abs(p["error"]["request_throughput"]) < 0.05 for p in doc["points"][:-1])
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"profkit sweep: {tmp_path / 'out'}: 6 rate(s), ")
    assert lines[3].split()[:4] == ["6.65", "1", "6.44", "/"]


def test_the_goodput_under_each_bound_is_measured_beside_the_models(recorded: Path, tmp_path: Path) -> None:
    """The 8B's sweep under p99 TPOT <= 15 ms and p99 E2E <= 5 s: measured 17.35 and 19.28 req/s between its points,
    the model's -5 % and -2 % (tests/test_frontier.py holds what the model misses by); the benchmarks' seconds are
    the recorded runs' durations."""
    from profkit.compare.sweep import measured_goodput
    from profkit.model.search import Bound

    r = sweep(recorded, tmp_path, "--rates", ",".join(map(str, RATES)), "--from", recorded / "sweep" / "capture" / "r2",
              "--slo", "p99_tpot_ms<=15", "--slo", "p99_e2el_ms<=5000")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "out" / "sweep.json").read_text())
    points = [json.loads((recorded / "sweep" / "defaults" / f"rate-{x}.json").read_text()) for x in RATES]
    assert doc["benchmark_s"] == pytest.approx(sum(p["duration"] for p in points), abs=0.1)
    for g, bound in zip(doc["goodput"], (Bound("p99_tpot_ms", "<=", 15), Bound("p99_e2el_ms", "<=", 5000)),
                        strict=True):
        assert g["bound"] == f"{bound.metric}<={bound.value:g}" and g["at_least"] is None and g["below"] is None
        assert g["measured"] == pytest.approx(measured_goodput(points, bound))
        assert g["error"] == pytest.approx(g["predicted"]["rate"] / g["measured"] - 1)
        assert -0.06 < g["error"] < 0 and g["inside_range"] == (g["predicted"]["low"] <= g["measured"]
                                                                <= g["predicted"]["high"])
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"  goodput within {g['bound']}: "))
        assert f"measured {g['measured']:,.2f} req/s, predicted {g['predicted']['rate']:,.2f}" in line
    assert f"  GPU time: {doc['benchmark_s']:,.0f} s of benchmarks (6 run(s))" in r.stdout


def test_a_rate_that_was_not_recorded_is_refused_by_the_stand_in(recorded: Path, tmp_path: Path) -> None:
    r = sweep(recorded, tmp_path, "--rates", "7")
    line = one_error_line(r, "vllm bench serve", progress=True)
    assert r.returncode != 0 and "see" in line


def test_the_rates_come_from_the_predicted_frontier_around_its_knee_and_the_bounds_edge(recorded: Path,
                                                                                       tmp_path: Path) -> None:
    from profkit.model.frontier import frontier
    from profkit.model.observe import observe
    from profkit.model.predict import calibrate
    from profkit.model.search import Bound
    from profkit.report import build_report

    cal = calibrate(observe(build_report(recorded / "sweep" / "capture" / "r2").document()))
    front = frontier(cal, {}, [Bound("p99_tpot_ms", "<=", 15)]).document()
    rates = chosen_rates(front)
    capacity = front["capacity"]["metrics"]["request_throughput"]["predicted"]
    good = front["goodput"]["rate"]
    assert {round(capacity * s, 2) for s in (0.5, 0.75, 0.9, 1.0)} <= set(rates)
    assert {round(good * s, 2) for s in (0.9, 1.0, 1.1)} <= set(rates) and rates == sorted(rates)
    r = sweep(recorded, tmp_path, "--from", recorded / "sweep" / "capture" / "r2", "--slo", "p99_tpot_ms<=15",
              "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"rates: {', '.join(f'{x:g}' for x in rates)} req/s"
    benches = [shlex.split(line) for line in lines[3:]]
    assert [float(b[b.index("--request-rate") + 1]) for b in benches] == rates
    assert [int(b[b.index("--num-prompts") + 1]) for b in benches] == [prompts_for(x) for x in rates]


def test_a_changed_configurations_sweep_is_predicted_as_predict_predicts_its_frontier(recorded: Path,
                                                                                     tmp_path: Path) -> None:
    """`--changes`: the swept server is the run's configuration with those flags (a prescription, measured). Lease 6's
    1-API-server 8B at 128/256 with 2 API servers: the rates come from the frontier `profkit predict RUN --frontier --
    --api-server-count 2` predicts (its capacity 1.3x the run's: the engine's step, its CPU read off the run, caps it
    below the API servers' ceiling at the median imbalance; 1.5x before lease 10's changes, that ceiling), and
    a change the swept server does not make, a change the model refuses, or --changes without a run are one line."""
    from profkit.report.predict import frontier_run

    run, two = recorded / "api" / "s2_api1", "--max-model-len 2048 --load-format dummy --api-server-count 2"
    slo = ("--slo", "p99_tpot_ms<=10")
    r = sweep(recorded, tmp_path, "--from", run, "--changes", "--api-server-count 2", *slo, "--dry-run",
              server_args=two)
    assert r.returncode == 0, r.stderr
    predicted = frontier_run(run, "--api-server-count 2", slos=[("p99_tpot_ms", "<=", 10.0)])["frontier"]
    own = frontier_run(run, None, slos=[("p99_tpot_ms", "<=", 10.0)])["frontier"]
    rates = chosen_rates(predicted)
    assert r.stdout.splitlines()[0] == f"rates: {', '.join(f'{x:g}' for x in rates)} req/s"
    assert rates != chosen_rates(own)
    capacity = [f["capacity"]["metrics"]["request_throughput"]["predicted"] for f in (own, predicted)]
    assert capacity[1] / capacity[0] == pytest.approx(1.3, abs=0.05)
    assert "--api-server-count 2" in r.stdout.splitlines()[1]  # the server swept is the changed one
    one_error_line(sweep(recorded, tmp_path, "--from", run, "--changes", "--api-server-count 4", "--dry-run",
                         server_args=two), "--changes api_server_count=4: the swept server's flags do not set it")
    # a size as vLLM spells it, on both: the same setting (they were compared as 42949672960 and '40G')
    assert sweep(recorded, tmp_path, "--from", run, "--changes", "--api-server-count 2 --max-num-batched-tokens 8K",
                 "--dry-run", server_args=two + " --max-num-batched-tokens 8K").returncode == 0
    one_error_line(sweep(recorded, tmp_path, "--from", run, "--changes", "--quantization awq", "--dry-run",
                         server_args=two + " --quantization awq"), "changes: not predicted:")
    one_error_line(sweep(recorded, tmp_path, "--rates", "5", "--changes", "--api-server-count 2"), "add --from RUN")
    # a flag that takes a value, given none, would read as True (== 1 API server): refused, not predicted
    one_error_line(sweep(recorded, tmp_path, "--from", run, "--changes", "--api-server-count", "--dry-run",
                         server_args=two), "--api-server-count takes a value")
    # values compare as vLLM reads them: 1 and 1.0 are one setting
    assert sweep(recorded, tmp_path, "--from", run, "--changes", "--api-server-count 2 --gpu-memory-utilization 0.9",
                 "--dry-run", server_args=two + " --gpu-memory-utilization 0.90").returncode == 0


def test_a_changed_sweep_is_shown_beside_the_prediction_it_was_made_with(recorded: Path, tmp_path: Path) -> None:
    """A sweep measured with --changes records them (sweep.json's predicted_from, as run_sweep writes the document),
    so reading it again beside the run predicts the configuration that was swept (lease 7's 2 API servers), not the
    run's own; other changes given are one line."""
    import shutil

    from profkit.compare.sweep import predictor, sweep_document

    folder = tmp_path / "sweep8s2"
    shutil.copytree(recorded / "sweep8s2", folder)
    run = recorded / "api" / "s2_api1"
    doc = sweep_document(folder, [28, 38, 46, 54, 63], predictor(run, [], "--api-server-count  2"))
    assert doc["predicted_from"] == {"run": str(run), "changes": "--api-server-count 2"}
    (folder / "sweep.json").write_text(json.dumps(doc))
    shown = profkit("sweep", "--show", folder, "--from", run, "--format", "json")
    assert shown.returncode == 0, shown.stderr
    again = json.loads(shown.stdout)
    assert [p["predicted"] for p in again["points"]] == [p["predicted"] for p in doc["points"]]
    own = json.loads(profkit("sweep", "--show", recorded / "sweep8s2", "--from", run, "--format", "json").stdout)
    assert own["points"][-1]["predicted"] != doc["points"][-1]["predicted"]  # the 1-API-server run's own frontier
    one_error_line(profkit("sweep", "--show", folder, "--from", run, "--changes", "--api-server-count 4"),
                   "swept with the changes '--api-server-count 2'")
    # a hand-edited or hostile record: one line naming the file, never a traceback
    for hostile in ({"changes": 7}, {"changes": "--api-server-count"}, ["--api-server-count 2"]):
        (folder / "sweep.json").write_text(json.dumps({**doc, "predicted_from": hostile}))
        r = profkit("sweep", "--show", folder, "--from", run)
        if isinstance(hostile, dict):
            one_error_line(r, "changes")
        else:  # not a record of changes: the run's own configuration, as for a sweep made without --changes
            assert r.returncode == 0, r.stderr


def test_a_run_budget_keeps_the_rates_that_decide_the_goodput_first(recorded: Path, tmp_path: Path) -> None:
    """`--replicates 3 --runs 10`: 3 rates of the 7 the frontier marks, those around the goodput (what a replicated
    sweep is for: its edge, measured with its noise), 9 runs; a budget below one rate's replicates, or with --rates,
    is one line."""
    from profkit.model.frontier import frontier
    from profkit.model.search import Bound
    from profkit.report import build_report

    capture = recorded / "sweep" / "capture" / "r2"
    cal = calibrate(observe(build_report(capture).document()))
    front = frontier(cal, {}, [Bound("p99_tpot_ms", "<=", 15)]).document()
    good = front["goodput"]["rate"]
    assert chosen_rates(front, 3) == sorted(round(good * s, 2) for s in (0.9, 1.0, 1.1))
    assert chosen_rates(front, 4)[-1] == round(front["capacity"]["metrics"]["request_throughput"]["predicted"], 2)
    # 7 marks, 7 rates (the goodput 17.03 req/s, the capacity 22.42); where two marks round alike, one rate: before
    # 7a23ad0 0.75 of the capacity (22.06) rounded to the goodput (16.55), as it does here with the goodput moved there
    assert chosen_rates(front, 99) == chosen_rates(front) and len(chosen_rates(front)) == 7
    capacity = front["capacity"]["metrics"]["request_throughput"]["predicted"]
    at_the_knee = {**front, "goodput": {**front["goodput"], "rate": 0.75 * capacity}}
    assert len(chosen_rates(at_the_knee)) == 6 and round(0.75 * capacity, 2) in chosen_rates(at_the_knee)
    r = sweep(recorded, tmp_path, "--from", capture, "--slo", "p99_tpot_ms<=15", "--replicates", "3", "--runs", "10",
              "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"rates: {', '.join(f'{x:g}' for x in chosen_rates(front, 3))} req/s"
    assert len(lines[3:]) == 9  # each rate's three replicates
    # every rate once, then again: a sweep cut short still measured each rate, and drift spreads over them all
    runs = [(w[w.index("--request-rate") + 1], Path(w[w.index("--result-dir") + 1]).name, w[w.index("--seed") + 1])
            for w in map(shlex.split, lines[3:])]
    assert runs == [(f"{x:g}", f"r{k}", str(int(runs[0][2]) + i))
                    for i, (x, k) in enumerate((x, k) for k in (1, 2, 3) for x in chosen_rates(front, 3))]
    one_error_line(sweep(recorded, tmp_path, "--from", capture, "--replicates", "3", "--runs", "2", "--dry-run"),
                   "cannot hold one rate's 3 replicates")
    one_error_line(sweep(recorded, tmp_path, "--rates", "5", "--runs", "4", "--dry-run"),
                   "give --from RUN and no --rates")


def test_a_sweep_needs_its_rates_or_a_run_to_choose_them(recorded: Path, tmp_path: Path) -> None:
    one_error_line(sweep(recorded, tmp_path), "give --rates, or --from RUN")
    one_error_line(sweep(recorded, tmp_path, "--rates", "5,x"), "request rates, e.g. 5,10,15")
    one_error_line(sweep(recorded, tmp_path, "--slo", "p99_ttft_ms<=9"), "add --from RUN")


def test_a_rate_past_any_load_and_a_malformed_bound_are_one_line(recorded: Path, tmp_path: Path) -> None:
    """1e9 req/s would send 40 billion prompts: refused before anything starts; a bound that is not METRIC<OP>VALUE
    names the flag it came with (--slo, not diff's --fail-on)."""
    one_error_line(sweep(recorded, tmp_path, "--rates", "1e9", "--dry-run"), "up to 10,000 req/s")
    line = one_error_line(profkit("predict", "samples/vllm_14b_kv_bound", "--frontier", "--slo", "p99_ttft_ms<=1e400"),
                          "--slo 'p99_ttft_ms<=1e400': expected METRIC<OP>VALUE, e.g. 'p99_ttft_ms<=2000'")
    assert "--fail-on" not in line


def test_show_reads_a_real_sweep_folder_beside_todays_model(recorded: Path, tmp_path: Path) -> None:
    """`profkit sweep --show` on the sweep `profkit sweep` measured on an H200 (lease 4: the 14B at the 7 rates its
    predicted frontier chose; its sweep.json predates the goodput lines): each point as measured, today's model beside
    it, each bound's goodput between the measured points (p99 TPOT <= 15 ms: 7.75 req/s, between 6.09 and 9.13)."""
    from profkit.compare.sweep import measured_goodput
    from profkit.model.search import Bound

    folder = recorded / "sweep14p"
    r = profkit("sweep", "--show", folder, "--from", recorded / "sweep14" / "capture" / "r2", "--slo",
                "p99_tpot_ms<=15", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    benches = {float(d.name[5:]): json.loads((d / "r1" / "bench.json").read_text()) for d in folder.glob("rate-*")}
    assert [p["rate"] for p in doc["points"]] == sorted(benches) and len(benches) == 7
    for p in doc["points"]:
        assert p["measured"]["p99_tpot_ms"] == benches[p["rate"]]["p99_tpot_ms"] and "predicted" in p
    points = [benches[k] for k in sorted(benches)]
    (g,) = doc["goodput"]
    assert g["measured"] == pytest.approx(measured_goodput(points, Bound("p99_tpot_ms", "<=", 15))) \
        == pytest.approx(7.75, abs=0.01)
    assert doc["benchmark_s"] == pytest.approx(sum(b["duration"] for b in points), abs=0.1)
    assert doc["seconds"] == json.loads((folder / "sweep.json").read_text())["seconds"]
    text = profkit("sweep", "--show", folder).stdout
    assert text.splitlines()[0] == f"profkit sweep: {folder}: 7 rate(s), 647 s with the server's start-up (92 s)"


def test_show_on_what_is_not_a_sweep_is_one_line(recorded: Path, tmp_path: Path) -> None:
    one_error_line(profkit("sweep", "--show", recorded / "sweep14" / "capture"), "not a sweep folder")
    one_error_line(profkit("sweep", "--show", tmp_path / "nowhere"), "nowhere: no such folder")
    # and a sweep folder given to the report: where to read it
    one_error_line(profkit("report", recorded / "sweep14p"), "a sweep folder, one run per request rate: profkit sweep "
                   f"--show {recorded / 'sweep14p'} reads it")
    broken = tmp_path / "sweep"
    (broken / "rate-5" / "r1").mkdir(parents=True)
    (broken / "rate-5" / "r1" / "bench.json").write_text('{"request_throughput": 4.9, ')
    one_error_line(profkit("sweep", "--show", broken), "bench.json: not JSON")


def test_a_goodput_the_measured_rates_do_not_bracket_is_a_floor_or_a_ceiling(recorded: Path, tmp_path: Path) -> None:
    """The real 14B sweep: every rate met p99 TPOT <= 30 ms (the goodput is at least 12.58, no error is claimed);
    none met p99 TTFT <= 200 ms (210 ms at 6.09: below 6.09). A folder named as profkit does not name its rates
    (rate-6.090 beside rate-6.09, rate-inf, rate--1) is not a rate; vLLM's median_tpot_ms reads as p50_tpot_ms."""
    import shutil

    folder = tmp_path / "sweep"
    shutil.copytree(recorded / "sweep14p", folder)
    for odd in ("rate-6.090", "rate-inf", "rate--1", "rate-nan"):
        shutil.copytree(folder / "rate-6.09", folder / odd)
    r = profkit("sweep", "--show", folder, "--from", recorded / "sweep14" / "capture" / "r2", "--slo",
                "p99_tpot_ms<=30", "--slo", "p99_ttft_ms<=200", "--slo", "median_tpot_ms<=15", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["points"]) == 7
    floor, ceiling, median = doc["goodput"]
    assert floor["at_least"] == 12.58 and floor["measured"] is None and "error" not in floor
    assert floor["inside_range"] == (floor["predicted"]["high"] >= 12.58)
    assert ceiling["below"] == 6.09 and ceiling["measured"] is None and "error" not in ceiling
    assert median["bound"] == "p50_tpot_ms<=15" and median["measured"] is not None
    text = profkit("sweep", "--show", folder, "--from", recorded / "sweep14" / "capture" / "r2", "--slo",
                   "p99_tpot_ms<=30", "--slo", "p99_ttft_ms<=200").stdout
    assert "goodput within p99_tpot_ms<=30: measured 12.58 req/s or more (every rate measured met it), predicted" \
        in text
    assert "goodput within p99_ttft_ms<=200: measured below 6.09 req/s (the lowest rate measured missed it)" in text


def test_a_runs_mean_ttft_is_split_where_it_went_in_every_format(recorded: Path) -> None:
    """The 14B at 6.09 req/s (lease 4's sweep, its run's two /metrics scrapes): vLLM's histograms over the benchmark's
    243 requests, read off metrics-before.txt and metrics-after.txt: TTFT (server) 173.14986 - 156.83379 s, queue
    66.81756 - 66.81517 s, prefill 80.08507 - 67.12607 s; the client's mean TTFT 75.058 ms (bench.json). Most of
    what the model does not predict at a finite rate is outside the engine: 7.9 ms client and HTTP, 13.8 ms API
    server."""
    run = recorded / "sweep14p" / "rate-6.09" / "r1"
    doc = json.loads(profkit("report", run, "--format", "json").stdout)
    split = doc["vllm"]["ttft_split"]
    n = 343 - 100
    assert split["requests"] == n
    assert split["server_ttft_ms"] == pytest.approx((173.14986371994019 - 156.83378767967224) / n * 1e3)
    assert split["queue_ms"] == pytest.approx((66.81756154900154 - 66.81516761400201) / n * 1e3)
    assert split["prefill_ms"] == pytest.approx((80.08507423799756 - 67.12607407699818) / n * 1e3)
    assert split["api_server_ms"] == pytest.approx(split["server_ttft_ms"] - split["queue_ms"] - split["prefill_ms"])
    assert split["client_ms"] == pytest.approx(75.05795673661997 - split["server_ttft_ms"])
    line = "mean TTFT 75.1 ms = 7.9 client and HTTP + 13.8 API server + 0.0 queue + 53.3 prefill ms"
    assert line in profkit("report", run).stdout
    assert line in profkit("report", run, "--format", "md").stdout
    assert line in profkit("report", run, "--format", "html").stdout


def test_a_ttft_split_is_withheld_where_the_scrapes_went_backwards(recorded: Path, tmp_path: Path) -> None:
    """The same run's scrapes given after before (a server restarted between them reads the same): the histograms'
    counts and sums went down, so no split is said, and the report is otherwise whole."""
    run = recorded / "sweep14p" / "rate-6.09" / "r1"
    r = profkit("report", "--bench", run / "bench.json", "--metrics", run / "metrics-after.txt", "--metrics",
                run / "metrics-before.txt", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["vllm"].get("ttft_split") is None
    assert doc["vllm"]["bench"]["ttft_mean_ms"] == pytest.approx(75.058, abs=1e-3)


def test_two_sweeps_are_compared_rate_by_rate_with_each_bounds_goodput(recorded: Path, tmp_path: Path) -> None:
    """The 14B's defaults (lease 4) against its FP8 pair (lease 5), both measured by `profkit sweep`: at a rate one
    sweep did not measure its figure is read between its neighbours (the defaults' p50 TTFT at 9 req/s: 65.0 at 6.09
    and 92.0 at 9.13 -> 90.8; the FP8 pair measured 79.2 there); goodput under p99 TPOT <= 15 ms 7.75 -> 12.96 req/s,
    as scripts/validate_frontier.py measures each."""
    a, b = recorded / "sweep14p", recorded / "sweep14fp8"
    r = profkit("diff", a, b, "--slo", "p99_tpot_ms<=15", "--slo", "median_ttft_ms<=100", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "profkit.sweep-diff/1"
    assert doc["before"]["rates"] == [6.09, 9.13, 10.29, 10.96, 11.43, 12.17, 12.58]
    row = {x["rate"]: x for x in doc["rows"]}[9.0]
    assert row["measured"] == [False, True]
    assert row["before"]["p50_ttft_ms"] == pytest.approx(65.0 + (92.0 - 65.0) * (9.0 - 6.09) / (9.13 - 6.09), abs=0.1)
    assert row["after"]["p50_ttft_ms"] == pytest.approx(79.2, abs=0.05)
    assert row["change"]["p99_tpot_ms"] == pytest.approx(row["after"]["p99_tpot_ms"] / row["before"]["p99_tpot_ms"]
                                                         - 1)
    assert all(x["rate"] >= 6.09 and x["rate"] <= 12.58 for x in doc["rows"])  # no curve extrapolated: 6 and 14-19
    tpot = doc["goodput"][0]
    assert tpot["bound"] == "p99_tpot_ms<=15"
    assert (round(tpot["before"]["measured"], 2), round(tpot["after"]["measured"], 2)) == (7.75, 12.96)
    assert doc["goodput"][1]["bound"] == "p50_ttft_ms<=100"
    text = profkit("diff", a, b, "--slo", "p99_tpot_ms<=15").stdout
    assert "goodput within p99_tpot_ms<=15: 7.75 → 12.96 req/s (+67%)" in text
    assert "     9  7.95* → 8.22 (+3%~)" in text  # the throughput's change within the 5 % noise
    md = tmp_path / "d.md"
    assert profkit("diff", a, b, "-o", md).returncode == 0
    assert "| rate | req/s | TTFT p50 |" in md.read_text()


def test_a_sweep_against_what_is_not_a_sweep_is_one_line(recorded: Path) -> None:
    one_error_line(profkit("diff", recorded / "sweep14p", recorded / "sweep14" / "capture"),
                   "is a sweep folder and")
    one_error_line(profkit("diff", recorded / "sweep14p", recorded / "sweep14fp8", "--fail-on",
                           "request_throughput<-5%"), "--fail-on gates a diff of two runs")
    one_error_line(profkit("diff", recorded / "sweep14p", recorded / "sweep14fp8", "--slo", "p95_ttft_ms<=3"),
                   "p95_ttft_ms")
    one_error_line(profkit("diff", recorded / "sweep14" / "capture" / "r1", recorded / "sweep14" / "capture" / "r2",
                           "--slo", "p99_ttft_ms<=3"), "--slo applies to two sweep folders")


def test_the_sweep_and_predict_refuse_alike(recorded: Path, tmp_path: Path) -> None:
    """`profkit sweep --from RUN --changes X` asks the model `profkit predict RUN --frontier -- X` asks, through one
    calibration and one set of refusals: the same line from each (here a value the flag does not take)."""
    run = recorded / "api" / "s2_api1"
    said = one_error_line(profkit("predict", run, "--frontier", "--", "--max-num-seqs", "many"),
                          "changes: --max-num-seqs many: a value vLLM would not take")
    assert said == one_error_line(sweep(recorded, tmp_path, "--from", run, "--changes", "--max-num-seqs many",
                                        "--dry-run", server_args="--max-model-len 2048 --max-num-seqs many"))
    assert said == one_error_line(profkit("predict", run, "--", "--max-num-seqs", "many"))


@pytest.mark.parametrize("args", [[], ["--rates", "5", "--", "vllm", "bench", "throughput", "--model", "m"]])
def test_a_sweep_without_a_server_says_so_first(args: list[str]) -> None:
    """`profkit sweep` alone said to give `-- vllm bench throughput|latency ARGS...` (capture's usage), and doing so
    then said a sweep measures a server: the server's usage is said at once."""
    one_error_line(profkit("sweep", *args), "a sweep measures a server: profkit sweep ... serve --model M ...")
