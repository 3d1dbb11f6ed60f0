"""Nsight Systems GPU metrics (profkit.traces.nsys_gpu_metrics, profkit.traces.gpu_metrics,
profkit.analysis.gpu_metrics).

Two exports:
- `h100_gemm_copy`: tests/data/gpu_metrics/h100_gemm_copy.sqlite.xz, a real H100 capture with GPU metrics
  (README there).
- `derived`: a copy of the real H100 nsys 2025.3 export tests/data/h100_serve_frontend_slice.sqlite.xz (4,704
  kernels over 1 s) given the two GPU-metric tables in nsys's own DDL and the gh100 set's 32 metric names, sampled
  every 100 us: GR Active is 100 where one of the trace's kernels runs and 0 where none does, the clocks read
  1755 MHz (a value past 100 that is no percentage of ours), the other metrics fixed pseudo-random integers. No
  public export with GPU metrics was found (README there); this one carries the format, hostile-row and kernel
  tests meanwhile.
Every expected figure is computed here from the file's rows with plain SQL and Python's `statistics`.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.analysis.categories import categorize
from profkit.analysis.gpu_metrics import (
    NO_KERNEL,
    by_category,
    inside,
    metrics_section,
    running_kernel,
    summary,
    within,
)
from profkit.errors import TraceError
from profkit.traces.gpu_metrics import open_gpu_metrics, read_gpu_metrics
from profkit.traces.nsys import open_nsys
from profkit.traces.nsys_gpu_metrics import NO_TIME, NOT_A_NUMBER, OUT_OF_RANGE, UNKNOWN_METRIC

DATA = Path(__file__).parent / "data"
GEMM_COPY = DATA / "gpu_metrics" / "h100_gemm_copy.sqlite.xz"
SLICE = DATA / "gpu_metrics" / "slice.py"
REAL_H100 = DATA / "h100_serve_frontend_slice.sqlite.xz"
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"

# nsys 2025.3's DDL for the two tables (its SQLite schema reference, `nsys export` schema 3.20).
GPU_METRICS_DDL = """
CREATE TABLE TARGET_INFO_GPU_METRICS (
    typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL, metricId INTEGER NOT NULL,
    metricName TEXT NOT NULL);
CREATE TABLE GPU_METRICS (
    rawTimestamp INTEGER NOT NULL, timestamp INTEGER NOT NULL, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL,
    value INTEGER NOT NULL);
