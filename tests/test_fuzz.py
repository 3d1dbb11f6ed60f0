"""Property-based fuzzing of the readers of user input (hypothesis; issue 18). Oracle for every example:
either a result whose numbers are finite, or a ProfkitError (one printable line) — never another exception.
Issue 29 adds a property per class of hostile input (the section at its name below), each with its exact outcome
and, for traces and rules, a memory bound. Bounded for CI (PROFKIT_FUZZ_EXAMPLES, default 150 per property; a
third of that for properties that read whole traces); run long locally with e.g.
PROFKIT_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py (`--hypothesis-show-statistics` shows what each
property's examples came to)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import resource
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from profkit.compare.gate import parse_condition
from profkit.diagnose.facts import known_fact_names
from profkit.diagnose.rule_files import load_rule_file
from profkit.diagnose.sandbox import RuleError
from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.evidence.bench import parse_bench
from profkit.evidence.metrics import parse_metrics
from profkit.evidence.vllm_log import parse_log
from profkit.traces.kineto_guard import MAX_DEPTH, MAX_STRING
from profkit.vllm.command import VllmCommand
from tests.cli import one_error_line, profkit

pytestmark = pytest.mark.slow  # CI runs it (pytest -m slow); the default run leaves it out

EXAMPLES = int(os.environ.get("PROFKIT_FUZZ_EXAMPLES", "150"))
# No explain phase: on a failure it reruns a slow example hundreds of times to annotate what varies (minutes).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
REAL_LOG = (Path(__file__).parent / "data" / "vllm_serve_kv300mb" / "server.log").read_text().splitlines()
REAL_METRICS = (Path(__file__).parent / "data" / "vllm_serve_kv300mb" / "metrics-after.txt").read_text().splitlines()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30)


def finite_numbers(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_numbers(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_numbers(v) for v in value)
    return True


def printable(exc: Exception) -> bool:
    line = one_line(exc)
    return "\n" not in line and all(ord(c) >= 32 for c in line)


@FUZZ
@given(st.lists(st.sampled_from(REAL_LOG) | st.text(max_size=200), max_size=30),
       st.lists(st.tuples(st.integers(0, 199), st.text(max_size=40)), max_size=10))
def test_log_parser(lines: list[str], mutations: list[tuple[int, str]]) -> None:
    """Real log lines, cut and spliced with junk."""
    for i, junk in mutations:
        if lines:
            line = lines[i % len(lines)]
            cut = i % (len(line) + 1)
            lines[i % len(lines)] = line[:cut] + junk + line[cut:]
    out = msgspec.to_builtins(parse_log("\n".join(lines)))
    assert finite_numbers(out) and out["stats_lines"] >= 0


@FUZZ
@given(json_values)
def test_bench_parser(data: object) -> None:
    if isinstance(data, dict):
        assert finite_numbers(msgspec.to_builtins(parse_bench(data)))


@FUZZ
@given(st.lists(st.sampled_from(REAL_METRICS) | st.text(max_size=80), max_size=40))
def test_metrics_parser(lines: list[str]) -> None:
    try:
        out = parse_metrics("\n".join(lines))
    except ProfkitError as exc:
        assert printable(exc)
        return
    assert all(math.isfinite(v) for v in out.values.values())


@FUZZ
@given(st.text(max_size=60))
def test_gate_conditions(text: str) -> None:
    try:
        cond = parse_condition(text)
    except ProfkitError as exc:
        assert printable(exc)
        return
    assert cond.op in ("<", "<=", ">", ">=") and math.isfinite(cond.value)


@FUZZ
@given(st.text(max_size=120))
def test_flag_text(text: str) -> None:
    for parse in (lambda t: VllmCommand.parse(t).flags(), VllmCommand.parse):
        try:
            parse(text)
        except (ProfkitError, ValueError) as exc:  # shlex: unbalanced quotes -> the caller says which option
            assert printable(exc)


@FUZZ
@given(st.lists(st.sampled_from(["--max-num-seqs", "4", "--enforce-eager", "--no-enforce-eager", "--model", "m",
                                 "--kv-cache-memory-bytes=3", "--max_num_seqs", "x y", "'", "--"]), max_size=10),
       st.sampled_from(["--max-num-seqs", "--enforce-eager", "--kv-cache-memory-bytes", "--kv-cache-dtype"]),
       st.none() | st.booleans() | st.integers(0, 10 ** 6) | st.sampled_from(["fp8", "auto"]))
def test_apply_change_round_trips(args: list[str], flag: str, to: object) -> None:
    new, action, _ = VllmCommand(["vllm"], ["serve"], args).apply(flag, to)
    assert action in ("edit", "add", "remove", "none")
    assert shlex.split(new.shell()) == new.argv()


rule_keys = st.sampled_from(["id", "title", "severity", "when", "summary", "evidence", "changes", "description",
                             "bogus"])


@FUZZ
@given(st.dictionaries(rule_keys, json_values | st.sampled_from(
    ["gpu.utilization < 0.5", "info", "{{ f['gpu.utilization'] }}", "{% for %}", "x(", "1/0"]), max_size=8))
def test_rule_files(tmp_path_factory, data: dict) -> None:
    path = tmp_path_factory.mktemp("rules") / "r.yaml"
    path.write_text(json.dumps(data, default=str))  # JSON is YAML
    try:
        load_rule_file(path, known_fact_names())
    except RuleError as exc:
        assert printable(exc) and str(path) in str(exc)


# --- whole traces: a real nsys export (prefill_long, H100) mutated by SQL, then `profkit report` in-process.
TRACE_EXAMPLES = max(10, EXAMPLES // 3)
TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "StringIds"]
COLUMNS = ["start", "end", "deviceId", "streamId", "correlationId", "demangledName", "shortName", "graphNodeId",
           "nameId", "bytes", "copyKind", "srcKind", "dstKind", "globalPid", "globalTid", "value", "text"]
ODD_VALUES = st.sampled_from([None, -1, 0, 1, 2 ** 63 - 1, -(2 ** 63), 1e300, -0.5, float("nan"), "x", "",
                              "\x1b[31m|](javascript:x)", b"\xff\xfe"])
mutation = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(TABLES), st.sampled_from(COLUMNS), ODD_VALUES, st.integers(1, 50)),
    st.tuples(st.just("dup"), st.sampled_from(TABLES), st.integers(1, 3)),
    st.tuples(st.just("device"), st.sampled_from([-1, 1, 7, 2 ** 40]), st.integers(1, 5)),
    st.tuples(st.just("swap"), st.sampled_from(TABLES), st.integers(1, 20)),
    st.tuples(st.just("delete"), st.sampled_from(TABLES), st.integers(1, 4)),
    st.tuples(st.just("drop"), st.sampled_from(TABLES)),
)


def _mutate(conn, m: tuple) -> None:
    import sqlite3

    kind, *rest = m
    try:
        if kind == "set":
            table, col, value, every = rest
            conn.execute(f"UPDATE {table} SET {col} = ? WHERE rowid % ? = 0", (value, every))
        elif kind == "dup":  # every row again, `times` times: duplicated events
            table, times = rest
            for _ in range(times):
                conn.execute(f"INSERT INTO {table} SELECT * FROM {table}")
        elif kind == "device":  # some kernels on another (or an impossible) device
            device, every = rest
            conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = ? WHERE rowid % ? = 0", (device, every))
        elif kind == "swap":
            table, every = rest
            conn.execute(f"UPDATE {table} SET start = end, end = start WHERE rowid % ? = 0", (every,))
        elif kind == "delete":
            table, every = rest
            conn.execute(f"DELETE FROM {table} WHERE rowid % ? != 0", (every,))
        else:
            conn.execute(f"DROP TABLE {rest[0]}")
    except sqlite3.Error:  # a column this table does not have, a constraint: that mutation is a no-op
        pass


def _plausible(report: dict) -> None:
    text = json.dumps(report, allow_nan=False)  # valid JSON: no NaN/Infinity anywhere
    assert text
    for k in report["kernels"]:
        assert k["min_ns"] >= 0 and k["total_ns"] >= 0 and k["count"] > 0
    assert 0 <= report["gpu"]["utilization"] <= 1
    for name, value in report["facts"].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert math.isfinite(value), name
            # host API shares may pass 1 legitimately (several threads in calls at once)
            if name.endswith(("_share", ".utilization", ".busy")) and not name.endswith(".api_share"):
                assert 0 <= value <= 1, (name, value)
            if name.endswith(("_ns", ".count", ".calls")):
                assert value >= 0, (name, value)


def _check_mutated(base: Path, folder: Path, mutations: list[tuple]) -> None:
    import hashlib
    import shutil
    import sqlite3

    from profkit.report import ReportOptions, build_report

    path = folder / "t.sqlite"
    shutil.copyfile(base, path)
    path.chmod(0o644)
    with sqlite3.connect(path) as conn:
        for m in mutations:
            _mutate(conn, m)
    conn.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        report = build_report(path, options=ReportOptions(window="all")).document()
    except ProfkitError as exc:
        assert printable(exc)
    else:
        _plausible(report)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # the user's trace, untouched
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.sqlite"]  # nothing written beside it


@settings(FUZZ, max_examples=TRACE_EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(mutation, min_size=1, max_size=4))
def test_mutated_nsys_exports(sqlite_path, tmp_path_factory, mutations: list[tuple]) -> None:
    _check_mutated(sqlite_path("prefill_long"), tmp_path_factory.mktemp("mut"), mutations)


K, R = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
FOUND = [  # what the property above found; each failed before its fix
    [("set", K, "end", "x", 1)], [("set", R, "end", 1e300, 1)], [("set", R, "end", "x", 1)],
    [("set", K, "start", -1, 1)], [("set", R, "start", -1, 1)], [("delete", "StringIds", 2)],
    [("set", "CUPTI_ACTIVITY_KIND_MEMSET", "bytes", 1e300, 2)], [("set", "NVTX_EVENTS", "end", None, 1)],
    [("set", K, "deviceId", "x", 1)], [("set", K, "start", None, 1), ("dup", R, 3)],
]


@pytest.mark.parametrize("mutations", FOUND, ids=[str(m)[:60] for m in FOUND])
def test_found_by_fuzzing(sqlite_path, tmp_path: Path, mutations: list[tuple]) -> None:
    _check_mutated(sqlite_path("prefill_long"), tmp_path, mutations)


# Metamorphic: the order of an export's rows and duplicated rows change no number of the report.
reorder = st.tuples(st.sampled_from([K, R, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"]),
                    st.sampled_from(["start DESC", "end", "random()", "rowid % 7, rowid"]),
                    st.integers(0, 5))


@settings(FUZZ, max_examples=TRACE_EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(reorder, min_size=1, max_size=3), st.sampled_from(["all", "auto"]))
def test_row_order_and_duplicates_change_nothing(sqlite_path, tmp_path_factory, changes: list[tuple],
                                                 window: str) -> None:
    import shutil
    import sqlite3

    from profkit.report import ReportOptions, build_report

    path = tmp_path_factory.mktemp("order") / "t.sqlite"
    shutil.copyfile(sqlite_path("prefill_long"), path)
    path.chmod(0o644)
    good = build_report(path, options=ReportOptions(window=window)).document()
    with sqlite3.connect(path) as conn:
        for table, order, every in changes:  # rows in another order; every `every`-th row twice (0: none)
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
                continue  # this export has no such table (prefill_long made no memcpy)
            conn.execute(f"ALTER TABLE {table} RENAME TO old_rows")
            twice = f" UNION ALL SELECT * FROM old_rows WHERE rowid % {every} = 0" if every else ""
            conn.execute(f"CREATE TABLE {table} AS SELECT * FROM (SELECT * FROM old_rows{twice}) ORDER BY {order}")
            conn.execute("DROP TABLE old_rows")
    conn.close()
    doc = build_report(path, options=ReportOptions(window=window)).document()
    same = ("kernels", "api", "gpu", "gaps", "gap_classes", "timeline", "window", "launch", "steps", "memops",
            "memory_kinds")
    assert {k: doc[k] for k in same} == {k: good[k] for k in same}


# --- torch.profiler traces at the CLI: a real Kineto trace (graphs_b16, H100) mutated as JSON, then serialized
# plain, with a BOM, with trailing garbage, gzip'd or gzip cut short; `profkit report` through its console entry.
KINETO_FIELDS = ["ts", "dur", "ph", "cat", "name", "pid", "tid", "args"]
KINETO_ARGS = ["correlation", "device", "stream", "External id", "bytes", "cbid"]
KINETO_HEADER = ["deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion",
                 "cuda_driver_version", "traceEvents", "displayTimeUnit"]
KINETO_ODD = st.sampled_from([None, -1, 0, 2 ** 70, 1e20, -1e20, float("nan"), float("inf"), "x", "",
                              "\x1b[2J|](javascript:x)\r\x00", [], {}, True, [{"name": 7}], {"rank": "x"}])
kineto_mutation = st.one_of(
    st.tuples(st.just("field"), st.integers(0, 10 ** 6), st.sampled_from(KINETO_FIELDS), KINETO_ODD),
    st.tuples(st.just("arg"), st.integers(0, 10 ** 6), st.sampled_from(KINETO_ARGS), KINETO_ODD),
    st.tuples(st.just("drop"), st.integers(0, 10 ** 6), st.sampled_from(KINETO_FIELDS)),
    st.tuples(st.just("header"), st.sampled_from(KINETO_HEADER), KINETO_ODD),
    st.tuples(st.just("dup"), st.integers(2, 50)),
    st.tuples(st.just("cut"), st.integers(1, 99)),
)
KINETO_WRAPPING = st.sampled_from(["plain", "bom", "garbage", "gzip", "gzip-cut"])


def _kineto_events() -> tuple[dict, list[int]]:
    import gzip

    from tests.conftest import FIXTURES

    doc = json.loads(gzip.decompress((FIXTURES / "h100_toy" / "torch_graphs_b16.json.gz").read_bytes()))
    gpu_side = [i for i, e in enumerate(doc["traceEvents"])
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver")]
    return doc, gpu_side


def _kineto_bytes(doc: dict, gpu_side: list[int], mutations: list[tuple], wrapping: str) -> bytes:
    import copy
    import gzip

    doc = copy.deepcopy(doc)
    events = doc["traceEvents"]
    for kind, *rest in mutations:
        if kind in ("field", "arg", "drop"):
            at = gpu_side[rest[0] % len(gpu_side)]
            if not isinstance(events, list) or at >= len(events):  # cut away, or no event list any more
                continue
            event = events[at]
            if kind == "field":
                event[rest[1]] = rest[2]
            elif kind == "arg" and isinstance(event.get("args"), dict):
                event["args"][rest[1]] = rest[2]
            else:
                event.pop(rest[1], None)
        elif kind == "header":
            doc[rest[0]] = rest[1]
        elif kind == "dup" and isinstance(events, list):  # every n-th event twice
            events.extend(events[:: rest[0]])
        elif kind == "cut" and isinstance(events, list):  # the trace of a profiler stopped early
            del events[len(events) * rest[0] // 100:]
    data = json.dumps(doc).encode()  # NaN/Infinity as JSON writers of Python (and Kineto) write them
    if wrapping == "bom":
        return b"\xef\xbb\xbf" + data
    if wrapping == "garbage":
        return data + b"\x00\xff}]garbage"
    packed = gzip.compress(data, compresslevel=1)
    return packed[: len(packed) * 2 // 3] if wrapping == "gzip-cut" else packed


def _clean_text(text: str) -> bool:
    return all(ch in "\n\t" or ord(ch) >= 32 and not 0x7f <= ord(ch) < 0xa0 for ch in text)


_KINETO: tuple[dict, list[int]] | None = None


@settings(FUZZ, max_examples=TRACE_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(kineto_mutation, min_size=1, max_size=4), KINETO_WRAPPING)
def test_mutated_kineto_traces_at_the_cli(tmp_path_factory, mutations: list[tuple], wrapping: str) -> None:
    import tempfile

    from profkit.render.markdown import render_markdown
    from profkit.render.text import render_text

    global _KINETO
    _KINETO = _KINETO or _kineto_events()
    folder = tmp_path_factory.mktemp("kineto")
    trace = folder / ("t.pt.trace.json.gz" if wrapping.startswith("gzip") else "t.pt.trace.json")
    data = _kineto_bytes(*_KINETO, mutations, wrapping)
    trace.write_bytes(data)
    scratch = folder / "tmp"
    scratch.mkdir()
    saved, tempfile.tempdir = tempfile.tempdir, str(scratch)  # every temporary file of the run lands here
    try:
        r = profkit("report", str(trace), "--format", "json", "-o", str(folder / "r.json"),
                                  "--no-progress")
    finally:
        tempfile.tempdir = saved
    assert trace.read_bytes() == data  # the user's trace, untouched
    assert list(scratch.iterdir()) == []  # no temporary file left behind, whatever happened
    if r.returncode == 0:
        report = json.loads((folder / "r.json").read_text(), parse_constant=lambda c: pytest.fail(c))
        _plausible(report)
        assert _clean_text(render_text(report)) and _clean_text(render_markdown(report))
    else:
        line = one_error_line(r)
        assert printable(RuntimeError(line)) and not (folder / "r.json").exists()


KINETO_FOUND = [  # what the property above found; each failed before its fix
    ([("header", "baseTimeNanoseconds", 1e20)], "plain"),  # a header number ijson gives as a Decimal: not JSON
    ([("arg", 0, "correlation", 2 ** 70)], "plain"),  # an id past int64: SQLite refused it (internal error)
    ([("field", 0, "tid", 2 ** 70)], "gzip"),
]


@pytest.mark.parametrize(("mutations", "wrapping"), KINETO_FOUND, ids=[str(m)[:60] for m, _ in KINETO_FOUND])
def test_kineto_found_by_fuzzing(tmp_path_factory, mutations: list[tuple], wrapping: str) -> None:
    test_mutated_kineto_traces_at_the_cli.hypothesis.inner_test(tmp_path_factory, mutations, wrapping)


# --- a capture folder whose manifest is anything JSON (vllm_args, command, environment of any shape) beside a
# real run's evidence, reported without a trace; and `profkit report` with arbitrary option values.
MANIFEST_KEYS = st.sampled_from(["vllm_args", "command", "environment", "tool", "bench", "argv", "mode", "profiled"])


@FUZZ
@given(st.dictionaries(MANIFEST_KEYS, json_values, max_size=6) | json_values)
@example({"vllm_args": None, "command": None, "environment": {"": float("inf")}})  # Infinity reached the JSON
@example({"vllm_args": '"'})  # an unclosed quote was blamed on --vllm-args, an option nobody gave
def test_capture_manifests(tmp_path_factory, manifest: object) -> None:
    import shutil

    from profkit.report import build_report

    folder = tmp_path_factory.mktemp("capture")
    for name in ("bench.json", "server.log", "metrics-after.txt"):
        shutil.copyfile(Path(__file__).parent / "data" / "vllm_serve_kv300mb" / name, folder / name)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    try:
        report = build_report(folder).document()
    except ProfkitError as exc:
        assert printable(exc) and "manifest.json" in str(exc)
    else:
        json.dumps(report, allow_nan=False)
        assert finite_numbers(report["facts"])


cli_value = st.sampled_from(["all", "auto", "0:1", "5:3", "nvtx:", "nvtx:x", "1:99999999999999999999", "-1",
                             "1e400", "100us", "0", "10ms", "-5us", "2s", "abc", "", "\x1b[2J", "9" * 30]) | \
    st.text(max_size=12)


@settings(FUZZ, max_examples=TRACE_EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(window=cli_value, gap=cli_value, top=cli_value, fmt=st.sampled_from(["text", "json", "md", "html", "x"]))
def test_report_arguments(sqlite_path, tmp_path_factory, window: str, gap: str, top: str, fmt: str) -> None:
    import hashlib

    trace = sqlite_path("prefill_long")
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()
    out = tmp_path_factory.mktemp("args") / "r.out"
    r = profkit("report", str(trace), "--window", window, "--gap-threshold", gap, "--top", top,
                "--format", fmt, "-o", str(out), "--no-progress")
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == digest
    if r.returncode == 0:
        text = out.read_text()
        if fmt == "json":
            _plausible(json.loads(text, parse_constant=lambda c: pytest.fail(c)))
        elif fmt in ("text", "md"):
            assert _clean_text(text)
    else:
        line = one_error_line(r)
        assert all(ch == "\t" or ord(ch) >= 32 for ch in line) and not out.exists()


# =====================================================================================================================
# Issue 29: a property per class of hostile input that once cost gigabytes or printed something unsafe (each class's
# regression test is in test_hostile.py / test_hostile_outputs.py). An example is checked against its exact outcome
# where one is known; reading a trace or evaluating a rule may allocate a bounded amount only (`_peak_growth`).
MiB = 1 << 20


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        m = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    assert m, field
    return int(m.group(1)) << 10


@contextlib.contextmanager
def _peak_growth(limit: int) -> Iterator[None]:
    """The block may allocate at most `limit` bytes more than it started with, at its peak (tracemalloc: Python's
    and numpy's allocations, exactly; resident memory would hide an example's peak in what the allocator kept from
    the one before). Its address space is capped meanwhile: a bound that regressed badly is a MemoryError here, not
    the OOM killer ending the run."""
    import tracemalloc

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _status_bytes("VmSize") + 16 * limit
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    assert peak <= limit, f"peak memory {peak / MiB:.0f} MiB (bound {limit / MiB:.0f} MiB)"


# --- torch traces built as bytes around a placeholder: two real traces, in two layouts -----------------------------
MINITOY = Path(__file__).parent / "data" / "foreign" / "hta_amd_mi250_minitoy.json.gz"
HOLE = "@@profkit-fuzz@@"  # a JSON string the example's bytes replace (quotes included)
SAME = ("kernels", "gpu", "api", "memops", "nvtx")  # report sections a trace's odd bytes must leave as they were
_TORCH: dict[str, dict] = {}
_BASE_REPORTS: dict[tuple, dict] = {}


def _torch_base(name: str) -> dict:
    """'h100': 600 events of the H100 graphs_b16 trace (kernels, runtime, memsets, CPU ops; read by the msgspec
    fast path). 'mi250': HTA's MI250 toy trace whole (with CPU and GPU annotations: NVTX text; its stream ids are
    text, so it is read by the streaming ijson path)."""
    import gzip

    from tests.conftest import FIXTURES

    if name not in _TORCH:
        if name == "h100":
            doc = json.loads(gzip.decompress((FIXTURES / "h100_toy" / "torch_graphs_b16.json.gz").read_bytes()))
            events = doc["traceEvents"]
            doc["traceEvents"] = events[700:1300] + [e for e in events if e.get("ph") == "M"]
        else:
            doc = json.loads(gzip.decompress(MINITOY.read_bytes()))
        _TORCH[name] = doc
    return _TORCH[name]


def _first(events: list, cat: str) -> int:
    return next(i for i, e in enumerate(events) if e.get("cat") == cat)


def _serialize(head: dict, events: list, tail: dict, layout: str) -> bytes:
    """'kineto': header keys first, one event a line joined by Kineto's `},\\n  {` (the fast path's cut points);
    'compact': no whitespace at all (no cut point: the whole array at once, or the streaming path)."""
    if layout == "compact":
        text = json.dumps({**head, "traceEvents": events, **tail}, separators=(",", ":"))
    else:
        keys = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in head.items()]
        text = "{\n" + ",\n".join([*keys, '  "traceEvents": [\n  ' + ",\n  ".join(map(json.dumps, events)) + "\n  ]",
                                   *(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tail.items())]) + "\n}"
    return text.encode()


def _holed(base: str, place: str, layout: str) -> tuple[bytes, bytes]:
    """The trace's bytes before and after the placeholder put at `place`."""
    import copy

    doc = copy.deepcopy(_torch_base(base))
    events = doc.pop("traceEvents")
    head, tail = doc, {}
    kernel = _first(events, "kernel")
    if place == "header":  # metadata before the events, first of all
        head = {"fuzz": HOLE, **head}
    elif place == "device":
        head["deviceProperties"][0]["fuzz"] = HOLE
    elif place == "trailer":  # a key after the events
        tail = {"fuzz": HOLE}
    elif place == "item":  # an element of traceEvents that is no event
        events.insert(kernel, HOLE)
    elif place == "event":
        events[kernel]["fuzz"] = HOLE
    elif place == "args":
        events[kernel]["args"]["fuzz"] = HOLE
    elif place == "kernel":  # a kernel's name
        events[kernel]["name"] = HOLE
    elif place == "nvtx":  # a CPU annotation's text (torch's record_function: NVTX ranges in the report)
        events[_first(events, "user_annotation")]["name"] = HOLE
    elif place == "cpu_op":
        events[_first(events, "cpu_op")]["name"] = HOLE
    elif place == "arg":  # a string in a kernel's args profkit does not read
        events[kernel]["args"]["note"] = HOLE
    elif place == "gpu":  # the first GPU's name in the header
        head["deviceProperties"][0]["name"] = HOLE
    data = _serialize(head, events, tail, layout)
    before, _, after = data.partition(json.dumps(HOLE).encode())
    assert _ and HOLE.encode() not in after
    return before, after


