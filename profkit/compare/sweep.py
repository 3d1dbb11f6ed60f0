"""`profkit sweep`: the measured counterpart of the predicted frontier. `vllm bench serve` at a few request rates
against one server (one start-up; a warm-up; each run its own --seed and 40 s of prompts), each rate's replicates in
OUT/rate-R/r1, r2, ..., and sweep.json: each point's measured throughput and latency percentiles (the mean over its
replicates, and their spread), beside what the model calibrated on a full-load run (`--from RUN`) predicted for it.

The rates come from the user (`--rates`) or from the predicted frontier of `--from RUN`: around its knee and, with
`--slo`, the bounds' edge (where the goodput is decided), not a uniform grid: each point costs a benchmark run."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from profkit.capture.plan import Plan
from profkit.capture.run import CaptureError, ServerSession
from profkit.evidence.bench import is_figure
from profkit.inputs import read_json

SCHEMA = "profkit.sweep/1"
SECONDS = 40.0  # a point's prompts are sent over this long at its rate
MIN_PROMPTS = 60
# what a point holds of a `vllm bench serve` result: every frontier metric a bound may name (vLLM's `median_X` is
# read as `p50_X`; the percentiles other than 99 only where the benchmark ran with --metric-percentiles 50,90,99)
METRICS = ("request_throughput", "output_throughput",
           *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "e2el") for s in ("mean", "p50", "p90", "p99")))
KNEE = (1.0, 0.75, 0.5, 0.9)  # shares of the predicted capacity measured, in the order a limit on the runs keeps them
EDGE = (0.9, 1.1)  # around a bound's edge: shares of the predicted goodput


def measured_goodput(points: Sequence[dict[str, Any]], bound: Any) -> float:
    """The largest request rate whose measured value meets `bound` (a `profkit.model.search.Bound`), linearly between
    the last point that does and the next; `points`: `vllm bench serve` results, ascending by request rate."""
    last = None
    for m in points:
        if not bound.holds(m[bound.metric]):
            if last is None:
                return 0.0
            f = (bound.value - last[bound.metric]) / (m[bound.metric] - last[bound.metric])
            return last["request_rate"] + f * (m["request_rate"] - last["request_rate"])
        last = m
    return last["request_rate"] if last else 0.0


def prompts_for(rate: float) -> int:
    """A point's prompt count: SECONDS of its rate (at least MIN_PROMPTS)."""
    return max(MIN_PROMPTS, int(rate * SECONDS))


def chosen_rates(front: dict[str, Any], limit: int | None = None) -> list[float]:
    """The rates worth measuring on a predicted frontier (`Frontier.document()`): its knee, and around the goodput
    where it has one; rounded to 0.01 req/s, ascending. `limit`: at most so many, those that decide the goodput
    first (the goodput, then its edges), then the knee's (the capacity, then 0.75, 0.5 and 0.9 of it)."""
    capacity = front["capacity"]["metrics"]["request_throughput"]["predicted"]
    good = (front.get("goodput") or {}).get("rate") or 0.0
    ranked = [good * s for s in (1.0, *EDGE)] if good > 0 else []
    ranked += [capacity * s for s in KNEE]
    rates = [r for r in dict.fromkeys(round(x, 2) for x in ranked) if r > 0]
    return sorted(rates[:limit] if limit is not None else rates)


def folder_name(rate: float) -> str:
    return f"rate-{rate:g}"


def run_order(rates: Sequence[float], replicates: int) -> list[tuple[float, int]]:
    """The order of a sweep's runs, (rate, replicate number from 1): every rate once, ascending, then every rate
    again. A sweep cut short (the box taken back, Ctrl-C) still measured each rate, and what drifts over a session
    (the box's clocks, the server's caches) is spread over the rates rather than landing on the last one."""
    return [(rate, k + 1) for k in range(replicates) for rate in rates]


