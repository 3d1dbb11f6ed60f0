"""The columnar core (issue 13): the same report whichever way the columns leave the trace, and GPU gaps
that equal a plain pass over the raw rows."""

from __future__ import annotations

import sqlite3

import adbc_driver_sqlite  # noqa: F401 - a dependency of profkit: missing, the module fails, not skips
import numpy as np
import pytest

from profkit.analysis import gaps as gaps_module
from profkit.report import ReportOptions, build_report
from profkit.traces import columns, nsys, open_trace
from tests.conftest import FIXTURES, TOY

NSYS = [*TOY, "thr_graphs", "serve_frontend"]
TORCH = ["torch_graphs_b16", "torch_swap_b16"]


def _report(path, window: str, monkeypatch, adbc: bool) -> tuple[dict, int, list[str]]:
    """The report with the Arrow driver for every relation (adbc) or with none; how often a relation was read
    through Arrow, and which tables were read by their one checked scan (traces/scan.py, taken by analysis/scans.py)."""
    reads, scanned = [], []
    real, real_scan = columns._read_adbc, nsys.scan_table

    def spy(*args, **kwargs):
        reads.append(1)
        return real(*args, **kwargs)

    def scan_spy(trace, table, *args, **kwargs):
        scanned.append(table)
        return real_scan(trace, table, *args, **kwargs)

    monkeypatch.setattr(columns, "_read_adbc", spy)
    monkeypatch.setattr(nsys, "scan_table", scan_spy)
    monkeypatch.setattr(columns, "ADBC_MIN_ROWS", 0 if adbc else 1 << 62)
    report = build_report(path, options=ReportOptions(window=window)).document()
    report.pop("profkit_version")
    return report, len(reads), scanned


@pytest.mark.parametrize("name", NSYS + TORCH)
def test_arrow_and_sqlite_reads_give_the_same_report(sqlite_path, monkeypatch, name: str) -> None:
    """Through Arrow an export's kernel and CUDA API tables are each read once, their checks on that read; the
    report is the one the SQL checks and sqlite3 reads give."""
    torch = name.startswith("torch_")
    path = FIXTURES / "h100_toy" / f"{name}.json.gz" if torch else sqlite_path(name)
    for window in ("all", "auto"):
        with_arrow, reads, scanned = _report(path, window, monkeypatch, adbc=True)
        without, none, not_scanned = _report(path, window, monkeypatch, adbc=False)
        assert none == 0 and not not_scanned
        if torch:  # torch traces are loaded by profkit itself: read through Arrow as relations
            assert reads >= 3 and not scanned
        else:
            assert scanned == ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"]
        assert with_arrow == without


def _gaps_by_a_plain_pass(path) -> dict[int, list[tuple[int, int]]]:
    """Every idle gap per device from the raw export: operations in start order, one at a time."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE name IN ('CUPTI_ACTIVITY_KIND_KERNEL', "
                                         "'CUPTI_ACTIVITY_KIND_MEMCPY', 'CUPTI_ACTIVITY_KIND_MEMSET')")]
    union = " UNION ALL ".join(f"SELECT deviceId, start, end FROM {t}" for t in tables)
    out: dict[int, list[tuple[int, int]]] = {}
    reach: dict[int, int] = {}
    for device, start, end in conn.execute(f"SELECT * FROM ({union}) ORDER BY deviceId, start"):
        if device in reach and start > reach[device]:
            out.setdefault(device, []).append((reach[device], start))
        reach[device] = max(reach.get(device, end), end)
    conn.close()
    return out


@pytest.mark.parametrize("name", ["thr_graphs", "swap_b16", "eager_b64"])
def test_gpu_gaps_equal_a_plain_pass_for_any_chunk_size(sqlite_path, name: str) -> None:
    path = sqlite_path(name)
    expected = _gaps_by_a_plain_pass(path)
    with open_trace(path) as trace:
        for chunk in (1, 1000, 1 << 19):
            found = gaps_module._compute(trace, chunk_rows=chunk)
            for device, pairs in expected.items():
                d = found.devices[device]
                assert np.array_equal(d.start, [a for a, _ in pairs]) and np.array_equal(d.end, [b for _, b in pairs])
                assert d.cum[-1] == sum(b - a for a, b in pairs)
            assert set(found.devices) == set(expected)


def test_idle_in_matches_clipping_every_gap(sqlite_path) -> None:
    """`idle_in` (two binary searches and a prefix sum) against summing every gap clipped to the range."""
    with open_trace(sqlite_path("hostgap_b16")) as trace:
        d = gaps_module.gpu_gaps(trace).devices[0]
    rng = np.random.default_rng(0)
    lo = rng.integers(d.first - 10**8, d.last, 300)
    hi = lo + rng.integers(1, 10**9, 300)
    for a, b, got in zip(lo, hi, d.idle_in(lo, hi), strict=True):
        gaps = int(np.clip(np.minimum(d.end, b) - np.maximum(d.start, a), 0, None).sum())
        outside = max(0, min(d.first, b) - a) + max(0, b - max(d.last, a))
        assert got == min(gaps + outside, b - a)