"""
# The 32 series of nsys 2025.3's gh100 set (GpuMetrics/gh100.config), "<metric> [<sub-metric>]", in its order.
GH100 = ["GPC Clock Frequency [MHz]", "SYS Clock Frequency [MHz]", "GR Active [Throughput %]",
         "SMs Active [Throughput %]", "SM Issue [Throughput %]", "Tensor Active [Throughput %]",
         *[f"{w} Warps in Flight [{s}]" for w in ("Vertex/Tess/Geometry", "Pixel", "Compute")
           for s in ("Throughput %", "Avg", "Avg Warps per Cycle")],
         *[f"Unallocated Warps in Active SMs [{s}]" for s in ("Throughput %", "Avg", "Avg Warps per Cycle")],
         "DRAM Read Bandwidth [Throughput %]", "DRAM Write Bandwidth [Throughput %]",
         *[f"NVLink {d} {k} {p} Data [Throughput %]" for d in ("RX", "TX") for k in ("Requests", "Responses")
           for p in ("Protocol", "User")],
         "CTC RX Throughput [Throughput %]", "CTC TX Throughput [Throughput %]",
         "PCIe RX Throughput [Throughput %]", "PCIe TX Throughput [Throughput %]"]
# Which stored names are which of profkit's metrics: the spellings of nsys 2025.3 and the older ones its recipes
# accept, written out here rather than taken from profkit.
SPELLINGS = {"SMs Active [Throughput %]": "sm_active", "SM Active [Throughput %]": "sm_active",
             "SM Active": "sm_active", "SMs Active": "sm_active",
             "Tensor Active [Throughput %]": "tensor_active", "Tensor Active": "tensor_active",
             "DRAM Read Bandwidth [Throughput %]": "dram_read", "DRAM Write Bandwidth [Throughput %]": "dram_write",
             "GR Active [Throughput %]": "gr_active"}
# The derived export's GPU-metrics type: GPU 0 in the low byte, as nsys's recipes read it; the high bits are
# this copy's own (real exports set others there).
TYPE_ID = (1 << 40) | 0
PERIOD_NS = 100_000  # 10 kHz, nsys's default --gpu-metrics-frequency
# Rows fit for statistics, in SQL of the test's own: a numeric percentage at an integer time.
GOOD = ("typeof(g.timestamp) = 'integer' AND typeof(g.value) IN ('integer', 'real') "
        "AND g.value BETWEEN 0 AND 100")


def decompress(src: Path, dst: Path) -> Path:
    with lzma.open(src) as f, dst.open("wb") as out:
        shutil.copyfileobj(f, out, 1 << 20)
    return dst


def build_derived(path: Path) -> Path:
    decompress(REAL_H100, path)
    conn = sqlite3.connect(path)
    conn.executescript(GPU_METRICS_DDL)
    conn.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, ?, 'GPU Metrics', ?, ?)",
                     [(TYPE_ID, TYPE_ID >> 8, i, name) for i, name in enumerate(GH100)])
    conn.execute(f"CREATE INDEX kernel_start ON {KERNEL}(start)")
    lo, hi = conn.execute(f"SELECT min(start), max(end) FROM {KERNEL}").fetchone()
    gr = GH100.index("GR Active [Throughput %]")
    conn.execute(
        f"""WITH RECURSIVE sample(t) AS (SELECT {lo} UNION ALL SELECT t + {PERIOD_NS} FROM sample WHERE t < {hi}),
            metric(id, name) AS (SELECT metricId, metricName FROM TARGET_INFO_GPU_METRICS)
            INSERT INTO GPU_METRICS SELECT t, t, {TYPE_ID}, id,
              CASE WHEN id = {gr} THEN 100 * EXISTS (SELECT 1 FROM {KERNEL} k WHERE k.start <= t AND k.end >= t)
                   WHEN name LIKE '%[MHz]' THEN 1755
                   ELSE (t / {PERIOD_NS} * 37 + id * 11) % 101 END
            FROM sample CROSS JOIN metric ORDER BY t, id""")
    conn.commit()
    conn.close()
    return path


@pytest.fixture(scope="session")
def derived(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_derived(tmp_path_factory.mktemp("gpu_metrics") / "derived.sqlite")
    path.chmod(0o444)  # the readers must never need to write
    return path


@pytest.fixture(scope="session")
def gemm_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = decompress(GEMM_COPY, tmp_path_factory.mktemp("gpu_metrics") / "h100_gemm_copy.sqlite")
    conn = sqlite3.connect(path)  # the test's own index for its per-sample SQL; the readers never use one
    conn.execute(f"CREATE INDEX IF NOT EXISTS kernel_start ON {KERNEL}(start)")
    conn.close()
    path.chmod(0o444)
    return path


@pytest.fixture(params=["derived", "h100_gemm_copy"])
def export(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("derived" if request.param == "derived" else "gemm_copy")


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def raw_values(path: Path, where: str = "1", params: tuple = ()) -> dict[tuple[int, str], list[float]]:
    """{(GPU, metric): values in time order} from the rows themselves."""
    out: dict[tuple[int, str], list[float]] = {}
    with connect(path) as conn:
        rows = conn.execute(f"""SELECT t.typeId & 255, t.metricName, g.value FROM GPU_METRICS g
            JOIN TARGET_INFO_GPU_METRICS t ON t.typeId = g.typeId AND t.metricId = g.metricId
            WHERE {GOOD} AND t.metricName IN ({", ".join(f"'{n}'" for n in SPELLINGS)}) AND ({where})
            ORDER BY g.timestamp""", params).fetchall()
    for gpu, name, value in rows:
        if name in SPELLINGS:
            out.setdefault((gpu, SPELLINGS[name]), []).append(float(value))
    return out


def expected_stats(values: list[float]) -> dict:
    return {"samples": len(values), "mean": statistics.fmean(values), "median": statistics.median(values),
            "p90": statistics.quantiles(values, n=10, method="inclusive")[8]}


def assert_stats(got: dict, values: list[float]) -> None:
    want = expected_stats(values)
    assert got["samples"] == want["samples"]
    for key in ("mean", "median", "p90"):
        assert got[key] == pytest.approx(want[key], rel=1e-12, abs=1e-9), key


def kernel_columns(path: Path, gpu: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Starts, ends and short names of the kernels on GPU `gpu`, in the table's order."""
    with connect(path) as conn:
        rows = conn.execute(f"""SELECT k.start, k.end, s.value FROM {KERNEL} k JOIN StringIds s ON s.id = k.shortName
            WHERE k.deviceId = ? ORDER BY k.rowid""", (gpu,)).fetchall()
    return (np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=np.int64),
            [r[2] for r in rows])


