"""The prediction (`profkit.prediction/1`) and a report's prescription, laid out once for every format: each metric
measured, predicted and its range, the limit before and after, the reasoning, what the change trades, the flags the
model does not know, and how well the model fitted the run it was calibrated on. Values are formatted here; the
templates only place them."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, terminal
from profkit.render.frontier_words import ANCHORED, frontier_notes
from profkit.render.prescription import fmt_metric, metric_rows, metric_table, validation_line
from profkit.units import figure


def prediction_view(doc: dict[str, Any]) -> dict[str, Any]:
    fit = doc.get("calibration") or {}
    errors = fit.get("fit_error") or {}
    fitted = ", ".join(f"{k} {v * 100:.1f}%" for k, v in errors.items())
    return {
        "changes": doc.get("changes_text") or " ".join(f"--{k.replace('_', '-')} {v}" for k, v in
                                                      (doc.get("changes") or {}).items()),
        "rows": metric_rows(doc.get("metrics") or {}),
        "limit_before": (doc.get("limit") or {}).get("before"), "limit_after": (doc.get("limit") or {}).get("after"),
        "reasoning": list(doc.get("reasoning") or []), "trades": list(doc.get("trades") or []),
        "validation": validation_line(doc.get("validation")),
        "fit": (f"calibrated on the run ({fit.get('calibrated_on')}): simulated vs measured {fitted}" if fitted
                else fit.get("calibrated_on")),
        "source": (doc.get("source") or {}).get("path") or "the evidence given (no run folder or trace)",
    }


def search_rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    """`--search`'s configurations, best first: the changes, each metric predicted (its range), the limit after."""
    rows = []
    for i, p in enumerate(doc.get("search") or [], 1):
        m = p.get("metrics") or {}
        rt, ttft, tpot = (m.get(k) or {} for k in ("request_throughput", "mean_ttft_ms", "mean_tpot_ms"))
        rows.append({"rank": str(i), "changes": p.get("changes_text") or "",
                     "requests/s": f"{fmt_metric('request_throughput', rt.get('predicted'))} "
                                   f"({fmt_metric('request_throughput', rt.get('low'))}-"
                                   f"{fmt_metric('request_throughput', rt.get('high'))})",
                     "mean TTFT (ms)": fmt_metric("mean_ttft_ms", ttft.get("predicted")),
                     "mean TPOT (ms)": fmt_metric("mean_tpot_ms", tpot.get("predicted")),
                     "limit after": (p.get("limit") or {}).get("after") or "",
                     "trades": "; ".join(p.get("trades") or []),
                     "goodput": _goodput_cell(p.get("goodput"))})
    return rows


def _goodput_cell(good: dict[str, Any] | None) -> str:
    if good is None:
        return ""
    return f"{figure(good['rate'])} ({figure(good['low'])}-{figure(good['high'])})" if good["rate"] > 0 else "none"


def _search_view(doc: dict[str, Any]) -> dict[str, Any]:
    closest = search_rows({"search": [doc["closest"]]})[0] if doc.get("closest") else None
    rows = search_rows(doc)
    return {"rows": rows, "source": (doc.get("source") or {}).get("path"),
            "bounds": ", ".join(doc.get("bounds") or []), "closest": closest, "order": _order(doc),
            "left_out": LEFT_OUT, "goodputs": any(r["goodput"] for r in rows)}


# why a search lists fewer configurations than --top asks (model.search._simplest, _pruned)
LEFT_OUT = "a configuration that predicts what one with fewer changes does (every metric within 0.5 %) is left out"


def _order(doc: dict[str, Any]) -> str:
    return ("best predicted goodput first (the largest request rate served within the latency bounds)"
            if doc.get("ranked_by") == "goodput" else "best predicted request throughput first")


def _search_text(doc: dict[str, Any]) -> str:
    rows = search_rows(doc)
    bounds = ", ".join(doc.get("bounds") or [])
    out = [f"profkit predict --search: {terminal((doc.get('source') or {}).get('path') or '')}",
           f"  {len(rows)} configuration(s)" + (f" within {terminal(bounds)}" if bounds else "")
           + f", {_order(doc)}; {LEFT_OUT}:", ""]
    for r in rows:
        out.append(f"  {r['rank']}. {terminal(r['changes'])}")
        out.append((f"     goodput {r['goodput']} req/s; " if r["goodput"] else "     ")
                   + f"requests/s {r['requests/s']}; mean TTFT {r['mean TTFT (ms)']} ms; mean TPOT "
                   f"{r['mean TPOT (ms)']} ms; limit: {terminal(r['limit after'])}"
                   + (f"; {terminal(r['trades'])}" if r["trades"] else ""))
    if not rows:
        out.append(f"  none meets {terminal(bounds) or 'the constraints'}")
        if doc.get("closest"):
            c = search_rows({"search": [doc["closest"]]})[0]
            out.append(f"  the closest: {terminal(c['changes'])}: requests/s {c['requests/s']}; mean TTFT "
                       f"{c['mean TTFT (ms)']} ms; mean TPOT {c['mean TPOT (ms)']} ms")
    return document("\n".join(out) + "\n")


