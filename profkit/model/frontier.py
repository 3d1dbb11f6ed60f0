"""The SLO frontier of a calibrated run: throughput against latency percentiles over request rates, and the largest
rate that meets every latency bound (the goodput), from the one run the model was calibrated on.

Each point is the scheduler simulation of `vllm bench serve --request-rate R` (Poisson arrivals, the run's own
prompt and output lengths and client cap) with the calibrated step costs, its requests' TTFT, TPOT and end-to-end
latency read as `vllm bench` reads them (p50, p90, p99: numpy's linear interpolation). A request's time outside the
engine's steps (HTTP, tokenising) is not known from a run at full load, where queueing sets TTFT: below the
capacity it is 1.6 of the engine's steps (read off vLLM's histograms on H200s) stretched by the frontend's
load (`predict.frontend_latency`; docs/prediction.md gives the measured errors). A rate's
prompts span at least MIN_SECONDS, as a sweep's runs would. The rates are shares of the simulated capacity (the run
at rate inf), dense near the knee; the capacity shown is `predict`'s, anchored to the measured run as it is.
Ranges: the ends of what the change does to a step's cost, widened by the noise and the fit's error on the
calibrated run, as `predict`'s are, and where the API servers' count changes, their
ceiling at the imbalance's ends (at full load the full-load runs' 10th-90th percentiles; at a rate, where the API
servers share more evenly, those of runs at a rate: `predict.API_SERVER_IMBALANCE_AT_RATE`); the capacity as wide
as `predict`'s for the change (its class's held-out errors); at a finite rate, also what the simulation gives with
every cost that spread shorter and longer (near the knee a step's error compounds: `_through`), then widened again to
what each metric missed by on the measured sweeps (`validation.frontier_band`: under a change, the sweeps of its
class of change).

What a vLLM sweep (`vllm bench sweep`, benchmarks/auto_tune) measures one restart and one run a point, this
predicts in seconds; `profkit sweep` measures the points it chooses (around the knee and the bounds' edges)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from profkit.model import predict as model
from profkit.model import validation
from profkit.model.predict import Calibrated, Configured, configured, frontend_latency, host_stretch, range_width
from profkit.model.predict import spread as predict_spread
from profkit.model.search import Bound
from profkit.model.simulate import Infeasible, Latencies, SimResult, StepCost, Workload, simulate_latencies

LATENCIES = ("ttft", "tpot", "e2el")
STATS = ("mean", "p50", "p90", "p99")
SHARES = (0.1, 0.25, 0.4, 0.55, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25)  # of the capacity
REPORT_SHARES = (0.25, 0.5, 0.75, 0.9)  # the report's frontier before and after its prescription: fewer points
MIN_SECONDS = 30.0  # a rate's prompts are sent over at least this long
BISECT = 6  # simulations that place the goodput between two points (1/64 of their gap)
ALIASES = {"median": "p50"}
# metrics a sweep does not measure as such, widened by the errors of the one they derive from (per user: 1,000 / mean
# TPOT, the sign flipped; per GPU: the output throughput's)
BAND_OF = {"tokens_per_user": ("mean_tpot_ms", -1), "output_throughput_per_gpu": ("output_throughput", 1)}
MISSED_BY = ("p99_ttft_ms", "p99_tpot_ms")  # what the recorded sweeps missed by, said beside the curve


def frontier_metrics() -> tuple[str, ...]:
    """The metrics a frontier point predicts: vLLM's bench names (`p99_ttft_ms`, `mean_tpot_ms`, ...)."""
    return ("request_throughput", "output_throughput", "output_throughput_per_gpu", "tokens_per_user",
            *(f"{s}_{m}_ms" for m in LATENCIES for s in STATS))


def bounds_of(specs: Sequence[tuple[str, str, float]]) -> list[Bound]:
    """(metric, op, value) triples, e.g. from --slo, as the frontier's bounds (`median_` read as `p50_`); ValueError
    naming the known metrics for one it does not predict."""
    return [Bound(canonical_metric(m), op, v) for m, op, v in specs]


def canonical_metric(name: str) -> str:
    """`median_ttft_ms` -> `p50_ttft_ms`; ValueError naming the known metrics otherwise."""
    head, _, rest = name.partition("_")
    name = f"{ALIASES.get(head, head)}_{rest}" if rest else name
    if name not in frontier_metrics():
        raise ValueError(f"the frontier predicts no {name!r} (it predicts {', '.join(frontier_metrics())})")
    return name


