"""Time `profkit report` on multi-million-kernel nsys traces against a raw-SQL floor.

Two shapes, each grown from a real H100 trace in a temp copy by replicating every CUDA (and OS) table's rows
with shifted times and correlation ids, so the data has real names, real duration distributions and real
API/kernel ratios:
- `throughput` (default): vLLM's offline throughput benchmark with CUDA graphs (thr_graphs: 59k kernels, 193k
  CUDA API calls in 12 s; long busy stretches);
- `serve`: 1 s of `vllm serve` under a rate-inf client, frontend-bound (tests/data/h100_serve_frontend_slice:
  4,704 kernels, 13,378 CUDA API calls, ~700 engine steps, context switches and OS runtime calls): many short
  steps and host gaps, the shape of a real serve trace. 213 copies: 1.0M kernels over 213 s.

For each size the floor is one raw `SELECT demangledName, count(*), sum(end-start) ... GROUP BY
demangledName` over the kernel table, measured in the same run; the report is the full CLI
(`profkit report --window all --format json`, every analysis over every event). Each runs in its
own process so that peak RSS is the process's own. The second floor is the report's irreducible work: the kernel
GROUP BY, the CUDA API GROUP BY, every kernel and memory operation in start order (the idle gaps), and the context
switches, one SQL pass each in its own process, summed.

    python benchmarks/bench_report.py [--fixture PATH.sqlite.xz] [--scales 17,68,272] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import lzma
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPES = {"throughput": (REPO / "tests" / "data" / "fixtures" / "h100_vllm" / "thr_graphs.sqlite.xz", "17,68,272"),
          "serve": (REPO / "tests" / "data" / "h100_serve_frontend_slice.sqlite.xz", "213")}
TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "SCHED_EVENTS",
          "OSRT_API", "CUDA_GRAPH_NODE_EVENTS"]
FLOOR_SQL = ("SELECT demangledName, count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
             "GROUP BY demangledName")
# The report's irreducible work, one SQL pass per table computing only what the report needs, each in its own
# process (issue 41): the kernel summary (the floor above), the CUDA API summary, every kernel and memory operation
# in start order (the GPU's idle gaps: the running maximum of the ends), and the context switches.
# nsys exports its activity tables in start order (the reader checks it): rowid order needs no sort, as the
# report's own reading does not; the few memory operations are merged in a sort of their own.
GAPS = ("SELECT count(*), sum(max(0, start - coalesce(prev, start))) FROM (SELECT start, max(end) OVER (ORDER BY "
        "{order} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM {rel})")
MEMOPS = ("(SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, end FROM "
          "CUPTI_ACTIVITY_KIND_MEMSET)")
IRREDUCIBLE_SQL = {
    "kernels by name": FLOOR_SQL,
    "CUDA API by name": "SELECT nameId, count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY nameId",
    "kernels in start order": GAPS.format(order="rowid", rel="CUPTI_ACTIVITY_KIND_KERNEL"),
    "memory operations in start order": GAPS.format(order="start", rel=MEMOPS),
    "context switches": "SELECT cpu, count(*), min(start), max(start) FROM SCHED_EVENTS GROUP BY cpu",
}


def build_replicated(base: Path, copies: int, out: Path) -> int:
    """Copy `base` to `out` with every CUDA table's rows repeated `copies` times; returns kernel count."""
    shutil.copyfile(base, out)
    conn = sqlite3.connect(out)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    # Shift each copy past the end of every table's events, so each table stays in start order
    # (nsys writes rows sorted by start, and profkit relies on that for the API table).
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    tables = [t for t in TABLES if t in present and conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()]
    ends = {t: "end" in {r[1] for r in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
    lo = min(conn.execute(f"SELECT min(start) FROM {t}").fetchone()[0] for t in tables)
    hi = max(conn.execute(f"SELECT max(max(start), max(coalesce(end, 0))) FROM {t}" if ends[t] else
                          f"SELECT max(start) FROM {t}").fetchone()[0] for t in tables)
    span = hi - lo + 1_000_000
    corr = conn.execute("SELECT max(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    for table in tables:
        cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        n0 = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
        for k in range(1, copies):
            exprs = []
            for c in cols:
                if c in ("start", "end"):
                    exprs.append(f"{c} + {k * span}")
                elif c == "correlationId":
                    exprs.append(f"{c} + {k * corr}")
                else:
                    exprs.append(c)
            conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) SELECT {', '.join(exprs)} FROM {table} "
                         f"WHERE rowid <= {n0}")
        conn.commit()
    kernels = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    conn.close()
    return kernels


def run_measured(cmd: list[str], tree: Path | None = None) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process (profkit imported from `tree` when given)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))} \
        if tree else None
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tree)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss / 1024


