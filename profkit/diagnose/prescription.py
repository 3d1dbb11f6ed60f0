"""One prescription per report, led by the model of the run: its search over every lever it knows, combined
(`profkit.model.search`), chooses the changes and their values; the findings explain them.

The prescription names the limit before and after (the verdict), each change with the findings whose evidence supports
it, its predicted effect with a range, and the reasoning. Where the best configuration changes the model's precision
(FP8), the best without such a change is given beside it, and the trade named. A rule's change on a lever the model
does not know is listed apart, unpredicted. Where nothing the model knows is predicted to help more than the noise, the
verdict says so and names the limit; where the model cannot be calibrated on the run, the leading finding is the
verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from profkit.diagnose.engine import Finding
from profkit.model import levers
from profkit.model.frontier import REPORT_SHARES, frontier
from profkit.model.observe import Unobservable, observe
from profkit.model.predict import DEFAULT_NOISE, Calibrated, Prediction, calibrate, predict
from profkit.model.refusals import unreproduced
from profkit.model.search import ranked
from profkit.vllm.command import dest_of
from profkit.vllm.options import flag_for

OBJECTIVE = "request_throughput"
PRECISION_TRADE = "changes model precision (FP8): check accuracy before shipping"


@dataclass
class Prescription:
    limit: str | None
    changes: list[dict[str, Any]] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    note: str | None = None  # why there is none, or what holds it back
    unpredicted: list[dict[str, Any]] = field(default_factory=list)  # rules' changes on levers the model lacks
    alternative: dict[str, Any] | None = None  # the best without a precision change, where the best has one
    frontier: dict[str, Any] | None = None  # {"before", "after"}: profkit.model.frontier documents

    def document(self) -> dict[str, Any]:
        return {"limit": self.limit, "changes": self.changes, "predicted": self.predicted,
                "reasoning": self.reasoning, "answers": self.answers, "note": self.note,
                "unpredicted": self.unpredicted, "alternative": self.alternative, "frontier": self.frontier}


def gain(p: Prediction) -> float:
    """The prediction's relative change of the objective (0: no change or nothing measured)."""
    m = p.metrics[OBJECTIVE]
    before, after = m.get("before"), m.get("predicted")
    return after / before - 1 if before and after is not None else 0.0


def prescribe(doc: dict[str, Any], findings: list[Finding], noise: float | None = None) -> Prescription:
    """The prescription for a report document's vLLM run and its findings (see the module's doc)."""
    try:
        cal = calibrate(observe(doc))
    except Unobservable as exc:
        return Prescription(limit=None, note=f"no prescription: the model cannot be calibrated on this run ({exc})",
                            unpredicted=_unpredicted(findings, set()))
    if (miss := unreproduced(cal)) is not None:
        return Prescription(limit=None, note=f"no prescription: the model does not reproduce this run ({miss})",
                            unpredicted=_unpredicted(findings, set()))
    threshold = max(noise if noise is not None else DEFAULT_NOISE, 0.02)
    base = predict(cal, {})
    found = ranked(cal, allow_precision=True, threshold=threshold, noise=noise)
    chosen = found[0] if found else None
    if chosen is None or chosen.gain() < threshold:
        near = f"; the best it finds ({levers.describe(chosen.changes)}) is predicted at " \
               f"{chosen.gain() * 100:+.1f}% request throughput" if chosen and chosen.changes else ""
        return Prescription(limit=base.limit_before, predicted={},
                            note=f"nothing the model knows is predicted to help more than the noise "
                                 f"({threshold * 100:.0f}%){near}", unpredicted=_unpredicted(findings, set()))
    safe = next((f for f in found if not set(f.changes) & levers.PRECISION), None)
    p = chosen.prediction
    alternative = None
    if set(chosen.changes) & levers.PRECISION and safe is not None and safe.gain() >= threshold:
        ap = safe.prediction
        alternative = {"changes": _described(safe.changes, cal, doc, findings),
                       "predicted": {**ap.metrics, "limit_after": ap.limit_after, "validation": ap.validation},
                       # the precision's own gain: over the safe change's throughput, not the baseline's points
                       "trade": f"{((1 + chosen.gain()) / (1 + safe.gain()) - 1) * 100:+.0f}% request throughput for "
                                "a change of the model's precision"}
    described = _described(chosen.changes, cal, doc, findings)
    return Prescription(
        limit=p.limit_before, changes=described,
        predicted={**p.metrics, "limit_after": p.limit_after, "validation": p.validation},
        reasoning=p.reasoning, answers=sorted({r for c in described for r in c["answers"]}),
        unpredicted=_unpredicted(findings, set(chosen.changes)), alternative=alternative,
        frontier=_frontiers(cal, chosen.changes, noise))