@dataclass(frozen=True)
class Point:
    """One request rate's predicted outcome (rate None: every request at once, the capacity)."""

    rate: float | None
    prompts: int
    predicted: dict[str, float]
    low: dict[str, float]
    high: dict[str, float]
    queue_growth_s: float = 0.0  # the last quarter's median TTFT beyond what a steady queue allows (0: steady)
    # the same with every cost the spread shorter and longer (`_through`): whether the range's ends keep up
    growth_ends: tuple[float, float] = (0.0, 0.0)
    # every request at once: the simulated request throughput before the anchor to the measured run (the rates'
    # grid is shares of it); None at a rate
    simulated_throughput: float | None = None

    def document(self) -> dict[str, Any]:
        return {"rate": self.rate, "prompts": self.prompts, "keeps_up": keeps_up(self),
                "metrics": {k: {"predicted": v, "low": self.low[k], "high": self.high[k]}
                            for k, v in self.predicted.items()}}


@dataclass
class Frontier:
    changes: dict[str, Any]
    gpus: int
    capacity: Point
    points: list[Point]
    bounds: list[Any] = field(default_factory=list)  # profkit.model.search.Bound on frontier metrics
    goodput: dict[str, Any] | None = None  # {"rate", "low", "high", "binding"}
    gpu_scale_at_a_rate: float = 1.0  # a step's GPU costs at a rate, of the fit's (`Configured.rate_scale`)
    missed_by: dict[str, Any] | None = None  # `validation.frontier_misses` of this configuration's class

    def document(self) -> dict[str, Any]:
        return {"changes": self.changes, "gpus": self.gpus, "capacity": self.capacity.document(),
                "points": [p.document() for p in self.points],
                "bounds": [f"{b.metric}{b.op}{b.value:g}" for b in self.bounds], "goodput": self.goodput,
                "gpu_scale_at_a_rate": self.gpu_scale_at_a_rate, "missed_by": self.missed_by}


def frontier(cal: Calibrated, changes: dict[str, Any] | None = None, bounds: Sequence[Any] = (),
             shares: Sequence[float] = SHARES, noise: float | None = None, prompts: int | None = None,
             conf: Configured | None = None) -> Frontier:
    """The run's predicted frontier under `changes` ({vLLM dest: value}): the capacity, a point at each share of it,
    and with `bounds` (on `frontier_metrics()`) the goodput. `prompts`: every point's request count (default: the
    run's own, or MIN_SECONDS of the rate). `conf`: the run under `changes` where the caller has it already
    (`configured(cal, changes)`). Raises Infeasible where the configuration cannot serve the workload."""
    if (why := no_frontier(cal)) is not None:
        raise ValueError(why)
    changes = dict(changes or {})
    conf = configured(cal, changes) if conf is None else conf
    spread = predict_spread(cal, noise)
    # the capacity is what `predict` predicts for the change: its range as wide
    capacity = point_at(cal, conf, None, prompts or cal.workload.requests,
                        range_width(cal, bool(conf.caps(cal.baseline)), noise))
    # the rates: shares of the simulated capacity, before `predict`'s anchor to the measured run (within the fit's
    # error of it): where the simulation at a rate saturates, and the grid the recorded frontiers were predicted at
    top = capacity.simulated_throughput or capacity.predicted["request_throughput"]
    points = [point_at(cal, conf, top * s, prompts or _prompts(cal, top * s), spread) for s in shares]
    gpus = cal.observation.tensor_parallel * int(changes.get("data_parallel_size") or cal.observation.data_parallel)
    out = Frontier(changes, gpus, capacity, points, list(bounds), gpu_scale_at_a_rate=conf.rate_scale,
                   missed_by=validation.frontier_misses(MISSED_BY, conf.changed, tuple(conf.families)))
    if bounds:
        out.goodput = _goodput(cal, conf, points, list(bounds), spread, prompts)
    return out


def no_frontier(cal: Calibrated) -> str | None:
    """Why the run has no frontier (an offline run has no request rate), or None."""
    return "a frontier needs a served run (vllm bench serve): an offline run has no request rate" \
        if cal.observation.offline else None


