"""Both trace readers produce the normalized trace of profkit.traces.schema: every relation, with its columns in
order and a value of the column's type (or NULL where the column allows it) in every row, on real H100 traces.

Real traces read here: nsys exports of the toy engine (eager_b1), of a frontend-bound `vllm serve` with the OS
scheduler's context switches (tests/data/h100_serve_frontend_slice.sqlite.xz), of a GEMM loop with the GPU's
counters sampled (tests/data/gpu_metrics/h100_gemm_copy.sqlite.xz); torch.profiler traces of the toy engine (eager,
with swaps) and of a vLLM engine with step annotations (tests/data/fixtures). Each is checked through its first
connection and through a reopened one (analyses run on both).
"""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.traces import Trace, open_trace
from profkit.traces.nsys_gpu_metrics import SPELLINGS
from profkit.traces.schema import GPU_COUNTERS, RELATIONS, Column
from tests.conftest import FIXTURES

DATA = Path(__file__).parent / "data"
NSYS = ["eager_b1", "serve_frontend", "gemm_copy"]
TORCH = {"torch_eager_b1": FIXTURES / "h100_toy" / "torch_eager_b1.json.gz",
         "torch_swap_b16": FIXTURES / "h100_toy" / "torch_swap_b16.json.gz",
         "torch_vllm_rank0": next((FIXTURES / "h100_vllm" / "torch_profile").glob("rank0.*.pt.trace.json.gz"), None)}
# The relations whose rows `Trace.present` speaks for.
EVENTS = ("strings", "kernels", "memops", "api", "sync", "nvtx", "cpu_ops", "sched", "gpu_metrics")
TYPEOF = {"INTEGER": "integer", "TEXT": "text", "REAL": "real"}


@pytest.fixture(scope="module")
def gemm_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("schema") / "h100_gemm_copy.sqlite"
    with lzma.open(DATA / "gpu_metrics" / "h100_gemm_copy.sqlite.xz") as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    path.chmod(0o444)
    return path


@pytest.fixture(params=[*NSYS, *TORCH])
def traces(request: pytest.FixtureRequest, sqlite_path, gemm_copy: Path) -> Iterator[tuple[str, list[Trace]]]:
    """A real trace opened by its reader, and a second connection to it."""
    name = request.param
    path = gemm_copy if name == "gemm_copy" else TORCH[name] if name in TORCH else sqlite_path(name)
    with open_trace(path) as trace:
        other = trace.reopen()
        try:
            yield name, [trace, other]
        finally:
            other.close()


def allowed(column: Column) -> str:
    """The typeof() values a column may hold, as an SQL list."""
    return f"'{TYPEOF[column.type]}'" + (", 'null'" if column.nullable else "")


def rows(trace: Trace, relation: str) -> int:
    return trace.query(f"SELECT count(*) FROM {relation}")[0][0]


def test_every_relation_has_the_schemas_columns_and_types(traces: tuple[str, list[Trace]]) -> None:
    name, opened = traces
    for trace in opened:
        for relation, columns in RELATIONS.items():
            cursor = trace.conn.execute(f"SELECT * FROM {relation} LIMIT 0")
            assert [d[0] for d in cursor.description] == [c.name for c in columns], (name, relation)
            # per column: the rows holding a value of another type (NULL counts as one where not allowed)
            wrong = ", ".join(f"coalesce(sum(typeof({c.name}) NOT IN ({allowed(c)})), 0)" for c in columns)
            found = trace.query(f"SELECT {wrong} FROM {relation}")[0]
            assert dict(zip([c.name for c in columns], found, strict=True)) == {c.name: 0 for c in columns}, \
                (name, relation)


def test_present_names_the_relations_holding_rows(traces: tuple[str, list[Trace]]) -> None:
    name, opened = traces
    for trace in opened:
        assert trace.present <= set(EVENTS)
        holding = {relation for relation in EVENTS if rows(trace, relation)}
        assert trace.present == holding, name
        # the GPU's counters are present with the series the trace recorded
        assert ("gpu_metrics" in trace.present) == bool(rows(trace, "gpu_metric_names")), name


def test_the_real_traces_fill_every_relation_a_reader_has_data_for(sqlite_path, gemm_copy: Path) -> None:
    """Which relations the real traces fill, per reader: together they reach every relation but the samples left
    out (no real export holds a broken sample); torch.profiler records no scheduler switches, GPU counters or
    CUDA-device map, nsys no CPU operators, and no torch trace here synchronizes explicitly."""
    filled: dict[str, set[str]] = {"nsys": set(), "torch": set()}
    for reader, paths in (("nsys", [sqlite_path("eager_b1"), sqlite_path("serve_frontend"), gemm_copy]),
                          ("torch", list(TORCH.values()))):
        for path in paths:
            with open_trace(path) as trace:
                filled[reader] |= {relation for relation in RELATIONS if rows(trace, relation)}
    assert filled["nsys"] == set(RELATIONS) - {"cpu_ops", "gpu_metrics_left_out"}
    assert filled["torch"] == {"strings", "kernels", "memops", "api", "nvtx", "cpu_ops"}


def test_annotations_name_their_process(sqlite_path) -> None:
    """nvtx.pid: nsys's process id (bits 24-47 of the thread's globalTid), the event's pid in a torch trace."""
    with open_trace(sqlite_path("eager_b1")) as trace:
        annotated = trace.query("SELECT tid, pid FROM nvtx")
        assert annotated and all(pid == (tid >> 24) & 0xFFFFFF for tid, pid in annotated)
    path = TORCH["torch_vllm_rank0"]
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    want = sorted((e["name"], e["pid"]) for e in events
                  if e.get("cat") in ("user_annotation", "gpu_user_annotation") and e.get("ph") == "X")
    with open_trace(path) as trace:
        assert sorted(trace.query("SELECT name, pid FROM nvtx")) == want


def test_the_gpu_counters_are_the_schemas(gemm_copy: Path) -> None:
    assert tuple(SPELLINGS) == GPU_COUNTERS
    with open_trace(gemm_copy) as trace:
        assert {m for (m,) in trace.query("SELECT DISTINCT metric FROM gpu_metrics")} == set(GPU_COUNTERS)
        assert trace.query("SELECT DISTINCT device FROM gpu_metric_names") == trace.query(
            "SELECT DISTINCT gpu FROM cuda_devices")