_HOLED: dict[tuple, tuple[bytes, bytes]] = {}


_SCRATCH: dict[str, Path] = {}


def _trace_file(tmp_path_factory, what: str, base: str, place: str, layout: str, value: bytes,
                wrapping: str) -> Path:
    """The trace with `value` in its placeholder, in `what`'s scratch folder (one file, rewritten by each example:
    tens of MB each would otherwise pile up)."""
    import gzip

    key = (base, place, layout)
    if key not in _HOLED:
        _HOLED[key] = _holed(*key)
    before, after = _HOLED[key]
    data = before + value + after
    if what not in _SCRATCH:
        _SCRATCH[what] = tmp_path_factory.mktemp(what)
    for name in ("t.json", "t.json.gz"):
        (_SCRATCH[what] / name).unlink(missing_ok=True)
    path = _SCRATCH[what] / ("t.json.gz" if wrapping == "gzip" else "t.json")
    path.write_bytes(gzip.compress(data, compresslevel=1) if wrapping == "gzip" else data)
    return path


def _torch_report(path: Path) -> tuple[dict | None, str | None]:
    """`profkit report TRACE --format json` through the console entry, in this process: (report, None) or
    (None, the one error line)."""
    r = profkit("report", str(path), "--format", "json", "--window", "all", "--no-progress")
    if r.returncode == 0:
        return json.loads(r.stdout, parse_constant=lambda c: pytest.fail(c)), None
    return None, one_error_line(r)