class SweepModel:
    """The model calibrated on a full-load run of the swept configuration (`profkit sweep --from RUN`): each point it
    predicts (`point(rate, prompts)`: `profkit.model.frontier.Point.document()`), its frontier within the bounds (which
    chooses the rates) and its goodput under each bound alone (what a sweep's measurement is held against)."""

    def __init__(self, point: Callable[[float, int], dict[str, Any]], frontier: dict[str, Any], bounds: list[Any],
                 goodputs: dict[str, dict[str, Any] | None], run: str = "", changes: str | None = None) -> None:
        self.point, self.frontier, self.bounds, self.goodputs = point, frontier, bounds, goodputs
        self.run, self.changes = run, changes  # what predicts it: the run, and the swept configuration's changes


def run_sweep(plan: Plan, rates: Sequence[float], replicates: int = 1, say: Callable[[str], None] = lambda _m: None,
              predicted: SweepModel | None = None) -> dict[str, Any]:
    """Each rate's `replicates` runs against one server; sweep.json in the plan's folder, returned. `predicted`: the
    model's points, put beside the measurement, and the goodput under each of its bounds, measured and predicted."""
    started = time.time()
    try:
        with ServerSession(plan, say) as session:
            for rate, k in run_order(rates, replicates):
                say(f"rate {rate:g} req/s, run {k} of {replicates}")
                session.run(f"{folder_name(rate)}/r{k}", rate=rate, prompts=prompts_for(rate))
            startup_s = session.startup_s
    except KeyboardInterrupt:
        raise CaptureError(f"interrupted; partial sweep kept in {plan.out}", interrupted=True) from None
    doc = sweep_document(plan.out, rates, predicted)
    doc.update(seconds=round(time.time() - started, 1), startup_s=startup_s)
    (plan.out / "sweep.json").write_text(json.dumps(doc, indent=2))
    return doc


def sweep_document(out: Path, rates: Sequence[float], predicted: SweepModel | None = None) -> dict[str, Any]:
    """The measured points of a sweep folder, each beside its prediction where one is given; the goodput under each
    bound, measured (between the measured points) and predicted; the benchmarks' own seconds (the GPU time the
    answer cost, beside the server's start-up)."""
    points = []
    benchmark_s = 0.0
    for rate in rates:
        numbered = {int(p.parent.name[1:]): r for p in (out / folder_name(rate)).glob("r*/bench.json")
                    if p.parent.name[1:].isdigit() and isinstance(r := read_json(p, "benchmark result"), dict)}
        runs = [_figures(numbered[k]) for k in sorted(numbered)]
        benchmark_s += sum(r.get("duration", 0.0) for r in runs)
        measured = {k: statistics.mean(r[k] for r in runs) for k in METRICS if runs and all(k in r for r in runs)}
        spread = {k: (max(r[k] for r in runs) - min(r[k] for r in runs)) / measured[k]
                  for k in measured if len(runs) > 1 and measured[k]}
        point: dict[str, Any] = {"rate": rate, "prompts": prompts_for(rate), "replicates": len(runs),
                                 "measured": measured, "spread": spread}
        if len(runs) > 1:  # each replicate's own by its number (a bound's goodput per replicate pairs them)
            point["runs"] = {str(k): {m: r[m] for m in measured} for k, r in zip(sorted(numbered), runs, strict=True)}
        if predicted is not None:
            p = predicted.point(rate, prompts_for(rate))
            point["predicted"] = {k: v for k, v in p["metrics"].items() if k in METRICS}
            point["error"] = {k: point["predicted"][k]["predicted"] / measured[k] - 1
                              for k in point["predicted"] if measured.get(k)}
            point["inside_range"] = {k: point["predicted"][k]["low"] <= measured[k] <= point["predicted"][k]["high"]
                                     for k in point["predicted"] if k in measured}
        points.append(point)
    errors = [abs(e) for p in points for e in (p.get("error") or {}).values() if not math.isnan(e)]
    return {"schema": SCHEMA, "folder": str(out), "points": points,
            "predicted_from": {"run": predicted.run, "changes": predicted.changes} if predicted else None,
            "median_abs_error": statistics.median(errors) if errors else None,
            "goodput": [_goodput(points, b, predicted) for b in predicted.bounds] if predicted else [],
            "benchmark_s": round(benchmark_s, 1)}


