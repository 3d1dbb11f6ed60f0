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
        change = "-"
        if before and mid is not None:
            pct = (mid / before - 1) * 100
            moved = round(pct) != 0  # a move that rounds to 0 % is none (not "-0% WORSE")
            change = f"{pct if moved else 0.0:+.0f}% {direction_word(name, before, mid if moved else before)}".rstrip()
        rows.append({"metric": NAMES[name][0], "before": fmt_metric(name, before),
                     "predicted": fmt_metric(name, mid), "change": change,
                     "range": f"{fmt_metric(name, m.get('low'))} - {fmt_metric(name, m.get('high'))}"})
    return rows


def validation_line(v: dict[str, Any] | None) -> str | None:
    """What the ranges carry, in one sentence: the held-out errors of the recorded pairs sharing a class of change,
    how often such ranges held, and the classes no held-out recording validates (extrapolated)."""
    if not v:
        return None
    low, high = v["error_range"]
    coverage = v["coverage"]
    said = []
    if v["extrapolated"]:
        said.append(f"extrapolated: no held-out recording validates a change of {', '.join(v['extrapolated'])}")
    if v["pairs"]:
        said.append(f"ranges widened to the errors of {v['pairs']} held-out recorded pair(s) sharing a class of change "
                    f"({', '.join(v['classes'])}; request throughput measured {low * 100:+.0f}% to {high * 100:+.0f}% "
                    "of predicted)"
                    + (f": {coverage['inside']} of {coverage['rows']} held-out predictions fell inside their range "
                       "(each built leaving its own recordings out)" if coverage["rows"] else ""))
    else:
        said.append("the ranges are the model's own")
    return "; ".join(said)


def metric_table(rows: list[dict[str, str]]) -> list[str]:
    cols = ("metric", "before", "predicted", "range", "change")
    widths = {c: max([len(c), *(len(terminal(r[c])) for r in rows)]) for c in cols}
    lines = ["  " + "  ".join(c.ljust(widths[c]) for c in cols).rstrip()]
    lines += ["  " + "  ".join(terminal(r[c]).ljust(widths[c]) for c in cols).rstrip() for r in rows]
    return lines


def prescription_view(report: dict[str, Any]) -> dict[str, Any] | None:
    """The report's lead: the verdict (what limits the run), and the one prescription the model chose with its
    predicted effect, the best without a precision change beside it, and the findings' changes it cannot predict
    (None: a report without a verdict, made before profkit had one)."""
    p = report.get("prescription") or {}
    verdict = report.get("verdict") or ({"limit": p.get("limit"), "by": "the model of the run"} if p else None)
    if verdict is None:
        return None
    if verdict.get("by") == "the model of the run":
        headline = f"the limit is {verdict['limit']}"
    elif verdict.get("limit"):
        headline = f"{verdict['limit']} (the leading finding)"
    else:
        headline = "no rule fired on this run"
    if verdict.get("gpu"):
        headline += f"; the GPU: {verdict['gpu']}"
    predicted = p.get("predicted") or {}
    alt = p.get("alternative")
    return {"headline": headline, "note": p.get("note"), "changes": _changes(p.get("changes") or []),
            "limit_after": predicted.get("limit_after"),
            "rows": metric_rows({k: v for k, v in predicted.items() if isinstance(v, dict)}),
            "reasoning": list(p.get("reasoning") or []), "answers": list(p.get("answers") or []),
            "validation": validation_line(predicted.get("validation")),
            "alternative": None if not alt else {
                "changes": _changes(alt["changes"]), "trade": alt.get("trade"),
                "rows": metric_rows({k: v for k, v in alt["predicted"].items() if isinstance(v, dict)}),
                "limit_after": alt["predicted"].get("limit_after"),
                "validation": validation_line(alt["predicted"].get("validation"))},
            "unpredicted": [{"flag": u["flag"], "to": change_to(u), "rule": u["rule"], "why": u.get("why", "")}
                            for u in p.get("unpredicted") or []]}


def _changes(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"flag": c["flag"], "from": change_from(c), "to": change_to(c), "trades": c.get("trades"),
             "answers": ", ".join(c.get("answers") or [])} for c in changes]
