"""Data parallelism recorded on 2 H200s (issue 51; tests/data/h200_model_led.README.md, lease 21): one GPU's capture of
two shapes, then the same with --data-parallel-size 2 on both GPUs. What the report got wrong of such runs: a GPU's MFU
and MBU are its share of the engines' summed counters (it read one GPU's peak against both GPUs' work: 97 % MFU where
each GPU did 49 %), and no peak is read off the idle server's scrape after the benchmark (several API servers: one
per engine). And what the model said: asked first, x1.99 and x1.98 where the runs measured x1.84 and x1.78, outside
its ranges, so a change of the GPUs' count stays refused, in one line that says what was measured."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

import profkit.model.predict as model_predict
from profkit.api import predict, render
from profkit.model.observe import observe
from profkit.report import build_report
from tests.cli import one_error_line, profkit
from tests.test_gpu_bound import counter, counter_delta
from tests.test_model import _mean_rate

H200_BF16, H200_BANDWIDTH = 989.5e12, 4.8e12  # profkit's peak table, NVIDIA's dense figures


@pytest.fixture(scope="module")
def recorded(h200_model_led: Path) -> Path:
    return h200_model_led


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
    """Several API servers (data parallelism runs one per engine): vLLM logs no stats lines (s2_api2's server.log;
    lease 21's folders keep none), and /metrics after the benchmark reads an idle server though every prompt was sent
    at once. The report had said "peak KV usage 0.0%"
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


def test_one_gpu_to_two_by_data_parallelism_fell_short_of_the_prediction_made_first(recorded: Path) -> None:
    """The refusal's line says what the recordings say: the measured ratios (the replicates' means) and the ratios
    the model predicted on the box before the DP=2 server started, each outside the range it gave."""
    measured, said = {}, {}
    for shape in ("14b", "8b"):
        one, two = (_mean_rate(recorded / "api" / f"d{n}_{shape}") for n in (1, 2))
        made_first = json.loads((recorded / "lease21-predicted-onbox" / f"d1_{shape}.json").read_text())
        assert made_first["changes"] == {"data_parallel_size": 2}
        throughput = made_first["metrics"]["request_throughput"]
        measured[shape], said[shape] = two / one, throughput["predicted"] / throughput["before"]
        assert two < throughput["low"]  # the range made first missed the measurement
        assert 0.08 < throughput["predicted"] / two - 1 < 0.12  # +8.5 % (14B) and +11.0 % (8B)
    line = one_error_line(profkit("predict", recorded / "api" / "d1_14b", "--", "--data-parallel-size", "2"),
                          "2 GPUs where the run used 1: the model predicts only splits of the run's own GPUs")
    low, high = sorted(measured.values())
    uni = _mean_rate(recorded / "api" / "e2_uni") / _mean_rate(recorded / "api" / "d1_14b")
    longer = _mean_rate(recorded / "api" / "e3_long") / _mean_rate(recorded / "api" / "d3_long")
    made_longer = json.loads((recorded / "lease23-predicted" / "d1_14b-dp2_long.json").read_text())
    said["14b longer"] = made_longer["metrics"]["request_throughput"]["predicted"] / \
        made_longer["metrics"]["request_throughput"]["before"]
    assert (f"(1 GPU -> --data-parallel-size 2 measured x{low:.2f}-{high:.2f} on two shapes (x{uni:.2f} with "
            f"--distributed-executor-backend uni, x{longer:.2f} on twice the requests) where it predicted "
            f"x{min(said.values()):.2f}-{max(said.values()):.2f})") in line


def _idle_at_the_ends(capture: Path, report: dict) -> list[float]:
    """Each of the run's GPUs: the seconds it was idle (NVML) after the benchmark started and before it ended (the
    window its `profkit report` document read the host over)."""
    host = json.loads((capture / "host.json").read_text())
    start, end = report["host"]["window_s"]
    idle = []
    for gpu in (g for g in host["gpus"] if g["visible"]):
        busy = [t for t, value, *_ in gpu["util"] if value > 0 and start <= t <= end]
        idle.append((busy[0] - start) + (end - busy[-1]))
    return idle


@pytest.mark.parametrize("run", ["r1", "r2", "r3"])
def test_the_worker_process_is_not_what_data_parallelism_lost(recorded: Path, run: str) -> None:
    """Lease 22: DP=2 with the worker in each engine core (`--distributed-executor-backend uni`, which vLLM took: no
    `VLLM::Worker` among the host's processes) fell as short of the prediction made first as lease 21's `mp` runs
    did; its engine cores no longer spun at a full core (lease 21's: in 79-86 % of the samples). Each GPU idled for
    seconds at the run's ends instead, the busier API server streaming on after they were done; one GPU alone, 1.4-1.7
    s of its 60 s."""
    capture = recorded / "api" / "e2_uni" / run
    assert "'distributed_executor_backend': 'uni'" in (capture / "server.log").read_text()
    names = [p["name"] for p in json.loads((capture / "host.json").read_text())["processes"]]
    assert not any("VLLM::Worker" in n for n in names) and sum("EngineCore_DP" in n for n in names) == 2
    made_first = json.loads((recorded / "lease21-predicted-onbox" / "d1_14b.json").read_text())
    assert _mean_rate(recorded / "api" / "e2_uni") < made_first["metrics"]["request_throughput"]["low"]
    report = build_report(capture).document()
    assert report["facts"]["host.engine_core_saturated_share"] < 0.7
    assert len(idle := _idle_at_the_ends(capture, report)) == 2 and min(idle) > 2.0
    alone = recorded / "api" / "d1_14b" / run
    assert max(_idle_at_the_ends(alone, build_report(alone).document())) < 2.0


def test_the_refusal_rests_on_what_the_model_still_predicts(recorded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal lifted (as scripts/predict_dp.py did on the box), today's model still predicts more than any
    measured ratio: the 14B's is the prediction the lease measured against, within 0.001 % (the folders here lack the
    runs' server.log, left on the box), its range the same until lease 26's GPU layout pairs (Q48-Q50) moved the
    class's held-out errors (the throughput's low end 55.59 -> 55.75 req/s); the 8B's moved from x1.98 to x1.95
    with the API servers' queue (7a23ad0: two engines' tokens at the run's end through the busier of two API
    servers), against x1.78 measured."""
    monkeypatch.setattr(model_predict, "change_refusal", lambda obs, changes: None)
    ratios = {}
    for shape in ("14b", "8b"):
        now = predict(recorded / "api" / f"d1_{shape}", "--data-parallel-size 2")["metrics"]
        ratios[shape] = now["request_throughput"]["predicted"] / now["request_throughput"]["before"]
        if shape == "14b":
            made_first = json.loads((recorded / "lease21-predicted-onbox" / "d1_14b.json").read_text())["metrics"]
            for metric in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms"):
                assert now[metric]["predicted"] == pytest.approx(made_first[metric]["predicted"], rel=1e-5), metric
                # the ends are the class's held-out band, which moves as GPU layout pairs are recorded
                assert now[metric]["low"] <= now[metric]["predicted"] <= now[metric]["high"], metric
            assert now["request_throughput"]["low"] == pytest.approx(55.75, abs=0.01)
    assert round(ratios["8b"], 2) == 1.95 and round(ratios["14b"], 2) == 1.99
    pairs = (("d1_14b", "d2_14b"), ("d1_8b", "d2_8b"), ("d1_14b", "e2_uni"), ("d3_long", "e3_long"))
    measured = [_mean_rate(recorded / "api" / two) / _mean_rate(recorded / "api" / one) for one, two in pairs]
    assert min(ratios.values()) > 1.04 * max(measured)


@pytest.mark.parametrize("flag, value", [("--data-parallel-size", "-2"), ("--tensor-parallel-size", "0")])
def test_a_parallel_size_that_is_not_a_count_withholds_the_figures_per_gpu(recorded: Path, tmp_path: Path, flag: str,
                                                                           value: str) -> None:
    """A manifest whose parallel size is no count of GPUs (hostile: vLLM refuses it at start-up) gives no MFU or MBU
    divided by it: the estimates' figures are withheld, in one line naming the flag, and the report still renders."""
    run = tmp_path / "r1"
    shutil.copytree(recorded / "api" / "d2_14b" / "r1", run)
    manifest = json.loads((run / "manifest.json").read_text())
    args = manifest["vllm_args"]
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    (run / "manifest.json").write_text(json.dumps(manifest))
    eff = build_report(run).document()["efficiency"]
    assert all(eff[k]["mfu"] is None and eff[k]["mbu"] is None for k in ("vllm_counters", "model_shape"))
    assert eff["window"].get("mfu") is None
    said = f"{flag} {value}: not a count of GPUs, so no figure per GPU (MFU, MBU) is given"
    assert said in eff["withheld"]
    out = profkit("report", run)
    assert out.returncode == 0 and said in out.stdout, out.stderr