def _base_report(tmp_path_factory, base: str, place: str, layout: str, value: bytes, wrapping: str) -> dict:
    """The report of the same trace with an ordinary value in the placeholder."""
    key = (base, place, layout, value, wrapping)
    if key not in _BASE_REPORTS:
        path = _trace_file(tmp_path_factory, "base", base, place, layout, value, wrapping)
        report, error = _torch_report(path)
        assert error is None, error
        _BASE_REPORTS[key] = report
    return _BASE_REPORTS[key]


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


# --- 1. nesting: metadata before the events, an event, its args, the event list, keys after the events ------------
# (containers around the placeholder: the document, the device list and its entry, the event list, the event, args)
DEPTH_PLACES = {"header": 1, "device": 3, "trailer": 1, "item": 2, "event": 3, "args": 4}
# Brackets and quotes inside strings are no nesting: the bound counts structure only.
DECOYS = [None, '"[[{{"', '"\\\\"', '"\\"[{"', '"}]]"', '"\\\\\\"[{"', '"\\u005b\\u007b"']


def _nest(depth: int, pattern: list[str], decoy: str | None) -> bytes:
    """`depth` nested arrays/objects (kinds cycling through `pattern`), a decoy string at each level, cheaply: the
    bytes of one cycle repeated."""
    opens = {"[": "[" + (decoy + "," if decoy else ""), "{": "{" + (decoy or '"a"') + ":"}
    closes = {"[": "]", "{": "}"}
    n, r = divmod(depth, len(pattern))
    head = "".join(opens[k] for k in pattern).encode() * n + "".join(opens[k] for k in pattern[:r]).encode()
    tail = "".join(closes[k] for k in reversed(pattern[:r])).encode() + \
        "".join(closes[k] for k in reversed(pattern)).encode() * n
    return head + b"0" + tail


