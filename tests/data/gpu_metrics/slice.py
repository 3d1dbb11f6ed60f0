"""Cut an nsys SQLite export with GPU metrics down to a test fixture: a short span of it, every table kept.

    python tests/data/gpu_metrics/slice.py EXPORT.sqlite OUT.sqlite [--start-ns T] [--span-ns N] [--max-rows R]
        [--whole TABLE ...] [--drop TABLE ...] [--every K] [--series PATTERN ...]
    xz -9 -k OUT.sqlite

The span starts at --start-ns (default: the first GPU_METRICS sample inside a kernel, else the first sample) and
lasts --span-ns (default 200 ms), shortened so that GPU_METRICS keeps at most --max-rows rows (default 200,000),
cut between two sample times. In the copy, every table of the export is created with its own DDL; tables with
`start`/`end` columns keep the rows overlapping the span (kernels, memory copies, API calls, NVTX ranges), tables
with a `timestamp` column the rows inside it (GPU_METRICS), every other table (TARGET_INFO_*, META_DATA_*,
StringIds, ENUM_*) all its rows. A table named by --whole keeps all its rows (NVTX_EVENTS: every engine step's
annotation; GPU_METRICS: the whole run's samples, and --max-rows no longer shortens the span), one named by --drop
none. --every K keeps every K-th GPU_METRICS sample time, --series only the series whose names match a LIKE
pattern. The original is opened read-only; the copy is written fresh and vacuumed.
"""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path
from urllib.parse import quote


def first_busy_sample(src: sqlite3.Connection, tables: set[str]) -> int:
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        row = src.execute("SELECT min(g.timestamp) FROM GPU_METRICS g WHERE EXISTS (SELECT 1 FROM "
                          "CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.start <= g.timestamp AND k.end >= g.timestamp)"
                          ).fetchone()
        if row[0] is not None:
            return int(row[0])
    return int(src.execute("SELECT min(timestamp) FROM GPU_METRICS").fetchone()[0])


def span_end(src: sqlite3.Connection, start: int, span: int, max_rows: int) -> int:
    """The end of the span: start + span, or earlier, before the sample time at which max_rows would be passed."""
    row = src.execute("SELECT timestamp FROM GPU_METRICS WHERE timestamp BETWEEN ? AND ? ORDER BY timestamp "
                      "LIMIT 1 OFFSET ?", (start, start + span, max_rows)).fetchone()
    return start + span if row is None else int(row[0]) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--start-ns", type=int)
    parser.add_argument("--span-ns", type=int, default=200_000_000)
    parser.add_argument("--max-rows", type=int, default=200_000)
    parser.add_argument("--whole", action="append", default=[], metavar="TABLE")
    parser.add_argument("--drop", action="append", default=[], metavar="TABLE")
    parser.add_argument("--every", type=int, default=1, help="keep every K-th GPU_METRICS sample time")
    parser.add_argument("--series", action="append", default=[], metavar="PATTERN",
                        help="keep the GPU_METRICS series whose name is LIKE this (default: all)")
    args = parser.parse_args()
    if args.out.exists():
        parser.error(f"{args.out} exists")
    source_uri = f"file:{quote(str(args.export.resolve()))}?mode=ro"
    src = sqlite3.connect(source_uri, uri=True)
    tables = {name: sql for name, sql in src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                                                     "AND name NOT LIKE 'sqlite_%'")}
    if "GPU_METRICS" not in tables:
        raise SystemExit(f"{args.export}: no GPU_METRICS table")
    start = args.start_ns if args.start_ns is not None else first_busy_sample(src, set(tables))
    end = start + args.span_ns if "GPU_METRICS" in args.whole else span_end(src, start, args.span_ns, args.max_rows)
    src.close()

    out = sqlite3.connect(f"file:{quote(str(args.out.resolve()))}?mode=rwc", uri=True)  # URI: ATTACH reads one too
    out.execute("ATTACH DATABASE ? AS src", (source_uri,))
    for name, sql in tables.items():
        out.execute(sql)
        if name in args.drop:
            continue
        columns = {r[1] for r in out.execute(f'PRAGMA src.table_info("{name}")')}
        where = []
        if name in args.whole:
            pass
        elif {"start", "end"} <= columns:
            where.append(f"start <= {end} AND (end >= {start} OR end IS NULL)")
        elif "timestamp" in columns:
            where.append(f"timestamp BETWEEN {start} AND {end}")
        if name == "GPU_METRICS" and args.series:
            like = " OR ".join(f"metricName LIKE '{p.replace(chr(39), chr(39) * 2)}'" for p in args.series)
            where.append(f"metricId IN (SELECT metricId FROM src.TARGET_INFO_GPU_METRICS WHERE {like})")
        if name == "GPU_METRICS" and args.every > 1:
            where.append(f"timestamp IN (SELECT timestamp FROM (SELECT timestamp, row_number() OVER (ORDER BY "
                         f"timestamp) AS n FROM (SELECT DISTINCT timestamp FROM src.GPU_METRICS)) "
                         f"WHERE n % {args.every} = 1)")
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        out.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}" {clause}')
    out.commit()
    out.execute("DETACH DATABASE src")
    out.execute("VACUUM")
    out.close()
    print(f"{args.out}: span {start}..{end} ns")


if __name__ == "__main__":
    main()
