"""The CLI through its console entry point: output formats, and one clear line for every bad input."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import one_error_line, profkit
from tests.conftest import GROUND_TRUTH


def writable_copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    return dst


def test_json_output_is_the_report_contract(sqlite_path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = profkit("report", str(sqlite_path("swap_b16")), "--window", "all", "--format", "json", "-o", str(out))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "profkit.report/1"
    # The numbers in the document are nsys stats' numbers.
    h2d = next(m for m in doc["memops"] if m["operation"] == "[CUDA memcpy Host-to-Device]")
    truth = (GROUND_TRUTH / "swap_b16_cuda_gpu_mem_time_sum.csv").read_text().splitlines()[1].split(",")
    assert h2d["total_ns"] == int(truth[1]) and h2d["count"] == int(truth[2])
    assert doc["facts"]["memops.pageable_count"] == 128  # 64 steps x (DtoH + HtoD) through pageable memory
    assert doc["window"]["how"] == "whole"


def test_text_and_markdown_output(sqlite_path) -> None:
    text = profkit("report", str(sqlite_path("eager_b1")), "--top", "3")
    assert text.returncode == 0, text.stderr
    assert "GPU utilization 10.7%" in text.stdout  # nsys analyze gpu_time_util: 10.7 %
    assert "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT" in text.stdout
    md = profkit("report", str(sqlite_path("eager_b1")), "--format", "md")
    assert md.returncode == 0
    assert "| gemm |" in md.stdout and "### Top kernels" in md.stdout


def test_window_options(sqlite_path) -> None:
    path = str(sqlite_path("eager_b1"))
    nvtx = json.loads(profkit("report", path, "--window", "nvtx:prefill", "--format", "json").stdout)
    assert nvtx["window"]["how"] == "nvtx:prefill"
    assert nvtx["window"]["duration_ns"] == 20464823 - 13687553  # the prefill range in NVTX_EVENTS
    explicit = json.loads(profkit("report", path, "--window", "13687553ns:20464823ns", "--format", "json").stdout)
    assert explicit["facts"]["kernels.count"] == nvtx["facts"]["kernels.count"]
    one_error_line(profkit("report", path, "--window", "nvtx:nope"), "no NVTX range")
    one_error_line(profkit("report", path, "--window", "banana"), "expected all, auto")


def test_trace_is_never_modified(sqlite_path, tmp_path: Path) -> None:
    path = writable_copy(sqlite_path("graphs_b1"), tmp_path / "t.sqlite")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    stat = path.stat()
    assert profkit("report", str(path), "--format", "json").returncode == 0
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert path.stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.sqlite"]  # no -journal / -wal / -shm


def test_missing_path(tmp_path: Path) -> None:
    one_error_line(profkit("report", str(tmp_path / "nope.sqlite")), "no such file")


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.sqlite"
    p.touch()
    one_error_line(profkit("report", str(p)), "empty file")


# Fixed junk (not os.urandom): one CI run drew bytes starting with "[" and the file went to the JSON reader.
JUNK = random.Random(20261123).randbytes(4096)


@pytest.mark.parametrize("prefix", [b"", b"[", b"  {", b"\x00\x00"], ids=["junk", "bracket", "brace", "zeros"])
def test_random_bytes(tmp_path: Path, prefix: bytes) -> None:
    p = tmp_path / "junk.sqlite"
    p.write_bytes(prefix + JUNK)
    result = profkit("report", str(p))
    one_error_line(result, "not a trace" if prefix != b"\x00\x00" else "nsys-rep")
    assert all(" " <= ch <= "~" for ch in result.stderr.strip())


def test_broken_json_message_is_one_printable_line(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "\xff\xfe\n\x01')
    result = profkit("report", str(p))
    one_error_line(result, "t.json")
    assert all(" " <= ch <= "~" for ch in result.stderr.strip())


@pytest.mark.parametrize("keep", [4096, 65536, 400_000])
def test_truncated_sqlite(sqlite_path, tmp_path: Path, keep: int) -> None:
    p = tmp_path / "truncated.sqlite"
    p.write_bytes(sqlite_path("eager_b1").read_bytes()[:keep])
    before = p.read_bytes()
    result = profkit("report", str(p))
    one_error_line(result, "truncated.sqlite")
    assert p.read_bytes() == before


def test_sqlite_that_is_not_nsys(tmp_path: Path) -> None:
    p = tmp_path / "other.sqlite"
    with sqlite3.connect(p) as conn:
        conn.execute("CREATE TABLE t (x)")
    one_error_line(profkit("report", str(p)), "not an Nsight Systems export")


def test_export_without_kernel_table(sqlite_path, tmp_path: Path) -> None:
    p = writable_copy(sqlite_path("eager_b1"), tmp_path / "nokern.sqlite")
    with sqlite3.connect(p) as conn:
        conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    one_error_line(profkit("report", str(p)), "no CUDA kernel table")


def test_export_with_no_kernels(sqlite_path, tmp_path: Path) -> None:
    p = writable_copy(sqlite_path("eager_b1"), tmp_path / "nocuda.sqlite")
    with sqlite3.connect(p) as conn:
        conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
    one_error_line(profkit("report", str(p)), "no CUDA kernels")


def test_old_schema(sqlite_path, tmp_path: Path) -> None:
    # Exports before nsys 2021.2 had no demangledName column in the kernel table.
    p = writable_copy(sqlite_path("eager_b1"), tmp_path / "old.sqlite")
    with sqlite3.connect(p) as conn:
        conn.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN demangledName TO name")
    one_error_line(profkit("report", str(p)), "unsupported nsys export schema 3.20.3")


def test_optional_tables_absent(sqlite_path, tmp_path: Path) -> None:
    # No NVTX, runtime, memcpy/memset or sync tables: the kernel breakdown still matches nsys stats.
    p = writable_copy(sqlite_path("sync_b16"), tmp_path / "lean.sqlite")
    with sqlite3.connect(p) as conn:
        for t in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
                  "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
            conn.execute(f"DROP TABLE {t}")
    result = profkit("report", str(p), "--window", "all", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["api"] == [] and doc["nvtx"] == [] and doc["memops"] == []
    truth = (GROUND_TRUTH / "sync_b16_cuda_gpu_kern_sum.csv").read_text().splitlines()[1:]
    assert doc["facts"]["kernels.count"] == sum(int(line.split(",")[2]) for line in truth)
    assert doc["facts"]["launch.api_share"] is None


def test_corrupt_gzip(tmp_path: Path) -> None:
    p = tmp_path / "trace.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [')[:20])
    result = profkit("report", str(p))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_folder_without_trace(tmp_path: Path) -> None:
    one_error_line(profkit("report", str(tmp_path)), "holds no trace")


def test_bad_gap_threshold(sqlite_path) -> None:
    result = profkit("report", str(sqlite_path("eager_b1")), "--gap-threshold", "soon")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_report_path_imports_only_what_it_uses(sqlite_path) -> None:
    """Start-up is part of every report: the JSON report of a trace without /metrics imports neither the
    plotting library (HTML only), the Prometheus parser (metrics only) nor pandas (0.4-0.8 s, 77 MB: the
    summaries are plain rows); `python -X importtime` says so."""

    trace = str(sqlite_path("graphs_b1"))
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "profkit.cli", "report", trace, "--format", "json",
                        "--no-progress"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "profkit.report" in imported and "profkit.analysis.kernels" in imported  # the check sees imports
    assert not {m for m in imported if m.split(".")[0] in ("matplotlib", "prometheus_client", "pandas")}


@pytest.mark.parametrize("args, says", [
    (["predict", "samples/vllm_14b_kv_bound", "--search", "--", "--max-num-seqs", "64"],
     "--search starts from the run's own settings: give CHANGES without --search"),
    (["predict", "samples/vllm_14b_kv_bound", "--top", "3", "--", "--max-num-seqs", "64"],
     "--top and --allow-precision-changes shape a search: add --search"),
    (["predict", "samples/vllm_14b_kv_bound", "--allow-precision-changes", "--", "--max-num-seqs", "64"],
     "--top and --allow-precision-changes shape a search: add --search"),
    (["report", "samples/vllm_14b_kv_bound", "--label", "x"], "--label names the run stored with --save"),
    (["report", "samples/vllm_14b_kv_bound", "--rules", "samples"], "samples: no rule files (*.yaml) in this folder"),
])
def test_an_option_that_would_be_ignored_is_one_line(args: list[str], says: str) -> None:
    """A first-hour review found each of these exit 0 with the option dropped: changes beside --search (the search
    ignored them), a search's options without a search, a label with nothing saved, a rules folder with no rule."""
    one_error_line(profkit(*args), says)
