"""How far the model's predictions held on recorded runs: each validation pair's error by class of change, and the
range those errors give a new prediction of the same classes.

`scripts/validate_model.py --write` predicts every recorded (run, change) pair in tests/data from each baseline
replicate and writes the rows to `validation.json` beside this module: the change's classes (`levers.families`), its
provenance (`held-out`: no constant of the model was read off it; `in-sample`: one was), the recordings it used, the
prediction with the model's own range, and the measured mean. A prediction's range is the model's own ends widened
to the errors of every held-out pair sharing a class with it (log of measured over predicted; their 10th-90th
percentiles from 10 rows, else their extremes). The coverage said beside it is leave-one-recording-out: each
held-out row's range built without the rows that share a recording with it, and whether its measurement fell
inside. A class no held-out
pair has validated makes the prediction extrapolated, said in every format."""

from __future__ import annotations

import copy
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROWS = Path(__file__).with_name("validation.json")
# The frontier's points against measured sweeps (`scripts/validate_frontier.py --write`): one row per (sweep point,
# full-load replicate predicting it, metric), the points where both the server and the model kept up with the rate.
FRONTIER_ROWS = Path(__file__).with_name("frontier_validation.json")
HELD_OUT = "held-out"
QUANTILE_ROWS = 10  # from this many rows the band is their 10th-90th percentiles, below it their extremes
# a metric's errors as the validation measured them (output tokens/s moves with requests/s: fixed lengths)
MEASURED_AS = {"output_throughput": "request_throughput"}


@dataclass(frozen=True)
class Band:
    """The held-out errors of a prediction's classes, as log(measured / predicted) at the two ends."""

    families: tuple[str, ...]
    low: float
    high: float
    pairs: int  # held-out validation pairs sharing a class with the prediction
    inside: int  # held-out rows inside their leave-one-recording-out range
    rows: int  # held-out rows
    extrapolated: tuple[str, ...]  # the prediction's classes no held-out pair validated

    def document(self) -> dict[str, Any]:
        return {"classes": list(self.families), "pairs": self.pairs,
                "coverage": {"inside": self.inside, "rows": self.rows}, "extrapolated": list(self.extrapolated),
                "error_range": [math.expm1(self.low), math.expm1(self.high)]}


def widened(predicted: float, low: float, high: float, band: tuple[float, float]) -> tuple[float, float]:
    """A range's ends widened to a band of held-out log errors around the prediction (the model's own ends kept where
    wider): the one rule every held-out range follows."""
    return min(low, predicted * math.exp(band[0])), max(high, predicted * math.exp(band[1]))


def _inside(row: dict[str, Any], band: tuple[float, float]) -> bool:
    low, high = widened(row["predicted"], row["low"], row["high"], band)
    return low <= row["measured"] <= high


@cache
def recorded_rows() -> tuple[dict[str, Any], ...]:
    """The validation rows shipped with profkit (none where the file is absent: every class then extrapolated)."""
    if not ROWS.is_file():
        return ()
    return tuple(json.loads(ROWS.read_text())["rows"])


def residual(row: dict[str, Any]) -> float:
    return math.log(row["measured"] / row["predicted"])


def _ends(errors: Sequence[float]) -> tuple[float, float]:
    if not errors:
        return 0.0, 0.0
    if len(errors) < QUANTILE_ROWS:
        return min(errors), max(errors)
    cuts = statistics.quantiles(errors, n=10, method="inclusive")
    return cuts[0], cuts[-1]


