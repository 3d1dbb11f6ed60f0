"""Many rank traces, one report: `--jobs N` local processes against `--jobs 1`, and the Dask path's overhead.

The traces are the real vLLM worker trace of the fixtures (`h100_vllm/torch_profile/rank0.*`) grown to
`--copies` back-to-back copies (`bench_torch.replicate`), written `--ranks` times as rank0..rankN-1 (each
its own `distributedInfo` rank), so every rank has the same work. Each case is one `profkit report` process
over all of them (`--window all --format json`), best of `--repeat`:

* `--jobs 1`: the traces one after another in one process;
* `--jobs N`: one process per trace, N at once;
* `--dask`: a `distributed.LocalCluster` of N one-thread worker processes, started before the timing (an
  existing cluster, as in use), each trace one task.

    python benchmarks/bench_ranks.py [--ranks 8] [--copies 4] [--repeat 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_torch import DEFAULT_FIXTURE, replicate  # noqa: E402


def rank_copies(base: Path, ranks: int, out: Path) -> list[Path]:
    """`ranks` copies of the trace, each saying its own rank (distributedInfo) as torch writes it."""
    with gzip.open(base, "rt") as f:
        doc = json.load(f)
    paths = []
    for r in range(ranks):
        doc["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": ranks}
        p = out / f"rank{r}.bench.pt.trace.json.gz"
        with gzip.open(p, "wt", compresslevel=1) as f:
            json.dump(doc, f)
        paths.append(p)
    return paths


def timed(args: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "profkit.cli", "report", *args, "--window", "all", "--format", "json"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="profkit-bench-ranks-"))
    work.mkdir(parents=True, exist_ok=True)
    base = work / "base.json.gz"
    if not base.exists():
        replicate(args.fixture, args.copies, base)
    paths = [str(p) for p in rank_copies(base, args.ranks, work)]
    size = sum(Path(p).stat().st_size for p in paths) / 1e6
    rows = [("one trace (rank 0)", timed(paths[:1], args.repeat)),
            ("--jobs 1", timed([*paths, "--jobs", "1"], args.repeat)),
            (f"--jobs {args.ranks}", timed([*paths, "--jobs", str(args.ranks)], args.repeat))]
    try:
        from distributed import LocalCluster
    except ImportError:
        LocalCluster = None  # noqa: N806
    if LocalCluster is not None:
        with LocalCluster(n_workers=args.ranks, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster:
            rows.append((f"--dask (LocalCluster, {args.ranks} workers)",
                         timed([*paths, "--dask", cluster.scheduler_address], args.repeat)))
    print(f"{args.ranks} rank traces of {args.copies} copies each ({size:.0f} MB gzip in all)")
    print("| case | wall s | vs --jobs 1 |\n|---|---:|---:|")
    serial = rows[1][1]
    for name, s in rows:
        print(f"| {name} | {s:.2f} | {serial / s:.2f}x |")


if __name__ == "__main__":
    main()
