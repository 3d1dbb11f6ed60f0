"""The model's search for the best configuration of the run: every lever of `profkit.model.levers` at once, within
the user's bounds (SLOs) and leave (precision).

A beam search over combinations: from the run's own settings, vLLM's defaults (every flag the user set taken back) and,
where precision may change, the FP8 pair, each round moves every configuration of the beam by one lever to each of its
values, and keeps the best few; it stops when the beam no longer changes. A configuration is judged by the middle of
its prediction (one simulation). The best, each without the changes that move nothing, are then predicted whole
(their ranges); one that predicts what a simpler one does (no more changes, every metric within 0.5 %) is not
listed. Configurations that meet every bound rank first, by the objective; those that do not, by how far they miss
(so the search walks toward the bounds from a run that misses them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from profkit.model import levers
from profkit.model.predict import METRICS, Calibrated, Prediction, predict
from profkit.model.simulate import Infeasible

OBJECTIVE = "request_throughput"
BEAM, ROUNDS, FINALISTS = 4, 4, 12
SAME = 0.005  # a configuration predicting every metric within this of a simpler one's says nothing more


@dataclass(frozen=True)
class Bound:
    """An SLO on a predicted metric: `mean_ttft_ms <= 5000`."""

    metric: str
    op: str  # <, <=, >, >=
    value: float

    def miss(self, predicted: float | None) -> float:
        """How far a predicted value misses the bound (log ratio; 0 when it holds, inf when it is unknown)."""
        if predicted is None or predicted <= 0 or self.value <= 0:
            return math.inf if predicted is None else (0.0 if self.holds(predicted) else math.inf)
        if self.holds(predicted):
            return 0.0
        return abs(math.log(predicted / self.value)) + 1e-9

    def holds(self, predicted: float) -> bool:
        return {"<": predicted < self.value, "<=": predicted <= self.value, ">": predicted > self.value,
                ">=": predicted >= self.value}[self.op]


def known_metrics() -> tuple[str, ...]:
    return tuple(name for name, _ in METRICS)


def check_bounds(bounds: Sequence[Bound]) -> None:
    """Every bound names a metric the model predicts (ValueError naming them otherwise)."""
    for b in bounds:
        if b.metric not in known_metrics():
            raise ValueError(f"the model predicts no {b.metric!r} (it predicts {', '.join(known_metrics())})")


@dataclass
class Found:
    """A configuration the search judged: its changes from the run's own settings and its prediction."""

    changes: dict[str, Any]
    prediction: Prediction
    miss: float  # how far it misses the bounds (0: meets them all)
    objective: str = OBJECTIVE
    higher: bool = True  # a larger objective is better (throughput), else a smaller (latency)
    bounds: tuple[Bound, ...] = ()  # the bounds it was judged against

    @property
    def score(self) -> float:
        """The objective's predicted value, signed so that larger is better (-inf: not predicted)."""
        v = self.prediction.metrics[self.objective]["predicted"]
        return -math.inf if v is None else (v if self.higher else -v)

    def gain(self) -> float:
        """The predicted relative improvement of the objective over the run (0: nothing measured)."""
        m = self.prediction.metrics[self.objective]
        before, after = m.get("before"), m.get("predicted")
        if not before or after is None:
            return 0.0
        return after / before - 1 if self.higher else 1 - after / before

    def loss_to(self, other: Found) -> float:
        """What `other` predicts short of this configuration's objective, relative to this one's (what a measurement
        of the two would have to tell apart: a benchmark's noise is relative to what it measures)."""
        mine, theirs = self.prediction.metrics[self.objective]["predicted"], other.prediction.metrics[self.objective][
            "predicted"]
        if not mine or theirs is None:
            return 0.0
        return 1 - theirs / mine if self.higher else theirs / mine - 1

    def key(self) -> tuple[float, float, int]:
        return (-self.miss, self.score, -len(self.changes))


Memo = dict[tuple, Any]  # predictions already made for one calibration: (ends, changes) -> Prediction or None


