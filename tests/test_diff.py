"""`profkit diff` on real H100 traces and real vLLM evidence: outcome, noise, findings, flags, GPU, gate.

The expected values are each side's own report (the diff must quote them exactly) and the stories the
fixtures were recorded to tell (graphs_b1 replays the decode step that eager_b1 launches kernel by kernel).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from profkit.compare import gate
from profkit.compare.diff import Side, diff, diff_reports
from profkit.errors import ProfkitError
from profkit.evidence.record import Evidence
from profkit.render.diff import verdict_sentence
from profkit.render.json import render_json
from profkit.report import build_report
from tests.cli import one_error_line, profkit
from tests.conftest import FIXTURES

REAL_SERVE = Path(__file__).parent / "data" / "vllm_serve_kv300mb"
TORCH = FIXTURES / "h100_toy"


@pytest.fixture(scope="module")
def saved(sqlite_path, tmp_path_factory):
    """Report JSON files of real traces (window auto, as `profkit report` writes them)."""
    folder = tmp_path_factory.mktemp("reports")
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            path = folder / f"{name}.json"
            path.write_text(render_json(build_report(sqlite_path(name)).document()))
            cache[name] = path
        return cache[name]

    return get


def metric(doc: dict, name: str) -> dict:
    return next(r for r in doc["metrics"] if r["name"] == name)


def test_eager_to_graphs_tells_the_launch_story(saved) -> None:
    doc = diff(str(saved("eager_b1")), str(saved("graphs_b1")))
    before = json.loads(saved("eager_b1").read_text())["facts"]
    after = json.loads(saved("graphs_b1").read_text())["facts"]
    assert doc["schema"] == "profkit.diff/2"
    share = metric(doc, "kernels.graph_share")
    assert (share["before"], share["after"]) == (before["kernels.graph_share"], after["kernels.graph_share"])
    assert share["before"] == 0.0 and share["after"] > 0.97  # ~0 -> ~98 % replayed from the graph
    idle = metric(doc, "gaps.sub_ms_idle_share")
    assert idle["before"] == before["gaps.sub_ms_idle_share"] and idle["after"] < idle["before"] / 4
    assert idle["verdict"] == "better"
    assert doc["findings"]["resolved"] == ["launch-overhead"]
    assert "launch-overhead" not in doc["findings"]["new"]
    util = metric(doc, "gpu.utilization")
    assert util["change_pct"] == pytest.approx((util["after"] - util["before"]) / util["before"] * 100)
    # One run per side: the threshold is assumed and said so.
    assert doc["noise"]["measured_pct"] is None and util["noise"] == "assumed" and util["threshold_pct"] == 5.0
    verdict = verdict_sentence(doc)  # the renderer writes the line from the rows; the document holds none
    assert "verdict" not in doc
    assert verdict.startswith("AFTER: ") and "resolved: launch-overhead" in verdict
    assert "5 % assumed" in verdict
    # Different window lengths: rates and shares are compared, and the windows are stated.
    w = doc["gpu"]["windows"]
    assert (w["before_ns"], w["after_ns"]) == (json.loads(saved("eager_b1").read_text())["window"]["duration_ns"],
                                               json.loads(saved("graphs_b1").read_text())["window"]["duration_ns"])
    assert not w["same_length"] and "shares" in w["compared"]
    # The same 25 kernels run in both: every one matched by name, none new or vanished.
    k = doc["gpu"]["kernels"]
    assert (k["matched"], k["new"], k["vanished"]) == (25, [], [])


def test_sync_to_graphs_resolves_three_findings(saved) -> None:
    doc = diff(str(saved("sync_b16")), str(saved("graphs_b64")))
    assert doc["findings"]["resolved"] == ["launch-overhead", "low-gpu-utilization", "sync-stall"]
    assert metric(doc, "gpu.utilization")["verdict"] == "better"


def test_trace_sides_equal_report_json_sides(saved, sqlite_path) -> None:
    """A diff of two saved reports costs no trace reading and says the same as the traces."""
    from_json = diff(str(saved("hostgap_b16")), str(saved("graphs_b64")))
    from_traces = diff(str(sqlite_path("hostgap_b16")), str(sqlite_path("graphs_b64")))
    assert from_json["metrics"] == from_traces["metrics"]
    assert from_json["findings"] == from_traces["findings"]
    assert from_json["gpu"] == from_traces["gpu"]
    assert from_json["findings"]["resolved"] == ["host-gaps", "low-gpu-utilization"]


def test_torch_pair() -> None:
    # A torch report first, in this process: its decode pool starts a forkserver. The diff's workers must
    # not inherit that handle (forked workers failed on it with ECHILD, "No child processes").
    from profkit.report import build_report

    build_report(TORCH / "torch_eager_b1.json.gz").document()
    doc = diff(str(TORCH / "torch_eager_b1.json.gz"), str(TORCH / "torch_graphs_b16.json.gz"))
    assert doc["before"]["kind"] == doc["after"]["kind"] == "torch-trace"
    assert "launch-overhead" in doc["findings"]["resolved"]
    assert metric(doc, "kernels.graph_share")["after"] > 0.9


def _evidence_folder(tmp: Path, name: str) -> Path:
    folder = tmp / name
    folder.mkdir()
    for f in ("bench.json", "server.log", "metrics-before.txt", "metrics-after.txt"):
        shutil.copyfile(REAL_SERVE / f, folder / f)
    return folder


def test_evidence_only_sides(tmp_path: Path) -> None:
    """Folders without a trace (unprofiled runs) compare on vLLM's outcome; the GPU section is absent."""
    a, b = _evidence_folder(tmp_path, "a"), _evidence_folder(tmp_path, "b")
    doc = diff(str(a), str(b))
    assert doc["gpu"] is None and doc["before"]["window"] is None
    rt = metric(doc, "request_throughput")
    assert rt["before"] == rt["after"] == pytest.approx(11.066771364919576)  # the bench JSON's own figure
    assert rt["verdict"] == "same"
    assert metric(doc, "vllm.preemptions")["before"] == 29
    assert doc["findings"]["persisting"] == ["kv-cache-pressure", "kv-preemption", "prefill-dominated"]
    assert doc["flags"] == []


