"""`profkit diff`: did the change help? Two runs (or two sets of replicates) compared, `profkit.diff/2`.

A side is anything that yields reports: a trace, a capture folder (with or without a trace), a folder
of capture folders (replicates of one configuration), a saved report JSON, or history rows
(`runs.db:ID`, `runs.db:label=L`). The diff reads reports only; traces are reported first (two
trace sides in parallel processes).

Noise: where a side holds several runs, the spread of its replicates ((max - min) / mean, the larger
of the two sides) is the threshold a change must exceed; otherwise `noise` (5 % by default) is
assumed, and the document says which. A change within the threshold is "within noise", never
"better" or "worse".
"""

from __future__ import annotations

import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.compare import metrics as m
from profkit.errors import ProfkitError
from profkit.evidence.folder import CaptureFolder
from profkit.inputs import read_json, require_file
from profkit.kernel_names import distinct_labels
from profkit.resources import process_context
from profkit.vllm.command import VllmCommand
from profkit.vllm.options import normalize_flag

SCHEMA = "profkit.diff/2"
REPORT_SCHEMA = "profkit.report/1"
DEFAULT_NOISE = 0.05
# The bench arguments that define a workload: two runs with different values measure different things.
WORKLOAD_FLAGS = ("--dataset-name", "--random-input-len", "--random-output-len", "--num-prompts", "--input-len",
                  "--output-len", "--batch-size", "--request-rate", "--max-concurrency", "--random-range-ratio",
                  "--dataset-path", "--seed", "--n")


@dataclass
class Side:
    """One side of a diff: its reports (one per replicate) and how it was named."""

    spec: str
    reports: list[dict[str, Any]]
    sources: list[str] = field(default_factory=list)

    @property
    def first(self) -> dict[str, Any]:
        return self.reports[0]


# --- loading sides --------------------------------------------------------------------------------

def _report_json(path: Path) -> dict[str, Any] | None:
    """A saved report document, or None when the file is not JSON (then it may be a torch trace)."""
    require_file(path, "diff side")  # a FIFO or a device would block the read below
    try:
        with path.open("rb") as f:
            head = f.read(4096).lstrip()
    except OSError as exc:
        raise ProfkitError(f"{path}: {exc.strerror}") from None
    if not head.startswith(b"{") or b'"schema"' not in head:
        return None
    doc = read_json(path, "report JSON", bad="not valid JSON")
    if not isinstance(doc, dict):
        return None
    schema = doc.get("schema")
    if schema == REPORT_SCHEMA:
        return doc
    if isinstance(schema, str) and schema.startswith("profkit."):
        raise ProfkitError(f"{path}: a {schema} document; diff takes reports ({REPORT_SCHEMA}), traces or folders")
    return None


def plan_side(spec: str) -> tuple[list[dict[str, Any]], list[Path]]:
    """Resolve a side's spec into reports already at hand and paths that still need `build_report`."""
    path = Path(spec)
    if ":" in spec and not path.exists():  # `runs.db:ID`, `runs.db:last`, `runs.db:label=L`
        from profkit.compare.history import load_runs, parse_db_spec

        db = parse_db_spec(spec)
        if db:
            return [r for _, r in load_runs(*db)], []
    if not path.exists():
        raise ProfkitError(f"{spec}: no such file, folder or history run")
    if path.is_dir():
        if CaptureFolder.recognise(path):
            return [], [path]
        runs = sorted(p for p in path.iterdir() if CaptureFolder.recognise(p))
        if not runs:
            raise ProfkitError(f"{path}: neither a capture folder nor a folder of capture folders")
        return [], runs
    doc = _report_json(path)
    return ([doc], []) if doc else ([], [path])


def _build(path: Path) -> dict[str, Any]:
    from profkit.report import build_report

    return build_report(path).document()


def load_sides(before: str, after: str, parallel: bool = True) -> tuple[Side, Side]:
    """Both sides' reports; traces and folders are reported in worker processes, two at a time."""
    plans = [plan_side(before), plan_side(after)]
    todo = [p for _, paths in plans for p in paths]
    built: dict[Path, dict[str, Any]] = {}
    if len(todo) > 1 and parallel and (os.cpu_count() or 1) > 1:
        with ProcessPoolExecutor(max_workers=min(2, len(todo)), mp_context=process_context()) as pool:
            built = dict(zip(todo, pool.map(_build, todo), strict=True))
    else:
        built = {p: _build(p) for p in todo}
    sides = []
    for spec, (docs, paths) in zip((before, after), plans, strict=True):
        reports = docs + [built[p] for p in paths]
        sources = [str(d.get("source", {}).get("path")) for d in docs] + [str(p) for p in paths]
        sides.append(Side(spec, reports, sources))
    return sides[0], sides[1]


