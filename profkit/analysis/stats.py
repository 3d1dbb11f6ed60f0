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


def grouped_stats(keys: np.ndarray, values: np.ndarray, key: str = "key",
                  below: int | None = None) -> pd.DataFrame:
    """Exact per-key count/total/avg/median/min/max/stddev of non-negative int64 `values`, from one sort.

    (key, value) pairs are packed into one int64 where they fit (ids and durations do), so a single
    `np.sort` orders every group's values; group bounds are where the key changes, and the order
    statistics are read at offsets. `below`: also count each group's values under this bound (column
    `below`). Sample stddev, two-pass, as nsys stats reports it."""
    columns = [key, *STAT_COLUMNS] + (["below"] if below is not None else [])
    if len(keys) == 0:
        return pd.DataFrame(columns=columns)
    k_lo, k_hi, v_hi = int(keys.min()), int(keys.max()), int(values.max())
    bits = max(1, (k_hi - k_lo).bit_length())
    if int(values.min()) >= 0 and v_hi.bit_length() + bits <= 62:
        shift = v_hi.bit_length()
        packed = np.sort(((keys - k_lo) << shift) | values)
        sk, sv = (packed >> shift) + k_lo, packed & ((1 << shift) - 1)
    else:  # ids or values too wide to share one integer: sort the pairs
        order = np.lexsort((values, keys))
        sk, sv = keys[order], values[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    ends = np.r_[starts[1:], len(sk)]
    count = ends - starts
    total = np.add.reduceat(sv, starts)
    avg = total / count
    median = (sv[starts + (count + 1) // 2 - 1] + sv[starts + count // 2]) / 2
    dev = sv - np.repeat(avg, count)
    ss = np.add.reduceat(dev * dev, starts)
    stddev = np.where(count > 1, np.sqrt(ss / np.maximum(count - 1, 1)), 0.0)
    out = pd.DataFrame({key: sk[starts], "count": count, "total": total, "avg": avg, "median": median,
                        "min": sv[starts], "max": sv[ends - 1], "stddev": stddev})
    if below is not None:
        out["below"] = np.add.reduceat((sv < below).astype(np.int64), starts)
    for col in ("count", "total", "min", "max"):
        out[col] = out[col].astype("int64")
    return out



# Rows per read of `columnar_histogram`: memory stays bounded (a chunk's columns, then its histogram).
CHUNK_ROWS = 1 << 19


def columnar_histogram(trace: Trace, relation: str, key: str, value: str, where: str,
                       params: dict[str, Any] | None = None, extras: dict[str, str] | None = None,
                       chunk_rows: int = CHUNK_ROWS) -> pd.DataFrame | None:
    """`id_histogram` of a large start-ordered relation (kernels, api) from its columns, or None where that
    path does not apply (a small relation, no Arrow driver, an odd value): then the caller counts in SQL.

    The relation is read in seq ranges of `chunk_rows` (each on two threads); each range becomes a
    (key, value) -> count histogram by one packed sort, and the histograms are merged the same way, so
    memory is a chunk plus the distinct pairs. The result equals `id_histogram`'s row for row."""
    from profkit.analysis.seq import seq_bounds
    from profkit.traces.columns import ADBC_MIN_ROWS, NULL_INT, adbc_available, read_columns, relation_source

    span = seq_bounds(trace, relation)
    if span is None or span[1] - span[0] + 1 < ADBC_MIN_ROWS or relation_source(trace, relation) is None \
            or not adbc_available():
        return None
    extras = extras or {}
    keys, values, counts, sums = [], [], [], {name: [] for name in extras}
    for lo in range(span[0], span[1] + 1, chunk_rows):
        hi = min(span[1], lo + chunk_rows - 1)
        cols = read_columns(trace, relation, {"k": key, "v": value, **extras},
                            where=f"({where}) AND seq >= {lo} AND seq <= {hi}", params=params, seq_span=(lo, hi))
        k, v = cols["k"], cols["v"]
        if len(k) and (k.min() < 0 or v.min() < 0 or k.min() == NULL_INT):
            return None  # NULL ids or negative values: the SQL path's grouping handles them
        part = _pairs(k, v, [cols[name] for name in extras])
        if part is None:
            return None
        keys.append(part[0]), values.append(part[1]), counts.append(part[2])
        for name, s in zip(extras, part[3], strict=True):
            sums[name].append(s)
    if not keys:
        return pd.DataFrame({key: [], "v": [], "c": [], **{name: [] for name in extras}}, dtype="int64")
    merged = _pairs(np.concatenate(keys), np.concatenate(values), [np.concatenate(sums[n]) for n in extras],
                    weights=np.concatenate(counts))
    if merged is None:
        return None
    k, v, c, extra = merged
    return pd.DataFrame({key: k, "v": v, "c": c, **dict(zip(extras, extra, strict=True))})


def _pairs(k: np.ndarray, v: np.ndarray, flags: list[np.ndarray], weights: np.ndarray | None = None):
    """Distinct (k, v) pairs in (k, v) order with their counts (or summed `weights`) and the sums of `flags`.

    Without weights (a chunk of events) the flags (0/1 columns) ride in the low bits of the packed integer,
    so one `np.sort` gives all; merging chunk histograms (few rows, weighted) uses `np.unique`."""
    if len(k) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, [empty for _ in flags]
    shift = max(1, int(v.max()).bit_length())
    nb = 0 if weights is not None else len(flags)
    if int(k.max()).bit_length() + shift + nb > 62:
        return None
    packed = (k << shift) | v
    if weights is not None:
        uniq, inverse = np.unique(packed, return_inverse=True)
        count = np.bincount(inverse, weights=weights, minlength=len(uniq)).astype(np.int64)
        summed = [np.bincount(inverse, weights=f, minlength=len(uniq)).astype(np.int64) for f in flags]
        return uniq >> shift, uniq & ((1 << shift) - 1), count, summed
    for f in flags:  # the first flag ends up in bit nb-1, the last in bit 0
        if len(f) and (f.min() < 0 or f.max() > 1):
            return None
        packed = (packed << 1) | f
    packed.sort()
    pair = packed >> nb
    starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    count = np.diff(np.r_[starts, len(pair)])
    summed = [np.add.reduceat((packed >> (nb - 1 - i)) & 1, starts) for i in range(nb)]
    uniq = pair[starts]
    return uniq >> shift, uniq & ((1 << shift) - 1), count, summed