def test_replicates_measure_the_noise(tmp_path: Path) -> None:
    """Two runs of one configuration per side: their spread is the threshold (here real figures of the
    recorded serve run, and the same run with its throughput moved within and beyond that spread)."""
    base = build_report(None, Evidence.read(bench=REAL_SERVE / "bench.json", log=REAL_SERVE / "server.log")).document()
    rt = base["vllm"]["bench"]["requests_per_second"]

    def with_rt(value: float) -> dict:
        doc = json.loads(json.dumps(base))
        doc["vllm"]["bench"]["requests_per_second"] = value
        return doc

    before = Side("before", [with_rt(rt), with_rt(rt * 1.10)])  # a 10 % spread between replicates
    inside = diff_reports(before, Side("after", [with_rt(rt * 1.12), with_rt(rt * 1.14)]))
    row = metric(inside, "request_throughput")
    assert row["noise"] == "measured" and row["threshold_pct"] == pytest.approx(100 * 0.1 / 1.05)
    assert row["verdict"] == "within noise" and "within noise: request_throughput" in verdict_sentence(inside)
    beyond = diff_reports(before, Side("after", [with_rt(rt * 1.5), with_rt(rt * 1.52)]))
    assert metric(beyond, "request_throughput")["verdict"] == "better"
    assert beyond["noise"]["replicates"] == [2, 2] and beyond["noise"]["measured_pct"] is not None