def _figures(result: dict[str, Any]) -> dict[str, float]:
    """A benchmark result's finite numbers (vLLM writes NaN where no request finished), `median_X` as `p50_X`."""
    out = {k: float(v) for k, v in result.items() if is_figure(v)}
    for k, v in list(out.items()):
        if k.startswith("median_"):
            out.setdefault("p50_" + k.removeprefix("median_"), v)
    return out


def measured_rates(out: Path) -> list[float]:
    """The rates a sweep folder holds: its folders named as `profkit sweep` names them (`rate-R`, R a positive
    rate) with a benchmark result, ascending."""
    rates = []
    for d in out.glob("rate-*"):
        try:
            rate = float(d.name.removeprefix("rate-"))
        except ValueError:
            continue
        if math.isfinite(rate) and rate > 0 and folder_name(rate) == d.name and any(d.glob("r*/bench.json")):
            rates.append(rate)
    return sorted(rates)


def recorded_changes(out: Path, run: str | None, changes: str | None) -> str | None:
    """The changes `--show` predicts a sweep folder with: those given, else those its sweep was predicted with
    (sweep.json's `predicted_from`: the swept server was the run's configuration with them); given ones that differ
    from the recorded are one line."""
    from profkit.errors import ProfkitError
    from profkit.report.predict import parse_changes

    ran = read_json(out / "sweep.json", "sweep.json") if (out / "sweep.json").is_file() else None
    said = ran.get("predicted_from") if isinstance(ran, dict) else None
    recorded = said.get("changes") if isinstance(said, dict) else None
    if not run or recorded is None:
        return changes
    if not isinstance(recorded, str) or not recorded.strip():
        raise ProfkitError(f"{out / 'sweep.json'}: predicted_from.changes is not vLLM flags ({recorded!r})")
    if changes is None:
        return recorded
    if parse_changes(changes) != parse_changes(recorded):
        raise ProfkitError(f"{out}: swept with the changes {recorded!r}, not {changes!r}")
    return changes


def show_sweep(out: Path, predicted: SweepModel | None = None) -> dict[str, Any]:
    """A sweep folder's document as of today: its measured points (each beside today's model, with `predicted`) and
    the times its run recorded in sweep.json. One line where the folder holds no measured rate."""
    from profkit.errors import ProfkitError

    if not out.exists():
        raise ProfkitError(f"{out}: no such folder")
    rates = measured_rates(out) if out.is_dir() else []
    if not rates:
        raise ProfkitError(f"{out}: not a sweep folder (no rate-R/r1/bench.json: what profkit sweep writes)")
    doc = sweep_document(out, rates, predicted)
    recorded = out / "sweep.json"
    if recorded.is_file():
        ran = read_json(recorded, "sweep.json")
        if isinstance(ran, dict):
            doc.update({k: ran[k] for k in ("seconds", "startup_s") if isinstance(ran.get(k), (int, float))})
    return doc


