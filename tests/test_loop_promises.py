"""The loop keeps its promises (issue 27), through the fake vLLM of tests/fakes (its prefix cache serves a seed it
has seen, its counters live as long as its server): runs of one configuration share one server, each with its own
seed; the user's misstep is tried first; runs the prefix cache served are never compared; the gate fails 0 -> N."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profkit.capture.plan import CaptureOptions, commands_from_cli, plan
from profkit.capture.run import ServerSession
from profkit.compare.diff import diff
from profkit.evidence.folder import CaptureFolder
from profkit.report import build_report
from tests.cli import one_error_line, profkit
from tests.test_capture import free_port
from tests.test_tune import env, serve, tune  # noqa: F401 - the fake vLLM's environment (a fixture)

WORKLOAD = "--dataset-name random --random-input-len 1024 --random-output-len 256 --num-prompts 800 --seed 0"


def test_replicates_share_one_server_each_with_its_own_seed(env, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "s"
    r = profkit("capture", "--tool", "none", "--replicates", "3", "--out", out, "serve", "--model", "/tmp/tiny",
                "--port", free_port(), "--server-args", "--max-model-len 2048", "--bench-args", WORKLOAD, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("vllm serve: vllm serve") == 1  # one start-up for three runs
    session = json.loads((out / "session.json").read_text())
    assert session["status"] == "ok" and [x["seed"] for x in session["runs"]] == [0, 1, 2]
    assert (out / "warmup.json").is_file() and "--seed 1000" in (out / "warmup.log").read_text() + r.stderr
    runs = CaptureFolder(out).replicates()
    assert [f.path.name for f in runs] == ["r1", "r2", "r3"] and not CaptureFolder.recognise(out)
    for i, folder in enumerate(runs):
        m = folder.manifest()
        assert m.status == "ok" and m.user_commands[1][-2:] == ["--seed", str(i)]
        rep = build_report(folder.path)
        assert rep.facts["vllm.prefix_cache_hit_rate"] == 0.0 and rep.facts["workload.shared_prefixes"] is False
        assert "prefix-cache-replay" not in {f.rule for f in rep.findings}
        # the run's server log: the start-up lines and the stats line of its own benchmark
        assert rep.vllm.log.kv_cache_tokens is not None and rep.vllm.log.stats_lines == 1
    comparable = diff(str(out), str(out), parallel=False)
    assert comparable["comparability"]["comparable"] and comparable["noise"]["replicates"] == [3, 3]


def test_the_same_prompts_twice_are_flagged_and_not_compared(env, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    """Against one server, a second run with the first one's seed: the fake's prefix cache serves half its
    tokens (and 1.9x the throughput, as on the H100). The report says so; a diff of the two is not comparable."""
    for key, value in env.items():  # the session runs here: the fake vllm on this process's PATH
        monkeypatch.setenv(key, value)
    user = commands_from_cli(["serve"], "/tmp/tiny", "", WORKLOAD, free_port())
    p = plan(CaptureOptions(out=tmp_path / "s", user=user, tool="none"))
    with ServerSession(p, warmup=False) as session:
        session.run("r1")
        session.runs.clear()  # the next run reuses seed 0: what a replicate loop without seeds does
        session.run("r2")
    first, again = build_report(tmp_path / "s" / "r1"), build_report(tmp_path / "s" / "r2")
    assert first.facts["vllm.prefix_cache_hit_rate"] == 0.0
    assert again.facts["vllm.prefix_cache_hit_rate"] == pytest.approx(0.5)
    replay = next(f for f in again.findings if f.rule == "prefix-cache-replay")
    assert "50.0%" in replay.summary and replay.changes == []
    doc = diff(str(tmp_path / "s" / "r1"), str(tmp_path / "s" / "r2"), parallel=False)
    assert not doc["comparability"]["comparable"]
    assert any("prefix cache served 50.0 %" in d for d in doc["comparability"]["differs"])
    assert "NOT COMPARABLE" in profkit("diff", tmp_path / "s" / "r1", tmp_path / "s" / "r2").stdout


def test_tune_shares_servers_and_says_which_runs_did(env, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "t"
    r, doc = tune(env, out, "--profile", "never", "--port", str(free_port()), "--replicates", "3", "--budget", "6",
                  *serve("--kv-cache-memory-bytes 300000000 --max-model-len 2048"))
    assert r.returncode == 0, r.stderr
    assert doc["runs_used"] == 6 and doc["start_ups"] == 2 and r.stderr.count("vllm serve: vllm serve") == 2
    assert [(s["folder"], s["shared"], s["runs"]) for s in doc["servers"]] == [("01-baseline", True, 3),
                                                                             ("04-kv-preemption", True, 3)]
    for step in doc["steps"]:
        assert len({run["server"] for run in step["runs"]}) == 1 and [run["seed"] for run in step["runs"]] == [0, 1, 2]
    cand = doc["steps"][1]["candidate"]
    assert cand["undoes"].startswith("removes --kv-cache-memory-bytes 300000000") and cand["order"].startswith("first")


def test_the_users_misstep_goes_first_whatever_its_severity(tmp_path: Path) -> None:
    """A critical finding with a large gain and an info finding that undoes the user's own flag: tune tries the
    misstep first, and says why."""
    from profkit.tune.loop import Run, TuneOptions, Tuner

    user = commands_from_cli(["serve"], "/tmp/tiny", "--max-cudagraph-capture-size 16", "", 8000, verb="tune")
    tried = []

    def executor(p, rules_dirs, say):
        tried.append(p.user.commands[0].shell())
        p.out.mkdir(parents=True)
        findings = [
            {"rule": "frontend-bound", "severity": "critical", "title": "t", "summary": "s", "gain": 0.6,
             "changes": [{"flag": "--api-server-count", "from": 1, "from_source": "vLLM 0.26 default", "to": 4}]},
            {"rule": "cuda-graph-coverage", "severity": "info", "title": "t", "summary": "s", "gain": 0.1,
             "changes": [{"flag": "--max-cudagraph-capture-size", "from": 16, "from_source": "given", "to": None}]}]
        return Run(p.out, "ok", False, report={"vllm": {"bench": {"requests_per_second": 10.0}}, "facts": {},
                                               "findings": findings})

    doc = Tuner(TuneOptions(out=tmp_path / "t", user=user, profile="never", budget=3, replicates=1),
                executor=executor).run()
    first = doc["steps"][1]["candidate"]
    assert first["rule"] == "cuda-graph-coverage" and "--max-cudagraph-capture-size" not in tried[1]
    assert first["order"].startswith("first: removes --max-cudagraph-capture-size 16, which the run set")
    waiting = first["waiting"][0]
    assert waiting["rule"] == "frontend-bound" and "expected gain up to 60 %" in waiting["order"]
    # measured the same as the user's setting (10 req/s either way): back to vLLM's default is kept
    assert doc["steps"][1]["decision"] == "keep" and doc["steps"][1]["why"].startswith("back to vLLM's default")
    assert doc["steps"][2]["candidate"]["rule"] == "frontend-bound" and doc["steps"][2]["decision"] == "revert"
    assert "--max-cudagraph-capture-size" not in doc["best"]["commands"][0]


def test_findings_of_equal_severity_put_the_misstep_first(sqlite_path) -> None:
    """Two warnings on a real trace: the one that undoes a flag the run set comes first, whatever the gain."""
    from profkit.diagnose.engine import Finding, ProposedChange
    from profkit.diagnose.priority import order_findings

    gain = Finding(rule="a", severity="warning", title="", summary="", evidence=[], gain=0.9,
                   changes=[ProposedChange(flag="--max-num-seqs", from_=None, from_source="vLLM 0.26 default",
                                           to=512, why="")])
    undo = Finding(rule="b", severity="warning", title="", summary="", evidence=[], gain=0.1,
                   changes=[ProposedChange(flag="--max-num-seqs", from_=8, from_source="given", to=None, why="")])
    crit = Finding(rule="c", severity="critical", title="", summary="", evidence=[], changes=[])
    assert [f.rule for f in order_findings([gain, undo, crit], "NVIDIA H100 80GB HBM3")] == ["c", "b", "a"]


@pytest.mark.parametrize(("before", "after", "condition", "fails"), [
    (0, 31, "vllm.preemptions>+0%", True),  # the regression the gate is for
    (0, 31, "vllm.preemptions<-5%", False),  # a rise is no fall
    (0, 0, "vllm.preemptions>+0%", False),
    (10, 31, "vllm.preemptions>+100%", True),
    (31, 0, "vllm.preemptions<-50%", True),
])
def test_the_gate_on_a_before_of_zero(tmp_path: Path, before: int, after: int, condition: str, fails: bool) -> None:
    """Two evidence-only runs (the real serve run's files) whose preemption counters differ as given."""
    src = Path(__file__).parent / "data" / "vllm_serve_kv300mb"
    sides = []
    for name, count in (("before", before), ("after", after)):
        folder = tmp_path / name
        folder.mkdir()
        for f in ("bench.json", "server.log"):
            (folder / f).write_bytes((src / f).read_bytes())
        metric = "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total {}\n"
        (folder / "metrics-before.txt").write_text(metric.format(0))
        (folder / "metrics-after.txt").write_text(metric.format(count))
        sides.append(folder)
    r = profkit("diff", *sides, "--fail-on", condition)
    assert r.returncode == (3 if fails else 0), r.stderr
    if fails:
        assert f"profkit: gate failed: {condition}" in r.stderr


def test_noise_and_history_options_through_the_cli(sqlite_path, tmp_path: Path) -> None:
    a, b = sqlite_path("eager_b1"), sqlite_path("graphs_b1")
    wide = json.loads(profkit("diff", a, b, "--noise", "40%", "--format", "json").stdout)
    assert wide["noise"]["assumed_pct"] == 40.0
    assert json.loads(profkit("diff", a, b, "--noise", "0.05", "--format", "json").stdout)["noise"]["assumed_pct"] == 5
    for bad in ("100%", "-1%", "five", "1.5"):
        one_error_line(profkit("diff", a, b, "--noise", bad), "--noise")
    db = tmp_path / "runs.db"
    for trace, label in ((a, "eager"), (b, "graphs"), (a, "eager")):
        assert profkit("report", trace, "--save", db, "--label", label, "--format", "json").returncode == 0
    rows = json.loads(profkit("history", db, "--label", "eager", "--format", "json").stdout)["runs"]
    assert [r["id"] for r in rows] == [1, 3] and {r["label"] for r in rows} == {"eager"}
    last = json.loads(profkit("history", db, "--last", "2", "--format", "json").stdout)["runs"]
    assert [r["id"] for r in last] == [2, 3]
    one_error_line(profkit("history", db, "--last", "0"), "--last")