def test_twice_the_requests_did_not_close_data_parallelisms_gap(recorded: Path) -> None:
    """Lease 23: DP=2 on 3,600 prompts against one GPU on 3,600 (the same box) came to x1.86, where 1,800 gave
    x1.82-1.84: the shortfall is not a fixed cost at the run's ends that a longer run would hide. Each DP=2 GPU still
    idled seconds at the ends (one GPU alone: about 2 s of 120). The prediction made first for the longer run was
    +6.3 % on the mean, two replicates of three inside its range; one GPU's +0.6 %, inside."""
    api = recorded / "api"
    longer = _mean_rate(api / "e3_long") / _mean_rate(api / "d3_long")
    shorter = _mean_rate(api / "d2_14b") / _mean_rate(api / "d1_14b")
    assert 1.84 < longer < 1.9 and abs(longer - shorter) < 0.05
    for capture in sorted((api / "e3_long").glob("r[0-9]")):
        assert json.loads((capture / "bench.json").read_text())["completed"] == 3600
        assert min(_idle_at_the_ends(capture, build_report(capture).document())) > 3.0
    for capture in sorted((api / "d3_long").glob("r[0-9]")):
        assert max(_idle_at_the_ends(capture, build_report(capture).document())) < 2.5
    made_first = {case: json.loads((recorded / "lease23-predicted" / f"d1_14b-{case}.json").read_text())
                  ["metrics"]["request_throughput"] for case in ("dp2_long", "one_long")}
    inside = [made_first["dp2_long"]["low"] <= rate <= made_first["dp2_long"]["high"]
              for rate in _rates(api / "e3_long")]
    assert inside == [True, True, False]
    assert made_first["dp2_long"]["predicted"] / _mean_rate(api / "e3_long") - 1 == pytest.approx(0.063, abs=0.001)
    assert made_first["one_long"]["predicted"] / _mean_rate(api / "d3_long") - 1 == pytest.approx(0.006, abs=0.001)
    one = made_first["one_long"]
    assert all(one["low"] <= rate <= one["high"] for rate in _rates(api / "d3_long"))


