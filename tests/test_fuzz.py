"""Property-based fuzzing of the readers of user input (hypothesis; issue 18). Oracle for every example:
either a result whose numbers are finite, or a ProfkitError (one printable line) — never another exception.
Bounded for CI (PROFKIT_FUZZ_EXAMPLES, default 150 per property); run long locally with e.g.
PROFKIT_FUZZ_EXAMPLES=20000 python -m pytest tests/test_fuzz.py."""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profkit.compare.gate import parse_condition
from profkit.diagnose.engine import RuleError, load_rule_file
from profkit.diagnose.facts import known_fact_names
from profkit.diagnose.vllm_command import VllmCommand
from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.evidence.bench import parse_bench
from profkit.evidence.metrics import parse_metrics
from profkit.evidence.vllm_log import parse_log
from tests.cli import one_error_line, profkit

EXAMPLES = int(os.environ.get("PROFKIT_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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

    from profkit.report import build_report

    path = folder / "t.sqlite"
    shutil.copyfile(base, path)
    path.chmod(0o644)
    with sqlite3.connect(path) as conn:
        for m in mutations:
            _mutate(conn, m)
    conn.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        report = build_report(path, window="all").document()
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

    from profkit.report import build_report

    path = tmp_path_factory.mktemp("order") / "t.sqlite"
    shutil.copyfile(sqlite_path("prefill_long"), path)
    path.chmod(0o644)
    good = build_report(path, window=window).document()
    with sqlite3.connect(path) as conn:
        for table, order, every in changes:  # rows in another order; every `every`-th row twice (0: none)
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
                continue  # this export has no such table (prefill_long made no memcpy)
            conn.execute(f"ALTER TABLE {table} RENAME TO old_rows")
            twice = f" UNION ALL SELECT * FROM old_rows WHERE rowid % {every} = 0" if every else ""
            conn.execute(f"CREATE TABLE {table} AS SELECT * FROM (SELECT * FROM old_rows{twice}) ORDER BY {order}")
            conn.execute("DROP TABLE old_rows")
    conn.close()
    doc = build_report(path, window=window).document()
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
