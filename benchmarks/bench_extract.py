"""How fast can the columns the analyses need leave an nsys export? Evidence for the columnar core (issue 13).

On a replicated trace (see bench_report.py) it times, each in a fresh process, best of `--repeat`:

* floors: the kernel `GROUP BY demangledName` and one count/sum scan of each table the report reads;
* extraction of the report's integer columns (kernels: 7, CUDA API: 5) into numpy arrays
  - with plain sqlite3 (rows to Python, then numpy: the fallback every install has),
  - with Apache Arrow's ADBC SQLite driver (`adbc-driver-sqlite` + `pyarrow`, where installed),
    over 1 and 2 threads on rowid halves (the driver releases the GIL), and with CASTs that make any
    column an integer (what a broken export would need) to show what type safety costs.

    python benchmarks/bench_extract.py --trace /tmp/bench/x17.sqlite [--repeat 2]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
COLUMNS = {
    KERNEL: "start, end, deviceId, streamId, correlationId, demangledName, graphNodeId IS NOT NULL",
    RUNTIME: "start, end, correlationId, nameId, ((globalTid >> 24) & 16777215)",
}
CAST = {
    KERNEL: ", ".join(f"CAST({c} AS INTEGER)" for c in ("start", "end", "deviceId", "streamId", "correlationId",
                                                        "demangledName")) + ", graphNodeId IS NOT NULL",
    RUNTIME: ", ".join(f"CAST({c} AS INTEGER)" for c in ("start", "end", "correlationId", "nameId"))
    + ", ((globalTid >> 24) & 16777215)",
}

# Every column of both tables through one ADBC connection; EXPRS names the column expressions (COLS or CASTS).
ADBC_ONE_THREAD = """
import adbc_driver_sqlite.dbapi as ad
c = ad.connect(URI_ADBC); cur = c.cursor()
for t, cols in EXPRS.items():
    cur.execute(f"SELECT {{cols}} FROM {{t}}"); tb = cur.fetch_arrow_table()
    [col.to_numpy() for col in tb.columns]
"""

CASES = {
    "floor: kernel GROUP BY name": """
import sqlite3
c = sqlite3.connect(URI, uri=True)
c.execute("SELECT demangledName, count(*), sum(end - start) FROM {K} GROUP BY demangledName").fetchall()
""",
    "floor: count/sum scan, kernels + API": """
import sqlite3
c = sqlite3.connect(URI, uri=True)
for t in ("{K}", "{R}"):
    c.execute(f"SELECT count(*), sum(end - start) FROM {{t}}").fetchall()
""",
    "sqlite3 rows -> numpy, kernels + API": """
import sqlite3, numpy as np
c = sqlite3.connect(URI, uri=True)
for t, cols in COLS.items():
    np.array(c.execute(f"SELECT {{cols}} FROM {{t}}").fetchall(), dtype=np.int64)
""",
    "ADBC -> numpy, kernels + API, 1 thread": ADBC_ONE_THREAD.replace("EXPRS", "COLS"),
    "ADBC -> numpy, kernels + API, 2 threads": """
from concurrent.futures import ThreadPoolExecutor
import adbc_driver_sqlite.dbapi as ad, sqlite3
n = {{t: sqlite3.connect(URI, uri=True).execute(f"SELECT max(rowid) FROM {{t}}").fetchone()[0] for t in COLS}}
def part(t, lo, hi):
    c = ad.connect(URI_ADBC); cur = c.cursor()
    cur.execute(f"SELECT {{COLS[t]}} FROM {{t}} WHERE rowid > {{lo}} AND rowid <= {{hi}}")
    return [col.to_numpy() for col in cur.fetch_arrow_table().columns]
with ThreadPoolExecutor(2) as pool:
    list(pool.map(lambda a: part(*a), [(t, k * n[t] // 2, (k + 1) * n[t] // 2) for t in COLS for k in (0, 1)]))
""",
    "ADBC -> numpy with CASTs, 1 thread": ADBC_ONE_THREAD.replace("EXPRS", "CASTS"),
    "import pyarrow + ADBC driver": """
import adbc_driver_sqlite.dbapi
""",
    "import pandas": """
import pandas
""",
}


def timed(code: str) -> float | None:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode:
        return None  # e.g. ADBC not installed
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    path = args.trace.resolve()
    prelude = (f"URI = 'file:{path}?mode=ro&immutable=1'; URI_ADBC = URI; COLS = {COLUMNS!r}; "
               f"CASTS = {CAST!r}\n")
    start = timed("pass") or 0.0  # the interpreter's own start, taken off every case
    print(f"| case ({path.name}) | seconds |\n|---|---:|")
    for name, body in CASES.items():
        runs = [timed(prelude + body.format(K=KERNEL, R=RUNTIME)) for _ in range(args.repeat)]
        best = min((r for r in runs if r is not None), default=None)
        print(f"| {name} | {'n/a' if best is None else f'{best - start:.2f}'} |")


if __name__ == "__main__":
    main()