def test_one_api_server_for_two_engines_streams_on_after_the_gpus(recorded: Path) -> None:
    """Lease 23: DP=2 with --api-server-count 1 lost 9 % to two API servers (lease 21-22's boxes), 20 % below what the
    model said first (all three outside its range). Its API server was at a full core in under half the samples, so
    the model reads no ceiling from its mean; each GPU idled 5-8 s at the ends, 4-7 s of it before the benchmark
    ended while it worked on. The model of 5c1913a predicted no change from `--api-server-count 2` here; since the API
    servers' queue (7a23ad0) it predicts x1.03-1.13 from the three runs, where two API servers measured x1.08-1.15
    against each (lease 21's boxes)."""
    api = recorded / "api"
    one = _mean_rate(api / "e3_api1")
    assert one / min(_mean_rate(api / "d2_14b"), _mean_rate(api / "e2_uni")) == pytest.approx(0.91, abs=0.01)
    made_first = json.loads((recorded / "lease23-predicted" / "d1_14b-dp2_api1.json").read_text())
    throughput = made_first["metrics"]["request_throughput"]
    assert made_first["changes"] == {"data_parallel_size": 2, "api_server_count": 1}
    assert max(_rates(api / "e3_api1")) < throughput["low"]
    assert throughput["predicted"] / one - 1 == pytest.approx(0.204, abs=0.001)
    for capture in sorted((api / "e3_api1").glob("r[0-9]")):
        report = build_report(capture).document()
        facts = report["facts"]
        assert facts["host.api_server_count"] == 1 and facts["host.api_server_saturated_share"] < 0.5
        assert min(_idle_at_the_ends(capture, report)) > 5.0
        then = predict(capture, "--api-server-count 2")["metrics"]["request_throughput"]
        assert 1.02 < then["predicted"] / then["before"] < _mean_rate(api / "d2_14b") / then["before"]