def _frontiers(cal: Calibrated, changes: dict[str, Any], noise: float | None) -> dict[str, Any] | None:
    """The run's frontier before and after the prescription, at a few shares of each capacity (None: an offline
    run, which has no request rate)."""
    try:
        return {side: frontier(cal, c, shares=REPORT_SHARES, noise=noise).document()
                for side, c in (("before", {}), ("after", changes))}
    except ValueError:  # Infeasible too: a configuration the frontier's rates cannot serve
        return None


def _described(changes: dict[str, Any], cal: Calibrated, doc: dict[str, Any],
               findings: list[Finding]) -> list[dict[str, Any]]:
    """Each change as the report writes it: the flag, its value before (and where that came from), after, what it
    trades, and the findings whose evidence supports it (their rules change the same lever)."""
    config = (doc.get("vllm") or {}).get("config", {})
    out = []
    for dest, value in changes.items():
        answers = sorted({f.rule for f in findings for c in f.changes if dest_of(c.flag) == dest}
                         | ({f.rule for f in findings for c in f.changes if dest_of(c.flag) in levers.PARALLEL}
                            if dest in levers.PARALLEL else set()))
        out.append({"flag": flag_for(dest), "from": cal.observation.config.get(dest),
                    "from_source": (config.get(dest) or {}).get("source") or "unknown", "to": value,
                    "default": levers.vllm_default(dest, cal.observation) if value is None else None,
                    "trades": PRECISION_TRADE if dest in levers.PRECISION and str(value).startswith("fp8") else None,
                    "answers": answers})
    return out


def _unpredicted(findings: list[Finding], chosen: set[str]) -> list[dict[str, Any]]:
    """The findings' changes on levers the model does not know: said apart, with no prediction."""
    out: dict[str, dict[str, Any]] = {}
    for f in findings:
        for c in f.changes:
            dest = dest_of(c.flag)
            if dest not in levers.MODELLED and c.flag not in out:
                out[c.flag] = {"flag": c.flag, "to": c.to, "rule": f.rule, "why": c.why}
    return list(out.values())


def verdict(prescription: Prescription | None, findings: list[Finding],
            efficiency: dict[str, Any] | None = None) -> dict[str, Any]:
    """What limits the run, said first in every report: the limit the calibrated model names, else the leading
    finding (a trace alone, a run the model cannot be calibrated on), else that no rule fired. Where the GPU is the
    limit, how close it ran to its compute and bandwidth roofs over the benchmark (vLLM's counters, or the model's
    shape over the trace's window: `efficiency.window`)."""
    gpu = gpu_roof(efficiency)
    if prescription is not None and prescription.limit:
        out = {"limit": prescription.limit, "by": "the model of the run"}
        if "GPU" in prescription.limit and gpu:
            out["gpu"] = gpu
        return out
    if findings:
        return {"limit": findings[0].title, "by": "the leading finding", "rule": findings[0].rule,
                **({"gpu": gpu} if gpu else {})}
    return {"limit": None, "by": None, **({"gpu": gpu} if gpu else {})}


def gpu_roof(efficiency: dict[str, Any] | None) -> str | None:
    """`MFU 32 %, MBU 30 % over 22 s (vLLM's counters): nearer the compute roof`, or None without a window."""
    w = (efficiency or {}).get("window") or {}
    mfu, mbu = w.get("mfu"), w.get("mbu")
    if mfu is None or mbu is None:
        return None
    roof = "compute (the tensor cores' peak)" if mfu >= mbu else "memory bandwidth"
    return (f"MFU {mfu * 100:.0f} %, MBU {mbu * 100:.0f} % over {w.get('seconds') or 0:.0f} s ({w.get('from')}): "
            f"nearer its {roof}")
