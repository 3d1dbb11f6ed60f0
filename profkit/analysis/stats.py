"""Duration statistics per group, as nsys stats reports them (count, total, avg, median, min, max, stddev).

SQLite reduces millions of events to a histogram of (group, value, count) in one GROUP BY; the
histogram is small (durations repeat), so the exact median and a numerically stable standard
deviation are computed from it with pandas instead of sorting the events a second time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profkit.traces.model import Trace

STAT_COLUMNS = ["count", "total", "avg", "median", "min", "max", "stddev"]


def histogram(trace: Trace, source_sql: str, keys: list[str], params: dict[str, Any] | None = None,
              value: str = "dur", extras: dict[str, str] | None = None) -> pd.DataFrame:
    """(keys..., value, c, extras...) rows: how many events of each group had each value."""
    extra_sql = "".join(f", sum({expr}) AS {name}" for name, expr in (extras or {}).items())
    key_sql = ", ".join(keys)
    sql = (f"SELECT {key_sql}, {value} AS v, count(*) AS c{extra_sql} FROM ({source_sql}) "
           f"GROUP BY {key_sql}, {value}")
    return pd.read_sql_query(sql, trace.conn, params=params or {})


def summarize(hist: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per-group count/total/avg/median/min/max/stddev from a histogram (sample stddev, as nsys)."""
    if hist.empty:
        return pd.DataFrame(columns=keys + STAT_COLUMNS)
    h = hist.sort_values(keys + ["v"], kind="stable").reset_index(drop=True)
    h["vc"] = h["v"] * h["c"]
    g = h.groupby(keys, sort=False, dropna=False)
    out = g.agg(count=("c", "sum"), total=("vc", "sum"), min=("v", "min"), max=("v", "max"))
    out["avg"] = out["total"] / out["count"]

    # Exact median: the value(s) at rank (n+1)//2 and n//2+1 of each group's sorted values.
    h["cum"] = g["c"].cumsum()
    n = h[keys].merge(out["count"].reset_index(), on=keys, how="left")["count"].to_numpy()
    lo_rank, hi_rank = (n + 1) // 2, n // 2 + 1
    lo = h[h["cum"].to_numpy() >= lo_rank].groupby(keys, sort=False, dropna=False)["v"].first()
    hi = h[h["cum"].to_numpy() >= hi_rank].groupby(keys, sort=False, dropna=False)["v"].first()
    out["median"] = (lo + hi) / 2

    # Two-pass variance over the histogram: no catastrophic cancellation for long, steady events.
    mean = h[keys].merge(out["avg"].reset_index(), on=keys, how="left")["avg"].to_numpy()
    h["sq"] = h["c"] * (h["v"].to_numpy() - mean) ** 2
    ss = h.groupby(keys, sort=False, dropna=False)["sq"].sum()
    denom = (out["count"] - 1).where(out["count"] > 1, 1)
    out["stddev"] = np.sqrt(ss / denom).where(out["count"] > 1, 0.0)
    out = out.reset_index()
    for col in ("count", "total", "min", "max"):
        out[col] = out[col].astype("int64")
    return out[keys + STAT_COLUMNS + [c for c in out.columns if c not in keys + STAT_COLUMNS]]


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """DataFrame rows as JSON-ready dicts (numpy scalars to Python, NaN to None)."""
    clean = df.astype(object).where(pd.notna(df), None)
    out = []
    for row in clean.to_dict(orient="records"):
        out.append({k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
    return out