def _goodput(points: list[dict[str, Any]], bound: Any, predicted: SweepModel | None) -> dict[str, Any]:
    """One bound's goodput: the measured (between the last measured point that meets it and the next, each point's
    mean over its replicates; where the highest point still meets it, that rate and no more is known) beside the
    model's."""
    text = f"{bound.metric}{bound.op}{bound.value:g}"
    measured_points = [{"request_rate": p["rate"], **p["measured"]} for p in points if bound.metric in p["measured"]]
    out: dict[str, Any] = {"bound": text, "measured": None, "at_least": None, "below": None}
    if measured_points:
        out.update(_edge(measured_points, bound))
    if measured_points and (each := _goodput_per_replicate(points, bound)):
        out["per_replicate"] = each  # what each replicate's runs measure alone: the measurement's own noise
    good = predicted.goodputs.get(text) if predicted is not None else None
    if good:
        out["predicted"] = {k: good[k] for k in ("rate", "low", "high")}
        if out["measured"]:
            out["error"] = good["rate"] / out["measured"] - 1
            out["inside_range"] = good["low"] <= out["measured"] <= good["high"]
        elif out["at_least"] is not None or out["below"] is not None:  # what the measurement allows
            out["inside_range"] = (good["high"] >= out["at_least"] if out["at_least"] is not None
                                   else good["low"] < out["below"])
    return out


def unserved_changes(changes: str, server: Any) -> str | None:
    """The first of `changes` (vLLM flags as written) the server's command (a `VllmCommand`) does not set so
    ("flag=value"), or None: a sweep predicted for one configuration and run with another would compare two
    different things. Values compare as vLLM's parser reads them (1 and 1.0 alike)."""
    from profkit.report.predict import parse_changes
    from profkit.vllm.options import read_as_vllm

    # the server's as the changes are read ('40G', 'auto': vLLM's types)
    flags = {k: read_as_vllm(k, v) for k, v in (server.flags() if server is not None else {}).items()}
    for key, value in parse_changes(changes).items():
        if value is None:
            if flags.get(key) is not None:  # set away from vLLM's default (-1/auto for the length reads as it)
                return f"{key}=default"
        elif not _same_value(flags.get(key), value):
            return f"{key}={value}"
    return None


def _same_value(a: Any, b: Any) -> bool:
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return float(a) == float(b) if numbers else a == b


def _goodput_per_replicate(points: list[dict[str, Any]], bound: Any) -> list[dict[str, Any]] | None:
    """The goodput under `bound` that each replicate's runs measure alone (the runs numbered alike at every rate):
    {"measured": rate}, or {"at_least": the highest rate} where its runs met the bound at every rate, or {"below":
    the lowest} where they missed it at the first. None with one run a rate."""
    shared = set.intersection(*(set(p.get("runs") or ()) for p in points)) if points else set()
    if not shared:
        return None
    out = []
    for k in sorted(shared, key=int):
        runs = [{"request_rate": p["rate"], **p["runs"][k]} for p in points if bound.metric in p["runs"][k]]
        if not runs:
            return None
        out.append(_edge(runs, bound))
    return out


def _edge(points: list[dict[str, Any]], bound: Any) -> dict[str, float]:
    """Where measured points (`vllm bench serve` results, ascending by rate, at least one) put a bound's goodput:
    {"measured": rate} between two points; where every rate met it, {"at_least": the highest}; where the first
    missed it, {"below": the lowest}."""
    met = [bound.holds(m[bound.metric]) for m in points]
    if all(met):
        return {"at_least": points[-1]["request_rate"]}
    if not met[0]:
        return {"below": points[0]["request_rate"]}
    return {"measured": measured_goodput(points, bound)}


def predictor(run: str | Path, bounds: Sequence[tuple[str, str, float]] = (),
              changes: str | None = None) -> SweepModel:
    """The model calibrated on `run` (a full-load run): its prediction of a point (rate, prompts) of the swept
    configuration, its frontier within `bounds` (which chooses the rates) and its goodput under each. `changes`
    (vLLM flags as written, `--api-server-count 2`): the swept configuration is the run's with them, predicted as
    `profkit predict RUN --frontier -- CHANGES` predicts it (its refusals one line)."""
    from profkit.model.frontier import frontier, point_at
    from profkit.model.predict import spread
    from profkit.report.predict import frontier_question, said_of

    # the question `profkit predict RUN --frontier -- CHANGES` asks, with its refusals
    q = frontier_question(run, changes, bounds)
    cal, asked, conf, width = q.cal, q.changes, q.configured, spread(q.cal)
    with said_of(changes):
        alone = {f"{b.metric}{b.op}{b.value:g}": frontier(cal, asked, [b], conf=conf).goodput for b in q.bounds}
        front = frontier(cal, asked, q.bounds, conf=conf).document()
    return SweepModel(lambda rate, prompts: point_at(cal, conf, rate, prompts, width).document(), front,
                      q.bounds, alone, str(run), " ".join(changes.split()) if changes else None)