# --- comparing ----------------------------------------------------------------------------------

def _mean(values: list[float]) -> float:
    return statistics.fmean(values)


def spread(values: list[float]) -> float | None:
    """Relative spread of replicates, (max - min) / |mean|; None for a single run."""
    if len(values) < 2:
        return None
    mean = _mean(values)
    return (max(values) - min(values)) / abs(mean) if mean else None


def _verdict(name: str, before: float, after: float, change_pct: float | None, threshold: float) -> str:
    if before == after:
        return "same"
    if m.is_share(name) and abs(after - before) < m.SHARE_FLOOR:
        return "within noise"
    if change_pct is None:  # from zero: any change is real for counts such as preemptions
        better = m.direction(name)
        if better is None:
            return "changed"
        return "better" if (after > before) == (better == "higher") else "worse"
    if abs(change_pct) / 100 <= threshold:
        return "within noise"
    better = m.direction(name)
    if better is None:
        return "changed"
    return "better" if (after > before) == (better == "higher") else "worse"


def compare_metrics(before: Side, after: Side, noise: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per metric both sides have: means, change, change %, replicate spread, verdict."""
    b_runs = [m.run_metrics(r) for r in before.reports]
    a_runs = [m.run_metrics(r) for r in after.reports]
    names = [n for n in (*m.OUTCOME, *m.HEADLINE_FACTS)
             if all(n in r for r in b_runs) and all(n in r for r in a_runs)]
    rows = []
    measured: dict[str, float] = {}
    for name in names:
        bv, av = [r[name] for r in b_runs], [r[name] for r in a_runs]
        spreads = [s for s in (spread(bv), spread(av)) if s is not None]
        threshold = max(spreads) if spreads else noise
        if spreads and name in m.OUTCOME:
            measured[name] = threshold
        b, a = _mean(bv), _mean(av)
        pct = (a - b) / abs(b) * 100 if b else None
        rows.append({"name": name, "before": b, "after": a, "change": a - b, "change_pct": pct,
                     "threshold_pct": threshold * 100, "noise": "measured" if spreads else "assumed",
                     "replicates": [len(bv), len(av)], "before_runs": bv, "after_runs": av,
                     "verdict": _verdict(name, b, a, pct, threshold)})
    # The headline noise is the first outcome metric's (request throughput where the bench has it); each
    # row keeps its own threshold (tail latencies are far noisier than throughput).
    headline = next(iter(measured), None)
    noise_doc = {"assumed_pct": noise * 100, "replicates": [len(before.reports), len(after.reports)],
                 "measured_pct": measured[headline] * 100 if headline else None, "measured_metric": headline,
                 "how": ("spread of replicates, (max - min) / mean, the larger side; per metric"
                         if measured else f"assumed {noise * 100:g} % (one run per side: give replicates to "
                                          "measure it)")}
    return rows, noise_doc


def compare_flags(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """The flags whose values differ. A side that did not set a flag has the value its report knows for it (vLLM's
    default for the run's version and GPU) and says so in `before_source` / `after_source`, as a finding's change
    says it (`auto (vLLM 0.26 default) -> fp8`)."""
    fb, fa = m.effective_flags(before), m.effective_flags(after)
    rows = []
    for k in sorted(set(fb) | set(fa)):
        if fb.get(k) == fa.get(k):
            continue
        row: dict[str, Any] = {"flag": k, "before": fb.get(k), "after": fa.get(k)}
        for side, report, flags in (("before", before, fb), ("after", after, fa)):
            if k not in flags and (known := m.config_value(report, k)) is not None:
                row[side], row[f"{side}_source"] = known
        rows.append(row)
    return rows


def compare_findings(before: Side, after: Side) -> dict[str, Any]:
    """Rules that fired on every run of a side count for it (replicates must agree)."""
    def fired(side: Side) -> dict[str, dict[str, Any]]:
        sets = [{f["rule"]: f for f in r.get("findings", [])} for r in side.reports]
        common = set.intersection(*(set(s) for s in sets)) if sets else set()
        return {k: sets[0][k] for k in common}

    fb, fa = fired(before), fired(after)
    persisting = []
    for rule in sorted(set(fb) & set(fa)):
        evidence = []
        after_ev = {e["fact"]: e["value"] for e in fa[rule].get("evidence", [])}
        for e in fb[rule].get("evidence", []):
            evidence.append({"fact": e["fact"], "before": e["value"], "after": after_ev.get(e["fact"])})
        persisting.append({"rule": rule, "severity": fa[rule]["severity"], "title": fa[rule]["title"],
                           "evidence": evidence})
    return {
        "resolved": sorted(set(fb) - set(fa)),
        "new": sorted(set(fa) - set(fb)),
        "persisting": [p["rule"] for p in persisting],
        "details": {
            "resolved": [{"rule": r, "severity": fb[r]["severity"], "title": fb[r]["title"],
                          "summary": fb[r]["summary"]} for r in sorted(set(fb) - set(fa))],
            "new": [{"rule": r, "severity": fa[r]["severity"], "title": fa[r]["title"],
                     "summary": fa[r]["summary"]} for r in sorted(set(fa) - set(fb))],
            "persisting": persisting,
        },
    }


def _rate_rows(b_rows: list[dict[str, Any]], a_rows: list[dict[str, Any]], key: str, b_win: int, a_win: int,
               limit: int | None = None) -> dict[str, Any]:
    """Rows matched by `key` (kernel name, category, ...): time as a share of the window and per second."""
    bd, ad = {r[key]: r for r in b_rows}, {r[key]: r for r in a_rows}
    rows = []
    for name in set(bd) | set(ad):
        b, a = bd.get(name), ad.get(name)
        bt, at = (b or {}).get("total_ns", 0), (a or {}).get("total_ns", 0)
        rows.append({
            key: name,
            "status": "new" if b is None else "vanished" if a is None else "both",
            "before_count": (b or {}).get("count", 0), "after_count": (a or {}).get("count", 0),
            "before_total_ns": bt, "after_total_ns": at,
            "before_window_share": bt / b_win if b_win else None,
            "after_window_share": at / a_win if a_win else None,
            "window_share_change": (at / a_win if a_win else 0) - (bt / b_win if b_win else 0),
        })
    rows.sort(key=lambda r: -abs(r["window_share_change"]))
    return {"rows": rows[:limit] if limit else rows,
            "new": sorted(r[key] for r in rows if r["status"] == "new"),
            "vanished": sorted(r[key] for r in rows if r["status"] == "vanished")}


def compare_gpu(before: dict[str, Any], after: dict[str, Any], top: int = 50) -> dict[str, Any] | None:
    """The GPU side (first replicate of each): windows stated; rates and shares compared, not raw totals."""
    if before.get("gpu") is None or after.get("gpu") is None:
        return None
    bw, aw = before["window"]["duration_ns"] or 1, after["window"]["duration_ns"] or 1

    def share(classes: dict[str, Any], win: int) -> dict[str, float]:
        return {k: v["idle_ns"] / win for k, v in classes.items()}

    gb, ga = share(before["gap_classes"], bw), share(after["gap_classes"], aw)
    kern = _rate_rows(before["kernels"], after["kernels"], "name", bw, aw)
    # the two sides' kernels labelled together: a kernel new in one and gone from the other reads differently
    labels = distinct_labels({k["name"]: k.get("short_name") for k in [*before["kernels"], *after["kernels"]]})
    for row in kern["rows"]:
        row["label"] = labels[row["name"]]
    return {
        "windows": {"before_ns": bw, "after_ns": aw, "same_length": abs(bw - aw) <= 0.05 * max(bw, aw),
                    "compared": "rates and shares of each side's window (raw totals depend on its length)"},
        "utilization": {"before": before["gpu"]["utilization"], "after": after["gpu"]["utilization"]},
        "idle_by_gap_class": [{"class": k, "before_share": gb.get(k, 0.0), "after_share": ga.get(k, 0.0)}
                              for k in dict.fromkeys([*gb, *ga])],
        "categories": _rate_rows(before["categories"], after["categories"], "category", bw, aw)["rows"],
        "kernels": {**kern, "rows": kern["rows"][:top], "matched": sum(r["status"] == "both" for r in kern["rows"])},
        "memops": _rate_rows(before["memops"], after["memops"], "operation", bw, aw)["rows"],
        "api": _rate_rows(before["api"], after["api"], "name", bw, aw, limit=top)["rows"],
        "nvtx": _rate_rows(before["nvtx"], after["nvtx"], "range", bw, aw, limit=top)["rows"],
    }


def _commands(report: dict[str, Any]) -> list[VllmCommand]:
    return [c for argv in (report.get("command") or {}).get("original_argv") or []
            if (c := VllmCommand.find_in([str(w) for w in argv])) is not None]


def _workload(report: dict[str, Any]) -> dict[str, str]:
    """The benchmark arguments that define the workload, as written."""
    out: dict[str, str] = {}
    for cmd in _commands(report):
        for arg in cmd.parsed[0]:
            name = normalize_flag(arg.name)
            if name in WORKLOAD_FLAGS:
                out[name] = " ".join(arg.values)
    return out


def _model(report: dict[str, Any]) -> str | None:
    flags = m.effective_flags(report)
    if flags.get("--model"):
        return str(flags["--model"])
    server = next((c for c in _commands(report) if c.role == "server"), None)
    return server.model if server else None


def run_identity(report: dict[str, Any]) -> dict[str, Any]:
    env = report.get("environment") or {}
    src = report.get("source") or {}
    return {"model": _model(report), "workload": _workload(report), "gpu": src.get("gpu") or env.get("gpu"),
            "vllm_version": env.get("vllm")}


def comparability(before: Side, after: Side) -> dict[str, Any]:
    """Same model, workload, GPU and vLLM version? What differs, and how far the verdict can be trusted."""
    ib, ia = run_identity(before.first), run_identity(after.first)
    differs, unknown = [], []
    for key in ("model", "gpu", "vllm_version"):
        if ib[key] is None or ia[key] is None:
            unknown.append(key)
        elif ib[key] != ia[key]:
            differs.append(f"{key}: {ib[key]} vs {ia[key]}")
    wb, wa = ib["workload"], ia["workload"]
    if not wb or not wa:
        unknown.append("workload")
    for k in sorted(set(wb) | set(wa)):
        if wb.get(k) != wa.get(k):
            differs.append(f"workload {k}: {wb.get(k, 'not set')} vs {wa.get(k, 'not set')}")
    cache = {"before": _hit_rates(before), "after": _hit_rates(after)}
    differs += prefix_cache_differs(before, after, cache)
    return {"before": ib, "after": ia, "differs": differs, "unknown": unknown, "comparable": not differs,
            "prefix_cache_hit_rate": cache}


# The prefix cache of a fresh server serves a few % of random prompts (H100 runs in tests/data: 3.1 % and 0.24 %);
# much more means prompts were sent to it before, and runs whose hit rates differ this much measured different things.
PREFIX_REPLAY = 0.10


def _hit_rates(side: Side) -> list[float | None]:
    return [(r.get("facts") or {}).get("vllm.prefix_cache_hit_rate") for r in side.reports]


def prefix_cache_differs(before: Side, after: Side, cache: dict[str, list[float | None]]) -> list[str]:
    """The runs are not comparable when the prefix cache served one of them prompts it had seen (a random workload
    with a high hit rate: the same prompts sent twice) or served the runs very differently."""
    out = []
    for label, side in (("before", before), ("after", after)):
        for r, rate in zip(side.reports, cache[label], strict=True):
            shared = (r.get("facts") or {}).get("workload.shared_prefixes")
            if shared is False and isinstance(rate, (int, float)) and rate > PREFIX_REPLAY:
                out.append(f"{label}: the prefix cache served {100 * rate:.1f} % of prompt tokens on prompts that "
                           "share no prefix (the same prompts sent to one server twice)")
                break
    known = [v for v in (*cache["before"], *cache["after"]) if isinstance(v, (int, float))]
    if known and max(known) - min(known) > PREFIX_REPLAY:
        out.append(f"prefix cache hit rate differs between runs: {100 * min(known):.1f} % to {100 * max(known):.1f} %")
    return out


def _side_doc(side: Side) -> dict[str, Any]:
    r = side.first
    win = r.get("window")
    return {"spec": side.spec, "sources": side.sources, "runs": len(side.reports),
            "kind": (r.get("source") or {}).get("kind"),
            "window": {"duration_ns": win["duration_ns"], "how": win["how"]} if win else None,
            "gpu": (r.get("source") or {}).get("gpu") or (r.get("environment") or {}).get("gpu"),
            "command": (r.get("command") or {}).get("original") or []}


def diff_reports(before: Side, after: Side, noise: float = DEFAULT_NOISE) -> dict[str, Any]:
    """The `profkit.diff/2` document for two sides (its verdict line is the renderer's: profkit.render.diff)."""
    rows, noise_doc = compare_metrics(before, after, noise)
    flags = compare_flags(before.first, after.first)
    findings = compare_findings(before, after)
    comp = comparability(before, after)
    gpu = compare_gpu(before.first, after.first)
    return {
        "schema": SCHEMA,
        "before": _side_doc(before),
        "after": _side_doc(after),
        "metrics": rows,
        "noise": noise_doc,
        "flags": flags,
        "findings": findings,
        "gpu": gpu,
        "kernels": gpu["kernels"] if gpu else None,
        "categories": gpu["categories"] if gpu else None,
        "comparability": comp,
    }


def diff(before: str, after: str, noise: float = DEFAULT_NOISE, parallel: bool = True) -> dict[str, Any]:
    """`profkit diff BEFORE AFTER` as a library call."""
    b, a = load_sides(before, after, parallel=parallel)
    return diff_reports(b, a, noise)
