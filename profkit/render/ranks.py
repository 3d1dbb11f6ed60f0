"""The rank table of a multi-GPU report, joined once for every format (text, Markdown, HTML)."""

from __future__ import annotations

from typing import Any


def rank_table(report: dict[str, Any]) -> dict[str, Any] | None:
    """`rows`: each entry of the report's `ranks` with `wait_ns` and `last_share` added, its wait in the matched
    collectives and the share of them it arrived last in (`imbalance.collectives.ranks`; None where the rank
    has none); `waits`: whether the collectives were matched at all (the table shows those columns). None for
    a report of one GPU."""
    ranks = report.get("ranks")
    if not ranks:
        return None
    collectives = (report.get("imbalance") or {}).get("collectives") or {}
    waits = {str(w["rank"]): w for w in collectives.get("ranks", [])}
    rows = [{**r, "wait_ns": waits[str(r["rank"])]["wait_ns"] if str(r["rank"]) in waits else None,
             "last_share": waits[str(r["rank"])]["last_share"] if str(r["rank"]) in waits else None}
            for r in ranks]
    return {"rows": rows, "waits": bool(waits)}