@settings(FUZZ, max_examples=TRACE_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["h100", "mi250"]), place=st.sampled_from(sorted(DEPTH_PLACES)),
       layout=st.sampled_from(["kineto", "compact"]), wrapping=st.sampled_from(["plain", "gzip"]),
       depth=st.integers(1, 8) | st.integers(MAX_DEPTH - 8, MAX_DEPTH + 2) | st.integers(1, 200_000),
       pattern=st.lists(st.sampled_from("[{"), min_size=1, max_size=3), decoy=st.sampled_from(DECOYS))
@example(base="h100", place="header", layout="kineto", wrapping="plain", depth=200_000, pattern=["["], decoy=None)
@example(base="h100", place="trailer", layout="kineto", wrapping="gzip", depth=100_000, pattern=["["], decoy=None)
def test_deeply_nested_torch_traces(tmp_path_factory, base: str, place: str, layout: str, wrapping: str, depth: int,
                                    pattern: list[str], decoy: str | None) -> None:
    """A torch trace nested `depth` levels deep somewhere (up to 200,000, built as bytes): a report with the
    trace's own numbers, or the one error line; peak memory bounded whatever the depth. Nesting in the metadata
    before the events is refused exactly past MAX_DEPTH (the header reader's bound); elsewhere a trace within the
    bound is read, and one past it may be refused."""
    path = _trace_file(tmp_path_factory, "deep", base, place, layout, _nest(depth, pattern, decoy), wrapping)
    good = _base_report(tmp_path_factory, base, place, layout, b"0", wrapping)
    total = max(_depth(_torch_base(base)), DEPTH_PLACES[place] + depth)
    with _peak_growth(64 * MiB):  # 36 MiB at 200,000 levels; unbounded, ijson took 4 GB at 40,000
        report, error = _torch_report(path)
    event("refused" if error else "read", f"{'past' if total > MAX_DEPTH else 'within'} MAX_DEPTH")
    if error is not None:
        assert error == f"profkit: error: {path}: JSON nested too deeply: not a torch.profiler trace"
        assert total > MAX_DEPTH, f"refused at depth {total}"
    else:
        assert place not in ("header", "device") or total <= MAX_DEPTH, f"read at depth {total}"
        assert {k: report[k] for k in SAME} == {k: good[k] for k in SAME}


# --- 2. long strings: a kernel name, NVTX text, a CPU op, an unread arg, the GPU's name; plain or gzip'd -----------
# Pieces of a JSON string as written, each one character: an escape (a surrogate pair among them), multibyte UTF-8
# or ASCII. A clipped string is cut at the last piece boundary within MAX_STRING bytes, exactly.
PIECES = [b"a", b"\\\\", b'\\"', b"\\n", b"\\/", b"\\u00e9", b"\\u001b", b"\\ud83d\\ude00", "é".encode(),
          "€".encode(), "😀".encode(), b"[", b"{", b" "]
LONG_PLACES = [("h100", "kernel"), ("h100", "cpu_op"), ("h100", "arg"), ("h100", "gpu"), ("mi250", "kernel"),
               ("mi250", "nvtx")]
MAX_LONG = 48 * MiB
# Reads the string may straddle: the header reader's and ijson's 64 KiB, the fast path's 4 MiB blocks.
BLOCKS = [None, 1 << 16, 4 << 20]


