"""The SLO frontier before and after the prescription: at a few shares of each configuration's simulated capacity,
the request rate it serves and its TTFT and TPOT percentiles (`profkit.model.frontier`; the measured errors of such
predictions are in docs/prediction.md)."""

from __future__ import annotations

from typing import Any

from profkit.render.frontier_words import ANCHORED, gpu_scale_words, missed_by_words
from profkit.render.sections.table import text_table
from profkit.units import figure


def latency_note(f: dict[str, Any]) -> str:
    """What the recorded sweeps measured against the model at a rate, as run and for the prescribed change's class
    (`validation.frontier_misses`, shipped with the model: the numbers move as sweeps are recorded), and the step at a
    rate where it is not the fit's (the run's GPU busy share), as `predict --frontier` says beside its curve."""
    sides = [words for side in ("before", "after") if (words := missed_by_words(f[side].get("missed_by")))]
    said = "; ".join(dict.fromkeys(sides)) if sides else "no recorded sweep says how far the model misses"
    scales = dict.fromkeys(words for side in ("before", "after") if (words := gpu_scale_words(f[side])))
    return ". ".join([f"{said}: read the curves' shapes, and measure the rate you need", *scales])


def _side(f: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in [*f["points"], f["capacity"]]:
        m = {k: v["predicted"] for k, v in p["metrics"].items()}
        out.append({"rate": p["rate"], "served": m["request_throughput"], "ttft_p50": m["p50_ttft_ms"],
                    "ttft_p99": m["p99_ttft_ms"], "tpot_p50": m["p50_tpot_ms"], "tpot_p99": m["p99_tpot_ms"],
                    "keeps_up": p.get("keeps_up", True)})
    return out


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    f = (report.get("prescription") or {}).get("frontier")
    if not f:
        return None
    rows = []
    for side in ("before", "after"):
        for p in _side(f[side]):
            rows.append({"side": "prescribed" if side == "after" else "as run",
                         "rate": "all at once" if p["rate"] is None else figure(p["rate"]),
                         **{k: figure(p[k]) for k in ("served", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")},
                         "note": "" if p["keeps_up"] else "queue grows"})
    caps = {side: f[side]["capacity"]["metrics"]["request_throughput"] for side in ("before", "after")}
    return {"rows": rows, "note": latency_note(f),
            "capacity": f"{figure(caps['before']['predicted'])} → {figure(caps['after']['predicted'])} req/s "
                        f"(range {figure(caps['after']['low'])}-{figure(caps['after']['high'])}; {ANCHORED})",
            "curves": {side: _side(f[side]) for side in ("before", "after")}}


def text(v: dict[str, Any]) -> list[str]:
    out = [f"The frontier, as run and prescribed (predicted; every request at once {v['capacity']}); latencies in ms; "
           f"{v['note']}."]
    out.append(text_table(v["rows"], {
        "config": lambda r: r["side"], "rate (req/s)": lambda r: r["rate"], "served": lambda r: r["served"],
        "TTFT p50": lambda r: r["ttft_p50"], "TTFT p99": lambda r: r["ttft_p99"], "TPOT p50": lambda r: r["tpot_p50"],
        "TPOT p99": lambda r: r["tpot_p99"], "": lambda r: r["note"]}, len(v["rows"])))
    return out