# --- reading ------------------------------------------------------------------------------------------------


def test_summary_is_the_sample_statistics_of_the_rows(export: Path) -> None:
    metrics = open_gpu_metrics(export)
    raw = raw_values(export)
    assert metrics is not None and metrics.left_out == {}
    assert set(metrics.gpus) == {gpu for gpu, _ in raw}
    for gpu in metrics.gpus:
        got = summary(metrics, gpu)
        for metric, values in ((m, v) for (g, m), v in raw.items() if g == gpu):
            assert_stats(got[metric], values)
        with connect(export) as conn:
            name = conn.execute("SELECT name FROM TARGET_INFO_GPU WHERE id = ?", (gpu,)).fetchone()[0]
        assert metrics.gpu_names[gpu] == name
        for series in metrics.series[gpu].values():
            assert series.timestamps.dtype == np.int64 and series.values.dtype == np.float64
            assert bool(np.all(np.diff(series.timestamps) >= 0))


def test_a_window_is_read_in_sql_ends_included(export: Path) -> None:
    with connect(export) as conn:
        times = [t for (t,) in conn.execute("SELECT DISTINCT timestamp FROM GPU_METRICS ORDER BY 1")]
    lo, hi = times[len(times) // 4], times[3 * len(times) // 4]  # two sample times: both ends hold samples
    metrics = open_gpu_metrics(export, lo, hi)
    raw = raw_values(export, "g.timestamp BETWEEN ? AND ?", (lo, hi))
    assert (metrics.start_ns, metrics.end_ns) == (lo, hi)
    for (gpu, metric), values in raw.items():
        series = metrics.get(gpu, metric)
        assert series.timestamps[0] == lo and series.timestamps[-1] == hi
        assert_stats(summary(metrics, gpu)[metric], values)


def test_the_same_metrics_through_a_trace_and_without_a_cuda_trace(export: Path, tmp_path: Path) -> None:
    """`nsys profile -t none --gpu-metrics-devices=all` writes no CUPTI tables: open_nsys refuses such an export,
    the GPU metrics read the same from it as from the full trace."""
    whole = open_gpu_metrics(export)
    with open_nsys(export) as trace:
        through_trace = read_gpu_metrics(trace.conn)
        cuda_devices = trace.query("SELECT pid, cudaId, gpuId FROM TARGET_INFO_CUDA_DEVICE")
        assert trace.query("SELECT pid, cuda_device, gpu FROM cuda_devices") == cuda_devices
    bare = tmp_path / "metrics_only.sqlite"
    shutil.copyfile(export, bare)
    bare.chmod(0o644)
    with sqlite3.connect(bare) as conn:
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'CUPTI%'"
                                     ).fetchall():
            conn.execute(f"DROP TABLE {table}")
    with pytest.raises(TraceError, match="no CUDA kernel"):
        open_nsys(bare)
    alone = open_gpu_metrics(bare)
    for other in (through_trace, alone):
        assert other.gpus == whole.gpus and other.gpu_names == whole.gpu_names
        for gpu in whole.gpus:
            assert summary(other, gpu) == summary(whole, gpu)


