"""The report's lead: what limits the run, and the one prescription the model chose with its predicted effect
(`render.prescription.prescription_view`, which predictions share)."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.prescription import metric_table, prescription_view


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    return prescription_view(report)


def text(v: dict[str, Any]) -> list[str]:
    out = [f"Verdict: {terminal(v['headline'])}"]
    if v["note"]:
        out.append(f"  {terminal(v['note'])}")
    if v["changes"]:
        out.append("Prescription (the model of this run searched every lever it knows, together, kept each change "
                   "only where it gains more than the noise, and predicts):")
        out += [change_line(c) for c in v["changes"]]
        out += metric_table(v["rows"])
        if v["validation"]:
            out.append(f"  {terminal(v['validation'])}")
        out.append(f"  then the limit: {terminal(v['limit_after'] or '?')}")
        out += [f"  - {terminal(r)}" for r in v["reasoning"]]
    alt = v["alternative"]
    if alt:
        out.append(f"Without a change of precision ({terminal(alt['trade'])}):")
        out += [change_line(c) for c in alt["changes"]]
        out += metric_table(alt["rows"])
        if alt["validation"]:
            out.append(f"  {terminal(alt['validation'])}")
    if v["unpredicted"]:
        out.append("The findings also propose (the model does not know these levers: no prediction):")
        out += [f"  {terminal(u['flag'])} -> {terminal(u['to'])} ({terminal(u['rule'])}: {terminal(u['why'])})"
                for u in v["unpredicted"]]
    return out


def change_line(c: dict[str, Any]) -> str:
    return (f"  {terminal(c['flag'])} {terminal(c['from'])} -> {terminal(c['to'])}"
            + (f"  [{terminal(c['trades'])}]" if c["trades"] else "")
            + (f"  (answers {terminal(c['answers'])})" if c["answers"] else ""))