def _predicted(cal: Calibrated, changes: dict[str, Any], noise: float | None, ends: bool, memo: Memo) -> Any:
    """predict(), once per configuration of one search (or of ranked()'s searches together); None: infeasible."""
    key = (ends, *sorted((k, repr(v)) for k, v in changes.items()))
    if key not in memo:
        try:
            memo[key] = predict(cal, changes, noise=noise, ends=ends)
        except Infeasible:
            memo[key] = None
    return memo[key]


def search(cal: Calibrated, allow_precision: bool = False, bounds: Sequence[Bound] = (), top: int = 5,
           noise: float | None = None, starts: Sequence[dict[str, Any]] = (), objective: str = OBJECTIVE,
           higher: bool = True, memo: Memo | None = None) -> list[Found]:
    """The `top` configurations the model predicts best for the run (best first), whole predictions; `starts`: more
    configurations to search from (changes from the run's own settings); `objective`: the predicted metric to
    maximise (`higher`) or minimise; `memo`: predictions shared with other searches of the same calibration and
    noise."""
    check_bounds(bounds)
    if objective not in known_metrics():
        raise ValueError(f"the model predicts no {objective!r} (it predicts {', '.join(known_metrics())})")
    obs = cal.observation
    sp = levers.space(obs, allow_precision)
    own = {dest: obs.config.get(dest) for dest in sp}
    seen: dict[tuple, Found | None] = {}
    memo = {} if memo is None else memo

    def norm(changes: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in changes.items() if k not in own or v != own[k]}

    def judged(changes: dict[str, Any], whole: bool = False) -> Found | None:
        changes = norm(changes)
        key = (whole, *sorted((k, repr(v)) for k, v in changes.items()))
        if key not in seen:
            p = _predicted(cal, changes, noise, whole, memo)
            seen[key] = None if p is None else Found(changes, p, sum(b.miss(p.metrics[b.metric]["predicted"])
                                                                     for b in bounds), objective, higher, tuple(bounds))
        return seen[key]

    beam = _best([judged(s) for s in _starts(obs, sp, allow_precision, starts)], BEAM)
    for _ in range(ROUNDS):
        moved = [judged({**f.changes, dest: v}) for f in beam for dest, values in sp.items() for v in values
                 if v != f.changes.get(dest, own[dest])]
        new = _best([*beam, *moved], BEAM)
        if [f.changes for f in new] == [f.changes for f in beam]:
            break
        beam = new
    quick = _best([f for k, f in seen.items() if not k[0]], FINALISTS)
    whole = _best([judged(_pruned(f, judged), whole=True) for f in quick], FINALISTS)
    return _simplest(whole)[:top]


def ranked(cal: Calibrated, allow_precision: bool, threshold: float, bounds: Sequence[Bound] = (),
           noise: float | None = None, objective: str = OBJECTIVE, higher: bool = True,
           top: int = 5) -> list[Found]:
    """The configurations to prescribe or try, best first, as the prescription and tune both take them: the search
    without precision changes over every split of the run's GPUs, then (with leave) with them, from the former's
    best; each configuration less every change whose removal loses less than `threshold` of the objective (no
    restart-worthy change the model cannot tell from none), those that then coincide said once. A configuration that
    changes precision ranks above the best without only where it is predicted to gain more than `threshold` over
    it."""
    starts = levers.layouts(cal.observation)
    memo: Memo = {}
    found = search(cal, False, bounds, top, noise, starts, objective, higher, memo)
    if allow_precision:
        found += search(cal, True, bounds, top, noise, [f.changes for f in found[:1]] + starts, objective, higher,
                        memo)
    out: dict[tuple, Found] = {}
    for f in sorted(found, key=lambda f: f.key(), reverse=True):
        m = minimal(cal, f, threshold, noise, memo)
        key = tuple(sorted((k, repr(v)) for k, v in m.changes.items()))
        out.setdefault(key, m)
    best = sorted(out.values(), key=lambda f: f.key(), reverse=True)
    safe = next((f for f in best if not set(f.changes) & levers.PRECISION), None)
    if best and safe is not None and best[0] is not safe and best[0].miss == safe.miss \
            and best[0].loss_to(safe) < threshold:
        best.remove(safe)  # a change of precision ranks first only for a gain beyond the noise over the best without
        best.insert(0, safe)
    return best[:top]


