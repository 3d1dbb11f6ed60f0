"""The shipped JSON Schemas (`profkit/schemas`, printed by `profkit schema KIND`) hold every document profkit
writes: fresh documents of real runs validate, and one with a contract key renamed or retyped does not.

The schemas were inferred once from the bundled samples (scripts/make_schemas.py) and are checked in: these tests
run today's code against yesterday's contract, and they include documents the inference never saw (nsys toy
traces, the graph-mode torch trace, an evidence-only run)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from profkit.api import diff, predict, report, schema
from profkit.cli import cli

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
TOY = REPO / "tests" / "data" / "fixtures" / "h100_toy"


def _check(kind: str, doc: dict) -> None:
    jsonschema.Draft202012Validator(schema(kind)).validate(doc)


@pytest.mark.parametrize("kind", ["report", "diff", "prediction", "tune", "history"])
def test_each_schema_is_a_valid_json_schema_naming_its_version(kind: str) -> None:
    s = schema(kind)
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["$id"].startswith(f"profkit.{kind}/")
    assert "schema" in s["required"]


def test_reports_the_schema_never_saw_validate(sqlite_path) -> None:
    for doc in (report(sqlite_path("eager_b64")), report(sqlite_path("sync_b16")),
                report(TOY / "torch_graphs_b16.json.gz"), report(SAMPLES / "vllm_14b_kv_bound")):
        _check("report", doc)


def test_a_renamed_or_retyped_contract_key_fails_validation() -> None:
    doc = report(SAMPLES / "vllm_14b_kv_bound")
    _check("report", doc)
    renamed = copy.deepcopy(doc)
    renamed["findings"][0]["changes_"] = renamed["findings"][0].pop("changes")
    with pytest.raises(jsonschema.ValidationError, match="'changes' is a required property"):
        _check("report", renamed)
    retyped = copy.deepcopy(doc)
    retyped["prescription"]["changes"][0]["flag"] = 3
    with pytest.raises(jsonschema.ValidationError, match="is not of type 'string'"):
        _check("report", retyped)
    wrong = copy.deepcopy(doc)
    wrong["schema"] = "profkit.report/2"
    with pytest.raises(jsonschema.ValidationError):
        _check("report", wrong)


def test_diff_and_prediction_documents_validate() -> None:
    _check("diff", diff(SAMPLES / "vllm_14b_prescribed", SAMPLES / "vllm_14b_kv_bound"))
    _check("prediction", predict(SAMPLES / "vllm_14b_kv_bound", "--max-num-seqs 512"))


def test_schema_command_prints_the_shipped_schema_and_refuses_an_unknown_kind() -> None:
    runner = CliRunner()
    out = runner.invoke(cli, ["schema", "diff"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == schema("diff")
    assert json.loads(runner.invoke(cli, ["schema"]).output)["$id"] == "profkit.report/1"
    bad = runner.invoke(cli, ["schema", "nope"])
    assert bad.exit_code == 2 and "'nope' is not one of" in bad.output
