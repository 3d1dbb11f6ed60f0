"""`profkit tune` end to end with the fake vLLM's deterministic performance model (tests/fakes/vllm,
FAKE_VLLM_PERF): every path of the loop — keep, revert, stop (no candidate, budget, patience), SLO,
a crashed run, Ctrl-C — without a GPU. The real runs on the H100 are in the issue note."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import Result, one_error_line, profkit
from tests.conftest import FIXTURES
from tests.test_capture import wait_for

FAKES = Path(__file__).parent / "fakes"
WORKLOAD = "--dataset-name random --random-input-len 1024 --random-output-len 256 --num-prompts 800 --request-rate inf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def env(sqlite_path, tmp_path: Path) -> dict[str, str]:
    perf = tmp_path / "perf"
    perf.mkdir()
    return {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_VLLM_PERF": str(perf),
            "FAKE_NSYS_SQLITE": str(sqlite_path("eager_b1")), "FAKE_VLLM_SEED": "1",
            "FAKE_METRICS_DIR": str(Path(__file__).parent / "data" / "vllm_serve_kv300mb"),
            "FAKE_TORCH_TRACE": str(FIXTURES / "h100_toy" / "torch_eager_b1.json.gz")}


def tune(env: dict[str, str], out: Path, *args: str, timeout: float = 240) -> tuple[Result, dict]:
    """`profkit tune` in a child process: the fake vllm and nsys are on its PATH."""
    r = profkit("tune", "--out", out, *args, env=env, timeout=timeout)
    doc = json.loads((out / "tune.json").read_text()) if (out / "tune.json").exists() else {}
    return r, doc


def serve(server_args: str) -> list[str]:
    return ["serve", "--model", "/tmp/tiny", "--server-args", server_args, "--bench-args", WORKLOAD]


def decisions(doc: dict) -> list[tuple[str, str]]:
    return [(s["kind"], s["decision"]) for s in doc["steps"]]


def test_hand_sized_kv_cache_is_dropped_and_kept(env, tmp_path: Path) -> None:
    out = tmp_path / "t"
    r, doc = tune(env, out, "--profile", "never", "--port", str(free_port()),
                  *serve("--kv-cache-memory-bytes 300000000 --max-model-len 2048"))
    assert r.returncode == 0, r.stderr
    assert doc["schema"] == "profkit.tune/1" and doc["objective"] == {"name": "request_throughput", "better": "higher"}
    assert decisions(doc)[:2] == [("baseline", "baseline"), ("candidate", "keep")]
    kept = doc["steps"][1]
    assert kept["candidate"]["rule"] == "kv-preemption"
    assert kept["candidate"]["changes"] == [{"flag": "--kv-cache-memory-bytes", "to": None, "action": "remove"}]
    # every replicate is kept, and the noise is what the baseline's runs measured
    base = doc["steps"][0]
    assert len(base["runs"]) == 2 and doc["noise"]["baseline_runs"] == [r["objective"] for r in base["runs"]]
    assert doc["best"]["commands"][0].startswith("vllm serve /tmp/tiny --max-model-len 2048 --port")
    assert "--kv-cache-memory-bytes" not in doc["best"]["commands"][0]
    assert doc["best"]["change_pct"] > 100
    assert doc["diff"]["findings"]["resolved"] == ["kv-cache-pressure", "kv-preemption"]
    assert doc["stopped"].startswith(("no finding proposes an untried change", "the budget of 6 runs is spent",
                                      "2 candidates in a row gained less than the noise"))
    # the folder: every run's capture folder with its report, and the final report in three formats
    for step in doc["steps"]:
        for run in step["runs"]:
            assert (Path(run["folder"]) / "manifest.json").is_file() and (Path(run["folder"]) / "report.json").is_file()
    assert "Winning command line" in (out / "tune.html").read_text()
    assert "<svg" in (out / "tune.html").read_text() and "<script" not in (out / "tune.html").read_text()
    assert "| 1 | candidate |" in (out / "tune.md").read_text()
    assert "winning command line:" in r.stdout


def test_enforce_eager_found_from_the_profiled_baseline(env, tmp_path: Path) -> None:
    """Offline: launch-overhead needs the trace, so the profiled run diagnoses; unprofiled runs measure."""
    r, doc = tune(env, tmp_path / "t", "--profile", "first", "--", "vllm", "bench", "throughput", "--model",
                  "/tmp/tiny", "--num-prompts", "1000", "--enforce-eager")
    assert r.returncode == 0, r.stderr
    assert decisions(doc)[:3] == [("profile", "diagnose"), ("baseline", "baseline"), ("candidate", "keep")]
    assert doc["steps"][0]["runs"][0]["profiled"] and not doc["steps"][1]["runs"][0]["profiled"]
    assert doc["steps"][2]["candidate"]["rule"] == "launch-overhead"
    assert doc["best"]["commands"] == ["vllm bench throughput --model /tmp/tiny --num-prompts 1000"]


def test_batch_cap_goes_back_to_the_default(env, tmp_path: Path) -> None:
    """On an H100 vLLM's default is 1024 and 800 requests were offered: the cap is dropped. Where the GPU
    is not known, the cap goes to what was offered (800)."""
    h100 = {**env, "FAKE_GPU": "NVIDIA H100 80GB HBM3, 580.159.04"}
    r, doc = tune(h100, tmp_path / "t", "--profile", "never", "--port", str(free_port()),
                  *serve("--max-num-seqs 4 --max-model-len 2048"))
    assert r.returncode == 0, r.stderr
    assert doc["steps"][1]["candidate"]["rule"] == "batch-cap" and doc["steps"][1]["decision"] == "keep"
    assert doc["steps"][1]["candidate"]["changes"] == [{"flag": "--max-num-seqs", "to": None, "action": "remove"}]
    assert "--max-num-seqs" not in doc["best"]["commands"][0]
    r, doc = tune(env, tmp_path / "t2", "--profile", "never", "--port", str(free_port()),
                  *serve("--max-num-seqs 4 --max-model-len 2048"))
    assert r.returncode == 0, r.stderr
    assert doc["steps"][1]["candidate"]["changes"] == [{"flag": "--max-num-seqs", "to": 800, "action": "edit"}]
    assert doc["best"]["commands"][0].startswith("vllm serve /tmp/tiny --max-num-seqs 800 --max-model-len 2048")


def test_slo_reverts_and_budget_stops(env, tmp_path: Path) -> None:
    r, doc = tune(env, tmp_path / "t", "--profile", "never", "--budget", "3", "--slo", "p99_ttft_ms<=1",
                  "--port", str(free_port()), *serve("--kv-cache-memory-bytes 300000000 --max-model-len 2048"))
    assert r.returncode == 0, r.stderr
    step = doc["steps"][1]
    assert step["decision"] == "revert" and step["why"] == "SLO not met: p99_ttft_ms<=1"
    assert doc["stopped"] == "the budget of 3 runs is spent" and doc["runs_used"] == 3
    assert doc["best"]["change_pct"] == 0 and doc["best"]["best_step"] == 0  # the baseline stays best


def test_nothing_to_change_stops_at_once(env, tmp_path: Path) -> None:
    r, doc = tune(env, tmp_path / "t", "--profile", "never", "--port", str(free_port()),
                  *serve("--max-model-len 2048"))
    assert r.returncode == 0, r.stderr
    assert decisions(doc) == [("baseline", "baseline")]
    assert doc["stopped"].startswith("no finding proposes an untried change") and doc["runs_used"] == 2


def test_worse_and_crashed_candidates_are_reverted(env, tmp_path: Path) -> None:
    """A 300 MB cache fits 7 sequences of this workload: lifting --max-num-seqs 4 makes it preempt, measured
    worse, reverted. The same candidate on a server that dies (as vLLM does on a flag it rejects): reverted,
    and the loop ends on patience or on having nothing left to try, never on the crash."""
    args = serve("--max-num-seqs 4 --kv-cache-memory-bytes 300000000 --max-model-len 2048")
    r, doc = tune(env, tmp_path / "t", "--profile", "never", "--patience", "1", "--port", str(free_port()), *args)
    assert r.returncode == 0, r.stderr
    worse = doc["steps"][1]
    assert worse["candidate"]["rule"] == "batch-cap" and worse["decision"] == "revert"
    assert worse["why"].endswith("worse") and worse["comparison"]["change_pct"] < 0
    assert "verdict" not in worse["comparison"]  # the verdict line is the renderer's
    assert doc["stopped"] == "1 candidate(s) in a row gained less than the noise"
    assert doc["best"]["best_step"] == 0 and doc["diff"] is None
    crash = {**env, "FAKE_VLLM_CRASH_ON": "!--max-num-seqs", "FAKE_GPU": "NVIDIA H100 80GB HBM3, 580.159.04"}
    r, doc = tune(crash, tmp_path / "t2", "--profile", "never", "--port", str(free_port()), *args)
    assert r.returncode == 0, r.stderr
    crashed = doc["steps"][1]
    assert crashed["decision"] == "revert" and "the run failed" in crashed["why"]
    assert crashed["runs"][0]["status"] == "failed" and "exited with code 1" in crashed["runs"][0]["error"]
    assert doc["stopped"].startswith("no finding proposes an untried change")
    assert doc["best"]["commands"][0].startswith("vllm serve /tmp/tiny --max-num-seqs 4")


def test_ctrl_c_keeps_the_folder_and_the_best_so_far(env, tmp_path: Path) -> None:
    """Ctrl-C (to the whole process group, as a terminal sends it) while a candidate's benchmark surely runs: the
    stand-in says when it has started, then blocks until the signal ends it."""
    out, blocking = tmp_path / "t", tmp_path / "blocking"
    env = {**env, "FAKE_VLLM_BLOCK_IN": r"/03-[^/]*/r1$", "FAKE_VLLM_BLOCKING": str(blocking)}
    proc = subprocess.Popen([sys.executable, "-m", "profkit.cli", "tune", "--out", str(out), "--profile", "never",
                             "--port", str(free_port()), *serve("--kv-cache-memory-bytes 300000000")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(blocking, proc)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    doc = json.loads((out / "tune.json").read_text())
    assert doc["stopped"].startswith("interrupted")
    assert doc["best"]["best_step"] == 0 and doc["best"]["commands"][0].startswith("vllm serve /tmp/tiny")
    assert (out / "tune.html").is_file() and "Traceback" not in err
    session = out / "runs" / "03-kv-preemption"
    assert json.loads((session / "r1" / "manifest.json").read_text())["status"] == "interrupted"
    assert json.loads((session / "session.json").read_text())["status"] == "interrupted"  # the server stopped


def test_dry_run_shows_the_allow_list(env, tmp_path: Path) -> None:
    r = profkit("tune", "--dry-run", "--out", tmp_path / "t", "--", "vllm", "bench", "throughput", "--model", "/m",
                "--enforce-eager")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "  vllm bench throughput --model /m --enforce-eager --output-json" in r.stdout
    allow = next(line for line in lines if line.startswith("flags tune may change"))
    assert "--enforce-eager" in allow and "--max-num-seqs" in allow
    assert "--max-concurrency" not in allow and "--request-rate" not in allow  # client flags change the workload
    # the profiled run the budget counts (--profile first, the default) is listed with its nsys command
    at = lines.index("profiled once for diagnosis (its figures perturbed by the profiler: not the objective's):")
    assert lines[at + 1].startswith("  nsys profile ") and "01-baseline-profiled" in lines[at + 1]
    assert lines.index("baseline:") > at
    assert not (tmp_path / "t").exists()
    one_error_line(profkit("tune", "--slo", "p99_ttft_ms<+5%", "--", "vllm", "bench", "throughput"), "--slo")


def test_an_error_mid_run_stops_the_loop_and_keeps_what_was_measured(env, tmp_path: Path) -> None:
    """A rule file broken while the tune runs (as happened on the GPU box): the loop stops with the error in
    tune.json and on stderr, exit 1, and the runs done so far are kept."""
    from profkit.capture.plan import commands_from_cli
    from profkit.errors import ProfkitError
    from profkit.tune.loop import Run, TuneOptions, Tuner

    calls = []

    def executor(plan, rules_dirs, say):
        calls.append(plan.out)
        if len(calls) == 2:
            raise ProfkitError("rules/x.yaml:1: when: unknown fact 'gpu.busy'")
        plan.out.mkdir(parents=True)
        report = {"vllm": {"bench": {"requests_per_second": 10.0}}, "facts": {}, "findings": []}
        return Run(plan.out, "ok", False, report=report)

    opts = TuneOptions(out=tmp_path / "t", user=commands_from_cli(["serve"], "/tmp/tiny", "", "", 8000, verb="tune"),
                       profile="never")
    doc = Tuner(opts, executor=executor).run()
    assert doc["stopped"] == "error: rules/x.yaml:1: when: unknown fact 'gpu.busy'"
    assert json.loads((tmp_path / "t" / "tune.json").read_text())["stopped"] == doc["stopped"]
    assert doc["runs_used"] == 2 and doc["best"] is None
    step = doc["steps"][0]  # the one baseline run measured before the error
    assert (step["kind"], step["decision"], step["objective"]) == ("baseline", "incomplete", 10.0)


def test_candidate_runs_measure_each_candidate_like_the_baseline(tmp_path: Path) -> None:
    """--candidate-runs 3 with --replicates 3: an A/B with three runs a side inside the budget of six; the
    candidate's objective is the mean of its three runs and is judged against the baseline's spread."""
    from profkit.capture.plan import commands_from_cli
    from profkit.tune.loop import Run, TuneOptions, Tuner

    rps = iter([30.0, 33.0, 31.0, 55.0, 70.0, 60.0])
    labels = []

    def executor(plan, rules_dirs, say):
        labels.append(f"{plan.out.parent.name}/{plan.out.name}")
        plan.out.mkdir(parents=True)
        value = next(rps)
        findings = [] if value > 50 else [{"rule": "frontend-bound", "severity": "critical", "title": "t",
                                           "summary": "s", "changes": [{"flag": "--api-server-count", "to": 3}]}]
        report = {"vllm": {"bench": {"requests_per_second": value}}, "facts": {}, "findings": findings}
        return Run(plan.out, "ok", False, report=report)

    opts = TuneOptions(out=tmp_path / "t", user=commands_from_cli(["serve"], "/tmp/tiny", "--max-model-len 2048", "",
                                                                   8000, verb="tune"),
                       profile="never", budget=6, replicates=3, candidate_runs=3)
    doc = Tuner(opts, executor=executor).run()
    assert labels == ["01-baseline/r1", "01-baseline/r2", "01-baseline/r3", "04-frontend-bound/r1",
                      "04-frontend-bound/r2", "04-frontend-bound/r3"]
    base, cand = doc["steps"]
    assert base["objective"] == pytest.approx(94 / 3) and doc["noise"]["spread_pct"] == pytest.approx(300 / 94 * 3)
    assert cand["decision"] == "keep" and cand["objective"] == pytest.approx(185 / 3)
    assert [r["objective"] for r in cand["runs"]] == [55.0, 70.0, 60.0]
    assert doc["best"]["change_pct"] == pytest.approx((185 - 94) / 94 * 100)
    assert "--api-server-count 3" in doc["best"]["commands"][0]
    assert doc["stopped"] == "the budget of 6 runs is spent" and doc["candidate_runs"] == 3


# --- real runs on the H100 (tests/data/h100_tune.tar.xz): what `profkit tune` wrote there


def _rps(run: Path) -> float:
    return json.loads((run / "bench.json").read_text())["request_throughput"]


@pytest.mark.parametrize("scenario, kept_rule, flag", [("s1", "kv-preemption", "--kv-cache-memory-bytes"),
                                                        ("s3", "batch-cap", "--max-num-seqs")])
def test_real_tune_folders_agree_with_their_runs_and_render(h100_tune: Path, tmp_path: Path, scenario: str,
                                                           kept_rule: str, flag: str) -> None:
    """A planted misconfiguration undone on the H100: each step's objective is its runs' own bench.json,
    the kept change is the one that removes the planted flag, and the winning server command is vLLM's
    defaults (what the defaults capture ran)."""
    from profkit.render import render
    from tests.test_html import assert_not_blank, browse

    folder = h100_tune / scenario
    doc = json.loads((folder / "tune.json").read_text())
    assert doc["schema"] == "profkit.tune/1"
    base, *cands = doc["steps"]
    base_runs = [h100_tune / r["folder"] for r in base["runs"]]
    assert base["objective"] == pytest.approx(sum(map(_rps, base_runs)) / len(base_runs))
    for step in cands:
        assert step["objective"] == pytest.approx(_rps(h100_tune / step["runs"][0]["folder"]))
    kept = [s for s in cands if s["decision"] == "keep"]
    assert [s["candidate"]["rule"] for s in kept] == [kept_rule]
    assert kept[0]["objective"] > 3 * base["objective"]
    server = doc["best"]["argv"][0]
    defaults = json.loads((h100_tune / "def_serve" / "manifest.json").read_text())["user_commands"][0]
    assert server == defaults and flag not in server
    html = tmp_path / "tune.html"
    html.write_text(render(doc, "html"), encoding="utf-8")
    dom, log, shot = browse(html, tmp_path)
    assert f"{kept[0]['objective']:.2f}" in dom and kept_rule in dom and "CONSOLE" not in log
    assert_not_blank(shot)
    md = render(doc, "md")
    assert f"{base['objective']:.2f}" in md or f"{base['objective']:.4g}" in md


def test_real_tune_cut_off_mid_run_still_reports(h100_tune: Path) -> None:
    """s2's machine went back after 30 minutes while its fourth run ran: tune.json as last written (after
    the profiled run and both baselines) still renders, and says the loop did not finish."""
    from profkit.render import render

    doc = json.loads((h100_tune / "s2" / "tune.json").read_text())
    assert doc["stopped"] == "running" and doc["runs_used"] == 3
    runs = [h100_tune / r["folder"] for r in doc["steps"][1]["runs"]]
    rps = [json.loads((r / "bench.json").read_text())["requests_per_second"] for r in runs]
    assert doc["steps"][1]["objective"] == pytest.approx(sum(rps) / 2)
    text = render(doc, "text")
    assert "not finished: tune.json was last written after run 3 of 5" in text
    assert f"{sum(rps) / 2:.4g}" in text and "--enforce-eager" in text


def test_recorded_diff_verdicts_are_written_again_from_their_rows(h100_tune: Path, h100_host: Path) -> None:
    """tune.json files recorded with profkit.diff/1 carry the verdict line as data; the renderer writes the same
    line from the diff's own rows, so they render as they did (profkit.diff/2 no longer carries it)."""
    from profkit.render import render
    from profkit.render.diff import verdict_sentence

    recorded = [json.loads(p.read_text()) for p in [*sorted(h100_tune.rglob("tune.json")),
                                                    *sorted(h100_host.rglob("tune.json"))]]
    with_diff = [d for d in recorded if d["diff"]]
    assert len(with_diff) == 3 and all(d["diff"]["schema"] == "profkit.diff/1" for d in with_diff)
    for doc in with_diff:
        # the words changed since: a flag a side did not set reads "not set", not "(removed)"; a regression "WORSE"
        verdict = doc["diff"]["verdict"].replace("(removed)", "not set").replace("(worse)", "(WORSE)")
        assert verdict_sentence(doc["diff"]) == verdict
        assert "best vs baseline: " + verdict + "\n" in render(doc, "text")
        assert render(doc["diff"], "text").splitlines()[4] == verdict