def _long_string(offset: int, pieces: list[bytes], length: int) -> tuple[bytes, int]:
    """A JSON string's content of about `length` bytes: 'k', `offset` x's, then `pieces` over and over; and the
    last piece boundary at or before MAX_STRING (where a clipped string must be cut)."""
    cycle = b"".join(pieces)
    reps = max(0, -(-(length - 1 - offset) // len(cycle)))
    content = b"k" + b"x" * offset + cycle * reps
    start = 1 + offset
    if start >= MAX_STRING or len(content) <= MAX_STRING:
        return content, MAX_STRING
    whole, within = divmod(MAX_STRING - start, len(cycle))
    ends = [0, *itertools.accumulate(len(p) for p in pieces)]
    return content, start + whole * len(cycle) + max(e for e in ends if e <= within)


def _rows(rows: list[dict], renamed: dict[str, str] | None = None) -> list[tuple]:
    """A report table as sorted rows, names in `renamed` replaced."""
    renamed = renamed or {}
    return sorted(tuple(sorted((k, renamed.get(v, v) if isinstance(v, str) else v) for k, v in r.items()))
                  for r in rows)


def _decoded(content: bytes) -> str:
    return json.loads(b'"' + content + b'"')


@settings(FUZZ, max_examples=TRACE_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(LONG_PLACES), layout=st.sampled_from(["kineto", "compact"]),
       wrapping=st.sampled_from(["plain", "gzip"]),
       offset=st.integers(0, 16) | st.integers(MAX_STRING - 24, MAX_STRING),
       pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=6),
       length=st.integers(1, 4096) | st.integers(MAX_STRING - 24, MAX_STRING + 24) |
       st.integers(MAX_STRING + 1, 8 * MiB) | st.integers(8 * MiB, MAX_LONG),
       block=st.sampled_from(BLOCKS), shift=st.integers(-24, 24))
@example(where=("h100", "kernel"), layout="kineto", wrapping="gzip", offset=0, pieces=[b"a"], length=MAX_LONG,
         block=None, shift=0)
def test_long_strings_in_torch_traces(tmp_path_factory, where: tuple[str, str], layout: str, wrapping: str,
                                      offset: int, pieces: list[bytes], length: int, block: int | None,
                                      shift: int) -> None:
    """A string of up to 48 MB in a torch trace: the report shows it clipped to MAX_STRING bytes of JSON at a
    character boundary (never half an escape, a surrogate pair or a UTF-8 character) with the marker giving its
    length, and says so; everything else is the report of the same trace with a short name. `block`/`shift` put
    the cut point `shift` bytes before the end of a read block, where the reader holds or skips an open string.
    Peak memory is bounded by the read block, whatever the string's length."""
    base, place = where
    content, cut = _long_string(offset, pieces, length)
    value = b'"' + content + b'"'
    if block:  # whitespace before the string: its cut point `shift` bytes before a block's end
        key = (base, place, layout)
        _HOLED.setdefault(key, _holed(*key))
        at = len(_HOLED[key][0]) + 1  # the content's first byte with no padding
        end = -(-(at + MAX_STRING + 64) // block) * block
        value = b" " * (end - shift - MAX_STRING - at) + value
    path = _trace_file(tmp_path_factory, "long", base, place, layout, value, wrapping)
    del value
    good = _base_report(tmp_path_factory, base, place, layout, b'"k"', wrapping)
    # The reader's scan of a 4 MiB block costs ~28 bytes per backslash or quote in it (their positions as int64,
    # and temporaries): 8-14 MiB for a string of letters, ~120 MiB for one of escaped quotes, whatever its length.
    special = min(content.count(b"\\") + content.count(b'"'), 4 * MiB)
    with _peak_growth(32 * MiB + 28 * special):
        report, error = _torch_report(path)
    assert error is None, error
    clipped = len(content) > MAX_STRING
    event("clipped" if clipped else "whole", f"{len(content) >> 20} MiB" if len(content) >= MiB else "< 1 MiB")
    name = _decoded(content[:cut]) + f"...[clipped by profkit: {len(content)} bytes]" if clipped else \
        _decoded(content)
    note = report["source"].get("inconsistent") or ""
    assert ("1 strings longer than 64 KiB clipped" in note) == clipped, note
    assert {k: report[k] for k in SAME if k not in ("kernels", "nvtx")} == \
        {k: good[k] for k in SAME if k not in ("kernels", "nvtx")}

    section = "nvtx" if place == "nvtx" else "kernels"
    if place in ("kernel", "nvtx"):  # the renamed event's row has the long name, clipped; the rest is as it was
        assert _rows(report[section]) == _rows(good[section], {"k": name})
    else:
        assert report["kernels"] == good["kernels"] and report["nvtx"] == good["nvtx"]
    if place == "gpu":
        assert report["source"]["gpu"] == name[:200]


# --- 3. rule files: templates and expressions asking for huge widths, repetitions, concatenations, powers ---------
# Facts of a real report (eager_b1) the expressions read; each has a value there.
RULE_FACTS = ["gpu.utilization", "kernels.count", "kernels.graph_share", "launch.latency_median_ns"]
# A width, count or exponent: small, at the bounds (1000 wide, 10,000 items, 20,000 characters) or up to 10^12.
BIG = st.integers(0, 12) | st.sampled_from([99, 999, 1000, 1001, 1999, 2000, 3999, 4000, 4300, 9999, 10000, 10001,
                                            19999, 20000, 20001, 10 ** 6, 10 ** 9, 9999999999, 10 ** 12]) | \
    st.integers(0, 10 ** 12)
PERCENT = st.builds(lambda flags, width, precision, conversion: f"%{flags}{width}{precision}{conversion}",
                    st.sampled_from(["", "-", "0", "+", " ", "#", "-0"]), st.just("") | st.just("*") | BIG.map(str),
                    st.just("") | BIG.map(lambda n: f".{n}"), st.sampled_from("dsfxer%"))
SPEC = st.builds(lambda align, width, comma, precision, kind: f"{align}{width}{comma}{precision}{kind}",
                 st.sampled_from(["", ">", "<", "^", "0", "x^"]), st.just("") | BIG.map(str),
                 st.sampled_from(["", ","]),
                 st.just("") | BIG.map(lambda n: f".{n}"), st.sampled_from(["", "d", "f", "e", "s", "%"]))


def _binary(inner: st.SearchStrategy, other: st.SearchStrategy, form: str) -> st.SearchStrategy:
    return st.tuples(inner, other).map(lambda t: form.format(*t))


# Expressions typed as they would be written (text or number), so that most evaluate and the bounds, not type
# errors, decide; a few branches mix types on purpose.
_J_NUMBER = st.recursive(
    st.sampled_from([f"f['{n}']" for n in RULE_FACTS] + ["2.5", "-3"]) | BIG.map(str),
    lambda n: st.one_of(_binary(n, BIG, "({}) * {}"), _binary(n, st.integers(-3, 100) | BIG, "({}) ** {}"),
                        _binary(n, n, "({}) + ({})"), _binary(n, BIG, "({}) | round({})")), max_leaves=3)
# Values near the bounds that are allowed: combined, they make outputs of up to 20,000 characters, or just over.
_ALLOWED = ["'word ' * 1999", "'%999d' % 7", "'x' | center(1000)", "(['ab'] * 3000) | join(' ')",
            "f['kernels.count'] | num(1000)", "'ab' | replace('a', 'a' * 999)"]
_PERCENT = PERCENT.map(repr)
_PERCENT_KEY = PERCENT.map(lambda p: repr("%(k)" + p[1:]))


def _jinja(text: st.SearchStrategy) -> st.SearchStrategy:
    """Jinja expressions making text over `f`: every operator and filter that builds text, sizes drawn from BIG."""
    number = _J_NUMBER
    return st.one_of(
        _binary(text, BIG, "({}) * {}"), _binary(BIG, text, "{} * ({})"), _binary(text, text, "({}) + ({})"),
        _binary(text, text | number, "({}) ~ ({})"), _binary(_PERCENT, number | text, "{} % ({})"),
        _binary(_PERCENT_KEY, number | text, "{} % {{'k': {}}}"), _binary(_PERCENT, number, "{} | format({})"),
        _binary(number, BIG, "({}) | num({})"), _binary(text, BIG, "({}) | center({})"),
        _binary(text, BIG, "({}) | truncate({})"), _binary(text, BIG, "([{}] * {}) | join(' ')"),
        _binary(text, st.tuples(text, text).map(", ".join), "({}) | replace({})"),
        number.map("({}) | string".format), _binary(text, number, "({}) * ({})"),  # 'ab' * 2.5: a type error
        _binary(number, BIG, "[{}] * {}"), _binary(text, number, "({}) | join({})"))


_P_NUMBER = st.recursive(
    st.sampled_from([*RULE_FACTS, "2.5", "-3"]) | BIG.map(str),
    lambda n: st.one_of(_binary(n, BIG, "({}) * {}"), _binary(n, st.integers(-3, 100) | BIG, "({}) ** {}"),
                        _binary(n, n, "({}) + ({})")), max_leaves=3)


def _python(text: st.SearchStrategy) -> st.SearchStrategy:
    """Condition and gain expressions over dotted facts: the operators simpleeval runs, f-string format specs."""
    number = _P_NUMBER
    return st.one_of(
        _binary(text, BIG, "({}) * {}"), _binary(BIG, text, "{} * ({})"), _binary(text, text, "({}) + ({})"),
        _binary(_PERCENT, number | text, "{} % ({})"), _binary(number | text, SPEC, 'f"{{{}:{}}}"'),
        _binary(number, BIG, 'f"{{{}:{{{}}}}}"'),  # a width from a nested field
        _binary(text, number, "({}) ** ({})"))  # a type error


_TEXTS = st.sampled_from(["'word '", "'ab'", "''", "'%s'"])
JINJA_EXPRESSION = st.recursive(_TEXTS | st.sampled_from(_ALLOWED), _jinja, max_leaves=5)
PYTHON_TEXT = st.recursive(_TEXTS, _python, max_leaves=5)
TEMPLATE = st.lists(st.sampled_from(["text ", "a|b ", "{{ f['gpu.utilization'] | pct }} "]) |
                    JINJA_EXPRESSION.map("{{{{ {} }}}}".format) |
                    _binary(JINJA_EXPRESSION, JINJA_EXPRESSION, "{{% if {} %}}{{{{ {} }}}}{{% endif %}}"),
                    min_size=1, max_size=3).map(lambda parts: "s " + "".join(parts))
CONDITION = st.one_of(st.just("gpu.utilization < 2"), st.just("gpu.utilization < 2"),  # holds: the templates run
                      PYTHON_TEXT.map("({}) != ''".format), _P_NUMBER.map("({}) > 0".format),
                      _binary(PYTHON_TEXT, PYTHON_TEXT, "gpu.utilization < 2 and ({}) == ({})"))


def _yaml_text(text: str) -> str:
    """A YAML double-quoted scalar holding exactly `text` (every character outside printable ASCII escaped)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


_RULE_FACTS: dict | None = None


@FUZZ
@given(when=CONDITION, summary=TEMPLATE, gain=st.none() | _P_NUMBER | PYTHON_TEXT, why=TEMPLATE,
       to=st.integers(1, 64) | TEMPLATE, change_when=st.none() | CONDITION)
@example(when="'%9999999999d' % gpu.utilization != ''", summary="s", gain=None, why="w", to=8, change_when=None)
@example(when="gpu.utilization < 2", summary="{{ '{:>9999999999}'.format(1) }}", gain=None, why="w", to=8,
         change_when=None)
@example(when="gpu.utilization < 2 and ('word ' * 1000000) == ''", summary="s {{ (['word'] * 1000000) | join(' ') }}",
         gain="gpu.utilization ** 1000000000000", why="{{ 'x' | center(9999999999) }}", to="{{ '%.9999999999f' % 1 }}",
         change_when="f\"{gpu.utilization:>9999999999}\" != ''")
def test_rule_files_that_ask_for_huge_text(tmp_path_factory, report_all, when: str, summary: str, gain: str | None,
                                           why: str, to: int | str, change_when: str | None) -> None:
    """A rule file whose condition, gain and templates combine format widths (%Nd, {:>N}, f-strings, num(N),
    format, center, round), repetition, concatenation (~ and +), join, replace and powers, N up to 10^12: evaluated
    over a real report's facts with every text it renders at most 20,000 characters, or one RuleError naming the
    file, line and part (when, gain, summary; a change's why, to, changes.when); peak memory bounded."""
    from profkit.diagnose.engine import evaluate
    from profkit.diagnose.sandbox import MAX_TEMPLATE_OUTPUT

    global _RULE_FACTS
    _RULE_FACTS = _RULE_FACTS or report_all("eager_b1")["facts"]
    path = tmp_path_factory.mktemp("rule") / "r.yaml"
    lines = ["id: fuzz", "title: t", "severity: info", f"when: {_yaml_text(when)}", f"summary: {_yaml_text(summary)}",
             *([f"gain: {_yaml_text(gain)}"] if gain is not None else []), "changes:",
             "  - flag: --max-num-seqs", f"    to: {to if isinstance(to, int) else _yaml_text(to)}",
             f"    why: {_yaml_text(why)}", *([f"    when: {_yaml_text(change_when)}"] if change_when else [])]
    path.write_text("\n".join(lines) + "\n")
    change_line = lines.index("  - flag: --max-num-seqs") + 1
    lines_of = {"when": 1, "gain": 1, "summary": 1, "why": change_line, "to": change_line,
                "changes.when": change_line}

    def one_rule_error(exc: RuleError) -> None:
        text = str(exc)
        m = re.match(rf"{re.escape(str(path))}:(\d+): (when|gain|summary|why|to|changes\.when): \S", text)
        assert m and int(m[1]) == lines_of[m[2]], text
        assert printable(exc) and len(text) <= 1000, text

    try:
        rule = load_rule_file(path, known_fact_names())
    except RuleError as exc:
        event("refused when loaded")
        one_rule_error(exc)
        return
    with _peak_growth(64 * MiB):
        try:
            findings, skipped = evaluate([rule], _RULE_FACTS)
        except RuleError as exc:
            event("refused when evaluated", exc.args[0].split(": ")[1])
            one_rule_error(exc)
            return
    longest = max((len(t) for f in findings for t in (f.summary, *(c.why for c in f.changes))), default=0)
    event("evaluated", "a rule error on these facts" if skipped else f"findings: {len(findings)}, longest text "
          f"{'> 1000' if longest > 1000 else '<= 1000'}")
    for finding in findings:
        assert len(finding.summary) <= MAX_TEMPLATE_OUTPUT
        for change in finding.changes:
            assert len(change.why) <= MAX_TEMPLATE_OUTPUT and len(str(change.to)) <= MAX_TEMPLATE_OUTPUT
    for skip in skipped:  # this rule failed on these facts (a type error, a division by zero): said in one line
        assert not skip["missing"] and skip["error"].startswith(f"{path}: ") and len(skip["error"]) <= 1000
        assert printable(RuntimeError(skip["error"]))


# --- shells reading printed command lines back (classes 4 and 5): one bash for many lines ------------------------
def _bash() -> str:
    import shutil

    bash = shutil.which("bash")
    assert bash, "bash is needed to read printed command lines back"
    return bash


def _words(out: bytes, lines: int) -> list[list[bytes]]:
    """`printf '%s\\0' "$#" "$@"` output of `lines` commands, as each one's words."""
    words, argvs, i = out.split(b"\0")[:-1], [], 0
    while i < len(words):
        n = int(words[i])
        argvs.append(words[i + 1:i + 1 + n])
        i += 1 + n
    assert len(argvs) == lines, (lines, argvs)
    return argvs


def shell_reads(lines: list[str]) -> list[list[bytes]]:
    """The words a shell (bash, UTF-8 locale) reads from each line as arguments (bytes, as exec passes them)."""
    assert all("\n" not in line for line in lines)
    script = "f() { printf '%s\\0' \"$#\" \"$@\"; }\n" + "".join(f"f {line}\n" for line in lines)
    r = subprocess.run([_bash(), "-c", script], capture_output=True, env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    return _words(r.stdout, len(lines))


def shell_runs(lines: list[str]) -> list[list[bytes]]:
    """The argv a shell runs for each line pasted as a command (program included): no program is found (PATH is
    empty), so bash hands each argv to its not-found hook, which prints it. Lines whose program holds a `/` (run
    without a search) or names a builtin are not for this reading."""
    script = "command_not_found_handle() { printf '%s\\0' \"$#\" \"$@\"; }\n" + "".join(f"{line}\n" for line in lines)
    r = subprocess.run([_bash(), "-c", script], capture_output=True,
                       env={"PATH": "/profkit-fuzz-nothing-here", "LC_ALL": "C.UTF-8"})
    return _words(r.stdout, len(lines))


_BUILTINS: set[str] = set()


def runs_as_a_command(program: str) -> bool:
    """A program name `shell_runs` can read back: no `/`, not a bash builtin (those run, and print nothing), not
    starting with `%` (bash takes such a command for a job, `fg %...`, however it is quoted)."""
    if not _BUILTINS:
        r = subprocess.run([_bash(), "-c", "compgen -b"], capture_output=True, text=True, check=True)
        _BUILTINS.update(r.stdout.split(), ["command_not_found_handle"])
    return "/" not in program and program not in _BUILTINS and not program.startswith("%")


def _argv_bytes(argv: list[str]) -> list[bytes]:
    return [os.fsencode(w) for w in argv]


# --- 4. Markdown: hostile kernel names, NVTX text, rule text, flag values, labels and paths -------------------------
HOSTILE_BITS = ["|", "\\|", "]", "[", "(", ")", "](http://x)", "[l](http://e)", "<http://y>", "[r]: http://z", "<i>",
                "<!--", "`", "```", "\n```\n", "~~~", "\\", "*e*", "_u_", "&amp;", "\n", "\r\n", "\t", "\x1b[31m",
                "\x1b]0;t\x07", "\u202e", "\u2066", "\u2028", "\x85", "\x9b2J", "\x00", "\ufeff", "\u200b", "# h",
                "> q", "- l", "1. n", "---", "=== ", "    code", "$x", "'", '"', "!"]
# Any character a trace or user may give: a lone surrogate only as Python spells a byte that is not UTF-8 in a
# path, argv word or environment value (surrogateescape, U+DC80..U+DCFF).
BYTE_NOT_UTF8 = st.integers(0x80, 0xFF).map(lambda b: chr(0xDC00 + b))
UNICODE = st.characters(exclude_categories=("Cs",)) | BYTE_NOT_UTF8
hostile_text = st.lists(st.sampled_from(HOSTILE_BITS) | st.text(UNICODE, max_size=6), min_size=1, max_size=6) \
    .map("".join)
# Keys whose text came from an input (a trace, a rule file, a user's flag, label or path).
TEXT_KEYS = {"path", "gpu", "driver", "tool", "tool_version", "inconsistent", "detail", "name", "short_name",
             "operation", "before", "after", "range", "rule", "title", "summary", "flag", "why", "label", "spec", "by"}
TEXT_LISTS = {"problems", "differs", "failed", "resolved", "new", "persisting", "vanished", "slos"}


def _hostile(value: object, texts: Iterator[str]) -> object:
    """The document with every text from an input replaced by the next of `texts` (and a flag change's values)."""
    if isinstance(value, list):
        return [_hostile(v, texts) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if k in TEXT_KEYS and isinstance(v, str) or k in ("to", "from") and "flag" in value:
            out[k] = next(texts)
        elif k in TEXT_LISTS and isinstance(v, list) and all(isinstance(i, str) for i in v):  # not details' dicts
            out[k] = [next(texts) for _ in v]
        else:
            out[k] = _hostile(v, texts)
    return out


_MD_DOCS: dict[str, dict] = {}


def _md_docs(sqlite_path, h100_tune: Path, tmp_path_factory) -> dict[str, dict]:
    """Real documents of each kind with Markdown: reports (eager_b1 with a firing rule's change and a suggested
    command; the serve slice with engine steps and processes), their diff, a real tune, the history of saved runs."""
    if not _MD_DOCS:
        folder = tmp_path_factory.mktemp("md")
        rules = folder / "rules"
        rules.mkdir()
        (rules / "r.yaml").write_text(json.dumps({
            "id": "fuzz", "title": "t", "severity": "info", "when": "gpu.utilization < 2", "summary": "s",
            "changes": [{"flag": "--max-num-seqs", "to": 8, "why": "w"}]}))
        db = folder / "runs.db"

        def doc(*args: object) -> dict:
            r = profkit(*args, "--format", "json")
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        eager, serve = sqlite_path("eager_b1"), sqlite_path("serve_frontend")
        _MD_DOCS["report"] = doc("report", eager, "--rules", rules, "--vllm-args", "--max-num-seqs 4 --model m",
                                 "--save", db, "--label", "L")
        _MD_DOCS["serve"] = doc("report", serve, "--save", db)
        diff = doc("diff", eager, serve)
        diff["flags"] = [{"flag": "--max-num-seqs", "before": 4, "after": 8}]  # as a diff of two captures has
        diff["comparability"]["differs"] = ["model"]
        diff["gate"] = {"failed": ["gpu.utilization < 0.5"]}
        _MD_DOCS["diff"] = diff
        _MD_DOCS["tune"] = json.loads((h100_tune / "s2" / "tune.json").read_text())
        _MD_DOCS["history"] = doc("history", db)
    return _MD_DOCS


@settings(FUZZ, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["report", "serve", "diff", "tune", "history"]),
       texts=st.lists(hostile_text, min_size=1, max_size=8),
       words=st.lists(hostile_text.map(lambda w: w.replace("\x00", "")), min_size=1, max_size=3))  # argv: no NUL
def test_markdown_of_hostile_text(sqlite_path, h100_tune, tmp_path_factory, kind: str, texts: list[str],
                                  words: list[str]) -> None:
    """Every text from an input replaced by hostile ones (|, ], (, [, <, `, ```, \\, newlines, ESC, bidi, any
    character): the Markdown keeps each table's cells, makes no link, no raw HTML, no character that is not
    printable, and each command of a code block is one line a shell reads back to the command's exact argv
    (`words` added to each)."""
    from profkit.escape import shell
    from profkit.render import render
    from tests.test_hostile_outputs import code_blocks, md_problems

    docs = _md_docs(sqlite_path, h100_tune, tmp_path_factory)
    doc = _hostile(docs[kind], itertools.cycle(texts))
    argvs: list[list[str]] = []
    if kind == "report":  # the run's command and the suggested one, each with the hostile words
        cmd = doc["command"]
        for key in ("original", "suggested"):
            cmd[f"{key}_argv"] = [[*argv, *words] for argv in cmd[f"{key}_argv"]]
            cmd[key] = [shell(argv) for argv in cmd[f"{key}_argv"]]
        # each pair as the diff block shows it (a command the changes leave as it was: once), then the commands
        argvs = [a for pair in zip(cmd["original_argv"], cmd["suggested_argv"], strict=True)
                 for a in (pair if pair[0] != pair[1] else pair[:1])] + cmd["suggested_argv"]
    elif kind == "tune":
        doc["best"]["argv"] = [[*argv, *words] for argv in doc["best"]["argv"]]
        doc["best"]["commands"] = [shell(argv) for argv in doc["best"]["argv"]]
        argvs = doc["best"]["argv"]
    assert argvs or kind not in ("report", "tune")  # these documents have commands: the code blocks are checked
    md = render(doc, "md")
    assert md_problems(md) == []
    lines = [line[2:] if line[:2] in ("- ", "+ ", "  ") else line for block in code_blocks(md) for line in block]
    assert shell_reads(lines) == [_argv_bytes(a) for a in argvs]


# --- 5. printed commands: any argv, and capture plans (`capture --dry-run`) ----------------------------------------
ARG = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00") | BYTE_NOT_UTF8, max_size=10) | \
    st.sampled_from(["", "-", "--", "'", '"', "\\", "$x", "$(false)", "`false`", "!", "#", "~", "a b", "\n", "*",
                     "{a,b}", "x=1", ";", "&", "|", ">", "\\x1b", "\x1bc", "\u202e", "\udcff", "\udcc3\udca9"])
# Program names a shell may read as something else: reserved words, assignments.
PROGRAM = ARG | st.sampled_from(["vllm", "time", "if", "!", "{", "[[", "coproc", "function", "A=B", "x=", "_=1"])
ARGV = st.tuples(PROGRAM, st.lists(ARG, max_size=6)).map(lambda t: [t[0], *t[1]])


@FUZZ
@given(argvs=st.lists(ARGV, min_size=1, max_size=8))
@example(argvs=[["vllm", "serve", "m\x1bc\x1b]0;title\x07\u202e\udcff", "--out", "a\nb 'c' $(false)"]])
def test_printed_commands_read_back_exactly(argvs: list[list[str]]) -> None:
    """profkit.escape.shell(argv) for any argv (any character, controls, newlines, bytes that are not UTF-8): one
    printable line, which a shell reads back to exactly argv, every word as an argument and, pasted as a command,
    the program too (not taken for an assignment or a reserved word)."""
    from profkit.escape import shell, terminal

    lines = [shell(argv) for argv in argvs]
    assert all(line.isprintable() and terminal(line) == line for line in lines), lines
    assert shell_reads(lines) == [_argv_bytes(argv) for argv in argvs]
    run = [i for i, argv in enumerate(argvs) if runs_as_a_command(argv[0])]
    assert shell_runs([lines[i] for i in run]) == [_argv_bytes(argvs[i]) for i in run]


@FUZZ
@given(out=st.text(UNICODE.filter(lambda c: c != "\x00"), min_size=1, max_size=12), model=ARG,
       server=st.lists(ARG, max_size=4), bench=st.lists(ARG, max_size=4), nsys=PROGRAM,
       tool=st.sampled_from(["nsys", "torch", "none", "both"]), serve=st.booleans(), replicates=st.integers(1, 3),
       gpu_metrics=st.booleans(), cpu_switches=st.booleans(), capture_range=st.booleans())
def test_capture_plans_print_exact_commands(out: str, model: str, server: list[str], bench: list[str], nsys: str,
                                            tool: str, serve: bool, replicates: int, gpu_metrics: bool,
                                            cpu_switches: bool, capture_range: bool) -> None:
    """`capture --dry-run` through the library: for an output folder, model, server and benchmark arguments and
    nsys path holding anything, every command line the plan prints (one run, or a served session's replicates)
    is one printable line a shell reads back to the step's exact environment and argv."""
    from profkit.capture.plan import CaptureOptions, commands_from_cli, plan
    from profkit.escape import terminal
    from tests.test_hostile_outputs import plan_steps

    try:
        user = commands_from_cli(["serve"], model, shlex.join(server), shlex.join(bench), 8000) if serve else \
            commands_from_cli(["vllm", "bench", "throughput", *server], None, "", "", 8000)
        p = plan(CaptureOptions(out=Path(out), user=user, tool=tool, nsys=nsys, capture_range=capture_range,
                                cpu_switches=cpu_switches, gpu_metrics=gpu_metrics))
    except ProfkitError as exc:  # no model, or two profilers for a server
        event("refused")
        assert printable(exc)
        return
    event(f"{p.kind} plan")
    shown = [(p.commands(), plan_steps(p))]
    if p.server is not None:
        shown.append((p.session_commands(replicates), [p.server, p.warmup_step(), *(
            p.bench_step(p.out / f"r{i + 1}", seed=p.seed() + i) for i in range(replicates))]))
    for lines, steps in shown:
        assert all(line.isprintable() and terminal(line) == line for line in lines), lines
        assert shell_reads(lines) == [[os.fsencode(f"{k}={v}") for k, v in s.env.items()] + _argv_bytes(s.argv)
                                      for s in steps]
        run = [i for i, s in enumerate(steps) if runs_as_a_command(s.argv[0])]
        assert shell_runs([lines[i] for i in run]) == [_argv_bytes(steps[i].argv) for i in run]


# --- 6. `rules explain`: rule text, a rule file's name, with controls -----------------------------------------------
RULE_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12) | hostile_text.map(
    lambda t: "".join(ch for ch in t if not 0xDC80 <= ord(ch) <= 0xDCFF))  # YAML has no lone surrogate
FILE_NAME = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="/\x00") | BYTE_NOT_UTF8,
                    min_size=1, max_size=20).filter(lambda n: len(os.fsencode(n)) <= 200)