def point_at(cal: Calibrated, conf: Configured, rate: float | None, prompts: int, spread: float,
             held_out: bool = True) -> Point:
    """The predicted outcome of `prompts` requests sent at `rate` (None: all at once). `held_out`: a rate's ranges
    widened to what each metric missed by on the recorded sweeps (`validation.frontier_band`); off, the model's own
    (what the validation compares)."""
    work = replace(cal.workload, requests=prompts, request_rate=rate)
    costs = conf.step_costs(rate)
    sims = [simulate_latencies(work, conf.engine, cost, conf.engines) for cost in costs]
    anchor = model.anchors(cal) if rate is None else None  # every request at once: as `predict` says it
    runs = [_metrics(cal, conf, r, lat, rate, anchor=anchor) for r, lat in sims]
    mid = runs[len(runs) // 2]
    # where the API servers' count changes, their ceiling at the imbalance's ends bounds the range too (as predict's)
    runs += [_metrics(cal, conf, r, lat, rate, i, anchor) for r, lat in sims for i in _imbalance_ends(conf, rate)]
    # at full load, as `predict`'s: the time to the first token also as wide as the fit's error on it
    width = {k: spread + (cal.fit_error.get("ttft", 0.0) if rate is None and "ttft" in k else 0.0) for k in mid}
    low = {k: min(r[k] for r in runs) * math.exp(-width[k]) for k in mid}
    high = {k: max(r[k] for r in runs) * math.exp(width[k]) for k in mid}
    ends = (0.0, 0.0)
    if rate is not None:  # the step's own uncertainty through the simulation, not only on its outputs (_through)
        through = _through(cal, conf, work, costs[len(costs) // 2], spread)
        for r, _ in through:
            low = {k: min(v, r[k]) for k, v in low.items()}
            high = {k: max(v, r[k]) for k, v in high.items()}
        ends = (through[0][1], through[1][1])
    if held_out and rate is None:  # the capacity: as `predict` widens the change's, to its class's held-out errors
        for k, v in mid.items():
            b = validation.band(conf.families, k)
            low[k], high[k] = validation.widened(v, low[k], high[k], (b.low, b.high))
    if held_out and rate is not None:
        for k, v in mid.items():
            source, sign = BAND_OF.get(k, (k, 1))
            band = validation.frontier_band(source, conf.changed, tuple(conf.families))
            low[k], high[k] = validation.widened(v, low[k], high[k], (band[0], band[1]) if sign > 0 else
                                                 (-band[1], -band[0]))
    growth = _growth(sims[len(sims) // 2][1]) if rate is not None else 0.0
    middle = sims[len(sims) // 2][0]  # its throughput under the host, as `_metrics` has it before the anchor
    simulated = middle.request_throughput * host_stretch(middle, conf.caps(middle, None)) if rate is None else None
    return Point(rate, prompts, mid, low, high, growth, ends, simulated)


def _growth(lat: Latencies) -> float:
    """How far the last quarter's median TTFT (in the order the requests were sent) exceeds what a steady queue
    allows: 0 where the server keeps up (QUEUE_GROWTH)."""
    ttft = lat.ttft_s
    quarter = max(1, len(ttft) // 4)
    growth = float(np.median(ttft[-quarter:])) - QUEUE_GROWTH[0] * float(np.median(ttft[:quarter])) - QUEUE_GROWTH[1]
    return max(growth, 0.0)


def _through(cal: Calibrated, conf: Configured, work: Workload, cost: StepCost,
             spread: float) -> list[tuple[dict[str, float], float]]:
    """The metrics and queue growth at a rate with every one of `cost`'s costs exp(-spread) and exp(+spread) times as
    long. At a rate a step a little longer gathers more tokens, which lengthen it again (lease 19's 8B at 1,024/128,
    29.45 req/s: steps of 808 tokens in 25.4 ms measured by vLLM's counters, 994 in 30.2 simulated: 31.9k and 32.9k
    tokens a second, 3 % apart), so near the knee the latencies move many times what the step's cost does, and a
    range that only widens the outputs by the spread misses it (docs/prediction.md gives the coverage either way)."""
    out = []
    for f in (math.exp(-spread), math.exp(spread)):
        r, lat = simulate_latencies(work, conf.engine, cost.times(f), conf.engines)
        out.append((_metrics(cal, conf, r, lat, work.request_rate), _growth(lat)))
    return out


def _imbalance_ends(conf: Configured, rate: float | None) -> tuple[float, ...]:
    """The API servers' imbalances a point's range spans where their count changes: at full load the full-load
    runs' ends, at a rate the ends of runs at a rate (they share more evenly there)."""
    return conf.imbalance_ends if rate is None or not conf.imbalance_ends else model.API_SERVER_IMBALANCE_AT_RATE_ENDS


def _prompts(cal: Calibrated, rate: float) -> int:
    return max(cal.workload.requests, math.ceil(rate * MIN_SECONDS))


def _metrics(cal: Calibrated, conf: Configured, r: SimResult, lat: Latencies, rate: float | None,
             imbalance: float | None = None, anchor: dict[str, float] | None = None) -> dict[str, float]:
    """One simulated run's metrics under the host's ceilings (past one, every time stretches alike); `imbalance`:
    the API servers' (default the median's); `anchor`: at full load, the baseline's measured over simulated
    (`predict.anchors`), each request's time to its first token and its decode's scaled by its metric's, so that
    the point's means are `predict`'s."""
    if rate is not None and imbalance is None:  # at a rate the API servers share more evenly than at full load
        imbalance = model.API_SERVER_IMBALANCE_AT_RATE
    caps = conf.caps(r, imbalance)
    scale = host_stretch(r, caps)
    # the latency fitted outside the engine's steps is what the run's mean TTFT exceeded the simulated one by at
    # full load, where queueing sets TTFT: it stands for that run alone (added to a rate's, it put 0-200 ms on a
    # 45 ms TTFT across the 8B's three replicates); at a rate, the frontend's own time under its load (a step and a
    # 1.6 steps of the simulated run's, its mean TPOT), each request's drawn about its mean (_waits)
    latency = cal.request_latency_s if rate is None else \
        frontend_latency(r, caps, _engine_step_s(r, lat)) * _waits(len(lat.ttft_s))
    out = {"request_throughput": r.request_throughput * scale, "output_throughput": r.output_throughput * scale}
    series = {m: getattr(lat, f"{m}_s") / scale + (latency if m != "tpot" else 0.0) for m in LATENCIES}
    if anchor is not None:  # each request's wait for its first token, and its decode, as predict scales their means
        out = {k: v * anchor[k] for k, v in out.items()}
        series["ttft"] = series["ttft"] * anchor["mean_ttft_ms"]
        series["tpot"] = series["tpot"] * anchor["mean_tpot_ms"]
        series["e2el"] = series["ttft"] + (lat.e2el_s - lat.ttft_s) / scale * anchor["mean_tpot_ms"]
    gpus = cal.observation.tensor_parallel * conf.engines
    out["output_throughput_per_gpu"] = out["output_throughput"] / gpus
    for m in LATENCIES:
        values = series[m]
        out[f"mean_{m}_ms"] = float(values.mean()) * 1e3
        for q, v in zip((50, 90, 99), np.percentile(values, (50, 90, 99)), strict=True):
            out[f"p{q}_{m}_ms"] = float(v) * 1e3
    out["tokens_per_user"] = 1e3 / out["mean_tpot_ms"] if out["mean_tpot_ms"] > 0 else math.inf
    return out


# A request's time outside the engine's steps varies as a sum of a few waits does (gamma of this shape: its p99 2.8x
# its mean), not as one queue's (exponential, p99 4.6x): of shapes 1, 3 and 5 on the six recorded sweeps, 3 put the
# goodput under a p99 TTFT bound nearest the measured (+1 to +13 %; 1: -15 to +7 %, 5: +1 to +22 %). In-sample.
FRONTEND_SEED, FRONTEND_SHAPE = 2, 3.0


def _engine_step_s(r: SimResult, lat: Latencies) -> float:
    """The engine's step at the simulated rate, as the requests saw it: their mean TPOT; where no request had a
    second token, a step with no prompt's tokens, else any step (the run's time over its steps)."""
    tpot = float(lat.tpot_s.mean()) if len(lat.tpot_s) else math.nan
    if math.isfinite(tpot) and tpot > 0:
        return tpot
    if math.isfinite(r.decode_step_s) and r.decode_step_s > 0:
        return r.decode_step_s
    return r.elapsed_s / r.steps if r.steps else 0.0


def _waits(n: int) -> np.ndarray:
    """n waits of mean 1, gamma of FRONTEND_SHAPE (a fixed seed; scaled to mean 1 exactly, as arrivals' gaps are)."""
    draws = np.random.default_rng(FRONTEND_SEED).gamma(FRONTEND_SHAPE, 1.0 / FRONTEND_SHAPE, n)
    return draws / draws.mean() if n else draws


QUEUE_GROWTH = 2.0, 0.1  # a queue grows where the last quarter's median TTFT exceeds the first's x2 + 0.1 s


def keeps_up(p: Point) -> bool:
    """Whether the server keeps up with the rate: past its capacity the queue grows through the run, and what a
    finite run's percentiles say then depends on how long it was."""
    return p.queue_growth_s <= 0.0

def _meets(values: dict[str, float], bounds: list[Any]) -> bool:
    return all(b.holds(values[b.metric]) for b in bounds)


def _goodput(cal: Calibrated, conf: Configured, points: list[Point], bounds: list[Any], spread: float,
             prompts: int | None) -> dict[str, Any]:
    """The largest rate the server keeps up with while meeting every bound: on the predicted curve (bisected between
    the last point that does and the next), and on the curves of the ranges' pessimistic and optimistic ends
    (interpolated between points)."""
    rates = [p.rate or 0.0 for p in points]

    def good(p: Point) -> bool:
        return keeps_up(p) and _meets(p.predicted, bounds)

    def edge(values: list[dict[str, float]], end: int) -> float:
        # the server keeps up at a range's end where the simulation with every cost at that end does (`_through`)
        kept = [p.growth_ends[end] <= 0.0 for p in points]
        ok = [i for i, v in enumerate(values) if kept[i] and _meets(v, bounds)]
        if not ok:
            return 0.0
        i = ok[-1]
        if i + 1 >= len(values) or not kept[i + 1]:
            return rates[i]
        # where the first bound to fail crosses, linearly between the two rates
        f = min((_crossing(b, values[i][b.metric], values[i + 1][b.metric]) for b in bounds
                 if not b.holds(values[i + 1][b.metric])), default=1.0)
        return rates[i] + f * (rates[i + 1] - rates[i])

    ok = [i for i, p in enumerate(points) if good(p)]
    if not ok:
        first = points[0]
        failed = next((f"{b.metric}{b.op}{b.value:g}" for b in bounds if not b.holds(first.predicted[b.metric])),
                      "capacity")
        return {"rate": 0.0, "low": 0.0, "high": edge([_optimistic(p, bounds) for p in points], 0), "binding": failed}
    if ok[-1] + 1 >= len(points):
        rate, failing = rates[ok[-1]], None
    else:
        lo, hi, failing = rates[ok[-1]], rates[ok[-1] + 1], points[ok[-1] + 1]
        for _ in range(BISECT):
            mid = (lo + hi) / 2
            try:
                p = point_at(cal, conf, mid, prompts or _prompts(cal, mid), spread)
            except Infeasible:
                hi = mid
                continue
            if good(p):
                lo = mid
            else:
                hi, failing = mid, p
        rate = lo
    binding = None if failing is None else next(
        (f"{b.metric}{b.op}{b.value:g}" for b in bounds if not b.holds(failing.predicted[b.metric])),
        "capacity")
    return {"rate": rate, "low": min(edge([_pessimistic(p, bounds) for p in points], 1), rate),
            "high": max(edge([_optimistic(p, bounds) for p in points], 0), rate), "binding": binding}


def _crossing(bound: Any, a: float, b: float) -> float:
    """Where between two points (0-1) a metric moving from `a` (holds) to `b` (does not) crosses the bound."""
    return min(max((bound.value - a) / (b - a), 0.0), 1.0) if b != a else 0.0


def _pessimistic(p: Point, bounds: list[Any]) -> dict[str, float]:
    """Each bounded metric at the end of its range that meets its bound last (upper bounds: the high end)."""
    return {b.metric: (p.high if b.op in ("<", "<=") else p.low)[b.metric] for b in bounds}


def _optimistic(p: Point, bounds: list[Any]) -> dict[str, float]:
    return {b.metric: (p.low if b.op in ("<", "<=") else p.high)[b.metric] for b in bounds}