def test_comparability_says_what_differs(saved, tmp_path: Path) -> None:
    other = json.loads(saved("graphs_b1").read_text())
    other["source"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    path = tmp_path / "a100.json"
    path.write_text(json.dumps(other))
    doc = diff(str(saved("eager_b1")), str(path))
    assert not doc["comparability"]["comparable"]
    assert "gpu: NVIDIA H100 80GB HBM3 vs NVIDIA A100-SXM4-80GB" in doc["comparability"]["differs"]
    assert "NOT COMPARABLE" in verdict_sentence(doc)


def test_gate_conditions(saved) -> None:
    doc = diff(str(saved("eager_b1")), str(saved("graphs_b1")))
    util = metric(doc, "gpu.utilization")
    assert gate.check(doc, [gate.parse_condition("gpu.utilization<-5%")]) == []  # it went up
    failed = gate.check(doc, [gate.parse_condition("gpu.utilization>+100%")])
    assert len(failed) == 1 and failed[0].startswith("gpu.utilization>+100%: gpu.utilization")
    # signed number: absolute change; unsigned: the after value
    assert gate.check(doc, [gate.parse_condition(f"gpu.utilization>+{util['change'] - 0.01:.4f}")])
    assert not gate.check(doc, [gate.parse_condition(f"gpu.utilization>+{util['change'] + 0.01:.4f}")])
    assert gate.check(doc, [gate.parse_condition("gpu.utilization>0.5")])
    assert not gate.check(doc, [gate.parse_condition("gpu.utilization>0.9")])
    with pytest.raises(ProfkitError, match="no metric 'request_throughput'"):
        gate.check(doc, [gate.parse_condition("request_throughput<-5%")])
    for bad in ("request_throughput", "x<", "__import__('os')<1", "a<1;b", "p99_ttft_ms>>1", "a<1e999"):
        with pytest.raises(ProfkitError, match="--fail-on"):
            gate.parse_condition(bad)


def test_cli_gate_exit_codes_and_formats(saved, tmp_path: Path) -> None:
    b, a = str(saved("eager_b1")), str(saved("graphs_b1"))
    ok = profkit("diff", b, a, "--fail-on", "gpu.utilization<-5%")
    assert ok.returncode == 0, ok.stderr
    bad = profkit("diff", b, a, "--fail-on", "gpu.utilization>+10%", "--fail-on", "gpu.idle_share<-50%")
    assert bad.returncode == 3
    lines = [line for line in bad.stderr.splitlines() if line.startswith("profkit: gate failed:")]
    assert len(lines) == 2
    syntax = profkit("diff", b, a, "--fail-on", "open('x')<1")
    assert syntax.returncode == 1 and len(syntax.stderr.strip().splitlines()) == 1
    for fmt in ("json", "md", "html", "text"):
        out = tmp_path / f"d.{fmt}"
        r = profkit("diff", b, a, "--format", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
        text = out.read_text()
        assert "launch-overhead" in text
    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["schema"] == "profkit.diff/2" and doc["gate"] == {"conditions": [], "failed": []}
    assert "<script" not in (tmp_path / "d.html").read_text().lower()
    assert "| kernels.graph\\_share | 0.0% | 98.3% | +98.3 pts |" in (tmp_path / "d.md").read_text()  # a share: points


def test_bad_sides(saved, tmp_path: Path, sqlite_path) -> None:
    missing = profkit("diff", str(tmp_path / "nope.sqlite"), str(saved("graphs_b1")))
    assert missing.returncode == 1 and "nope.sqlite: no such file" in missing.stderr
    # a profkit document of another schema (a diff) is not a side
    d = tmp_path / "d.json"
    assert profkit("diff", str(saved("eager_b1")), str(saved("graphs_b1")), "--format", "json", "-o",
                   str(d)).returncode == 0
    other = profkit("diff", str(d), str(saved("graphs_b1")))
    assert other.returncode == 1 and "a profkit.diff/2 document" in other.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = profkit("diff", str(empty), str(saved("graphs_b1")))
    assert r.returncode == 1 and "neither a capture folder nor a folder of capture folders" in r.stderr
    # the output never lands on an input
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    before = trace.read_bytes()
    r = profkit("diff", str(saved("eager_b1")), str(trace), "-o", str(trace))
    assert r.returncode == 1 and "is one of the inputs" in r.stderr and trace.read_bytes() == before
    sqlite3.connect(f"file:{trace}?mode=ro", uri=True).close()


def test_history_round_trip_through_the_cli(sqlite_path, tmp_path: Path) -> None:
    """report --save stores runs; history lists them; diff compares stored runs without their traces."""
    db = tmp_path / "runs.db"
    for name, label in (("eager_b1", "eager"), ("graphs_b1", "graphs")):
        r = profkit("report", str(sqlite_path(name)), "--format", "json", "--save", str(db), "--label", label)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["schema"] == "profkit.report/1"
    listed = profkit("history", str(db), "--format", "json")
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)["runs"]
    assert [(x["id"], x["label"]) for x in runs] == [(1, "eager"), (2, "graphs")]
    stored = profkit("diff", f"{db}:last-1", f"{db}:last", "--format", "json")
    assert stored.returncode == 0, stored.stderr
    direct = diff(str(sqlite_path("eager_b1")), str(sqlite_path("graphs_b1")))
    doc = json.loads(stored.stdout)
    assert doc["metrics"] == json.loads(json.dumps(direct["metrics"]))
    assert doc["findings"]["resolved"] == ["launch-overhead"]
    by_label = profkit("diff", f"{db}:label=eager", f"{db}:2", "--format", "json")
    assert json.loads(by_label.stdout)["findings"]["resolved"] == ["launch-overhead"]
    # the history is never written over an input trace
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    before = trace.read_bytes()
    r = profkit("report", str(trace), "--save", str(trace))
    assert r.returncode == 1 and trace.read_bytes() == before
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def real_pair(tmp_path_factory) -> Path:
    """A real vLLM 0.26 serve pair on the H100 (vllm bench serve, 800 prompts random 1024/256, rate inf,
    seed 0; unprofiled captures): before = `--kv-cache-memory-bytes 300000000 --max-model-len 2048`, three
    runs; after = what profkit suggested for the first of them (the cap dropped), one run."""
    import tarfile

    folder = tmp_path_factory.mktemp("pair")
    with tarfile.open(Path(__file__).parent / "data" / "vllm_serve_pair.tar.xz") as tar:
        tar.extractall(folder, filter="data")
    return folder


def _bench(folder: Path) -> float:
    return json.loads((folder / "bench.json").read_text())["request_throughput"]


def test_real_serve_pair_before_and_after_the_suggestion(real_pair: Path, tmp_path: Path) -> None:
    before_runs = sorted((real_pair / "before").iterdir())
    # the AFTER side is exactly the command profkit suggested for the first BEFORE run
    suggested = build_report(before_runs[0]).document()["command"]["suggested_argv"]
    after_manifest = json.loads((real_pair / "after" / "r1" / "manifest.json").read_text())
    assert suggested == after_manifest["user_commands"]
    doc = diff(str(real_pair / "before"), str(real_pair / "after"))
    rt = metric(doc, "request_throughput")
    values = [_bench(r) for r in before_runs]
    assert rt["before_runs"] == values and rt["after_runs"] == [_bench(real_pair / "after" / "r1")]
    assert rt["before"] == pytest.approx(sum(values) / 3) and rt["after"] > 4 * rt["before"]
    assert rt["noise"] == "measured"
    assert rt["threshold_pct"] == pytest.approx(100 * (max(values) - min(values)) / (sum(values) / 3))
    assert rt["verdict"] == "better" and metric(doc, "mean_ttft_ms")["verdict"] == "better"
    assert metric(doc, "mean_tpot_ms")["verdict"] == "worse"  # 647 streams at once instead of ~7: said, not hidden
    assert metric(doc, "vllm.preemptions")["after"] == 0 and metric(doc, "vllm.preemptions")["before"] > 100
    assert doc["findings"]["resolved"] == ["kv-cache-pressure", "kv-preemption"] and doc["findings"]["new"] == []
    assert doc["flags"] == [{"flag": "--kv-cache-memory-bytes", "before": 300000000, "after": None}]
    comp = doc["comparability"]
    assert comp["comparable"] and comp["unknown"] == []
    assert comp["before"]["workload"]["--num-prompts"] == "800" and comp["before"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert doc["noise"]["measured_metric"] == "request_throughput" and doc["noise"]["replicates"] == [3, 1]
    assert f"noise: {rt['threshold_pct']:.1f} % on request_throughput measured over 3+1 runs" in verdict_sentence(doc)
    # every format; the page in headless Chromium
    from tests.test_html import assert_not_blank, browse

    for fmt in ("md", "html", "text"):
        out = tmp_path / f"pair.{fmt}"
        r = profkit("diff", str(real_pair / "before"), str(real_pair / "after"), "--format", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
    assert "| `--kv-cache-memory-bytes` | 300000000 | not set |" in (tmp_path / "pair.md").read_text()
    # the finding that persists, with its evidence moving, in every format (Markdown left the evidence out)
    assert "prefill-dominated: vllm.prompt_token_share 80.0% -> 82.9%" in (tmp_path / "pair.text").read_text()
    assert "  - prefill-dominated: vllm.prompt\\_token\\_share 80.0% → 82.9%" in (tmp_path / "pair.md").read_text()
    # a report of the folder of replicates points at them
    one_error_line(profkit("report", real_pair / "before"), "a folder of 3 capture folders (r1, r2, r3): report one "
                                                              "of them")
    # the runs each side read, named
    assert "before: " in (tmp_path / "pair.text").read_text() and " - 3 runs: r1, r2, r3, " in \
        (tmp_path / "pair.text").read_text()
    dom, log, shot = browse(tmp_path / "pair.html", tmp_path)
    assert "kv-preemption" in dom and "Requests preempted for lack of KV cache" in dom
    assert "CONSOLE" not in log
    assert_not_blank(shot)
    # a CI gate on the same pair
    gate_ok = profkit("diff", str(real_pair / "before"), str(real_pair / "after"),
                      "--fail-on", "request_throughput<-5%", "--fail-on", "vllm.preemptions>+0")
    assert gate_ok.returncode == 0, gate_ok.stderr
    regress = profkit("diff", str(real_pair / "after"), str(real_pair / "before"), "--fail-on",
                      "request_throughput<-5%")
    assert regress.returncode == 3 and "request_throughput<-5%" in regress.stderr