CONTROL_OR_FORMAT = ("Cc", "Cf", "Zl", "Zp")


@FUZZ
@given(rule_id=RULE_TEXT, title=RULE_TEXT, description=st.lists(RULE_TEXT, max_size=3), literal=RULE_TEXT,
       source=RULE_TEXT, threshold=RULE_TEXT, flag=RULE_TEXT, to=RULE_TEXT, why=RULE_TEXT, name=FILE_NAME)
def test_rules_explain_prints_no_control_character(tmp_path_factory, rule_id: str, title: str,
                                                   description: list[str], literal: str, source: str,
                                                   threshold: str, flag: str, to: str, why: str, name: str) -> None:
    """A rule whose id, title, description, condition (a string literal in it), evidence, changes and file name
    hold controls, escapes, bidi and line separators: `rules explain` prints no control or format character, and
    one line per entry (the description its own lines, each value on its line)."""
    import unicodedata

    from profkit.diagnose.explain import explain
    from profkit.escape import terminal

    literal = "".join(ch for ch in literal if ch not in "'\\\n\r\x00")  # stays one Python string literal
    path = tmp_path_factory.mktemp("explain") / (name + ".yaml")
    fields = {"id": "r" + rule_id, "title": "T" + title, "severity": "info", "description": "\n".join(description),
              "when": f"gpu.utilization < 2 or '{literal}' == ''", "summary": "s"}
    text = "".join(f"{k}: {_yaml_text(v)}\n" for k, v in fields.items())
    text += (f"evidence:\n  - fact: gpu.utilization\n    threshold: {_yaml_text(threshold)}\n"
             f"    source: {_yaml_text(source)}\n"
             f"changes:\n  - flag: {_yaml_text('--x' + flag)}\n    to: {_yaml_text(to)}\n    why: {_yaml_text(why)}\n")
    path.write_text(text)
    try:
        rule = load_rule_file(path, known_fact_names())
    except RuleError as exc:  # `{{` or `{%` drawn in a template
        event("refused")
        assert printable(exc) and ("{" in to + why)
        return
    event("explained")
    lines = explain(rule).split("\n")
    # (half a surrogate pair only for a byte of the file's name that is not UTF-8: the CLI's echo shows U+FFFD)
    bad = [ch for line in lines for ch in line if unicodedata.category(ch) in CONTROL_OR_FORMAT or
           unicodedata.category(ch) == "Cs" and not (0xDC80 <= ord(ch) <= 0xDCFF and ch in lines[1])]
    assert not bad, (bad, lines)
    described = rule.description.splitlines()
    assert len(lines) == 3 + (len(described) + 1 if described else 0) + 2 + 3 + 3, lines
    assert lines[0] == f"{terminal(rule.id)} (info): {terminal(rule.title)}"
    assert lines[1] == "  file: " + terminal(path)