@pytest.mark.parametrize("run", ["r1", "r2"])
def test_the_engine_core_spins_where_it_feeds_a_worker_process(recorded: Path, run: str) -> None:
    """Lease 23: two one-GPU servers side by side, `--distributed-executor-backend mp` (one `VLLM::Worker`, as data and
    tensor parallelism run) and vLLM's default `uni`: the same throughput, the engine core at a full core in over 90 %
    of the samples with `mp` against under half with `uni` (it waits on the worker's replies by spinning on vLLM's
    shared-memory queue). The worker count is a fact; with workers, the engine core's saturation is no finding, and
    the model neither fits its CPU nor calls it the limit."""
    mp, uni = recorded / "api" / "f1_mp" / run, recorded / "api" / "f1_uni" / run
    assert "'distributed_executor_backend': 'mp'" in (mp / "server.log").read_text()
    assert _mean_rate(mp.parent) / _mean_rate(uni.parent) == pytest.approx(1.0, abs=0.02)
    spins, works = build_report(mp).document(), build_report(uni).document()
    assert (spins["facts"]["host.worker_count"], works["facts"]["host.worker_count"]) == (1, 0)
    saturated = [doc["facts"]["host.engine_core_saturated_share"] for doc in (spins, works)]
    assert saturated[0] > 0.9 and saturated[1] < 0.5
    assert "engine-core-bound" not in {f["rule"] for f in spins["findings"]}
    assert not model_predict.engine_core_cpu_says(observe(spins))
    said = "fed 1 worker process (vLLM's mp executor) and waits on it by spinning"
    for fmt in ("text", "md", "html"):  # the host section says why its engine core reads busy
        assert (said.replace("'", "&#39;") if fmt == "html" else said) in render(spins, fmt)
        assert "worker process" not in render(works, fmt)


def test_a_data_parallel_run_whose_engine_cores_spun_is_fitted_on_its_gpus(recorded: Path) -> None:
    """Lease 23's `e3_api1/r3` (DP=2, its GPUs busy 79 % with idle ends, its engine cores at a full core in 76 % of the
    samples): profkit called it engine-core-bound and fitted the engine core's CPU, which the simulation could not
    bring to the run ("its simulated duration is off by x6.26", refused). Its engine cores fed worker processes: the
    finding is gone and the model fits the GPUs' steps to the measured duration less the 5.9 s its GPUs were done
    before the end (7a23ad0); the API server's queue gives 4.2 s of that drain, so the whole run within 5 %."""
    capture = recorded / "api" / "e3_api1" / "r3"
    report = build_report(capture).document()
    facts = report["facts"]
    assert facts["host.engine_core_saturated_share"] > 0.5 and facts["gpu.busy"] < 0.85
    assert facts["host.worker_count"] == 2
    assert "engine-core-bound" not in {f["rule"] for f in report["findings"]}
    doc = predict(capture, "--api-server-count 2")
    assert facts["host.drain_s"] == pytest.approx(5.9, abs=0.05)
    assert doc["calibration"]["fit_error"]["elapsed"] < 0.05
    assert any("gives 4.2 s of it" in line for line in doc["reasoning"])


def _rates(folder: Path) -> list[float]:
    return [json.loads((r / "bench.json").read_text())["request_throughput"] for r in sorted(folder.glob("r[0-9]"))]


def test_vllm_starts_one_api_server_per_engine_unless_told(recorded: Path) -> None:
    """vLLM 0.26.0 defaults --api-server-count to --data-parallel-size (entrypoints/cli/serve.py, its internal load
    balancer): lease 21's DP=2 captures (their server.log left on the box) had two, as their host samples say. profkit
    took one from its defaults table, so `--api-server-count 1` on them predicted no move of the API server's ceiling
    (Q32 in scripts/validate_model.py); it halves now, and removing the flag (vLLM's default) changes nothing."""
    capture = recorded / "api" / "d2_14b" / "r1"
    facts = build_report(capture).document()["facts"]
    assert (facts["config.api_server_count"], facts["config_source.api_server_count"]) == (2, "vLLM 0.26 default")
    assert facts["host.api_server_count"] == 2
    said = next(r for r in predict(capture, "--api-server-count 1")["reasoning"] if r.startswith("the API server"))
    before, after = (float(x.replace(",", "")) for x in re.findall(r"([\d,]+) ", said.split("up to ")[1] + " ")[:2])
    assert after < 0.6 * before
    same = predict(capture, "--api-server-count default")["metrics"]["request_throughput"]
    assert same["predicted"] == pytest.approx(same["before"], rel=1e-6)
    one = build_report(recorded / "api" / "d1_14b" / "r1").document()["facts"]
    assert one["config.api_server_count"] == 1 and one["host.api_server_count"] == 1