def test_spellings_of_older_nsys_are_read_and_lookalikes_are_not(derived: Path, tmp_path: Path) -> None:
    path = tmp_path / "old_names.sqlite"
    shutil.copyfile(derived, path)
    path.chmod(0o644)
    with sqlite3.connect(path) as conn:  # nsys 2023 said "SM Active"; a lookalike takes "Tensor Active"'s place
        conn.execute("UPDATE TARGET_INFO_GPU_METRICS SET metricName = 'SM Active' "
                     "WHERE metricName = 'SMs Active [Throughput %]'")
        conn.execute("UPDATE TARGET_INFO_GPU_METRICS SET metricName = 'Tensor Active Cycles [Throughput %]' "
                     "WHERE metricName = 'Tensor Active [Throughput %]'")
    metrics = open_gpu_metrics(path)
    sm = metrics.get(0, "sm_active")
    assert sm.name == "SM Active" and len(sm) == len(raw_values(derived)[(0, "sm_active")])
    assert metrics.get(0, "tensor_active") is None and summary(metrics, 0)["tensor_active"]["samples"] == 0


# --- kernels ------------------------------------------------------------------------------------------------


def running_at(gpu: int, longest_ns: int, join: str = "") -> str:
    """SQL (correlated on a GPU_METRICS row g): the kernels of `gpu` running at g's time, ends included. The bound
    on start, the longest kernel's duration before g, only keeps SQLite's index walk short."""
    return (f"FROM {KERNEL} k {join} WHERE k.deviceId = {gpu} AND k.start <= g.timestamp "
            f"AND k.end >= g.timestamp AND k.start >= g.timestamp - {longest_ns}")


def longest_kernel(path: Path) -> int:
    with connect(path) as conn:
        return conn.execute(f"SELECT max(end - start) FROM {KERNEL}").fetchone()[0]


def test_within_kernels_is_binary_inclusion(export: Path) -> None:
    metrics = open_gpu_metrics(export)
    longest = longest_kernel(export)
    for gpu in metrics.gpus:
        starts, ends, _ = kernel_columns(export, gpu)
        got = summary(within(metrics, starts, ends, device=gpu), gpu)
        raw = raw_values(export, f"EXISTS (SELECT 1 {running_at(gpu, longest)})")
        for (g, metric), values in raw.items():
            if g == gpu:
                assert_stats(got[metric], values)
    if export.name == "derived.sqlite":  # GR Active was written as "a kernel runs"
        assert summary(within(metrics, starts, ends), 0)["gr_active"]["mean"] == 100.0
        outside = ~inside(metrics.get(0, "gr_active").timestamps, starts, ends)
        assert set(metrics.get(0, "gr_active").values[outside]) == {0.0}


def test_samples_go_to_the_category_of_the_kernel_running(export: Path) -> None:
    """Oracle: for each sample, SQL's latest-started kernel with start <= t <= end (equal starts: the later row)."""
    metrics = open_gpu_metrics(export)
    longest = longest_kernel(export)
    names = ", ".join(f"'{n}'" for n in SPELLINGS)
    for gpu in metrics.gpus:
        starts, ends, kernel_names = kernel_columns(export, gpu)
        categories = sorted({categorize(n) for n in kernel_names})
        codes = np.array([categories.index(categorize(n)) for n in kernel_names], dtype=np.int64)
        got = by_category(metrics, gpu, starts, ends, codes, categories)
        with connect(export) as conn:
            kernel_name = running_at(gpu, longest, "JOIN StringIds s ON s.id = k.shortName")
            rows = conn.execute(f"""SELECT t.metricName, g.value,
                    (SELECT s.value {kernel_name} ORDER BY k.start DESC, k.rowid DESC LIMIT 1)
                FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t ON t.typeId = g.typeId AND t.metricId = g.metricId
                WHERE {GOOD} AND t.typeId & 255 = {gpu} AND t.metricName IN ({names})""").fetchall()
        want: dict[str, dict[str, list[float]]] = {}
        for name, value, kernel in rows:
            if name in SPELLINGS:
                category = categorize(kernel) if kernel is not None else NO_KERNEL
                want.setdefault(category, {}).setdefault(SPELLINGS[name], []).append(float(value))
        assert set(got) == set(want)
        for category, by_metric in want.items():
            for metric, values in by_metric.items():
                assert got[category][metric]["samples"] == len(values)
                assert got[category][metric]["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)


def test_gemm_and_copy_show_on_their_own_counters(gemm_copy: Path) -> None:
    """The capture's physics: the tensor pipe is busier under the bf16 GEMMs than under the copies, DRAM reads
    are heavier under the copies (device-to-device memcpy rows, else kernels named like a copy)."""
    metrics = open_gpu_metrics(gemm_copy)
    gpu = metrics.gpus[0]
    starts, ends, names = kernel_columns(gemm_copy, gpu)
    gemm = np.array([categorize(n) == "gemm" for n in names])
    with connect(gemm_copy) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        copies = conn.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 8 "
                              "AND deviceId = ?", (gpu,)).fetchall() if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables else []
    if copies:
        copy_starts, copy_ends = (np.array(c, dtype=np.int64) for c in zip(*copies, strict=True))
    else:
        is_copy = np.array(["copy" in n.lower() for n in names])
        copy_starts, copy_ends = starts[is_copy], ends[is_copy]
    assert gemm.any() and len(copy_starts)
    under_gemm = summary(within(metrics, starts[gemm], ends[gemm], gpu), gpu)
    under_copy = summary(within(metrics, copy_starts, copy_ends, gpu), gpu)
    assert under_gemm["tensor_active"]["mean"] > under_copy["tensor_active"]["mean"]
    assert under_copy["dram_read"]["mean"] > under_gemm["dram_read"]["mean"]


