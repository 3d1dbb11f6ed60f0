"""The diagnosis stage's inputs: every fact declared once with its doc and unit, every computed fact declared, and
the report built once (typed, frozen) with the facts rules read."""

from __future__ import annotations

import msgspec
import pytest

from profkit.diagnose.facts import FACTS, UNITS, compute_facts
from profkit.report import Report, build_report
from tests.cli import profkit


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
    # computing the facts again from the same sections gives the same facts
    assert compute_facts(None, report.vllm, report.host, None, None).keys() == FACTS.keys()


def test_changes_carry_from_with_its_json_name(sqlite_path) -> None:
    report = build_report(sqlite_path("eager_b1"), vllm_args="--enforce-eager")
    change = next(c for f in report.findings for c in f.changes if c.flag == "--enforce-eager")
    assert (change.from_, change.action) == (True, "remove")
    assert msgspec.to_builtins(change) == {"flag": "--enforce-eager", "from": True, "from_source": "given",
                                           "to": False, "why": change.why, "action": "remove"}
