"""The prediction (`profkit.prediction/1`) and a report's prescription, laid out once for every format: each metric
measured, predicted and its range, the limit before and after, the reasoning, what the change trades, the flags the
model does not know, and how well the model fitted the run it was calibrated on. Values are formatted here; the
templates only place them."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, terminal

NAMES = {"request_throughput": ("requests/s", "{:,.2f}"), "output_throughput": ("output tokens/s", "{:,.0f}"),
         "ttft_mean_ms": ("mean TTFT (ms)", "{:,.0f}"), "tpot_mean_ms": ("mean TPOT (ms)", "{:,.1f}")}


def _fmt(name: str, value: float | None) -> str:
    return "-" if value is None else NAMES[name][1].format(value)


def metric_rows(predicted: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for name, m in predicted.items():
        if name not in NAMES:
            continue
        before, mid = m.get("before"), m.get("predicted")
        change = f"{(mid / before - 1) * 100:+.0f}%" if before and mid is not None else "-"
        rows.append({"metric": NAMES[name][0], "before": _fmt(name, before), "predicted": _fmt(name, mid),
                     "range": f"{_fmt(name, m.get('low'))} - {_fmt(name, m.get('high'))}", "change": change})
    return rows


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
        "unmodelled": list(doc.get("unmodelled") or []),
        "fit": (f"calibrated on the run ({fit.get('calibrated_on')}): simulated vs measured {fitted}" if fitted
                else fit.get("calibrated_on")),
        "source": (doc.get("source") or {}).get("path"),
    }


def _table(rows: list[dict[str, str]]) -> list[str]:
    cols = ("metric", "before", "predicted", "range", "change")
    widths = {c: max([len(c), *(len(terminal(r[c])) for r in rows)]) for c in cols}
    lines = ["  " + "  ".join(c.ljust(widths[c]) for c in cols).rstrip()]
    lines += ["  " + "  ".join(terminal(r[c]).ljust(widths[c]) for c in cols).rstrip() for r in rows]
    return lines


def search_rows(doc: dict[str, Any]) -> list[dict[str, str]]:
    """`--search`'s configurations, best first: the changes, each metric predicted (its range), the limit after."""
    rows = []
    for i, p in enumerate(doc.get("search") or [], 1):
        m = p.get("metrics") or {}
        rt, ttft, tpot = (m.get(k) or {} for k in ("request_throughput", "ttft_mean_ms", "tpot_mean_ms"))
        rows.append({"rank": str(i), "changes": p.get("changes_text") or "",
                     "requests/s": f"{_fmt('request_throughput', rt.get('predicted'))} "
                                   f"({_fmt('request_throughput', rt.get('low'))}-"
                                   f"{_fmt('request_throughput', rt.get('high'))})",
                     "mean TTFT (ms)": _fmt("ttft_mean_ms", ttft.get("predicted")),
                     "mean TPOT (ms)": _fmt("tpot_mean_ms", tpot.get("predicted")),
                     "limit after": (p.get("limit") or {}).get("after") or "",
                     "trades": "; ".join(p.get("trades") or [])})
    return rows


def _search_text(doc: dict[str, Any]) -> str:
    rows = search_rows(doc)
    out = [f"profkit predict --search: {terminal((doc.get('source') or {}).get('path') or '')}",
           f"  {len(rows)} configuration(s), best predicted request throughput first:", ""]
    for r in rows:
        out.append(f"  {r['rank']}. {terminal(r['changes'])}")
        out.append(f"     requests/s {r['requests/s']}; mean TTFT {r['mean TTFT (ms)']} ms; mean TPOT "
                   f"{r['mean TPOT (ms)']} ms; limit: {terminal(r['limit after'])}"
                   + (f"; {terminal(r['trades'])}" if r["trades"] else ""))
    if not rows:
        out.append("  none meets the constraints")
    return document("\n".join(out) + "\n")


def render_prediction_text(doc: dict[str, Any]) -> str:
    if "search" in doc:
        return _search_text(doc)
    v = prediction_view(doc)
    out = [f"profkit predict: {terminal(v['source'] or '')}", f"  changes: {terminal(v['changes'])}",
           f"  limit: {terminal(v['limit_before'])} -> {terminal(v['limit_after'])}", ""]
    out += _table(v["rows"])
    out += ["", "Why:"] + [f"  - {terminal(r)}" for r in v["reasoning"]]
    if v["trades"]:
        out += ["Trades:"] + [f"  - {terminal(t)}" for t in v["trades"]]
    if v["unmodelled"]:
        out += [f"Not modelled (no prediction for these): {terminal(', '.join(v['unmodelled']))}"]
    if v["fit"]:
        out += [f"Model: {terminal(v['fit'])}"]
    return document("\n".join(out) + "\n")


def render_prediction_markdown(doc: dict[str, Any]) -> str:
    from profkit.render import markdown

    if "search" in doc:
        return document(markdown.environment().get_template("prediction.md.j2").render(
            v=None, rows=search_rows(doc), source=(doc.get("source") or {}).get("path")))

    return document(markdown.environment().get_template("prediction.md.j2").render(v=prediction_view(doc)))


def render_prediction_html(doc: dict[str, Any]) -> str:
    from profkit.render import html

    if "search" in doc:
        return document(html.environment().get_template("prediction.html.j2").render(
            v=None, rows=search_rows(doc), source=(doc.get("source") or {}).get("path")))

    return document(html.environment().get_template("prediction.html.j2").render(v=prediction_view(doc)))


def prescription_view(report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's lead: what limits the run, and the one prescription with its predicted effect (None: the report
    has none)."""
    p = report.get("prescription")
    if not p:
        return None
    predicted = p.get("predicted") or {}
    changes = [{"flag": c["flag"], "from": "(default)" if c.get("from") is None else str(c["from"]),
                "to": "(removed)" if c.get("to") is None else str(c["to"]), "trades": c.get("trades")}
               for c in p.get("changes") or []]
    return {"limit": p.get("limit"), "limit_after": predicted.get("limit_after"), "changes": changes,
            "rows": metric_rows({k: v for k, v in predicted.items() if isinstance(v, dict)}),
            "reasoning": list(p.get("reasoning") or []), "answers": list(p.get("answers") or []),
            "note": p.get("note")}


def prescription_lines(report: dict[str, Any]) -> list[str]:
    """The prescription as the text report leads with it."""
    v = prescription_view(report)
    if v is None:
        return []
    out = [f"Verdict: the limit is {terminal(v['limit'] or 'not modelled')}"]
    if v["note"]:
        return [*out, f"  {terminal(v['note'])}", ""]
    out.append("Prescription (the model of this run chose these values and predicts):")
    out += [f"  {terminal(c['flag'])} {terminal(c['from'])} -> {terminal(c['to'])}"
            + (f"  [{terminal(c['trades'])}]" if c["trades"] else "") for c in v["changes"]]
    out += _table(v["rows"])
    out.append(f"  then the limit: {terminal(v['limit_after'] or '?')}; answers {terminal(', '.join(v['answers']))}")
    out += [f"  - {terminal(r)}" for r in v["reasoning"]]
    return out + [""]