def test_the_report_section_pools_the_gpus_and_splits_by_phase(export: Path) -> None:
    """Two phases of the trace's own kernels (the first half of them, the rest), as engine steps would give."""
    metrics = open_gpu_metrics(export)
    gpu = metrics.gpus[0]
    starts, ends, names = kernel_columns(export, gpu)
    half = len(starts) // 2
    categories = sorted({categorize(n) for n in names})
    codes = np.array([categories.index(categorize(n)) for n in names], dtype=np.int64)
    section = metrics_section(metrics, "capture/gpu-metrics.sqlite", phases={
        "prefill-bearing": (starts[:half], ends[:half]), "decode-only": (starts[half:], ends[half:])},
        kernels=(starts, ends, codes, categories))
    json.dumps(section)  # plain JSON values
    pooled = raw_values(export)
    for metric in {m for _, m in pooled}:
        values = [v for (_, m), vs in pooled.items() if m == metric for v in vs]
        assert section["window"][metric] == pytest.approx(statistics.fmean(values), rel=1e-12)
    with connect(export) as conn:
        (split,) = conn.execute(f"SELECT rowid FROM {KERNEL} WHERE deviceId = ? ORDER BY rowid LIMIT 1 OFFSET ?",
                                (gpu, half)).fetchone()
    longest = longest_kernel(export)
    for phase, rows in (("prefill-bearing", f"k.rowid < {split}"), ("decode-only", f"k.rowid >= {split}")):
        row = next(r for r in section["phases"] if r["phase"] == phase)
        raw = raw_values(export, f"EXISTS (SELECT 1 {running_at(gpu, longest)} AND {rows})")
        for (g, metric), values in raw.items():
            if g == gpu:
                assert row["samples"][metric] == len(values)
                assert row[metric] == pytest.approx(statistics.fmean(values), rel=1e-12)
    assert section["categories"] == by_category(metrics, gpu, starts, ends, codes, categories)
    assert section["gpus"][0]["name"] == metrics.gpu_names[gpu] and metrics_section(None) is None


def test_a_capture_folders_gpu_metrics_reach_the_report(derived: Path) -> None:
    """The report reads a capture folder's GPU metrics export through metrics_section (analysis.gpu_metrics)."""
    from profkit.analysis.gpu_metrics import run_gpu_metrics

    section = run_gpu_metrics(None, derived)
    assert section == metrics_section(open_gpu_metrics(derived), source=str(derived))
    assert section["window"]["gr_active"] is not None


# --- hostile input ------------------------------------------------------------------------------------------


def writable_copy(src: Path, dst: Path, nullable: bool = False) -> sqlite3.Connection:
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    conn = sqlite3.connect(dst)
    if nullable:  # before nsys export schema 3.15 GPU_METRICS.timestamp could be NULL (schema notes)
        conn.executescript("""ALTER TABLE GPU_METRICS RENAME TO nn; CREATE TABLE GPU_METRICS AS SELECT * FROM nn;
                              DROP TABLE nn;""")
    return conn


