"""The report's lead: what limits the run, and the one prescription the model chose with its predicted effect
(`render.prescription.prescription_view`, which predictions share)."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.prescription import metric_table, prescription_view


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    return prescription_view(report)


def text(v: dict[str, Any]) -> list[str]:
    out = [f"Verdict: the limit is {terminal(v['limit'] or 'not modelled')}"]
    if v["note"]:
        return [*out, f"  {terminal(v['note'])}"]
    out.append("Prescription (the model of this run chose these values and predicts):")
    out += [f"  {terminal(c['flag'])} {terminal(c['from'])} -> {terminal(c['to'])}"
            + (f"  [{terminal(c['trades'])}]" if c["trades"] else "") for c in v["changes"]]
    out += metric_table(v["rows"])
    out.append(f"  then the limit: {terminal(v['limit_after'] or '?')}; answers {terminal(', '.join(v['answers']))}")
    return out + [f"  - {terminal(r)}" for r in v["reasoning"]]
