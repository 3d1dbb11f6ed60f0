"""The diagnosis stage's inputs: every fact declared once with its doc and unit, every computed fact declared, every
declared fact computed for some real run, and the report built once (typed, frozen) with the facts rules read."""

from __future__ import annotations

import tarfile
from pathlib import Path

import msgspec
import pytest

from profkit.capture.attach import AttachOptions, attach
from profkit.diagnose.facts import FACTS, UNITS, compute_facts
from profkit.evidence.record import Evidence
from profkit.render import render
from profkit.report import Report, ReportOptions, build_report
from tests.cli import profkit
from tests.conftest import unpack
from tests.test_attach import StandIn

DATA = Path(__file__).parent / "data"
# Declared facts that none of the runs below gives a value, and why: each is None in every recorded run because
# that is its value there, not because nothing computes it.
NONE_IN_EVERY_RUN = {
    "vllm.spec_acceptance": "the one recorded run that speculates (h200_live's n-gram server) drafted no token: "
                            "an acceptance rate of nothing is none",
}


def test_every_fact_has_a_doc_and_a_known_unit() -> None:
    assert len(FACTS) > 100
    for name, fact in FACTS.items():
        assert fact.name == name and fact.doc and fact.unit in UNITS, name
    assert FACTS["gpu.utilization"].unit == "share" and FACTS["launch.api_ns"].unit == "ns"
    assert FACTS["host.api_server_cpu"].unit == "cores" and FACTS["config.max_num_seqs"].unit == "value"


def test_rules_facts_lists_the_one_table() -> None:
    r = profkit("rules", "facts")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == len(FACTS)
    assert [line.split()[0] for line in lines] == sorted(FACTS)
    row = next(line for line in lines if line.startswith("gpu.utilization "))
    assert row.split()[1] == "share" and FACTS["gpu.utilization"].doc in row


def test_the_report_is_built_once_and_holds_every_declared_fact(sqlite_path) -> None:
    report = build_report(sqlite_path("hostgap_b16"))
    assert isinstance(report, Report)
    with pytest.raises(AttributeError):
        report.findings = []  # frozen: nothing patches a report after it is built
    assert set(report.facts) == set(FACTS)
    doc = report.document()
    assert doc["facts"] == report.facts and doc["findings"][0]["rule"] == report.findings[0].rule
    # the typed sections sit at the document's top, each a key of its own; rendering the report renders that
    assert list(doc)[2:6] == ["source", "window", "gpu", "timeline"] and "sections" not in doc
    assert doc["gpu"]["utilization"] == report.sections.gpu.utilization
    assert render(report, "json") == render(doc, "json")
    # computing the facts again from the same sections gives the same facts
    assert compute_facts(None, report.vllm, report.host, None, None).keys() == FACTS.keys()


def test_changes_carry_from_with_its_json_name(sqlite_path) -> None:
    report = build_report(sqlite_path("eager_b1"), Evidence.read(vllm_args="--enforce-eager"))
    change = next(c for f in report.findings for c in f.changes if c.flag == "--enforce-eager")
    assert (change.from_, change.action) == (True, "remove")
    assert msgspec.to_builtins(change) == {"flag": "--enforce-eager", "from": True, "from_source": "given",
                                           "to": False, "why": change.why, "action": "remove"}


@pytest.fixture(scope="module")
def rich_reports(tmp_path_factory: pytest.TempPathFactory, h100_tune: Path) -> dict[str, Report]:
    """Reports that between them hold every kind of evidence: the profiled FP8 serve run (trace with step
    annotations and GPU metrics, benchmark, log, scrapes, host samples, model config), two rank traces of an NCCL
    job, an offline benchmark's capture (its front end's host samples) and a serve run's evidence with
    --kv-cache-memory-bytes (no trace), and a live window of a server that speculates."""
    folder = tmp_path_factory.mktemp("rich")
    with tarfile.open(DATA / "h100_phases" / "fp8.tar.xz") as tar:
        tar.extractall(folder, filter="data")
    ranks = [DATA / "foreign" / f"hta_sampled_rank-{i}.json.gz" for i in (0, 1)]
    kv = DATA / "vllm_serve_kv300mb"
    live = folder / "live"  # a live window: profkit attach on a stand-in replaying a real server's /metrics
    capture = unpack(tmp_path_factory, "h200_tp2") / "capture"
    scrapes = [(capture / f"metrics-{n}.txt").read_text() for n in ("before", "after", "after")]
    with StandIn(scrapes) as server:
        attach(AttachOptions(url=server.url, out=live, duration_s=2.0, interval_s=1.0))
    return {
        "live": build_report(live),
        "spec": build_report(unpack(tmp_path_factory, "h200_live") / "live_spec2"),
        "fp8": build_report(folder / "fp8", options=ReportOptions(window="all")),
        "ranks": build_report(ranks, options=ReportOptions(window="all", jobs=1)),
        "offline": build_report(h100_tune / "def_thr"),
        "kv_bytes": build_report(None, Evidence.read(bench=kv / "bench.json", log=kv / "server.log",
                                                     metrics=[kv / "metrics-before.txt", kv / "metrics-after.txt"],
                                                     vllm_args=(kv / "vllm_args.txt").read_text().strip())),
    }


def test_every_declared_fact_is_computed_for_some_run(rich_reports: dict[str, Report]) -> None:
    """A fact declared but never computed stays None, and its rules are skipped forever: each declared fact has a
    value in one of these runs, or says above why it has none in any."""
    computed = {name for report in rich_reports.values() for name, value in report.facts.items() if value is not None}
    never = sorted(set(FACTS) - computed - NONE_IN_EVERY_RUN.keys())
    assert never == [], f"declared but computed for none of the runs: {never}"
    assert not computed & NONE_IN_EVERY_RUN.keys(), "computed after all: take it off NONE_IN_EVERY_RUN"