def test_broken_rows_are_left_out_and_counted(export: Path, tmp_path: Path) -> None:
    path = tmp_path / "broken.sqlite"
    conn = writable_copy(export, path, nullable=True)
    ours = "SELECT g.rowid FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t USING (typeId, metricId) WHERE " \
           "t.metricName = '{}' ORDER BY g.rowid LIMIT {} OFFSET {}"
    sm, dram = "SMs Active [Throughput %]", "DRAM Read Bandwidth [Throughput %]"
    damage = [
        (NOT_A_NUMBER, "UPDATE GPU_METRICS SET value = 'n/a' WHERE rowid IN ({})", ours.format(sm, 7, 10)),
        (NOT_A_NUMBER, "UPDATE GPU_METRICS SET value = NULL WHERE rowid IN ({})", ours.format(dram, 3, 10)),
        (NO_TIME, "UPDATE GPU_METRICS SET timestamp = NULL WHERE rowid IN ({})", ours.format(sm, 5, 100)),
        (NO_TIME, "UPDATE GPU_METRICS SET timestamp = 'soon' WHERE rowid IN ({})", ours.format(dram, 2, 100)),
        (OUT_OF_RANGE, "UPDATE GPU_METRICS SET value = 150 WHERE rowid IN ({})", ours.format(sm, 4, 200)),
        (OUT_OF_RANGE, "UPDATE GPU_METRICS SET value = -3 WHERE rowid IN ({})", ours.format(dram, 6, 200)),
    ]
    want: dict[str, int] = {}
    for why, sql, rows in damage:
        want[why] = want.get(why, 0) + conn.execute(sql.format(rows)).rowcount
    # rows under ids no metric has (another GPU's type, an unknown metric id): every copied row is left out
    want[UNKNOWN_METRIC] = conn.execute("INSERT INTO GPU_METRICS SELECT rawTimestamp, timestamp, typeId + 1, metricId, "
                                        "value FROM GPU_METRICS WHERE rowid % 97 = 0").rowcount
    want[UNKNOWN_METRIC] += conn.execute("INSERT INTO GPU_METRICS SELECT rawTimestamp, timestamp, typeId, 4242, value "
                                         "FROM GPU_METRICS WHERE rowid % 89 = 0").rowcount
    # names the reader cannot use: a blob for a name, a text id
    conn.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (1, 1, 'x', 99, X'00'), ('GPU', 1, 'x', 98, "
                 "'SMs Active [Throughput %]')")
    conn.commit()
    conn.close()
    metrics = open_gpu_metrics(path)
    assert metrics.left_out == want
    assert all(why in metrics.said() for why in want)
    for (gpu, metric), values in raw_values(path).items():  # statistics of the rows left
        assert_stats(summary(metrics, gpu)[metric], values)


def test_files_that_are_no_nsys_export_raise_one_line_naming_them(derived: Path, tmp_path: Path) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(derived.read_bytes()[:8192])
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE scores (name TEXT, value INTEGER)")
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    renamed = tmp_path / "renamed.sqlite"
    conn = writable_copy(derived, renamed)
    conn.execute("ALTER TABLE GPU_METRICS RENAME COLUMN value TO data")
    conn.commit()
    conn.close()
    cases = {text: "not a SQLite file", truncated: "damaged or unreadable", other: "not an Nsight Systems export",
             empty: "not a SQLite file", tmp_path / "missing.sqlite": "no such file", tmp_path: "a folder",
             renamed: "GPU_METRICS has no column 'value'"}
    for path, words in cases.items():
        with pytest.raises(TraceError) as caught:
            open_gpu_metrics(path)
        message = str(caught.value)
        assert "\n" not in message and str(path) in message and words in message, message


def test_exports_without_gpu_metrics_give_none(derived: Path, tmp_path: Path) -> None:
    plain = decompress(REAL_H100, tmp_path / "plain.sqlite")  # a real export recorded without --gpu-metrics-devices
    assert open_gpu_metrics(plain) is None
    with open_nsys(plain) as trace:
        assert read_gpu_metrics(trace.conn) is None
    empty = tmp_path / "empty_tables.sqlite"
    conn = writable_copy(derived, empty)
    conn.execute("DELETE FROM GPU_METRICS")
    conn.commit()
    conn.close()
    assert open_gpu_metrics(empty) is None


