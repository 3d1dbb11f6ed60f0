"""`profkit sweep`'s result (`profkit.sweep/1`) in the terminal: each rate's measured figures beside the model's; and
two sweeps compared (`profkit.sweep-diff/1`, `profkit diff SWEEP SWEEP`) in the terminal and Markdown."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, markdown, terminal
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
    if g.get("per_replicate"):
        measured += f" (each replicate alone: {', '.join(_one_replicate(r) for r in g['per_replicate'])})"
    line = f"  goodput within {terminal(g['bound'])}: measured {measured}"
    p = g.get("predicted")
    if p:
        line += f", predicted {p['rate']:,.2f} (range {p['low']:,.2f}-{p['high']:,.2f})"
        if g.get("error") is not None:
            line += f": {g['error'] * 100:+.0f}%"
        if g.get("inside_range") is not None:
            line += f"{':' if g.get('error') is None else ','} {'inside' if g['inside_range'] else 'outside'} the range"
    return line


def _one_replicate(r: dict[str, Any]) -> str:
    if "measured" in r:
        return f"{r['measured']:,.2f}"
    return f">= {r['at_least']:,.2f}" if "at_least" in r else f"< {r['below']:,.2f}"


def _diff_cell(row: dict[str, Any], key: str, side: int) -> str:
    """One side's figure (* where that sweep did not measure the rate: read between its neighbours)."""
    value = row["before" if side == 0 else "after"].get(key)
    return "-" if value is None else figure(value) + ("" if row["measured"][side] else "*")


def _diff_change(row: dict[str, Any], key: str) -> str:
    c = row["change"].get(key)
    if c is None:
        return "-"
    return f"{c * 100:+.0f}%" + ("~" if row["within_noise"].get(key) else "")


def _diff_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["rate", *(name for name, _ in COLUMNS)]
    rows = [[f"{r['rate']:g}", *(f"{_diff_cell(r, k, 0)} → {_diff_cell(r, k, 1)} ({_diff_change(r, k)})"
                                 for _, k in COLUMNS)] for r in doc["rows"]]
    return header, rows


def _diff_goodput(g: dict[str, Any]) -> str:
    def side(s: dict[str, Any]) -> str:
        if s["measured"] is not None:
            return f"{s['measured']:,.2f}"
        if s.get("at_least") is not None:
            return f">= {s['at_least']:,.2f}"
        if s.get("below") is not None:
            return f"< {s['below']:,.2f}"
        return "-"

    change = f" ({g['change'] * 100:+.0f}%)" if g.get("change") is not None else ""
    return f"goodput within {g['bound']}: {side(g['before'])} → {side(g['after'])} req/s{change}"


def _diff_sides(doc: dict[str, Any]) -> list[str]:
    out = []
    for name in ("before", "after"):
        s = doc[name]
        runs = sorted(set(s["replicates"]))
        each = "-".join(str(r) for r in (runs[0], runs[-1])) if len(runs) > 1 else str(runs[0])
        out.append(f"{name}: {s['folder']} ({len(s['rates'])} rate(s), {each} run(s) each)")
    return out


DIFF_NOTE = ("before → after (change; ~ within the noise: {noise:.0f} % or the points' replicate spread); * a rate "
             "that sweep did not measure, read between its two neighbours")


def sweep_diff_text(doc: dict[str, Any]) -> str:
    out = ["profkit diff: two sweeps", *("  " + terminal(line) for line in _diff_sides(doc)),
           "  " + DIFF_NOTE.format(noise=doc["noise"] * 100)]
    header, rows = _diff_rows(doc)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    out.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    if not rows:
        out.append("  (the two sweeps measured no rate in common range)")
    out += ["  " + terminal(_diff_goodput(g)) for g in doc["goodput"]]
    return document("\n".join(out) + "\n")


def sweep_diff_markdown(doc: dict[str, Any]) -> str:
    out = ["# profkit diff: two sweeps", "", *(f"- {markdown(line)}" for line in _diff_sides(doc)), "",
           DIFF_NOTE.format(noise=doc["noise"] * 100), ""]
    header, rows = _diff_rows(doc)
    out += ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    out += ["| " + " | ".join(markdown(c) for c in r) + " |" for r in rows]
    if doc["goodput"]:
        out += ["", *(f"- {markdown(_diff_goodput(g))}" for g in doc["goodput"])]
    return "\n".join(out) + "\n"