# ------------------------------------------------------------------------------------------------ two sweeps

DIFF_SCHEMA = "profkit.sweep-diff/1"
# the metrics two sweeps are compared on (the columns `profkit sweep` shows)
DIFF_METRICS = ("request_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p99_e2el_ms")


def is_sweep_folder(path: Path) -> bool:
    """A folder `profkit sweep` wrote (a rate-R/r*/bench.json in it)."""
    return path.is_dir() and bool(measured_rates(path))


def _at(points: list[dict[str, Any]], rate: float, key: str) -> float | None:
    """A sweep's measured `key` at `rate`: its own point's, else linear between the two measured rates around it
    (None outside what it measured: a curve is not extrapolated)."""
    rates = [p["rate"] for p in points if key in p["measured"]]
    if not rates or not rates[0] <= rate <= rates[-1]:
        return None
    return float(np.interp(rate, rates, [p["measured"][key] for p in points if key in p["measured"]]))


def diff_sweeps(before: Path, after: Path, bounds: Sequence[tuple[str, str, float]] = (),
                noise: float = 0.05) -> dict[str, Any]:
    """Two measured sweeps (two configurations, or one measured twice) rate by rate: at every rate either measured
    within both's range, each metric before and after (a rate a sweep did not measure read between its two
    neighbours) and the change, flagged where it is within the larger of `noise` and the points' replicate spread;
    and each bound's goodput measured on each (`bounds`: (metric, op, value), as --slo gives them)."""
    from profkit.errors import ProfkitError
    from profkit.model.frontier import bounds_of

    try:
        checked = bounds_of(bounds)
    except ValueError as exc:
        raise ProfkitError(f"--slo: {exc}") from None
    sides = [show_sweep(before), show_sweep(after)]
    own = [{p["rate"]: p for p in side["points"]} for side in sides]
    rows = []
    for rate in sorted(set(own[0]) | set(own[1])):
        values: dict[str, tuple[float, float]] = {}
        for k in DIFF_METRICS:
            a, b = (_at(side["points"], rate, k) for side in sides)
            if a is not None and b is not None:
                values[k] = (a, b)
        if not values:
            continue
        change = {k: (b / a - 1 if a else None) for k, (a, b) in values.items()}
        spread = {k: max([noise] + [own[i][rate]["spread"].get(k, 0.0) for i in (0, 1) if rate in own[i]])
                  for k in values}
        rows.append({"rate": rate, "measured": [rate in own[0], rate in own[1]],
                     "before": {k: a for k, (a, _) in values.items()}, "after": {k: b for k, (_, b) in values.items()},
                     "change": change, "within_noise": {k: c is not None and abs(c) <= spread[k]
                                                        for k, c in change.items()}})
    goodput = []
    for bound in checked:
        each = [_goodput(side["points"], bound, None) for side in sides]
        g: dict[str, Any] = {"bound": each[0]["bound"], "before": each[0], "after": each[1], "change": None}
        if each[0]["measured"] and each[1]["measured"]:
            g["change"] = each[1]["measured"] / each[0]["measured"] - 1
        goodput.append(g)
    said = [{"folder": side["folder"], "rates": [p["rate"] for p in side["points"]],
             "replicates": [p["replicates"] for p in side["points"]], "benchmark_s": side.get("benchmark_s")}
            for side in sides]
    return {"schema": DIFF_SCHEMA, "before": said[0], "after": said[1], "noise": noise, "rows": rows,
            "goodput": goodput}
