"""A session folder (`profkit capture --replicates N`: one server, its runs in r1, r2, ...) given where a run is
expected: the report, predict and sweep --from read the run whose request throughput is the median, and say so.
Recorded: tests/data/h200_model_led.tar.xz's sweep14/capture (a 14B on an H200, three runs: 12.12, 12.18, 12.10
req/s), whose folder holds session.json, the server's log and the warm-up, but no benchmark result of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from profkit.evidence.folder import CaptureFolder
from tests.cli import one_error_line, profkit


@pytest.fixture(scope="module")
def session(h200_model_led: Path) -> Path:
    return h200_model_led / "sweep14" / "capture"


def rates(session: Path) -> dict[str, float]:
    return {r: json.loads((session / r / "bench.json").read_text())["request_throughput"] for r in ("r1", "r2", "r3")}


def test_the_median_run_is_the_one_read(session: Path) -> None:
    measured = rates(session)
    median = sorted(measured, key=measured.get)[1]  # type: ignore[arg-type]
    run, said = CaptureFolder(session).median_run()
    assert run.path.name == median == "r1"
    assert said["run"] == "r1" and [r["request_throughput"] for r in said["runs"]] == list(measured.values())


def test_report_on_a_session_folder_reads_its_median_run_in_every_format(session: Path, tmp_path: Path) -> None:
    text = profkit("report", session)
    assert text.returncode == 0, text.stderr
    assert f"profkit report: {session / 'r1'}" in text.stdout
    assert f"Session {session}: 3 runs against one server (12.12, 12.18, 12.10 req/s); this report is r1's, the " \
           "median" in text.stdout
    assert "req/s 12.12" in text.stdout and "Prescription" in text.stdout  # its benchmark read: the model calibrated
    doc = json.loads(profkit("report", session, "--format", "json").stdout)
    assert doc["source"]["path"] == str(session / "r1")
    assert doc["source"]["session"]["run"] == "r1" and len(doc["source"]["session"]["runs"]) == 3
    assert doc["facts"]["vllm.requests_per_second"] == pytest.approx(rates(session)["r1"])
    md = profkit("report", session, "--format", "md").stdout
    assert "3 runs against one server (12.12, 12.18, 12.10 req/s); this report is r1's, the median." in md
    html = profkit("report", session, "--format", "html").stdout
    assert "3 runs against one server (12.12, 12.18, 12.10 req/s); this report is r1&#39;s, the median" in html


def test_predict_and_sweep_take_a_session_folder_as_the_run(session: Path) -> None:
    on_session = json.loads(profkit("predict", session, "--format", "json", "--", "--max-num-seqs", "128").stdout)
    on_run = json.loads(profkit("predict", session / "r1", "--format", "json", "--", "--max-num-seqs", "128").stdout)
    assert on_session["metrics"] == on_run["metrics"]
    dry = profkit("sweep", "--dry-run", "--from", session, "serve", "--model", "/models/m14")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("rates: ")


def test_a_session_whose_runs_hold_no_result_is_one_line(session: Path, tmp_path: Path) -> None:
    broken = tmp_path / "session"
    shutil.copytree(session, broken)
    for r in ("r1", "r2", "r3"):
        (broken / r / "bench.json").unlink()
    line = one_error_line(profkit("report", broken))
    assert line == f"profkit: error: {broken}: a session folder whose runs (r1, r2, r3) hold no benchmark result"


def test_a_folder_put_beside_the_runs_is_not_a_run_and_a_run_without_a_result_is_said(session: Path,
                                                                                      tmp_path: Path) -> None:
    folder = tmp_path / "session"
    shutil.copytree(session, folder)
    shutil.copytree(session / "r1", folder / "zz-other")  # another capture copied in: not one of the server's runs
    (folder / "r2" / "bench.json").unlink()  # a run cut short
    run, said = CaptureFolder(folder).median_run()
    assert [r["run"] for r in said["runs"]] == ["r1", "r2", "r3"] and said["runs"][1]["request_throughput"] is None
    assert run.path.name == "r3"  # the lower middle of 12.10 and 12.12
    assert "3 runs against one server (12.12, ?, 12.10 req/s); this report is r3's" in profkit("report", folder).stdout