# --- 7. nsys exports whose numeric columns hold text (traces/nsys.py) ----------------------------------------------
NUMERIC_COLUMNS = [(table, column) for table, columns in {
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                                   "demangledName", "shortName", "graphNodeId"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes",
                                   "copyKind", "srcKind", "dstKind", "graphNodeId"],
    "CUPTI_ACTIVITY_KIND_MEMSET": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "bytes",
                                   "memKind", "graphNodeId"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId"],
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                                            "syncType"],
    "NVTX_EVENTS": ["start", "end", "eventType", "globalTid", "textId", "domainId"],
}.items() for column in columns]
# The value some rows get instead: text, a blob, a real (a fraction, or past int64), huge and negative integers,
# and the row's own number as text (which a column declared INTEGER turns back into the number).
WRONG_VALUES = {"text": "'x'", "blob": "x'00ff'", "fraction": "{c} + 0.5", "past int64": "1e19",
                "huge": str(2 ** 62), "negative": "-7", "numeric text": "CAST({c} AS TEXT)"}
# How the column is declared: as nsys does, or so that SQLite keeps text as text (TEXT, no type) or makes every
# number a real (REAL).
DECLARED = ["INTEGER", "TEXT", "", "REAL", "NUMERIC"]


def _set_column(conn, table: str, column: str, declared: str, value: str, every: int) -> None:
    """Rebuild `table` with `column` declared `declared`, every `every`-th row holding `value` (SQL) there."""
    sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    new = re.sub(rf"(\b{column}\s+)INTEGER", rf"\g<1>{declared}", sql, count=1)
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
    picked = ", ".join(f"CASE WHEN rowid % {every} = 0 THEN {value} ELSE {c} END" if c == column else c
                       for c in cols)
    conn.execute(f"ALTER TABLE {table} RENAME TO old_rows")
    conn.execute(new)
    conn.execute(f"INSERT INTO {table} (rowid, {', '.join(cols)}) SELECT rowid, {picked} FROM old_rows")
    conn.execute("DROP TABLE old_rows")


