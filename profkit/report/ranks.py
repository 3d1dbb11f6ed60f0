"""Many traces, one report: each rank's trace analysed in parallel, then one set of sections with every rank.

torch.profiler writes one trace per rank of a tensor-parallel run; nsys, one export per node. Each trace is
analysed on its own (`trace_sections`, with its per-device parts) by a local process pool or, with `dask`, as
one task per trace on an existing Dask cluster (as `nsys recipe` fans a multi-node analysis out); the results are
joined here. The joined sections (kernels, timeline, gaps, ...) are those of the first rank, said in
`source.primary`; `ranks` holds every rank's part, from which the report takes the cross-rank `imbalance`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from profkit.analysis.sections import RankPart, TraceSections
from profkit.errors import ProfkitError
from profkit.report.options import ReportOptions
from profkit.report.trace_part import trace_sections
from profkit.resources import process_context

MAX_JOBS = 32


def build_ranks(paths: list[Path], options: ReportOptions, step: Callable[[str], None]) -> TraceSections:
    """The joined sections of several traces (one per rank, or per node holding several GPUs), analysed as
    `options` say (window, gap threshold, buckets; on `jobs` processes or the Dask scheduler at `dask`)."""
    tasks = [(str(p), options.window, options.gap_threshold_ns, options.buckets) for p in paths]
    step(f"{len(tasks)} traces")
    parts = on_dask(options.dask, tasks) if options.dask else on_processes(tasks, options.jobs)
    return join_ranks(parts)


def analyse_rank(path: str, window: str, gap_threshold_ns: int, buckets: int) -> TraceSections:
    """One trace's sections with its per-device (rank) parts: what a worker process or Dask task runs."""
    return trace_sections(path, window, gap_threshold_ns, buckets, ranks=True)


def on_processes(tasks: list[tuple], jobs: int | None) -> list[TraceSections]:
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks), MAX_JOBS))
    if jobs == 1:
        return [analyse_rank(*task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=process_context()) as pool:
        return list(pool.map(analyse_rank, *zip(*tasks, strict=True)))


def on_dask(address: str, tasks: list[tuple]) -> list[TraceSections]:
    """Each trace's analysis as a task on the Dask cluster at `address` (its workers must see the files)."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ProfkitError("--dask needs Dask's distributed scheduler: pip install 'profkit[dask]'") from None
    try:
        client = Client(address, timeout=10)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ProfkitError(f"--dask {address}: no Dask scheduler there ({exc})") from None
    with client:
        futures = client.map(analyse_rank, *zip(*tasks, strict=True), pure=False)
        return client.gather(futures)


def join_ranks(parts: list[TraceSections]) -> TraceSections:
    """One set of sections from the traces': ranks labelled (the trace's distributedInfo rank, else the device
    id, else the file name where those repeat) and ordered, the first rank's sections on top."""
    entries = [(part, rank) for part in parts for rank in part.ranks or []]
    if len({rank.entry.rank for _, rank in entries}) < len(entries):  # e.g. every trace on its device 0
        entries = [(part, _relabel(rank, len(part.ranks or []))) for part, rank in entries]
    entries.sort(key=lambda e: _rank_key(e[1].entry.rank))
    primary = entries[0][0] if entries else parts[0]
    source = {**primary.source, "primary": primary.source["path"], "traces": [part.source["path"] for part in parts]}
    return msgspec.structs.replace(primary, source=source, ranks=[rank for _, rank in entries])


def _relabel(rank: RankPart, ranks_in_trace: int) -> RankPart:
    name = Path(rank.entry.source).name
    label = f"{name}:{rank.entry.device}" if ranks_in_trace > 1 else name
    return msgspec.structs.replace(rank, entry=msgspec.structs.replace(rank.entry, rank=label))


def _rank_key(rank: Any) -> tuple:
    return (0, rank, "") if isinstance(rank, int) else (1, 0, str(rank))
