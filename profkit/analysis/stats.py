"""Duration statistics per group, as nsys stats reports them (count, total, avg, median, min, max, stddev).

SQLite reduces millions of events to a histogram of (group, value, count); the histogram is small
(durations repeat), so the exact median and a numerically stable standard deviation are computed
from it with pandas instead of sorting the events a second time.
"""

from __future__ import annotations

import itertools
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


_table_ids = itertools.count()


def id_histogram(trace: Trace, source_sql: str, key: str, params: dict[str, Any] | None = None,
                 value: str = "dur", extras: dict[str, str] | None = None) -> pd.DataFrame:
    """`histogram` for one integer id key (name ids), in a single pass without a sort.

    SQLite groups by sorting every input row; its only hash-like structure is a b-tree. Packing
    (key, value) into one integer and counting with an upsert into a rowid table touches a b-tree
    of distinct values (tens of thousands) instead of sorting millions of rows: 1.7x faster on
    the CUDA API table. A row the packing cannot hold exactly (negative or huge value, NULL key)
    is counted under key -1; if there is any, the plain GROUP BY runs instead.
    """
    extras = extras or {}
    # Name ids are string-table ids: their bound is one rowid seek. Values get the remaining bits.
    max_id = trace.query("SELECT id FROM strings ORDER BY id DESC LIMIT 1")
    key_bits = int(max_id[0][0]).bit_length() if max_id and isinstance(max_id[0][0], int) else 31
    scale = 1 << (62 - max(1, key_bits))
    table = f"temp.id_hist_{next(_table_ids)}"
    cols = "".join(f", {name} INTEGER" for name in extras)
    inserts = "".join(f", {name}" for name in extras)
    selects = "".join(f", {expr}" for expr in extras.values())
    updates = "".join(f", {name} = {name} + excluded.{name}" for name in extras)
    try:
        trace.conn.execute(f"CREATE TABLE {table} (pk INTEGER PRIMARY KEY, c INTEGER{cols})")
        trace.conn.execute(
            f"""INSERT INTO {table} (pk, c{inserts})
                SELECT CASE WHEN {key} >= 0 AND {value} >= 0 AND {value} < {scale}
                            THEN {key} * {scale} + {value} ELSE -1 END, 1{selects}
                FROM ({source_sql}) WHERE true
                ON CONFLICT(pk) DO UPDATE SET c = c + 1{updates}""",
            params or {},
        )
        if not trace.query(f"SELECT 1 FROM {table} WHERE pk = -1"):
            return pd.read_sql_query(
                f"SELECT pk / {scale} AS {key}, pk % {scale} AS v, c{inserts} FROM {table} ORDER BY pk",
                trace.conn)
    finally:
        trace.conn.execute(f"DROP TABLE IF EXISTS {table}")
    return histogram(trace, source_sql, [key], params, value=value, extras=extras)


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