@pytest.mark.parametrize("given, count", [
    ({"data_parallel_size": 4}, 4),
    ({"data_parallel_size": 4, "data_parallel_external_lb": True}, 1),
    ({"data_parallel_size": 4, "data_parallel_rank": 0}, 1),
    ({"data_parallel_size": 4, "data_parallel_start_rank": 0, "data_parallel_size_local": 2}, 2),
    ({"data_parallel_size": 4, "headless": True}, 1),
    ({"data_parallel_size": 4, "api_server_count": 3}, 3),
])
def test_the_api_servers_vllm_starts_by_its_load_balancing_mode(given: dict, count: int) -> None:
    """vLLM 0.26.0's default by mode (entrypoints/cli/serve.py): one per engine with its internal load balancer; the
    local engines' count in the hybrid mode (a start rank); one behind an external load balancer (a rank) or with
    --headless; what the command gives, given."""
    from profkit.vllm.options import effective_config

    assert effective_config(given, {}, "NVIDIA H200")["api_server_count"]["value"] == count


def _last_busy(capture: Path, report: dict) -> float:
    """The last NVML sample in the benchmark's window at which any GPU was busy, from host.json as written."""
    start, end = report["host"]["window_s"]
    host = json.loads((capture / "host.json").read_text())
    return max(t for gpu in host["gpus"] if gpu["visible"] for t, value, *_ in gpu["util"]
               if value > 0 and start <= t <= end)


@pytest.mark.parametrize("run", ["r1", "r2", "r3"])
def test_the_host_section_says_the_gpus_were_done_while_an_api_server_streamed_on(recorded: Path, run: str) -> None:
    """Lease 23's one API server for two engines: the GPUs were done seconds before the benchmark ended (the client's
    second after it left out) while the API server was at a full core, streaming the last of 1,800 requests that
    finished together. The host section says how long and how busy, in every format; one GPU's run of the same shape
    (its GPU busy to the end) says nothing of it."""
    capture = recorded / "api" / "e3_api1" / run
    report = build_report(capture).document()
    drain = report["host"]["drain"]
    assert drain["seconds"] == pytest.approx(report["host"]["window_s"][1] - 1.0 - _last_busy(capture, report))
    assert 3.0 < drain["seconds"] < 6.5 and drain["api_server_cpu"] > 0.95
    said = f"the GPUs were done {drain['seconds']:.1f} s"
    for fmt in ("text", "md", "html"):
        assert said in render(report, fmt)
    for alone in (recorded / "api" / "d1_14b" / run, recorded / "api" / "d3_long" / "r1"):
        quiet = build_report(alone).document()
        assert quiet["host"]["drain"]["seconds"] < 0.5 and "drain_note" not in quiet["host"]
        assert "the GPUs were done" not in render(quiet, "text")


def test_a_frontend_bound_run_is_half_drain_and_its_slow_replicate_is_all_drain(recorded: Path) -> None:
    """Lease 9's 1.1B with one API server (Q25's baseline, the validation's worst miss): the GPU was done with every
    token 32-35 s into each 65-78 s run, and the API server streamed the rest at a full core. The slow replicate (r2,
    38.31 req/s against 44.07 and 46.18) took as long on the GPU as its siblings; its extra 9-11 s are all drain: the
    API server's cost per token, which the model takes as measured and predicts 2 API servers from."""
    gpu_done, drained = [], []
    for run in ("r1", "r2", "r3"):
        capture = recorded / "api" / "t1_api1" / run
        host = build_report(capture).document()["host"]
        start, end = host["window_s"]
        assert host["drain"]["api_server_cpu"] > 0.95 and host["drain"]["seconds"] > 0.45 * (end - start)
        assert "the GPUs were done" in host["drain_note"]
        gpu_done.append(end - 1.0 - host["drain"]["seconds"] - start)
        drained.append(host["drain"]["seconds"])
    assert max(gpu_done) - min(gpu_done) < 3.0
    assert drained[1] - max(drained[0], drained[2]) > 8.0


