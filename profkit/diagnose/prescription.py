"""One prescription per report: the findings say which levers apply, the model of the run chooses their values and
keeps only those predicted to help more than the noise, as one set of changes that do not conflict.

Each candidate is a finding's change (the rule's value) or a value the model tries for the same lever (the flag
removed: vLLM's default; the FP8 pair together); each is predicted alone, then the best are combined greedily while
the combination keeps gaining more than the noise. The result names the limit before and after, each change with
its predicted effect and range, what it trades (precision), the findings it answers, and the reasoning."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from profkit.diagnose.engine import Finding
from profkit.diagnose.rule_files import SEVERITY_ORDER
from profkit.model.observe import Unobservable, observe
from profkit.model.predict import DEFAULT_NOISE, MODELLED, Calibrated, Prediction, calibrate, predict
from profkit.model.simulate import Infeasible
from profkit.vllm.command import dest_of
from profkit.vllm.options import flag_for

OBJECTIVE = "request_throughput"
# Values the model tries beside the rules' own for a lever a finding names.
TRIED: dict[str, tuple[Any, ...]] = {
    "gpu_memory_utilization": (0.85, 0.9, 0.92),  # up to vLLM's own default: past it, start-up may run out
    "max_num_seqs": (256, 512, 1024),
    "max_num_batched_tokens": (8192, 16384),
    "api_server_count": (2, 4),
}


@dataclass
class Prescription:
    limit: str | None
    changes: list[dict[str, Any]] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    note: str | None = None  # why there is none, or what was left out

    def document(self) -> dict[str, Any]:
        return {"limit": self.limit, "changes": self.changes, "predicted": self.predicted,
                "reasoning": self.reasoning, "answers": self.answers, "note": self.note}


def _candidates(findings: list[Finding], cal: Calibrated) -> dict[tuple[str, Any], list[str]]:
    """(setting, value) -> the rules proposing it (the model's own values for the same levers included)."""
    out: dict[tuple[str, Any], list[str]] = {}
    config = cal.observation.config
    for f in findings:
        for c in f.changes:
            dest = dest_of(c.flag)
            if dest not in MODELLED:
                continue
            to = c.to
            if dest == "kv_cache_memory_bytes" and to is None:
                to = "default"
            if dest in PARALLEL:  # the same GPUs split another way: (GPUs per engine, engines), every split tried
                if _layout(dest, to, cal) is not None:
                    for layout in _layouts(cal):
                        out.setdefault(("parallel", layout), []).append(f.rule)
                continue
            out.setdefault((dest, to), []).append(f.rule)
            for value in TRIED.get(dest, ()):  # the model's own values answer the findings naming the lever
                rules = out.setdefault((dest, value), []) if value != config.get(dest) else None
                if rules is not None and f.rule not in rules:
                    rules.append(f.rule)
    if ("quantization", "fp8") in out or ("kv_cache_dtype", "fp8") in out:
        out.setdefault(("fp8-pair", True), sorted({r for k, v in out.items() if k[1] == "fp8" for r in v}))
    return out


PARALLEL = ("tensor_parallel_size", "data_parallel_size")


def _layout(dest: str, value: Any, cal: Calibrated) -> tuple[int, int] | None:
    """A finding's tensor or data parallel size as a split of the run's own GPUs: (per engine, engines), or None
    where it does not divide them or is the run's own."""
    obs = cal.observation
    gpus = obs.tensor_parallel * obs.data_parallel
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    if n < 1 or gpus % n:
        return None
    layout = (n, gpus // n) if dest == "tensor_parallel_size" else (gpus // n, n)
    return None if layout == (obs.tensor_parallel, obs.data_parallel) else layout


def _same_gpus(changes: dict[str, Any], cal: Calibrated) -> dict[str, Any]:
    """A change of the tensor or data parallel size alone, as the split of the run's own GPUs it means (tune runs
    on the machine the run used: it never asks for more GPUs)."""
    for dest in PARALLEL:
        if dest in changes:
            layout = _layout(dest, changes[dest], cal)
            rest = {k: v for k, v in changes.items() if k not in PARALLEL}
            return rest if layout is None else {**rest, "tensor_parallel_size": layout[0],
                                                "data_parallel_size": layout[1]}
    return changes


def _layouts(cal: Calibrated) -> list[tuple[int, int]]:
    """Every split of the run's GPUs into engines of equal size but its own (4 GPUs: 1x4, 2x2, 4x1)."""
    obs = cal.observation
    gpus = obs.tensor_parallel * obs.data_parallel
    return [(t, gpus // t) for t in range(1, gpus + 1) if gpus % t == 0 and (t, gpus // t) != (obs.tensor_parallel,
                                                                                                obs.data_parallel)]


def _changes(key: tuple[str, Any], cal: Calibrated) -> dict[str, Any]:
    dest, value = key
    if dest == "fp8-pair":
        return {"quantization": "fp8", "kv_cache_dtype": "fp8"}
    if dest == "parallel":
        return {"tensor_parallel_size": value[0], "data_parallel_size": value[1]}
    if dest == "kv_cache_memory_bytes" and value == "default":
        mem = cal.observation.memory
        if mem.total_bytes and mem.weights_bytes:
            return {"kv_cache_memory_bytes": 0.92 * mem.total_bytes - mem.weights_bytes - 0.02 * mem.total_bytes}
        return {}
    return {dest: value}


# The simulated run's duration or time per output token this far (log) from the measured: the model has not
# reproduced the run, and what it predicts for a change is not worth a range (a live window that opens on a backlog,
# traffic the simulation does not have).
FIT_LIMIT = 0.25


def unreproduced(cal: Calibrated) -> str | None:
    """What the fitted model misses by more than FIT_LIMIT, in words; None when it reproduces the run."""
    for key, words in (("elapsed", "duration"), ("tpot", "time per output token")):
        err = cal.fit_error.get(key, 0.0)
        if err > FIT_LIMIT:
            return f"its simulated {words} is off by x{math.exp(err):.2f}"
    return None


def _ratio(m: dict[str, float | None]) -> float:
    """A metric's predicted over its measured value (1: no change, or nothing measured or predicted)."""
    before, after = m.get("before"), m.get("predicted")
    return after / before if before and after is not None else 1.0


def _gain(p: Prediction) -> float:
    m = p.metrics[OBJECTIVE]
    return m["predicted"] / m["before"] - 1 if m["before"] and m["predicted"] else 0.0


def prescribe(doc: dict[str, Any], findings: list[Finding], allow_precision: bool = True,
              noise: float | None = None) -> Prescription | None:
    """The prescription for a report document's run and its findings; None when no finding proposes a lever the
    model knows; a Prescription with only a `note` when the run cannot be modelled."""
    if not any(dest_of(c.flag) in MODELLED for f in findings for c in f.changes):
        return None
    try:
        cal = calibrate(observe(doc))
    except Unobservable as exc:
        return Prescription(limit=None, note=f"no prescription: the model cannot be calibrated on this run ({exc})")
    if (miss := unreproduced(cal)) is not None:
        return Prescription(limit=None, note=f"no prescription: the model does not reproduce this run ({miss})")
    threshold = max(noise if noise is not None else DEFAULT_NOISE, 0.02)
    singles: list[tuple[float, dict[str, Any], list[str], Prediction]] = []
    for key, rules in _candidates(findings, cal).items():
        changes = _changes(key, cal)
        if not changes or (not allow_precision and any(str(v).startswith("fp8") for v in changes.values())):
            continue
        try:
            p = predict(cal, changes, noise=noise)
        except Infeasible:  # the change leaves the cache unable to hold a request: not a prescription
            continue
        singles.append((_gain(p), changes, rules, p))
    singles.sort(key=lambda s: -s[0])
    chosen, answers, best = combine(cal, [(g, changes, rules) for g, changes, rules, _ in singles], threshold, noise)
    if best is None:
        top = singles[0] if singles else None
        left = (f"; the best single change ({_describe(top[1])}) is predicted at {top[0] * 100:+.1f}% "
                f"request throughput") if top else ""
        return Prescription(limit=predict(cal, {}).limit_before, predicted={},
                            note=f"no change is predicted to help more than the noise ({threshold * 100:.0f}%)"
                                 + left)
    return Prescription(
        limit=best.limit_before,
        changes=[{"flag": flag_for(k), "from": cal.observation.config.get(k),
                  "from_source": ((doc.get("vllm") or {}).get("config", {}).get(k) or {}).get("source") or "unknown",
                  "to": v,
                  "trades": "changes model precision (FP8): check accuracy before shipping"
                  if str(v).startswith("fp8") else None} for k, v in chosen.items()],
        predicted={**best.metrics, "limit_after": best.limit_after},
        reasoning=best.reasoning, answers=answers)


def combine(cal: Calibrated, singles: list[tuple[float, dict[str, Any], list[str]]], threshold: float,
            noise: float | None = None) -> tuple[dict[str, Any], list[str], Prediction | None]:
    """Changes predicted alone ((gain, {dest: value}, rules), best first) combined greedily: each joins while the
    combination, predicted as a whole, gains more than the noise over the set without it and touches no lever
    already chosen. Returns the changes, the rules they answer and the combination's prediction (None: nothing
    helps beyond the noise)."""
    chosen: dict[str, Any] = {}
    answers: list[str] = []
    best: Prediction | None = None
    gain = 0.0
    for g, changes, rules in singles:
        if g < threshold or any(k in chosen for k in changes):
            continue
        trial = {**chosen, **changes}
        try:
            p = predict(cal, _resolved(trial, cal), noise=noise)
        except Infeasible:
            continue
        if _gain(p) - gain >= threshold:
            chosen, gain, best = trial, _gain(p), p
            answers += [r for r in rules if r not in answers]
    return chosen, answers, best


def _describe(changes: dict[str, Any]) -> str:
    return " ".join(f"{flag_for(k)} {v}" for k, v in changes.items())


# --- tune: the model orders the candidates and picks their values ----------------------------------------------

def choose_values(cal: Calibrated, changes: dict[str, Any], noise: float | None = None) -> tuple[dict[str, Any],
                                                                                               Prediction]:
    """The candidate's changes with each modelled lever's value chosen by the model among the rule's own and the
    values it tries for that lever (a misstep is undone fully, not stepped); and the prediction for them."""
    chosen = dict(changes)
    for dest in [k for k in changes if k in TRIED]:
        options = [changes[dest], *TRIED[dest]]
        scored = []
        for value in dict.fromkeys(options):
            trial = {**chosen, dest: value}
            try:
                scored.append((_gain(predict(cal, _resolved(trial, cal), noise=noise)), value))
            except Infeasible:
                continue
        if scored:
            chosen[dest] = max(scored, key=lambda s: s[0])[1]
    return chosen, predict(cal, _resolved(chosen, cal), noise=noise)


def _resolved(changes: dict[str, Any], cal: Calibrated) -> dict[str, Any]:
    """A removed --kv-cache-memory-bytes as the bytes vLLM's default budget leaves the cache."""
    if changes.get("kv_cache_memory_bytes", 0) is None:
        return {**{k: v for k, v in changes.items() if k != "kv_cache_memory_bytes"},
                **_changes(("kv_cache_memory_bytes", "default"), cal)}
    return changes


def rank_candidates(doc: dict[str, Any], queue: list[dict[str, Any]], objective: str,
                    noise: float | None = None) -> list[dict[str, Any]]:
    """Tune's candidates (each {"rule", "changes": [{"flag", "to", ...}], ...}) ordered by the model's predicted
    gain of `objective`, their modelled values chosen by the model, each with its prediction; a candidate
    predicted within the noise is marked `skip`. Unchanged (no prediction) where the run cannot be modelled or
    the objective is not one the model predicts."""
    if objective not in ("request_throughput", "output_throughput"):
        return queue
    try:
        cal = calibrate(observe(doc))
    except Unobservable:
        return queue
    threshold = max(noise if noise is not None else DEFAULT_NOISE, 0.02)
    ranked: list[tuple[float | None, dict[str, Any]]] = []
    for cand in queue:
        changes = _same_gpus({dest_of(c["flag"]): c.get("to") for c in cand["changes"]}, cal)
        if not set(changes) & MODELLED or set(changes) - MODELLED:
            ranked.append((None, cand))  # a lever the model cannot predict: tried after the predicted ones
            continue
        try:
            chosen, p = choose_values(cal, changes, noise)
        except Infeasible:
            ranked.append((None, cand))
            continue
        m = p.metrics[objective]
        gain = _ratio(m) - 1
        new_changes = [{**c, "to": chosen[dest_of(c["flag"])],
                        **({"model_chose": True} if chosen[dest_of(c["flag"])] != c.get("to") else {})}
                       for c in cand["changes"]]
        given = {dest_of(c["flag"]) for c in cand["changes"]}
        new_changes += [{"flag": flag_for(k), "to": v, "action": "set", "model_chose": True,
                         "why": "the same GPUs split the other way"} for k, v in chosen.items() if k not in given]
        ranked.append((gain, {**cand, "changes": new_changes, "skip": gain < threshold,
                              "predicted": {**m, "gain": gain, "limit_after": p.limit_after}}))
    predicted = sorted(((g, c) for g, c in ranked if g is not None), key=lambda r: -r[0])
    together = _together(cal, [c for _, c in predicted], objective, threshold, noise)
    return together + [c for _, c in predicted] + [c for g, c in ranked if g is None]


def _together(cal: Calibrated, ranked: list[dict[str, Any]], objective: str, threshold: float,
              noise: float | None) -> list[dict[str, Any]]:
    """The candidates the model predicts to help, combined as one jump (the prescription, within what tune may
    change) when together they are predicted to gain more than the best alone by more than the noise: one server
    start reaches what several single steps would. Empty when no such combination exists."""
    helping = [c for c in ranked if not c["skip"]]
    if len(helping) < 2:
        return []
    singles = [(c["predicted"]["gain"], {dest_of(ch["flag"]): ch["to"] for ch in c["changes"]}, [c["rule"]])
               for c in helping]
    chosen, rules, p = combine(cal, singles, threshold, noise)
    if p is None or len(rules) < 2:
        return []
    m = p.metrics[objective]
    gain = _ratio(m) - 1
    if gain - helping[0]["predicted"]["gain"] < threshold:
        return []
    members = [c for c in helping if c["rule"] in rules]
    changes = [ch for c in members for ch in c["changes"] if dest_of(ch["flag"]) in chosen]
    return [{"rule": "prescription", "severity": min((c["severity"] for c in members), key=SEVERITY_ORDER.__getitem__),
             "changes": changes, "gain": gain, "answers": rules,
             "undoes": "; ".join(c["undoes"] for c in members if c.get("undoes")) or None,
             "order": f"the model's prescription: {len(rules)} findings' changes together ({', '.join(rules)})",
             "skip": False, "predicted": {**m, "gain": gain, "limit_after": p.limit_after}}]

