"""Write the JSON Schemas of profkit's documents (`profkit/schemas/*.schema.json`) from real documents.

A schema is the contract a consumer codes against: the keys every document of a kind has (required), the keys
some have (optional), each value's JSON type. It is inferred once from many real documents (the bundled samples,
the H100 fixtures, the recorded tunes) and then checked in: the tests validate fresh documents against the
checked-in file, so a key renamed or removed, or a value whose type changes, fails them. Run this only when a
schema version changes on purpose (a key added is allowed within a version; re-run to record it):

    python scripts/make_schemas.py
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "profkit" / "schemas"
SAMPLES = REPO / "samples"
DATA = REPO / "tests" / "data"
FIXTURES = DATA / "fixtures"

# Objects keyed by data (flag names, metric names, fact names, roles), not by a fixed vocabulary: their values share
# one schema and any key may appear. Paths are dotted, `[]` for a list's items.
MAPS = {
    "report": {"vllm.metrics", "vllm.metrics_delta", "vllm.flags", "vllm.defaults", "vllm.config",
               "vllm.log.non_default_args", "facts", "host.roles", "gap_classes", "environment",
               "prescription.predicted", "efficiency.gpu_metrics", "efficiency.phases", "vllm.bench",
               "ranks[].facts", "prescription.frontier.before.changes", "prescription.frontier.after.changes",
               "prescription.frontier.before.capacity.metrics", "prescription.frontier.after.capacity.metrics",
               "prescription.frontier.before.points[].metrics", "prescription.frontier.after.points[].metrics"},
    "prediction": {"metrics", "predicted", "before", "search[].metrics", "search[].changes", "closest.metrics",
                   "frontier.changes", "frontier.capacity.metrics", "frontier.points[].metrics"},
    "diff": {"before.flags", "after.flags", "noise", "before.config", "after.config"},
    "tune": {"baseline.flags", "best.flags", "settings"},
    "history": set(),
}
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
# A flag's value, before or after a change, or in a map of changes by flag: any JSON value a vLLM flag takes (a
# number, a word, a JSON config).
_FLAG_VALUE = re.compile(r"(?:(?:flags|changes)\[\]\.(?:from|to|before|after|value)|(?:flags|changes)\.\*)$")
DESCRIPTIONS = {
    "report": "profkit report --format json: one run's trace and evidence analysed, its findings and prescription.",
    "diff": "profkit diff --format json: two runs (or two sets of replicates) compared metric by metric.",
    "prediction": "profkit predict --format json: what a set of vLLM flag changes is predicted to do to a run.",
    "tune": "tune.json written by profkit tune: every step tried, measured and kept or undone.",
    "history": "profkit history --format json: the runs saved with --save, newest last.",
}


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"  # a float field may hold a whole number in one document; the contract says number
    return {str: "string", list: "array", dict: "object", type(None): "null"}[type(value)]


def infer(values: list[Any], kind: str, path: str = "") -> dict[str, Any]:
    """The schema every value in `values` (the same place in many documents) satisfies."""
    if _FLAG_VALUE.search(path):
        return {}
    types = sorted({_type(v) for v in values})
    if types == ["null"]:
        return {}  # never seen with a value: no claim on its type
    schema: dict[str, Any] = {"type": types[0] if len(types) == 1 else types}
    objects = [v for v in values if isinstance(v, dict)]
    if objects:
        keys = [k for o in objects for k in o]
        if path in MAPS[kind] or not all(_IDENT.match(k) for k in keys):
            inner = [v for o in objects for v in o.values()]
            schema["additionalProperties"] = infer(inner, kind, path + ".*") if inner else {}
        else:
            order = list(dict.fromkeys(keys))
            schema["properties"] = {k: infer([o[k] for o in objects if k in o], kind, f"{path}.{k}".lstrip("."))
                                    for k in order}
            schema["required"] = [k for k in order if all(k in o for o in objects)]
    lists = [v for v in values if isinstance(v, list)]
    items = [x for v in lists for x in v]
    if items:
        schema["items"] = infer(items, kind, path + "[]")
    return schema


def documents() -> dict[str, list[dict[str, Any]]]:
    from profkit.api import diff, predict, report
    from profkit.compare.history import history_document, list_runs, save_run
    from profkit.model.search import Bound
    from profkit.report.predict import frontier_run, search_run

    fixtures_tmp = tempfile.TemporaryDirectory()
    tmp = Path(fixtures_tmp.name)
    toy = FIXTURES / "h100_toy"
    reports = [report(SAMPLES / "vllm_14b_kv_bound"), report(SAMPLES / "vllm_14b_prescribed"),
               report(SAMPLES / "capture_thr_torch"), report(SAMPLES / "hostgap_b16.sqlite"),
               report(toy / "torch_eager_b1.json.gz"),
               report([DATA / "foreign" / f"hta_sampled_rank-{r}.json.gz" for r in (0, 1)]),
               report(None, bench=FIXTURES / "h100_vllm" / "capture_thr_eager" / "bench.json")]
    with tarfile.open(DATA / "h200_live.tar.xz") as tar:  # live windows (profkit attach), speculative decoding
        tar.extractall(tmp, filter="data")
    reports += [report(tmp / "h200_live" / name) for name in ("live_tight2", "live_spec2", "live_tight_cut")]
    diffs = [diff(SAMPLES / "vllm_14b_kv_bound", SAMPLES / "vllm_14b_prescribed"),
             diff(toy / "torch_eager_b1.json.gz", toy / "torch_graphs_b16.json.gz"),
             diff(SAMPLES / "hostgap_b16.sqlite", SAMPLES / "capture_thr_torch")]
    predictions = [predict(SAMPLES / "vllm_14b_kv_bound", "--kv-cache-dtype fp8"),
                   predict(SAMPLES / "vllm_14b_kv_bound", "--max-num-seqs 64 --gpu-memory-utilization 0.95"),
                   predict(SAMPLES / "vllm_14b_prescribed", "--enforce-eager"),
                   search_run(SAMPLES / "vllm_14b_kv_bound", allow_precision=True,
                              bounds=[Bound("mean_ttft_ms", "<=", 9000)]),
                   search_run(SAMPLES / "vllm_14b_kv_bound", bounds=[Bound("p99_tpot_ms", "<=", 25)]),
                   frontier_run(SAMPLES / "vllm_14b_kv_bound", "--kv-cache-dtype fp8",
                                slos=[("p99_tpot_ms", "<=", 60)])]
    tunes = []
    for archive, member in (("h100_tune_model.tar.xz", "h100_tune_model/tune/tune.json"),
                            ("h100_tune.tar.xz", None)):
        with tarfile.open(DATA / archive) as tar:
            names = [member] if member else [m.name for m in tar.getmembers() if m.name.endswith("/tune.json")]
            for name in names:
                f = tar.extractfile(name)
                assert f is not None
                tunes.append(json.loads(f.read()))
    db = tmp / "runs.db"
    save_run(db, reports[0], label="kv-bound")
    save_run(db, reports[1], label="prescribed")
    save_run(db, reports[2])
    histories = [history_document(list_runs(db)), history_document(list_runs(db, label="kv-bound"))]
    fixtures_tmp.cleanup()
    return {"report": reports, "diff": diffs, "prediction": predictions, "tune": tunes, "history": histories}


def schema_of(kind: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    names = sorted({d["schema"] for d in docs})
    body = infer(docs, kind)
    body["properties"]["schema"] = {"enum": names}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": names[-1], "title": names[-1],
            "description": DESCRIPTIONS[kind], **body}


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for kind, docs in documents().items():
        schema = schema_of(kind, docs)
        path = OUT / f"{kind}.schema.json"
        path.write_text(json.dumps(schema, indent=1) + "\n")
        print(f"{path.relative_to(REPO)}: {schema['$id']} from {len(docs)} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