def floor_cmd(path: Path, sql: str = FLOOR_SQL) -> list[str]:
    code = (f"import sqlite3; c = sqlite3.connect('file:{path}?mode=ro', uri=True); "
            f"t = {{r[0] for r in c.execute(\"SELECT name FROM sqlite_master\")}}; "
            f"('SCHED_EVENTS' not in {sql!r} or 'SCHED_EVENTS' in t) and c.execute({sql!r}).fetchall()")
    return [sys.executable, "-c", code]


def irreducible(path: Path, repeat: int) -> dict[str, float]:
    """Each irreducible pass's best wall time (its own process, interpreter start included as for the report)."""
    return {name: min(run_measured(floor_cmd(path, sql))[0] for _ in range(repeat))
            for name, sql in IRREDUCIBLE_SQL.items()}


def prepare(fixture: Path, workdir: Path | None) -> tuple[Path, Path]:
    """(work folder, the decompressed fixture in it): reused when the folder already holds it."""
    work = workdir or Path(tempfile.mkdtemp(prefix="profkit-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    base = work / (fixture.name.removesuffix(".xz").removesuffix(".sqlite") + ".base.sqlite")
    if not base.exists():
        with lzma.open(fixture) as src, base.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return work, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="throughput")
    ap.add_argument("--fixture", type=Path, default=None, help="the trace to grow (default: the shape's)")
    ap.add_argument("--scales", default=None, help="copies of the fixture per size (throughput: 17 -> 1.0M "
                                                    "kernels; serve: 213 -> 1.0M)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the grown traces in the work folder (for profiling)")
    ap.add_argument("--baseline", action="append", default=[], metavar="[LABEL=]TREE",
                    help="another profkit source tree (e.g. a worktree of an earlier commit) measured alongside, "
                         "runs interleaved with this tree's (repeatable)")
    args = ap.parse_args()
    fixture, scales = SHAPES[args.shape]
    args.fixture, args.scales = args.fixture or fixture, args.scales or scales
    work, base = prepare(args.fixture, args.workdir)

    rows = []
    for copies in (int(s) for s in args.scales.split(",")):
        path = work / f"{args.shape}_x{copies}.sqlite"
        t0 = time.perf_counter()
        kernels = build_replicated(base, copies, path) if not path.exists() else \
            sqlite3.connect(path).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
        built = time.perf_counter() - t0
        passes = irreducible(path, args.repeat)
        floor, floor2 = passes["kernels by name"], sum(passes.values())
        print(f"irreducible passes x{copies}: " + ", ".join(f"{k} {v:.2f} s" for k, v in passes.items()),
              file=sys.stderr)
        size_mb = path.stat().st_size / 1e6
        trees = [("this tree", None)] + [(b.split("=", 1)[0] if "=" in b else "baseline",
                                          Path(b.split("=", 1)[-1])) for b in args.baseline]
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in trees}
        for _ in range(args.repeat):  # interleaved: each round runs every tree once, so drift hits all alike
            for label, tree in trees:
                runs[label].append(run_measured([sys.executable, "-m", "profkit.cli", "report", str(path), "--window",
                                                 "all", "--format", "json", "-o", str(work / "r.json"),
                                                 "--no-progress"], tree))
        for label, _ in trees:
            walls = sorted(w for w, _ in runs[label])
            rss = max(r for _, r in runs[label])
            rows.append((label, copies, kernels, size_mb, floor, floor2, walls, rss))
        print(f"built x{copies}: {kernels:,} kernels, {size_mb:.0f} MB in {built:.0f} s", file=sys.stderr)
        if not args.keep:
            path.unlink()

    print("| profkit | copies | kernels | SQLite MB | GROUP BY floor s | irreducible floor s | report s (runs) | "
          "best / GROUP BY | best / irreducible | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for label, copies, kernels, size_mb, floor, floor2, walls, rss in rows:
        print(f"| {label} | {copies} | {kernels:,} | {size_mb:.0f} | {floor:.2f} | {floor2:.2f} | "
              f"{' / '.join(f'{w:.2f}' for w in walls)} | {walls[0] / floor:.2f}x | {walls[0] / floor2:.2f}x | "
              f"{rss:.0f} |")


if __name__ == "__main__":
    main()