def minimal(cal: Calibrated, found: Found, threshold: float, noise: float | None, memo: Memo | None = None) -> Found:
    """`found` less each change whose removal loses less than `threshold` of its predicted objective and misses the
    bounds no more (precision changes weighed first: the costly; the GPUs' split goes whole or not at all)."""
    memo = {} if memo is None else memo
    changes = dict(found.changes)
    current = found
    for dest in sorted(found.changes, key=lambda d: d in levers.PRECISION, reverse=True):
        if dest not in changes:
            continue
        unit = levers.PARALLEL if dest in levers.PARALLEL else (dest,)
        rest = {k: v for k, v in changes.items() if k not in unit}
        if (p := _predicted(cal, rest, noise, False, memo)) is None:
            continue
        f = Found(rest, p, 0.0, found.objective, found.higher)
        f.miss = sum(b.miss(p.metrics[b.metric]["predicted"]) for b in found.bounds)
        if found.loss_to(f) < threshold and f.miss <= found.miss:
            changes, current = rest, f
    for dest, value in list(changes.items()):  # a value that does what vLLM's default does: the flag removed
        if value is None or dest in levers.PARALLEL or dest in levers.PRECISION \
                or levers.vllm_default(dest, cal.observation) is None or dest not in cal.observation.config:
            continue
        if (p := _predicted(cal, {**changes, dest: None}, noise, False, memo)) is None:
            continue
        f = Found({**changes, dest: None}, p, 0.0, found.objective, found.higher)
        f.miss = sum(b.miss(p.metrics[b.metric]["predicted"]) for b in found.bounds)
        if current.loss_to(f) <= SAME and f.miss <= found.miss:  # relative to the configuration, as above
            changes, current = f.changes, f
    if current is found:
        return found
    if (p := _predicted(cal, changes, noise, True, memo)) is None:
        return found
    return Found(changes, p, sum(b.miss(p.metrics[b.metric]["predicted"]) for b in found.bounds), found.objective,
                 found.higher, found.bounds)


def _pruned(found: Found, judged: Any) -> dict[str, Any]:
    """The configuration's changes without those that move nothing: each dropped in turn while the rest predicts the
    same objective (within SAME) and misses the bounds no more."""
    changes = dict(found.changes)
    for dest in list(changes):
        if dest not in changes:
            continue
        unit = levers.PARALLEL if dest in levers.PARALLEL else (dest,)  # the GPUs' split goes whole or not at all
        rest = {k: v for k, v in changes.items() if k not in unit}
        f = judged(rest)
        if f is not None and f.miss <= found.miss and f.score >= found.score - SAME * abs(found.score):
            changes = rest
    return changes


def _starts(obs: Any, sp: dict[str, tuple[Any, ...]], allow_precision: bool,
            more: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's own settings, vLLM's defaults for every lever the user set, and (with leave) the FP8 pair on each."""
    defaults: dict[str, Any] = {dest: None for dest in sp if None in sp[dest] and dest not in levers.PRECISION}
    out = [{}, defaults, *more]
    if allow_precision:
        pair: dict[str, Any] = {k: "fp8" for k in ("quantization", "kv_cache_dtype") if k in sp}
        out += [pair, {**defaults, **pair}]
    return out


def _best(found: Sequence[Found | None], n: int) -> list[Found]:
    """The best `n` distinct configurations, best first."""
    unique = {tuple(sorted((k, repr(v)) for k, v in f.changes.items())): f for f in found if f is not None}
    return sorted(unique.values(), key=lambda f: f.key(), reverse=True)[:n]


def _simplest(found: list[Found]) -> list[Found]:
    """Without the configurations that predict what a simpler one (a subset of their changes) predicts."""
    out: list[Found] = []
    for f in sorted(found, key=lambda f: (len(f.changes), -f.score)):
        if not any(len(g.changes) <= len(f.changes) and _same(f.prediction, g.prediction) for g in out):
            out.append(f)
    return sorted(out, key=lambda f: f.key(), reverse=True)


def _same(a: Prediction, b: Prediction) -> bool:
    for name, _ in METRICS:
        x, y = a.metrics[name]["predicted"], b.metrics[name]["predicted"]
        if (x is None) != (y is None) or x is not None and y is not None and abs(x - y) > SAME * max(abs(y), 1e-9):
            return False
    return True