def _sharing(rows: Iterable[dict[str, Any]], families: Sequence[str], metric: str,
             leave_out: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    metric = MEASURED_AS.get(metric, metric)
    return [r for r in rows if r["metric"] == metric and r["provenance"] == HELD_OUT
            and set(r["families"]) & set(families) and not set(r["recordings"]) & leave_out]


def band_of(rows: Sequence[dict[str, Any]], families: Sequence[str], metric: str,
            leave_out: frozenset[str] = frozenset()) -> tuple[float, float]:
    """The ends of the held-out errors of the rows sharing a class with `families`, without those using
    `leave_out`'s recordings (an in-sample row's error is not evidence: a constant was read off it)."""
    return _ends([residual(r) for r in _sharing(rows, families, metric, leave_out)])


def inside_held_out(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> bool:
    """Whether a row's measurement falls inside the range built without its own recordings."""
    return _inside(row, band_of(rows, row["families"], row["metric"], frozenset(row["recordings"])))


def band(families: Sequence[str], metric: str) -> Band:
    """The held-out errors a prediction of these classes of change carries, and how well they covered."""
    return _band(tuple(families), metric)


@cache  # a search asks for the same few classes thousands of times
def _band(families: tuple[str, ...], metric: str) -> Band:
    rows = recorded_rows()
    held = _sharing(rows, families, metric)
    low, high = _ends([residual(r) for r in held])
    validated = {f for r in held for f in r["families"]}
    pairs = len({r["pair"] for r in held})
    return Band(tuple(families), low, high, pairs, sum(bool(r["inside_held_out"]) for r in held), len(held),
                tuple(f for f in families if f not in validated))


def rows_text(schema: str, rows: Sequence[dict[str, Any]]) -> str:
    """A validation file as the scripts write it: one row a line (a diff of two versions reads row by row)."""
    return "{\"schema\": " + json.dumps(schema) + ", \"rows\": [\n" + ",\n".join(json.dumps(r) for r in rows) \
        + "\n]}\n"


@cache
def frontier_rows() -> tuple[dict[str, Any], ...]:
    """The sweep points the frontier was held against (none where the file is absent: its ranges are the model's)."""
    if not FRONTIER_ROWS.is_file():
        return ()
    return tuple(json.loads(FRONTIER_ROWS.read_text())["rows"])


def frontier_band_of(rows: Sequence[dict[str, Any]], metric: str, changed: bool,
                     leave_out: frozenset[str] = frozenset(), families: Sequence[str] = ()) -> tuple[float, float]:
    """The ends of log(measured / predicted) of `metric` at the measured sweeps' points, of the swept configuration
    predicted as it ran (`changed` False) or from another's run (True: the changes' own errors ride along: those of
    sweeps sharing a class of change with `families` where any do, else every changed sweep's), without those
    predicted from `leave_out`'s recordings (the full-load captures). A class whose sweeps are all left out has no
    band (0, 0: the model's own range), not another class's."""
    chosen, _ = _frontier_class(rows, metric, changed, families)
    return _ends([residual(r) for r in chosen if r["recording"] not in leave_out])


def _frontier_class(rows: Sequence[dict[str, Any]], metric: str, changed: bool,
                    families: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    """The sweep points a frontier point of this class is held against, and the class in words."""
    chosen = [r for r in rows if r["metric"] == metric and r["changed"] == changed]
    if not changed:
        return chosen, "the run's own configuration"
    same = [r for r in chosen if set(r.get("families", ())) & set(families)] if families else []
    swept = {f for r in same for f in r.get("families", ())}
    unswept = [f for f in families if f not in swept]
    if same:
        return same, f"a change of {' and '.join(f for f in families if f in swept)}" + \
            (f" ({' and '.join(unswept)} not swept)" if unswept else "")
    return chosen, "any change" + (f" ({' and '.join(unswept)} not swept)" if unswept else "")


def frontier_misses(metrics: tuple[str, ...], changed: bool, families: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """What the recorded sweeps' points of this class missed each of `metrics` by, as fractions (the ends a frontier
    point's range is widened to: `frontier_band`), the class in words and how many sweeps it counts; None where
    profkit ships no sweeps. What the frontier says beside its curve: a document's own copy."""
    return copy.deepcopy(_frontier_misses(metrics, changed, families))


@cache  # a search's frontiers ask for the same few classes
def _frontier_misses(metrics: tuple[str, ...], changed: bool, families: tuple[str, ...]) -> dict[str, Any] | None:
    rows = frontier_rows()
    out: dict[str, Any] = {}
    for metric in metrics:
        chosen, out["of"] = _frontier_class(rows, metric, changed, families)
        if not chosen:
            return None
        low, high = _ends([residual(r) for r in chosen])
        out[metric] = {"low": math.exp(low) - 1, "high": math.exp(high) - 1, "points": len(chosen),
                       "ends": "10th-90th percentile" if len(chosen) >= QUANTILE_ROWS else "extremes"}
        out["sweeps"] = len({r["sweep"] for r in chosen})
    return out or None


@cache
def frontier_band(metric: str, changed: bool, families: tuple[str, ...] = ()) -> tuple[float, float]:
    """What a frontier point's `metric` missed by on the recorded sweeps (of its class of change, where it is another
    configuration's): the ends its range is widened to."""
    return frontier_band_of(frontier_rows(), metric, changed, families=families)


def inside_frontier_held_out(row: dict[str, Any], rows: Sequence[dict[str, Any]]) -> bool:
    """Whether a sweep point's measurement falls inside the range built without its own recording's rows."""
    return _inside(row, frontier_band_of(rows, row["metric"], row["changed"], frozenset([row["recording"]]),
                                         row.get("families", ())))
