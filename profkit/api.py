"""profkit as a library: the command line's jobs as functions over plain values (paths, flag strings), each
returning the JSON document the command would print (`render` turns it into text, Markdown or HTML).

    from profkit.api import diff, predict, render, report
    doc = report("samples/vllm_14b_kv_bound")
    print(doc["prescription"]["predicted"]["request_throughput"])
    print(render(doc, "md"))
    diff("before/", "after/")["metrics"]
    predict("samples/vllm_14b_kv_bound", "--kv-cache-dtype fp8")["metrics"]

Bad input raises `profkit.ProfkitError` with the one line the command line would print."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

PathLike = str | Path


def report(trace: PathLike | Sequence[PathLike] | None = None, *, bench: PathLike | None = None,
           vllm_log: PathLike | None = None, metrics: Sequence[PathLike] = (), vllm_args: str | None = None,
           host: PathLike | None = None, model_config: PathLike | None = None, window: str = "auto",
           gap_threshold_ns: int = 100_000, rules_dirs: Sequence[PathLike] = ()) -> dict[str, Any]:
    """The `profkit.report/1` document of a trace (nsys SQLite export, torch.profiler JSON), a capture folder,
    several rank traces, or vLLM's evidence alone (`bench`, `vllm_log`, `metrics`, `vllm_args`, ...); what
    `profkit report --format json` prints."""
    from profkit.evidence.record import Evidence
    from profkit.report import ReportOptions, build_report

    if isinstance(trace, (str, Path)) or trace is None:
        traces: Any = Path(trace) if trace is not None else None
    else:
        traces = [Path(t) for t in trace]
        traces = traces[0] if len(traces) == 1 else traces
    evidence = Evidence.read(bench=_path(bench), log=_path(vllm_log), metrics=tuple(Path(m) for m in metrics),
                             vllm_args=vllm_args, model_config=_path(model_config), host=_path(host))
    options = ReportOptions(window=window, gap_threshold_ns=gap_threshold_ns,
                            rules_dirs=tuple(Path(r) for r in rules_dirs))
    return build_report(traces, evidence, options).document()


def diff(before: PathLike, after: PathLike, *, noise: float = 0.05) -> dict[str, Any]:
    """The `profkit.diff/1` document comparing two runs (each a trace, a capture folder, a folder of replicates,
    a saved report JSON or a history run such as `runs.db:last`); `noise` is the threshold assumed where a side
    has a single run."""
    from profkit.compare.diff import diff as diff_runs

    return diff_runs(str(before), str(after), noise=noise)


def predict(run: PathLike, changes: str, *, noise: float | None = None) -> dict[str, Any]:
    """The `profkit.prediction/1` document: what the vLLM flags in `changes` (as a user writes them, e.g.
    "--kv-cache-dtype fp8 --max-num-seqs 512") do to `run` (a capture folder or trace with its benchmark)."""
    from profkit.evidence.record import Evidence
    from profkit.report.predict import predict_run

    return predict_run(str(run), changes, Evidence.read(), noise=noise)


def render(document: dict[str, Any], fmt: str = "text", top: int = 10) -> str:
    """Any profkit document (report, diff, prediction, tune, history) as `text`, `md`, `html` or `json`."""
    from profkit.render import render as render_document

    return render_document(document, fmt, top)


def attach(url: str, out: PathLike, *, duration_s: float = 60.0, interval_s: float = 5.0,
           headers: dict[str, str] | None = None) -> Path:
    """Watch the vLLM server at `url` for `duration_s` through its own endpoints and write a live capture folder at
    `out` (what `profkit attach` does); `report(out)` reads it."""
    from profkit.capture.attach import AttachOptions
    from profkit.capture.attach import attach as watch

    return watch(AttachOptions(url=url, out=Path(out), duration_s=duration_s, interval_s=interval_s,
                               headers=dict(headers or {})))


def schema(kind: str = "report") -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a document kind: `report`, `diff`, `prediction`, `tune` or `history`.
    Keys every document has are `required`; a key is added, never renamed or removed, within one schema version."""
    from profkit.resources import document_schema

    return document_schema(kind)


def _path(p: PathLike | None) -> Path | None:
    return None if p is None else Path(p)