FRONTIER_COLUMNS = (("rate (req/s)", None), ("req/s", "request_throughput"),
                    ("tok/s per GPU", "output_throughput_per_gpu"), ("tok/s per user", "tokens_per_user"),
                    ("TTFT p50", "p50_ttft_ms"), ("p90", "p90_ttft_ms"), ("p99", "p99_ttft_ms"),
                    ("TPOT p50", "p50_tpot_ms"), ("p90", "p90_tpot_ms"), ("p99", "p99_tpot_ms"),
                    ("E2E p50", "p50_e2el_ms"), ("p99", "p99_e2el_ms"))


def _beyond(binding: str | None) -> str:
    # "capacity" in the JSON: the server stops keeping up, which at a rate can lie above the throughput with every
    # request at once (fewer in flight: a KV-bound run preempts less), so the words say what happens instead
    if binding is None:
        return "; the highest rate simulated (it may keep up beyond)"
    return "; beyond it the server falls behind (its queue grows)" if binding == "capacity" \
        else f"; beyond it {binding} fails"


def frontier_view(doc: dict[str, Any]) -> dict[str, Any]:
    """`--frontier`'s curve as rows (latencies in ms), its capacity and goodput in words."""
    f = doc["frontier"]

    def row(p: dict[str, Any]) -> list[str]:
        m = p["metrics"]
        return ["all at once" if p["rate"] is None else figure(p["rate"]),
                *(figure(m[k]["predicted"]) for _, k in FRONTIER_COLUMNS[1:])]

    cap = f["capacity"]["metrics"]
    rt, out = cap["request_throughput"], cap["output_throughput_per_gpu"]
    good = f.get("goodput")
    bounds = ", ".join(f.get("bounds") or [])
    goodput = None
    if good:
        goodput = (f"within {bounds}: {figure(good['rate'])} req/s (range {figure(good['low'])}-{figure(good['high'])})"
                   + _beyond(good.get("binding")) if good["rate"] > 0
                   else f"within {bounds}: none (at the lowest rate "
                        + ("the server falls behind)" if good.get("binding") == "capacity"
                           else f"{good.get('binding')} fails)"))
    return {"source": (doc.get("source") or {}).get("path") or "the evidence given",
            "changes": doc.get("changes_text") or "", "header": [c for c, _ in FRONTIER_COLUMNS],
            "rows": [row(p) for p in f["points"]] + [row(f["capacity"])],
            "capacity": f"{figure(rt['predicted'])} req/s (range {figure(rt['low'])}-{figure(rt['high'])}), "
                        f"{figure(out['predicted'])} output tok/s per GPU ({f['gpus']} GPU(s)); {ANCHORED}",
            "goodput": goodput, "notes": frontier_notes(f)}


def _frontier_text(doc: dict[str, Any]) -> str:
    v = frontier_view(doc)
    widths = [max(len(h), *(len(r[i]) for r in v["rows"])) for i, h in enumerate(v["header"])]
    out = [f"profkit predict --frontier: {terminal(v['source'])}", f"  changes: {terminal(v['changes'])}",
           f"  every request at once: {v['capacity']}"]
    if v["goodput"]:
        out.append(f"  goodput {terminal(v['goodput'])}")
    out += [f"  {terminal(n)}" for n in v["notes"]]
    out += ["", "  latencies in ms; each rate's prompts sent over at least 30 s, as a sweep's run would", ""]
    out.append("  " + "  ".join(h.rjust(w) for h, w in zip(v["header"], widths, strict=True)))
    out += ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in v["rows"]]
    return document("\n".join(out) + "\n")


def render_prediction_text(doc: dict[str, Any]) -> str:
    if "frontier" in doc:
        return _frontier_text(doc)
    if "search" in doc:
        return _search_text(doc)
    v = prediction_view(doc)
    out = [f"profkit predict: {terminal(v['source'] or '')}", f"  changes: {terminal(v['changes'])}",
           f"  limit: {terminal(v['limit_before'])} -> {terminal(v['limit_after'])}", ""]
    out += metric_table(v["rows"])
    if v["validation"]:
        out += [f"  {terminal(v['validation'])}"]
    out += ["", "Why:"] + [f"  - {terminal(r)}" for r in v["reasoning"]]
    if v["trades"]:
        out += ["Trades:"] + [f"  - {terminal(t)}" for t in v["trades"]]
    if v["fit"]:
        out += [f"Model: {terminal(v['fit'])}"]
    return document("\n".join(out) + "\n")


def render_prediction_markdown(doc: dict[str, Any]) -> str:
    from profkit.render import markdown

    if "frontier" in doc:
        return document(markdown.environment().get_template("prediction.md.j2").render(
            v=None, f=frontier_view(doc)))
    if "search" in doc:
        return document(markdown.environment().get_template("prediction.md.j2").render(
            v=None, **_search_view(doc)))

    return document(markdown.environment().get_template("prediction.md.j2").render(v=prediction_view(doc)))


def render_prediction_html(doc: dict[str, Any]) -> str:
    from profkit.render import html

    if "frontier" in doc:
        return document(html.environment().get_template("prediction.html.j2").render(
            v=None, f=frontier_view(doc)))
    if "search" in doc:
        return document(html.environment().get_template("prediction.html.j2").render(
            v=None, **_search_view(doc)))

    return document(html.environment().get_template("prediction.html.j2").render(v=prediction_view(doc)))