@settings(FUZZ, max_examples=TRACE_EXAMPLES,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(NUMERIC_COLUMNS), st.sampled_from(sorted(WRONG_VALUES)),
                          st.sampled_from(DECLARED), st.integers(1, 7)), min_size=1, max_size=3))
def test_numeric_columns_of_the_wrong_type(sqlite_path, tmp_path_factory, changes: list[tuple]) -> None:
    """Any numeric column of any relation of a real export (swap_b16: kernels, copies, memsets, CUDA API calls,
    syncs, NVTX ranges), declared as nsys does or not, holding text, a blob, a real or an out-of-range integer in
    every n-th row: `profkit report` exits 0 with every share in [0, 1] and each GPU's utilization at most 100 %
    (JSON and text), or fails with one error line naming the file; the export is left as it was."""
    import hashlib
    import shutil
    import sqlite3

    path = tmp_path_factory.mktemp("types") / "t.sqlite"
    shutil.copyfile(sqlite_path("swap_b16"), path)
    path.chmod(0o644)
    with sqlite3.connect(path) as conn:
        for (table, column), wrong, declared, every in changes:
            event(f"{wrong} in {column} declared {declared or 'without a type'}")
            _set_column(conn, table, column, declared, WRONG_VALUES[wrong].format(c=column), every)
    conn.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    r = profkit("report", str(path), "--format", "json", "--window", "all")
    if r.returncode:
        assert str(path) in one_error_line(r)
    else:
        report = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(c))
        _plausible(report)  # facts: finite, shares in [0, 1] (host API shares aside), no negative time or count
        assert all(0 <= row["share"] <= 1 for key in ("kernels", "categories") for row in report[key])
        assert all(0 <= d["utilization"] <= 1 for d in report["gpu"]["devices"])
        text = profkit("report", str(path), "--window", "all")
        assert text.returncode == 0, text.stderr
        util = re.search(r"GPU utilization ([\d.]+)%", text.stdout)
        assert util and float(util.group(1)) <= 100, text.stdout[:400]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


# --- found while fuzzing the classes above (issue 29) -------------------------------------------------------------
# JSON allows an escape of half a surrogate pair; Python's parsers decode it, ijson's C backend raises
# UnicodeDecodeError on a low half.
SURROGATE_ESCAPES = [b"\\ud800", b"\\udc80", b"\\udfff", b"\\ud83d\\ude00", b"\\ud83d", b"a"]


@settings(FUZZ, max_examples=TRACE_EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(["h100", "mi250"]), place=st.sampled_from(["kernel", "arg"]),
       layout=st.sampled_from(["kineto", "compact"]), escapes=st.lists(st.sampled_from(SURROGATE_ESCAPES),
                                                                        min_size=1, max_size=4))
@example(base="h100", place="kernel", layout="kineto", escapes=[b"\\udc80"])
def test_unpaired_surrogate_escapes_in_torch_traces(tmp_path_factory, base: str, place: str, layout: str,
                                                    escapes: list[bytes]) -> None:
    """Half a surrogate pair escaped in a kernel's name or an unread arg: a report of the trace's kernels, or the
    one error line; never an internal error."""
    path = _trace_file(tmp_path_factory, "surrogate", base, place, layout, b'"k' + b"".join(escapes) + b'"',
                       "plain")
    good = _base_report(tmp_path_factory, base, place, layout, b'"k"', "plain")
    report, error = _torch_report(path)
    event("refused" if error else "read")
    if error is None:
        assert report["facts"]["kernels.count"] == good["facts"]["kernels.count"]
        assert report["gpu"] == good["gpu"]