def test_a_prediction_from_a_drained_run_says_how_much_of_the_drain_the_model_gives(recorded: Path) -> None:
    """A prediction from lease 23's one-API-server DP=2 run: its GPUs were done seconds before the end while the API
    server, not saturated over the run, streamed on. The model's queue of the simulated run's tokens (7a23ad0) gives
    part of it, and the prediction says both, in every format. The pairs that shaped the queue (Q32, Q33) are
    in-sample since; lease 24's, recorded after it (Q34 predicted before the lease from another box), are held out:
    -12.4 % to +8.1 %, all 15 inside their ranges. Not from a run with no drain (one GPU), nor from a frontend-bound
    one, whose drain is the API server's ceiling from the start."""
    capture = recorded / "api" / "e3_api1" / "r1"
    seconds = build_report(capture).document()["host"]["drain"]["seconds"]
    doc = predict(capture, "--api-server-count 2")
    said = f"the GPUs were done {seconds:.1f} s"
    lines = [line for line in doc["reasoning"] if line.startswith(said)]
    assert len(lines) == 1 and lines[0].endswith("gives 0.9 s of it")
    for fmt in ("text", "md", "html"):
        assert said in render(doc, fmt)
    rows = [r for r in json.loads((Path(model_predict.__file__).parent / "validation.json").read_text())["rows"]
            if r["metric"] == "request_throughput" and r["pair"] in {f"Q{i}" for i in range(32, 39)}]
    assert {r["provenance"] for r in rows if r["pair"] in ("Q32", "Q33")} == {"in-sample"}
    held = [r for r in rows if r["pair"] not in ("Q32", "Q33")]
    errors = sorted(r["predicted"] / r["measured"] - 1 for r in held)
    assert len(held) == 15 and all(r["provenance"] == "held-out" and r["recorded_after_model"] for r in held)
    assert round(errors[0], 3) == -0.124 and round(errors[-1], 3) == 0.081 and all(r["inside_held_out"] for r in held)
    for quiet in ("d1_14b", "t1_api1"):
        reasoning = predict(recorded / "api" / quiet / "r1", "--api-server-count 2")["reasoning"]
        assert not any("the GPUs were done" in line for line in reasoning)


def test_one_api_server_behind_two_engines_was_predicted_first(recorded: Path) -> None:
    """Lease 24 (an eighth box): the API servers' queue of 7a23ad0, pre-registered. Before the lease that model said,
    from lease 21's DP=2 8B at 1,024/128 (two API servers, another box), that one API server would serve 44.3, 46.9
    and 48.0 req/s (lease24-predicted; the model before it: no change, 53.3-56.8). Measured: 50.06, 50.31, 51.47
    (50.61): -12.4 %, -7.3 %, -5.1 %, inside every range. On the same box two API servers served 56.03, one 0.90 of
    it, as on the 14B (49.80 against 55.39, the lease's second half)."""
    api = recorded / "api"
    assert (recorded / "lease24-predicted" / "made-by.txt").read_text().startswith("predict_lease24.py with profkit "
                                                                                  "at 7a23ad0")
    one = _mean_rate(api / "g_8b_api1")
    assert one == pytest.approx(50.61, abs=0.01)
    errors = []
    for run in ("r1", "r2", "r3"):
        made_first = json.loads((recorded / "lease24-predicted" / f"d2_8b_{run}-api1.json").read_text())
        assert made_first["changes"] == {"api_server_count": 1}
        said = made_first["metrics"]["request_throughput"]
        assert said["before"] == _rates(api / "d2_8b")[int(run[1]) - 1]
        assert said["low"] <= one <= said["high"]
        errors.append(round(said["predicted"] / one - 1, 3))
    assert errors == [-0.124, -0.073, -0.051]
    for shape, two_servers in (("8b", 56.03), ("14b", 55.39)):
        two = _mean_rate(api / f"{'g' if shape == '8b' else 'h'}_{shape}_api2")
        assert two == pytest.approx(two_servers, abs=0.01)
        assert _mean_rate(api / f"{'g' if shape == '8b' else 'h'}_{shape}_api1") / two == pytest.approx(0.90, abs=0.01)
