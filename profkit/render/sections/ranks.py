"""The GPUs of a multi-GPU report (a rank each): busy time, communication and its overlap, the wait in collectives,
the straggler; the rank table joined once for every format."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.sections.table import text_table
from profkit.units import ns, pct


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


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    table = rank_table(report)
    return None if table is None else {**table, "report": report}


def text(v: dict[str, Any]) -> list[str]:
    report, ranks = v["report"], v["rows"]
    src = report["source"]
    out = [f"GPUs ({len(ranks)} ranks)" + (f"; {len(src['traces'])} traces, the sections below are rank "
                                             f"{terminal(str(ranks[0]['rank']))}'s" if src.get("traces") else "")]
    coll = (report.get("imbalance") or {}).get("collectives") or {}
    columns = {"rank": lambda r: terminal(str(r["rank"])), "busy": lambda r: ns(r["gpu"]["busy_ns"]),
               "util": lambda r: pct(r["gpu"]["utilization"]), "kernels": lambda r: ns(r["kernels"]["total_ns"]),
               "communication": lambda r: ns(r["communication"]["total_ns"]),
               "share": lambda r: pct(r["communication"]["share"]),
               "overlapped": lambda r: pct(r["communication"]["overlap_share"])}
    if v["waits"]:
        columns["waits"] = lambda r: ns(r["wait_ns"])
        columns["last"] = lambda r: pct(r["last_share"])
    out.append(text_table(ranks, columns, 64))
    imb = report.get("imbalance")
    if imb:
        out.append(f"  busy time spread {pct(imb['busy_ns']['spread_share'])}")
        if coll:
            straggler = (f"straggler: rank {terminal(str(coll['straggler']['rank']))}, last in "
                         f"{pct(coll['straggler']['last_share'])}" if coll["straggler"] else "no straggler")
            out.append(f"  {coll['collectives']:,} collectives matched (names agree {pct(coll['names_agree'])}); "
                       f"start spread median {ns(coll['spread_ns']['median'])}, p90 {ns(coll['spread_ns']['p90'])}; "
                       f"{straggler}")
    return out
