"""How a report is built (`ReportOptions`): its own module, so that the rank reports (ranks.py) and the single one
(build.py) both take it without importing each other."""

from __future__ import annotations

from pathlib import Path

import msgspec


class ReportOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the traces are analysed and judged: the window (all | auto | nvtx:NAME | START:END with units), the
    shortest GPU gap listed, the timeline's buckets, extra rule folders, and where several traces are analysed
    (`jobs` local processes, default the cores; or tasks on the Dask scheduler at `dask`)."""

    window: str = "auto"
    gap_threshold_ns: int = 100_000
    buckets: int = 100
    rules_dirs: tuple[Path, ...] = ()
    jobs: int | None = None
    dask: str | None = None
