"""Many traces, one report: each rank's trace analysed in parallel, then one document with a section per rank.

torch.profiler writes one trace per rank of a tensor-parallel run; nsys, one export per node. Each trace is
analysed on its own (`report.build_trace_part`, with its per-device section) by a local process pool or, with
`dask`, as one task per trace on an existing Dask cluster (as `nsys recipe` fans a multi-node analysis
out); the results are joined here. The joined report's trace sections (kernels, timeline, gaps, ...) are
those of the first rank, said in `source.primary`; `ranks` holds every rank's GPU, kernel, category and
communication figures; `report.finish_ranks` adds the cross-rank `imbalance`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.resources import process_context

MAX_JOBS = 32


def build_ranks(paths: list[Path], window: str, gap_threshold_ns: int, buckets: int,
                step: Callable[[str], None], jobs: int | None = None, dask: str | None = None) -> dict[str, Any]:
    """The joined trace sections of several traces (one per rank, or per node holding several GPUs)."""
    tasks = [(str(p), window, gap_threshold_ns, buckets) for p in paths]
    step(f"{len(tasks)} traces")
    parts = on_dask(dask, tasks) if dask else on_processes(tasks, jobs)
    return join_ranks(parts)


def analyse_rank(path: str, window: str, gap_threshold_ns: int, buckets: int) -> dict[str, Any]:
    """One trace's sections with its per-device (rank) section: what a worker process or Dask task runs."""
    from profkit.report import build_trace_part

    return build_trace_part(path, window, gap_threshold_ns, buckets, ranks=True)


def on_processes(tasks: list[tuple], jobs: int | None) -> list[dict[str, Any]]:
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(tasks), MAX_JOBS))
    if jobs == 1:
        return [analyse_rank(*task) for task in tasks]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=process_context()) as pool:
        return list(pool.map(analyse_rank, *zip(*tasks, strict=True)))


def on_dask(address: str, tasks: list[tuple]) -> list[dict[str, Any]]:
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


def join_ranks(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from the traces' sections: ranks labelled (the trace's distributedInfo rank, else the device
    id, else the file name where those repeat) and ordered, the first rank's sections on top."""
    # (trace part, rank entry, the key its collectives have in the part)
    entries = [(part, entry, entry["rank"]) for part in parts for entry in part.get("ranks") or []]
    if len({entry["rank"] for _, entry, _ in entries}) < len(entries):  # e.g. every trace on its device 0
        for part, entry, _ in entries:
            name = Path(entry["source"]).name
            entry["rank"] = f"{name}:{entry['device']}" if len(part["ranks"]) > 1 else name
    entries.sort(key=lambda e: _rank_key(e[1]["rank"]))
    primary = entries[0][0] if entries else parts[0]
    report = {k: v for k, v in primary.items() if not k.startswith("_")}
    report["source"] = {**primary["source"], "primary": primary["source"]["path"],
                        "traces": [part["source"]["path"] for part in parts]}
    report["ranks"] = [entry for _, entry, _ in entries]
    report["_collectives"] = {entry["rank"]: part["_collectives"][key] for part, entry, key in entries}
    report["_window_ns"] = {entry["rank"]: part["_window_ns"][key] for part, entry, key in entries}
    return report


def _rank_key(rank: Any) -> tuple:
    return (0, rank, "") if isinstance(rank, int) else (1, 0, str(rank))
