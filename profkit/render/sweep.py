"""`profkit sweep`'s result (`profkit.sweep/1`) in the terminal: each rate's measured figures beside the model's."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, terminal
from profkit.units import figure

COLUMNS = (("req/s", "request_throughput"), ("TTFT p50", "p50_ttft_ms"), ("TTFT p99", "p99_ttft_ms"),
           ("TPOT p50", "p50_tpot_ms"), ("TPOT p99", "p99_tpot_ms"), ("E2E p99", "p99_e2el_ms"))



def _cell(p: dict[str, Any], key: str) -> str:
    measured = figure(p["measured"].get(key))
    pred = (p.get("predicted") or {}).get(key)
    if pred is None:
        return measured
    if key not in (p.get("error") or {}):  # not measured at this point: the prediction alone
        return f"{measured} / {figure(pred['predicted'])}"
    inside = "" if (p.get("inside_range") or {}).get(key) else "!"
    return f"{measured} / {figure(pred['predicted'])}{inside} ({p['error'][key] * 100:+.0f}%)"


def sweep_text(doc: dict[str, Any]) -> str:
    predicted = any("predicted" in p for p in doc["points"])
    took = (f", {doc['seconds']:.0f} s with the server's start-up ({doc.get('startup_s', 0):.0f} s)"
            if doc.get("seconds") is not None else "")  # a folder read again without its sweep.json: not known
    out = [f"profkit sweep: {terminal(doc['folder'])}: {len(doc['points'])} rate(s){took}"]
    if predicted:
        err = doc.get("median_abs_error")
        out.append("  measured / predicted (error; ! outside the predicted range); latencies in ms"
                   + (f"; median |error| {err * 100:.0f} %" if err is not None else ""))
    header = ["rate", "runs", *(c for c, _ in COLUMNS)]
    rows = [[f"{p['rate']:g}", str(p["replicates"]), *(_cell(p, k) for _, k in COLUMNS)] for p in doc["points"]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    out += [_goodput_line(g) for g in doc.get("goodput") or []]
    if doc.get("benchmark_s") is not None:
        runs = sum(p["replicates"] for p in doc["points"])
        out.append(f"  GPU time: {doc['benchmark_s']:,.0f} s of benchmarks ({runs} run(s))"
                   + (f" after a start-up of {doc['startup_s']:,.0f} s" if doc.get("startup_s") is not None else ""))
    return document("\n".join(out) + "\n")


def _goodput_line(g: dict[str, Any]) -> str:
    """A bound's goodput, measured beside predicted; a measurement whose points all met the bound is a floor."""
    if g["measured"] is not None:
        measured = f"{g['measured']:,.2f} req/s"
    elif g.get("at_least") is not None:
        measured = f"{g['at_least']:,.2f} req/s or more (every rate measured met it)"
    elif g.get("below") is not None:
        measured = f"below {g['below']:,.2f} req/s (the lowest rate measured missed it)"
    else:
        measured = "- (not measured)"
    line = f"  goodput within {terminal(g['bound'])}: measured {measured}"
    p = g.get("predicted")
    if p:
        line += f", predicted {p['rate']:,.2f} (range {p['low']:,.2f}-{p['high']:,.2f})"
        if g.get("error") is not None:
            line += f": {g['error'] * 100:+.0f}%"
        if g.get("inside_range") is not None:
            line += f"{':' if g.get('error') is None else ','} {'inside' if g['inside_range'] else 'outside'} the range"
    return line