def test_the_users_files_are_never_written_and_wal_transactions_are_read(derived: Path, tmp_path: Path) -> None:
    path = tmp_path / "wal.sqlite"
    writer = writable_copy(derived, path)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    added = writer.execute("INSERT INTO GPU_METRICS SELECT rawTimestamp, timestamp + 1, typeId, metricId, value "
                           "FROM GPU_METRICS WHERE rowid % 10 = 0").rowcount
    writer.commit()  # committed, still only in the -wal file while this connection stays open
    files = sorted(tmp_path.iterdir())
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    try:
        metrics = open_gpu_metrics(path)
        assert sorted(tmp_path.iterdir()) == files
        assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files} == before
        with connect(path) as conn:  # what SQLite itself sees, WAL included
            n = conn.execute(f"""SELECT count(*) FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS t
                USING (typeId, metricId) WHERE t.metricName = 'SMs Active [Throughput %]' AND {GOOD}""").fetchone()[0]
        assert len(metrics.get(0, "sm_active")) == n > len(raw_values(derived)[(0, "sm_active")]) and added
    finally:
        writer.close()


# --- the interval operations against brute force -------------------------------------------------------------

intervals = st.lists(st.tuples(st.integers(-50, 400), st.integers(-5, 120)), max_size=40)
times = st.lists(st.integers(-60, 600), max_size=60)
PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(intervals, times)
def test_running_kernel_is_the_latest_started_of_those_running(spans: list, ts: list) -> None:
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = starts + np.array([d for _, d in spans], dtype=np.int64)
    got = running_kernel(starts, ends, np.array(ts, dtype=np.int64))
    for t, index in zip(ts, got, strict=True):
        running = [i for i in range(len(spans)) if starts[i] <= t <= ends[i]]
        # latest start wins; equal starts: the later one in the arrays
        assert index == (max(running, key=lambda i: (starts[i], i)) if running else -1)


@PROPERTY
@given(intervals, times)
def test_inside_is_any_range_holding_the_time(spans: list, ts: list) -> None:
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    ends = starts + np.array([d for _, d in spans], dtype=np.int64)
    got = inside(np.array(ts, dtype=np.int64), starts, ends)
    assert got.tolist() == [any(a <= t <= b for a, b in zip(starts, ends, strict=True)) for t in ts]


# --- the slicing script -------------------------------------------------------------------------------------


def test_slice_keeps_a_span_of_every_table(export: Path, tmp_path: Path) -> None:
    with connect(export) as conn:
        start = conn.execute(f"SELECT min(start) FROM {KERNEL}").fetchone()[0] + 50_000_000
        rows_in_span = conn.execute("SELECT count(*) FROM GPU_METRICS WHERE timestamp BETWEEN ? AND ?",
                                    (start, start + 20_000_000)).fetchone()[0]
        kernels_in_span = conn.execute(f"SELECT count(*) FROM {KERNEL} WHERE start <= ? AND end >= ?",
                                       (start + 20_000_000, start)).fetchone()[0]
        small = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                 for t in ("TARGET_INFO_GPU_METRICS", "TARGET_INFO_GPU", "StringIds")}
    out = tmp_path / "slice.sqlite"
    subprocess.run([sys.executable, str(SLICE), str(export), str(out), "--start-ns", str(start),
                    "--span-ns", "20000000"], check=True, capture_output=True)
    with connect(out) as conn:
        assert conn.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0] == rows_in_span > 0
        assert conn.execute(f"SELECT count(*) FROM {KERNEL}").fetchone()[0] == kernels_in_span > 0
        assert {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in small} == small
    sliced = open_gpu_metrics(out)
    assert summary(sliced, 0) == summary(open_gpu_metrics(export, start, start + 20_000_000), 0)
    with open_nsys(out) as trace:
        assert trace.query("SELECT count(*) FROM kernels")[0][0] == kernels_in_span
    capped = tmp_path / "capped.sqlite"
    subprocess.run([sys.executable, str(SLICE), str(export), str(capped), "--start-ns", str(start),
                    "--span-ns", "20000000", "--max-rows", "1000"], check=True, capture_output=True)
    with connect(capped) as conn:
        assert 0 < conn.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0] <= 1000
