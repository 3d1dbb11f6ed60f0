"""The metrics of a prediction as rows, and a report's prescription laid out once for every format (text lines here;
Markdown and HTML place `prescription_view`'s values): what limits the run, each change with what it trades, each
metric before, predicted, its range and change."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.units import change_from, change_to, direction_word

NAMES = {"request_throughput": ("requests/s", "{:,.2f}"), "output_throughput": ("output tokens/s", "{:,.0f}"),
         "mean_ttft_ms": ("mean TTFT (ms)", "{:,.0f}"), "mean_tpot_ms": ("mean TPOT (ms)", "{:,.1f}")}


def fmt_metric(name: str, value: float | None) -> str:
    return "-" if value is None else NAMES[name][1].format(value)


def metric_rows(predicted: dict[str, Any]) -> list[dict[str, str]]:
    rows = []
    for name, m in predicted.items():
        if name not in NAMES:
            continue
        before, mid = m.get("before"), m.get("predicted")
        change = (f"{(mid / before - 1) * 100:+.0f}% {direction_word(name, before, mid)}".rstrip()
                  if before and mid is not None else "-")
        rows.append({"metric": NAMES[name][0], "before": fmt_metric(name, before),
                     "predicted": fmt_metric(name, mid), "change": change,
                     "range": f"{fmt_metric(name, m.get('low'))} - {fmt_metric(name, m.get('high'))}"})
    return rows


def metric_table(rows: list[dict[str, str]]) -> list[str]:
    cols = ("metric", "before", "predicted", "range", "change")
    widths = {c: max([len(c), *(len(terminal(r[c])) for r in rows)]) for c in cols}
    lines = ["  " + "  ".join(c.ljust(widths[c]) for c in cols).rstrip()]
    lines += ["  " + "  ".join(terminal(r[c]).ljust(widths[c]) for c in cols).rstrip() for r in rows]
    return lines


def prescription_view(report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's lead: what limits the run, and the one prescription with its predicted effect (None: the report
    has none)."""
    p = report.get("prescription")
    if not p:
        return None
    predicted = p.get("predicted") or {}
    changes = [{"flag": c["flag"], "from": change_from(c), "to": change_to(c), "trades": c.get("trades")}
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
    out += metric_table(v["rows"])
    out.append(f"  then the limit: {terminal(v['limit_after'] or '?')}; answers {terminal(', '.join(v['answers']))}")
    out += [f"  - {terminal(r)}" for r in v["reasoning"]]
    return out + [""]
