"""Hostile and broken input (issue 18): each class gets one clear line and a non-zero exit, or a report
that is safe wherever it lands; never a hang, a traceback or a write onto an input."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.cli import one_error_line, profkit

REAL_SERVE = Path(__file__).parent / "data" / "vllm_serve_kv300mb"
CONTROL = "\x1b[31mRED\x1b[0m\r\x00\x07\u202e\u2067"  # and bidi controls: an override, an isolate


@pytest.mark.parametrize("option", ["TRACE", "--bench", "--vllm-log", "--metrics", "--host"])
def test_fifo_and_devices_are_refused_without_hanging(tmp_path: Path, option: str) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    args = [str(fifo)] if option == "TRACE" else [option, str(fifo)]
    one_error_line(profkit("report", *args, timeout=120), "not a regular file")
    if option == "TRACE":
        one_error_line(profkit("report", "/dev/zero", timeout=120), "not a regular file")
        one_error_line(profkit("diff", str(fifo), str(fifo), timeout=120), "not a regular file")  # a diff side


def test_rule_file_fifo_alias_bomb_and_wrong_shapes(tmp_path: Path, sqlite_path) -> None:
    trace = str(sqlite_path("eager_b1"))
    rules = tmp_path / "rules"
    rules.mkdir()
    os.mkfifo(rules / "pipe.yaml")
    one_error_line(profkit("report", trace, "--rules", str(rules), timeout=120), "not a regular file")
    (rules / "pipe.yaml").unlink()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(9)) + "id: bomb\n"
    (rules / "bomb.yaml").write_text(bomb)
    one_error_line(profkit("report", trace, "--rules", str(rules), timeout=120), "anchors and aliases are not allowed")
    (rules / "bomb.yaml").unlink()
    base = "id: r\ntitle: t\nseverity: info\nwhen: gpu.utilization < 2\nsummary: s\n"
    for extra, needle in (("changes: 5\n", "changes must be a list"), ("evidence: x\n", "evidence must be a list"),
                          ("changes:\n  - flag: x\n    to: 1\n    why: w\n", "changes.flag must be a flag"),
                          ("changes:\n  - flag: --x\n    to: '{{ oops'\n    why: w\n", "bad template")):
        (rules / "r.yaml").write_text(base + extra)
        one_error_line(profkit("report", trace, "--rules", str(rules)), needle)
    (rules / "r.yaml").write_text(base.replace("summary: s", "summary: [1, 2]"))
    one_error_line(profkit("report", trace, "--rules", str(rules)), "summary must be a text")
    (rules / "r.yaml").write_text(base.replace("gpu.utilization < 2", " + ".join(["gpu.utilization"] * 400) + " > 0"))
    one_error_line(profkit("report", trace, "--rules", str(rules)), "at most 2000")
    (rules / "r.yaml").write_bytes(base.encode() + b"description: \xff\xfe bad utf-8\n")
    assert profkit("report", trace, "--rules", str(rules)).returncode == 0


@pytest.mark.parametrize(("template", "needle"), [
    ("{{ 'x' * 1000000000 }}", "summary: repetition too large"),
    ("{% for i in range(100000000) %}x{% endfor %}", "summary: bad template: `{% for %}` is not allowed"),
    ("{{ f.update({'gpu.utilization': 9}) }}", "summary: bad template: a call is not allowed"),
    ("{{ f.clear() }}", "summary: bad template: a call is not allowed"),
    ("{{ 10 ** 100000 }}", "summary: exponent too large"),
    ("{{ '%999999999d' % 1 }}", "summary: format width 999999999"),
    ("{{ ('y' * 9000 ~ 'y' * 9000) ~ ('y' * 9000) }}", "summary: a `~` concatenation of more than 10000"),
])
def test_rule_templates_are_bounded_and_cannot_change_facts(tmp_path: Path, sqlite_path, template: str,
                                                            needle: str) -> None:
    """A template that would build more than any rule needs, loop, or call (a fact's method) is the rule file's
    fault whatever the trace: one error line naming the file, the rule's line and the part."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "evil.yaml").write_text(json.dumps({"id": "evil", "title": "t", "severity": "info",
                                                 "when": "gpu.utilization < 2", "summary": template}))
    r = profkit("report", str(sqlite_path("eager_b1")), "--format", "json", "--rules", str(rules), timeout=180)
    one_error_line(r, f"{rules / 'evil.yaml'}:1: {needle}")


def test_a_rule_that_fails_on_these_facts_is_skipped_with_its_error(tmp_path: Path, sqlite_path) -> None:
    """A division by zero depends on the facts, not the file: that rule is skipped with its error, the rest run."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "evil.yaml").write_text(json.dumps({"id": "evil", "title": "t", "severity": "info",
                                                 "when": "gpu.utilization < 2", "summary": "{{ 1 / 0 }}"}))
    r = profkit("report", str(sqlite_path("eager_b1")), "--format", "json", "--rules", str(rules), timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    skipped = next(s for s in doc["rules_skipped"] if s["rule"] == "evil")
    assert "ZeroDivisionError" in skipped["error"] and str(rules / "evil.yaml") in skipped["error"]
    assert any(f["rule"] == "launch-overhead" for f in doc["findings"])  # the other rules still ran


def test_broken_evidence(tmp_path: Path, sqlite_path) -> None:
    trace = str(sqlite_path("eager_b1"))
    bench = tmp_path / "bench.json"
    for text, needle in (("[1, 2]", "expected an object"), ("[" * 100000, "not a benchmark JSON"),
                         ('{"x": 1', "not a benchmark JSON")):
        bench.write_text(text)
        one_error_line(profkit("report", trace, "--bench", str(bench)), needle)
    bench.write_text(json.dumps({"request_throughput": 10 ** 400, "mean_ttft_ms": 5.0}))
    r = profkit("report", trace, "--bench", str(bench), "--format", "json")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)["facts"]
    assert facts["vllm.requests_per_second"] is None and facts["vllm.ttft_mean_ms"] == 5.0
    # a log with odd numbers and a 100 kB pathological line: parsed (in linear time), not a failure
    log = tmp_path / "server.log"
    log.write_text("Engine 000: Avg prompt throughput: 1.2.3 tokens/s, Running: reqs, Waiting: 5 reqs, "
                   "GPU KV cache usage: 50.0%\n" + "non-default args: {'a': " + "1" * 100000 + "\n"
                   + "GPU KV cache size: " + "9," * 50000 + " tokens\n"
                   + (REAL_SERVE / "server.log").read_text())
    r = profkit("report", trace, "--vllm-log", str(log), "--format", "json", timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["vllm"]["log"]["kv_cache_tokens"] == 9152 and doc["vllm"]["log"]["skipped_lines"] == 2
    metrics = tmp_path / "m.txt"
    metrics.write_text((REAL_SERVE / "metrics-after.txt").read_text().replace(
        "vllm:num_preemptions_total{", "vllm:num_preemptions_total_x{") + "vllm:weird NaN\n")
    assert profkit("report", trace, "--metrics", str(metrics)).returncode == 0
    metrics.write_bytes(b"\x00\x01binary\x00")
    one_error_line(profkit("report", trace, "--metrics", str(metrics)), "binary data")
    folder = tmp_path / "cap"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"vllm_args": 5, "commands": "x", "user_commands": [3]}))
    shutil.copyfile(REAL_SERVE / "bench.json", folder / "bench.json")
    assert profkit("report", str(folder)).returncode == 0
    (folder / "manifest.json").write_text("[]")
    one_error_line(profkit("report", str(folder)), "not a capture manifest")


def test_control_characters_never_reach_an_output(tmp_path: Path, sqlite_path) -> None:
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    with sqlite3.connect(trace) as conn:
        top = conn.execute("SELECT demangledName, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY demangledName "
                           "ORDER BY sum(end - start) DESC LIMIT 1").fetchone()
        conn.execute("UPDATE StringIds SET value = ? WHERE id IN (?, ?)", (f"k|a](javascript:x){CONTROL}", *top))
    for fmt in ("text", "md", "html"):
        r = profkit("report", str(trace), "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert not any(ord(ch) < 32 and ch not in "\n\t" for ch in r.stdout), fmt
        assert "\u202e" not in r.stdout and "\u2067" not in r.stdout, fmt  # HTML's table and charts kept them
        assert "RED" in r.stdout
    md = profkit("report", str(trace), "--format", "md").stdout
    assert not re.search(r"(?<!\\)\]\(javascript:", md) and "k\\|a\\]" in md  # escaped: no link, no cell break
    doc = json.loads(profkit("report", str(trace), "--format", "json").stdout)
    assert doc["kernels"][0]["name"].startswith("k|a](javascript:x)\x1b[31m")  # JSON keeps the data, escaped


def test_outputs_never_land_on_inputs(tmp_path: Path, sqlite_path) -> None:
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    before = trace.read_bytes()
    link = tmp_path / "link.html"
    link.symlink_to(trace)
    hard = tmp_path / "hard.sqlite"
    os.link(trace, hard)
    for out in (trace, link, hard):
        one_error_line(profkit("report", str(trace), "-o", str(out)), "is one of the inputs")
    assert trace.read_bytes() == before
    one_error_line(profkit("report", str(trace), "-o", str(tmp_path / "missing" / "r.html")), "does not exist")
    # a failed run leaves no half-written output and no temporary file
    target = tmp_path / "r.json"
    target.write_text("old")
    r = profkit("report", str(tmp_path / "nope.sqlite"), "-o", str(target))
    assert r.returncode == 1 and target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.json")] == []


def test_wal_transactions_are_read_and_the_files_untouched(tmp_path: Path, sqlite_path) -> None:
    """Committed transactions in the export's -wal file are part of the database: the report counts them
    (read through a private checkpointed copy); the export, its -wal and the folder stay as they were."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    trace.chmod(0o644)
    before = json.loads(profkit("report", str(trace), "--window", "all", "--format", "json").stdout)
    conn = sqlite3.connect(trace)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid IN (SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL "
                 "ORDER BY start LIMIT 100)")
    conn.commit()
    wal = Path(f"{trace}-wal")
    assert wal.stat().st_size > 0
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    after = json.loads(profkit("report", str(trace), "--window", "all", "--format", "json").stdout)
    assert after["facts"]["kernels.count"] == before["facts"]["kernels.count"] - 100
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    conn.close()


def test_rows_ending_before_they_start_are_left_out_and_said(tmp_path: Path, sqlite_path) -> None:
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    trace.chmod(0o644)
    good = json.loads(profkit("report", str(trace), "--window", "all", "--format", "json").stdout)
    with sqlite3.connect(trace) as conn:  # 7 kernels whose end lies before their start, one overflowing
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000 WHERE rowid IN "
                     "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 6)")
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = -9223372036854775807 WHERE rowid = "
                     "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1 OFFSET 10)")
    r = profkit("report", str(trace), "--window", "all", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["source"]["inconsistent"].startswith("7 kernel rows end before they start")
    assert doc["facts"]["kernels.count"] == good["facts"]["kernels.count"] - 7
    assert all(k["min_ns"] >= 0 and k["total_ns"] >= 0 for k in doc["kernels"])
    assert 0 <= doc["gpu"]["utilization"] <= 1
    assert "TRACE INCONSISTENT: 7 kernel rows" in profkit("report", str(trace)).stdout


def test_kernels_on_a_negative_device_are_left_out_and_said(tmp_path: Path, sqlite_path) -> None:
    """A device id of -1 is no GPU: it counted as a second device and halved the utilization."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    trace.chmod(0o644)
    good = json.loads(profkit("report", str(trace), "--window", "all", "--format", "json").stdout)
    with sqlite3.connect(trace) as conn:
        n = conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = -1 WHERE rowid IN "
                         "(SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start DESC LIMIT 5)").rowcount
    doc = json.loads(profkit("report", str(trace), "--window", "all", "--format", "json").stdout)
    assert doc["source"]["inconsistent"] == (
        f"{n} kernel rows on a device id that is no GPU (negative or not a number); left out")
    assert doc["facts"]["kernels.count"] == good["facts"]["kernels.count"] - n
    assert doc["facts"]["gpu.devices"] == 1 and 0 <= doc["gpu"]["utilization"] <= 1


def _rewrite_rows(trace: Path, table: str, select: str) -> int:
    """Rebuild `table` from `select` over its old rows (row order is what `select` gives); returns its rows."""
    with sqlite3.connect(trace) as conn:
        conn.execute(f"ALTER TABLE {table} RENAME TO old_rows")
        conn.execute(f"CREATE TABLE {table} AS {select.format(t='old_rows')}")
        conn.execute("DROP TABLE old_rows")
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


SAME = ("kernels", "api", "gpu", "gaps", "gap_classes", "timeline", "window", "launch", "steps", "memops",
        "memory_kinds")


@pytest.mark.parametrize("window", ["all", "auto"])
def test_duplicated_and_unordered_rows_are_counted_once_and_said(tmp_path: Path, sqlite_path, window: str) -> None:
    """Duplicated events doubled every count, and rows out of start order broke the binary searches behind a
    window (wrong numbers without a word). Now they are sorted and counted once, and the report says so."""
    from profkit.report import ReportOptions, build_report

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("thr_graphs"), trace)
    trace.chmod(0o644)
    good = build_report(trace, options=ReportOptions(window=window)).document()
    k, r = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"
    with sqlite3.connect(trace) as conn:
        kernels = conn.execute(f"SELECT count(*) FROM {k}").fetchone()[0]
        calls = conn.execute(f"SELECT count(*) FROM {r} WHERE rowid % 3 = 0").fetchone()[0]
    # every kernel twice, in an order that is not the start order; a third of the API calls twice, the copies last
    assert _rewrite_rows(trace, k, "SELECT * FROM {t} UNION ALL SELECT * FROM {t} ORDER BY streamId, end DESC") \
        == 2 * kernels
    _rewrite_rows(trace, r, "SELECT * FROM {t} UNION ALL SELECT * FROM {t} WHERE rowid % 3 = 0")
    memsets = _rewrite_rows(trace, "CUPTI_ACTIVITY_KIND_MEMSET", "SELECT * FROM {t} UNION ALL SELECT * FROM {t}") // 2
    doc = build_report(trace, options=ReportOptions(window=window)).document()
    assert {key: doc[key] for key in SAME} == {key: good[key] for key in SAME}
    said = doc["source"]["inconsistent"]
    assert f"{kernels} duplicated kernel rows (same device, stream, start, end, correlation) counted once" in said
    assert "order" not in said  # sorting is no inconsistency: nsys stats reads rows in any order
    assert f"{calls} duplicated CUDA API rows (same tid, start, end, name_id, correlation) counted once" in said
    assert f"{memsets} duplicated memory-operation rows (same device, stream, start, end, correlation) counted once" \
        in said


@pytest.mark.parametrize("between", ["implausible", "no GPU", "deleted"])
def test_disorder_and_duplicates_beside_a_row_left_out_are_found(tmp_path: Path, sqlite_path, between: str) -> None:
    """Found in review: each row was compared with the next row id only, so a row the view leaves out (or a
    deleted one) between two rows out of order, or between a row and its duplicate, hid them."""
    from profkit.report import ReportOptions, build_report

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    trace.chmod(0o644)
    k = "CUPTI_ACTIVITY_KIND_KERNEL"
    spoil = {"implausible": f"UPDATE {k} SET end = start - 1 WHERE rowid = ?",
             "no GPU": f"UPDATE {k} SET deviceId = -1 WHERE rowid = ?",
             "deleted": f"DELETE FROM {k} WHERE rowid = ?"}[between]
    with sqlite3.connect(trace) as conn:
        s100, e100 = conn.execute(f"SELECT start, end FROM {k} WHERE rowid = 100").fetchone()
        # row 5000 moved to just after row 100 (out of order), row 4999 spoiled; row 502 a copy of row 500,
        # row 501 spoiled
        conn.execute(f"UPDATE {k} SET start = ?, end = ? WHERE rowid = 5000", (s100 + 1, e100 + 1))
        conn.execute(spoil, (4999,))
        conn.execute(f"DELETE FROM {k} WHERE rowid = 502")
        conn.execute(f"INSERT INTO {k} (rowid, {', '.join(c for c in _columns(conn, k))}) SELECT 502, "
                     f"{', '.join(c for c in _columns(conn, k))} FROM {k} WHERE rowid = 500")
        conn.execute(spoil, (501,))
        truth = conn.execute(f"SELECT count(*) FROM {k} WHERE start BETWEEN ? AND ? AND end >= start "
                             f"AND deviceId >= 0 AND rowid != 502", (s100 - 1000, s100 + 2_000_000)).fetchone()[0]
    window = f"{s100 - 1000}:{s100 + 2_000_000}"
    report = build_report(trace, options=ReportOptions(window=window)).document()
    assert report["facts"]["kernels.count"] == truth
    assert "1 duplicated kernel rows" in report["source"]["inconsistent"]


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def test_duplicated_torch_events_are_counted_once_and_said(tmp_path: Path) -> None:
    """The same for a torch.profiler trace: events written twice (a merge gone wrong) doubled every count."""
    import gzip

    from profkit.report import ReportOptions, build_report
    from tests.conftest import FIXTURES

    source = FIXTURES / "h100_toy" / "torch_graphs_b16.json.gz"
    good = build_report(source, options=ReportOptions(window="all")).document()
    doc = json.loads(gzip.decompress(source.read_bytes()))
    twice = doc["traceEvents"][::3]
    doc["traceEvents"] += twice
    trace = tmp_path / "t.pt.trace.json"
    trace.write_text(json.dumps(doc))
    report = build_report(trace, options=ReportOptions(window="all")).document()
    same = [key for key in SAME if key != "steps"] + ["cpu_ops", "nvtx", "sync"]
    assert {key: report[key] for key in same} == {key: good[key] for key in same}
    said = report["source"]["inconsistent"]
    kernels = sum(1 for e in twice if e.get("cat") == "kernel")
    memops = sum(1 for e in twice if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    assert f"{kernels} duplicated kernel events (same device, stream, start, end, correlation) counted once" in said
    assert f"{memops} duplicated memory-operation events (same device, stream, start, end, correlation) counted " \
        "once" in said


def test_no_usable_kernel_left_is_one_line(tmp_path: Path, sqlite_path) -> None:
    """Every kernel row dropped as inconsistent: a clear refusal, not a report of memsets alone."""
    import gzip

    from tests.conftest import FIXTURES

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("graphs_b1"), trace)
    trace.chmod(0o644)
    with sqlite3.connect(trace) as conn:
        n = conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = -1").rowcount
    r = profkit("report", str(trace))
    assert r.returncode == 1 and r.stderr.strip() == (
        f"profkit: error: {trace}: no usable kernel rows: {n} kernel rows on a device id that is no GPU "
        "(negative or not a number)")
    with gzip.open(FIXTURES / "h100_toy" / "torch_graphs_b16.json.gz") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"]["device"] = -1
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    r = profkit("report", str(path))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "no usable kernel events" in r.stderr


KINETO_MUTATIONS = {
    "device -1": lambda d, k: d["traceEvents"][k]["args"].__setitem__("device", -1),
    "dur is a string": lambda d, k: d["traceEvents"][k].__setitem__("dur", "long"),
    "ts past int64": lambda d, k: d["traceEvents"][k].__setitem__("ts", 1e20),
    # each fits an int64 in nanoseconds, their sum (the end) would not
    "ts and dur near int64": lambda d, k: d["traceEvents"][k].update(ts=8.9e15, dur=8.9e15),
    "ts NaN": lambda d, k: d["traceEvents"][k].__setitem__("ts", "NaN"),
    "args a list": lambda d, k: d["traceEvents"][k].__setitem__("args", [1, 2]),
    "device a string": lambda d, k: d["traceEvents"][k]["args"].__setitem__("device", "gpu0"),
    "negative duration": lambda d, k: d["traceEvents"][k].__setitem__("dur", -50),
    "deviceProperties a string": lambda d, k: d.__setitem__("deviceProperties", "x"),
    "driver version junk": lambda d, k: d.__setitem__("cuda_driver_version", "²"),
}


@pytest.mark.parametrize("case", sorted(KINETO_MUTATIONS))
def test_kineto_fields_of_the_wrong_type(tmp_path: Path, case: str) -> None:
    """One real kernel event (or header field) of the torch trace mutated: the report runs, the event is
    left out and counted, every number stays plausible."""
    import gzip

    from tests.conftest import FIXTURES

    with gzip.open(FIXTURES / "h100_toy" / "torch_graphs_b16.json.gz") as f:
        doc = json.load(f)
    k = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    KINETO_MUTATIONS[case](doc, k)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    r = profkit("report", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    header_case = case.startswith(("deviceProperties", "driver"))
    assert ("inconsistent" in rep["source"]) != header_case
    assert all(k["min_ns"] >= 0 for k in rep["kernels"]) and 0 <= rep["gpu"]["utilization"] <= 1


def test_deep_json_and_cli_numbers(tmp_path: Path, sqlite_path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": [], "meta": ' + "[" * 200000 + "]" * 200000 + "}")
    one_error_line(profkit("report", str(deep)), "nested too deeply")
    trace = str(sqlite_path("eager_b1"))
    r = profkit("report", trace, "--gap-threshold", "99999999999999999999999s")
    assert r.returncode == 2 and "longer than any trace" in r.stderr and "Traceback" not in r.stderr
    one_error_line(profkit("report", trace, "--window", "1ns:9999999999999s"), "longer than any trace")
    one_error_line(profkit("capture", "--dry-run", "serve", "--model", "m", "--server-args", "--x 'open"),
                   "No closing quotation")


@pytest.mark.parametrize("trailer", [{"deviceProperties": "x"}, {"deviceProperties": [{"name": 7}]},
                                     {"distributedInfo": [1, 2]}, {"cuda_driver_version": "²"}, "deep"])
def test_metadata_after_the_events_of_the_wrong_shape(tmp_path: Path, trailer) -> None:
    """Keys written after traceEvents are read too: odd ones leave the report as it is; a 100 000-deep one is
    refused in one line, as a deep header is."""
    import gzip

    from tests.conftest import FIXTURES

    with gzip.open(FIXTURES / "h100_toy" / "torch_graphs_b16.json.gz") as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    for key in ("deviceProperties", "distributedInfo", "cuda_driver_version"):
        doc.pop(key, None)
    text = json.dumps({"traceEvents": events, **doc})[:-1]
    if trailer == "deep":
        text += ', "distributedInfo": ' + "[" * 100_000 + "]" * 100_000 + "}"
    else:
        text += ", " + json.dumps(trailer)[1:]
    path = tmp_path / "t.json"
    path.write_text(text)
    r = profkit("report", str(path), "--format", "json")
    if trailer == "deep":
        assert r.returncode == 1 and r.stderr.strip() == f"profkit: error: {path}: JSON nested too deeply: " \
            "not a torch.profiler trace"
        return
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["facts"]["kernels.count"] > 0 and rep["source"].get("rank") is None
    assert rep["source"]["gpu"] in (None, "7")


def test_benchmark_durations_that_make_no_window(tmp_path: Path) -> None:
    """The host samples' window comes from bench.json's duration: a negative, zero, NaN-like or huge one
    gives every sample (or a window clipped at 0), never an error or an empty report."""
    from profkit.analysis.host import bench_window, host_section
    from profkit.evidence.host import parse_host, read_host

    procs = [{"pid": 1, "name": "vllm bench serve", "role": "bench_client", "tree": "client",
              "cpu": [[0.1 * i, 0.5] for i in range(1, 101)]}]
    for seconds in (-5.0, 0.0, float("nan"), float("inf"), "30", None):
        assert bench_window(parse_host({"schema": "profkit.host/1", "processes": procs}, "h").processes,
                            seconds) is None
    assert bench_window(parse_host({"schema": "profkit.host/1", "processes": procs}, "h").processes,
                        1e300) == (0.0, 10.0)
    assert bench_window(parse_host({"schema": "profkit.host/1", "processes": [{"role": "bench_client", "cpu": "x"}]},
                                   "h").processes, 3.0) is None
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"schema": "profkit.host/1", "cores": 2, "processes": procs}))
    huge = host_section(read_host(path), 1e300)  # 10 s of samples say nothing of so long a benchmark, and say so
    assert huge["roles"] == {} and huge["coverage_note"].startswith("the samples span 9.9 s of the benchmark's")
    assert host_section(read_host(path), 12.0)["roles"]["bench_client"]["cpu_mean"] == 0.5
    # a GPU idle for the client's last 9 s (a profiler stopping): the window moves to the GPU's work, whatever
    # the sampling interval claims (text, NaN, huge, negative: one tenth of a second instead)
    parsed = parse_host({"schema": "profkit.host/1", "processes": procs}, "h").processes
    util = [(0.1 * i, 1.0 if i <= 10 else 0.0) for i in range(1, 101)]
    for interval in ("x", float("nan"), 1e300, -1.0, None, True):
        start, end = bench_window(parsed, 1.0, util, interval)  # type: ignore[misc]
        assert end == pytest.approx(1.0) and start == pytest.approx(0.0, abs=1e-9)


def test_context_switches_and_step_kernels_of_the_wrong_shape(tmp_path: Path, sqlite_path) -> None:
    """The serve slice's SCHED_EVENTS and PROCESSES broken: times that are text, huge or negative, no thread
    id, an odd isSchedIn, a hostile process name; the step kernels ending before they start. The report is
    made, its CPU figures stay within one core per thread, the name is escaped, the trace is untouched;
    without the columns the section is simply absent."""
    import hashlib

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("serve_frontend"), trace)
    with sqlite3.connect(trace) as conn:
        conn.execute("UPDATE SCHED_EVENTS SET start = 'x' WHERE rowid % 7 = 0")
        conn.execute("UPDATE SCHED_EVENTS SET start = 1e30 WHERE rowid % 7 = 1")
        conn.execute("UPDATE SCHED_EVENTS SET start = -5 WHERE rowid % 7 = 2")
        conn.execute("UPDATE SCHED_EVENTS SET globalTid = NULL WHERE rowid % 7 = 3")
        conn.execute("UPDATE SCHED_EVENTS SET isSchedIn = 'yes' WHERE rowid % 7 = 4")
        conn.execute("UPDATE PROCESSES SET name = ? WHERE pid = 798", (f"p|a](javascript:x){CONTROL}",))
        conn.execute("UPDATE PROCESSES SET pid = 'nan' WHERE pid = 994")
        conn.execute("""UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1 WHERE rowid % 3 = 0 AND shortName IN
                        (SELECT id FROM StringIds WHERE value LIKE '\\_p%' ESCAPE '\\')""")
    digest = hashlib.sha256(trace.read_bytes()).hexdigest()
    doc = json.loads(profkit("report", str(trace), "--format", "json").stdout)
    for p in doc["sched"]["processes"]:
        assert 0 <= p["busiest_thread_cores"] <= 1 and 0 <= p["cores"] <= p["threads"]
    assert doc["steps"]["count"] > 0 and doc["source"]["inconsistent"]
    for fmt in ("text", "md", "html"):
        r = profkit("report", str(trace), "--format", fmt)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert not any(ord(ch) < 32 and ch not in "\n\t" for ch in r.stdout), fmt
        assert "\u202e" not in r.stdout and "\u2067" not in r.stdout, fmt  # HTML's table and charts kept them
    md = profkit("report", str(trace), "--format", "md").stdout
    assert "p\\|a\\]" in md and not re.search(r"(?<!\\)\]\(javascript:", md)
    assert hashlib.sha256(trace.read_bytes()).hexdigest() == digest
    with sqlite3.connect(trace) as conn:
        conn.execute("ALTER TABLE SCHED_EVENTS DROP COLUMN isSchedIn")
    r = profkit("report", str(trace), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["sched"] is None, r.stderr


@pytest.mark.parametrize("value", ["abc", "-5", "", "1" * 40, "\x1b[2J"])
def test_a_bad_arrow_threshold_in_the_environment_is_one_line(sqlite_path, value: str) -> None:
    """PROFKIT_ADBC_MIN_ROWS (when to read through Arrow) was parsed at import: 'abc' was an internal error."""
    r = profkit("report", sqlite_path("graphs_b1"), env={**os.environ, "PROFKIT_ADBC_MIN_ROWS": value})
    one_error_line(r, "PROFKIT_ADBC_MIN_ROWS")
    ok = profkit("report", sqlite_path("graphs_b1"), env={**os.environ, "PROFKIT_ADBC_MIN_ROWS": "0"})
    assert ok.returncode == 0, ok.stderr


# --- issue 29: numeric columns of the wrong type, validated at the reader ----------------------------------------
KERNEL, MEMCPY, MEMSET = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME, SYNC, NVTX = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS"
NVTX_RANGES = "eventType IN (59, 60, 70, 71)"


def _retype(trace: Path, table: str, column: str, declared: str, where: str, value: str) -> int:
    """Rebuild `table` with `column` declared `declared` (an export nsys did not write: its INTEGER affinity would
    turn numeric text back into a number), `value` (SQL) in the rows matching `where`; returns how many."""
    with sqlite3.connect(trace) as conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        new, n = re.subn(rf"(\b{column}\s+)INTEGER", rf"\g<1>{declared}", sql, count=1)
        assert n == 1, sql
        cols = _columns(conn, table)
        picked = ", ".join(f"CASE WHEN {where} THEN {value} ELSE {c} END" if c == column else c for c in cols)
        conn.execute(f"ALTER TABLE {table} RENAME TO old_rows")
        conn.execute(new)
        conn.execute(f"INSERT INTO {table} (rowid, {', '.join(cols)}) SELECT rowid, {picked} FROM old_rows")
        n = conn.execute(f"SELECT count(*) FROM old_rows WHERE {where}").fetchone()[0]
        conn.execute("DROP TABLE old_rows")
        return n


def test_device_ids_that_are_text_are_refused_or_left_out(tmp_path: Path, sqlite_path) -> None:
    """The issue's export: hostgap_b16 with its kernels' deviceId declared TEXT, every value the text '1'. SQLite
    compared them as text ('1' between '0' and '1048575'), so the kernels sat on a second GPU beside the memory
    copies: 'GPU idle by gap size' said 169.7 % of the window. Now the column is refused in one line; where
    only some rows hold text, exactly those are left out, and the report is the export's without them."""
    from profkit.report import build_report

    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("hostgap_b16"), trace)
    trace.chmod(0o644)
    _retype(trace, KERNEL, "deviceId", "TEXT", "1", "'1'")
    r = profkit("report", str(trace))
    assert "169.7%" not in r.stdout
    assert r.returncode == 1 and r.stderr.strip() == (
        f"profkit: error: {trace}: CUPTI_ACTIVITY_KIND_KERNEL.deviceId holds text where nsys writes integers")

    shutil.copyfile(sqlite_path("hostgap_b16"), trace)
    n = _retype(trace, KERNEL, "deviceId", "", "rowid % 7 = 0", "'1'")  # no type: only those rows are text
    without = tmp_path / "without.sqlite"
    shutil.copyfile(sqlite_path("hostgap_b16"), without)
    without.chmod(0o644)
    with sqlite3.connect(without) as conn:
        assert conn.execute(f"DELETE FROM {KERNEL} WHERE rowid % 7 = 0").rowcount == n == 1303
    doc, good = build_report(trace).document(), build_report(without).document()
    assert doc["source"]["inconsistent"] == f"{n} kernel rows with text in deviceId where nsys writes integers; " \
        "left out"
    assert doc["gpu"]["utilization"] == good["gpu"]["utilization"] == pytest.approx(0.2035, abs=1e-4)
    assert {k: doc[k] for k in SAME} == {k: good[k] for k in SAME}
    text = profkit("report", str(trace)).stdout
    assert "GPU utilization 20.4%" in text and max(float(p) for p in re.findall(r"([\d.]+)%", text)) <= 100


# (table, column, the value given to some rows, which rows, what the note calls it, how the report was wrong before)
WRONG_TYPES = [
    (KERNEL, "deviceId", "deviceId + 0.5", "rowid % 4 = 0", "a real number", "kept; their gaps named no kernel"),
    (KERNEL, "start", "CAST(start AS TEXT)", "rowid % 4 = 0", "text", "an internal error (TypeError)"),
    (KERNEL, "graphNodeId", "'abc'", "rowid % 4 = 0", "text", "kept; counted as CUDA-graph kernels"),
    (KERNEL, "streamId", "x'00ff'", "rowid % 4 = 0", "a blob", "kept without a word"),
    (RUNTIME, "nameId", "nameId + 0.5", "rowid % 4 = 0", "a real number", "launch.api_share 1.8e8"),
    (RUNTIME, "start", "CAST(start AS TEXT)", "rowid % 4 = 0", "text", "an internal error in the text report"),
    (RUNTIME, "correlationId", "'abc'", "rowid % 4 = 0", "text", "kept; launch latencies lost"),
    (MEMCPY, "bytes", "CAST(bytes AS TEXT)", "rowid % 4 = 0", "text", "an internal error (KeyError 'bytes')"),
    (MEMCPY, "deviceId", "'0'", "rowid % 4 = 0", "text", "left out without a word"),
    (MEMCPY, "copyKind", "copyKind + 0.5", "rowid % 4 = 0", "a real number", "kept as 'Unknown' copies"),
    (MEMSET, "end", "end + 0.5", "rowid % 4 = 0", "a real number", "kept with fractional durations"),
    (SYNC, "syncType", "'abc'", "rowid % 4 = 0", "text", "kept as 'Unknown' syncs"),
    (NVTX, "start", "CAST(start AS TEXT)", f"rowid % 4 = 0 AND {NVTX_RANGES}", "text", "left out without a word"),
    (NVTX, "eventType", "CAST(eventType AS TEXT)", f"rowid % 4 = 0 AND {NVTX_RANGES}", "text",
     "left out without a word"),
]
ROWS_OF = {KERNEL: "kernel", MEMCPY: "memory-copy", MEMSET: "memset", RUNTIME: "CUDA API", SYNC: "synchronization",
           NVTX: "NVTX"}


@pytest.mark.parametrize(("table", "column", "value", "where", "what", "before"), WRONG_TYPES,
                         ids=[f"{t.split('_')[-1]}.{c}={v}" for t, c, v, *_ in WRONG_TYPES])
def test_rows_with_a_number_of_the_wrong_type_are_left_out_and_said(tmp_path: Path, sqlite_path, table: str,
                                                                    column: str, value: str, where: str, what: str,
                                                                    before: str) -> None:
    """Each numeric column class of each relation (times, device ids, other ids, sizes, kinds): some rows of a
    real export (swap_b16: kernels, copies, memsets, syncs, NVTX) hold a real number, text or a blob there. The
    column is declared without a type, so that text stays text. The report is exactly that of the export
    without those rows, and says how many it left out and why (`before`: what it did instead)."""
    from profkit.report import ReportOptions, build_report

    trace, without = tmp_path / "t.sqlite", tmp_path / "without.sqlite"
    for path in (trace, without):
        shutil.copyfile(sqlite_path("swap_b16"), path)
        path.chmod(0o644)
    n = _retype(trace, table, column, "", where, value)
    with sqlite3.connect(without) as conn:
        assert conn.execute(f"DELETE FROM {table} WHERE {where}").rowcount == n > 0
    doc = build_report(trace, options=ReportOptions(window="all")).document()
    good = build_report(without, options=ReportOptions(window="all")).document()
    assert doc["source"]["inconsistent"] == f"{n} {ROWS_OF[table]} rows with {what} in {column} where nsys " \
        "writes integers; left out"
    same = (*SAME, "sync", "nvtx", "memory_kinds", "categories")
    assert {k: doc[k] for k in same} == {k: good[k] for k in same}


@pytest.mark.parametrize(("table", "column", "declared", "held"), [
    (KERNEL, "deviceId", "TEXT", "text"), (KERNEL, "start", "REAL", "real numbers"),
    (RUNTIME, "start", "TEXT", "text"), (MEMCPY, "bytes", "TEXT", "text"), (MEMSET, "deviceId", "BLOB", "text"),
    (SYNC, "end", "TEXT", "text"), (NVTX, "globalTid", "TEXT", "text"),
])
def test_a_column_with_no_integer_is_one_line(tmp_path: Path, sqlite_path, table: str, column: str, declared: str,
                                              held: str) -> None:
    """A numeric column declared TEXT (or REAL) holds no integer at all: before, an internal error (start,
    bytes), a second GPU (deviceId) or rows gone without a word. Now one line names the table and column."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("swap_b16"), trace)
    trace.chmod(0o644)
    _retype(trace, table, column, declared, "1", f"CAST({column} AS TEXT)")
    r = profkit("report", str(trace))
    assert r.returncode == 1 and r.stderr.strip() == (
        f"profkit: error: {trace}: {table}.{column} holds {held} where nsys writes integers")


def test_idle_by_gap_size_is_a_share_of_every_gpus_time(tmp_path: Path, sqlite_path) -> None:
    """A genuine second GPU (hostgap_b16's memory copies moved to device 1, integer ids): the idle of both GPUs is a
    share of their time together (window x GPUs), as the gaps.*_idle_share facts are; it read 169.7 % of one
    window before."""
    from profkit.report import build_report

    trace = tmp_path / "two.sqlite"
    shutil.copyfile(sqlite_path("hostgap_b16"), trace)
    trace.chmod(0o644)
    with sqlite3.connect(trace) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET deviceId = 1")
    conn.close()
    doc = build_report(trace).document()
    assert len(doc["gpu"]["devices"]) == 2
    gpu_time = doc["gpu"]["busy_ns"] + doc["gpu"]["idle_ns"]
    assert gpu_time > doc["window"]["duration_ns"]  # two GPUs' time
    host = doc["gap_classes"]["1ms_100ms"]["idle_ns"] / gpu_time
    assert host == pytest.approx(doc["facts"]["gaps.host_idle_share"]) and host == pytest.approx(0.848, abs=1e-3)
    text = profkit("report", str(trace)).stdout
    assert "1 - 100 ms    125   486 ms   84.8%" in text and "169.7%" not in text


def test_a_huge_name_id_is_a_missing_string_not_a_damaged_database(tmp_path: Path, sqlite_path) -> None:
    """A kernel whose name id is 2^62 (an integer, no string): the packed histogram key would overflow into a real;
    the kernel is counted under a missing string, the rest of the report as before."""
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("hostgap_b16"), trace)
    trace.chmod(0o644)
    with sqlite3.connect(trace) as conn:
        conn.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = {2 ** 62} WHERE rowid = 1")
    conn.close()
    r = profkit("report", str(trace), "--format", "json")
    assert r.returncode == 0, r.stderr
    names = [k["name"] for k in json.loads(r.stdout)["kernels"]]
    assert any("missing" in n for n in names), names


def test_a_trace_at_a_path_that_is_not_utf8(tmp_path: Path, sqlite_path) -> None:
    """A file name with a byte that is not UTF-8 (Linux allows it): the SQLite URI is built from the path's bytes
    (it was an internal error), and a report written to a file stays UTF-8 (the byte becomes '?')."""
    trace = Path(os.fsdecode(bytes(tmp_path) + b"/e\xff.sqlite"))
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    r = profkit("report", str(trace), env={**os.environ, "PROFKIT_ADBC_MIN_ROWS": "0"})
    assert r.returncode == 0, r.stderr
    out = tmp_path / "r.json"
    r = profkit("report", str(trace), "--format", "json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["source"]["path"].endswith("/e?.sqlite") and doc["kernels"]


def test_half_a_surrogate_pair_in_a_torch_trace_is_one_error_line(tmp_path: Path) -> None:
    """ijson's C backend raises UnicodeDecodeError on an escaped low surrogate alone (`\\udc80`): one line."""
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\\udc80", "pid": 1, "tid": 1, '
                     '"ts": 1.0, "dur": 2.0, "args": {"device": 0, "stream": 7, "correlation": 1}}]}')
    assert one_error_line(profkit("report", str(trace))) == f"profkit: error: {trace}: broken JSON (utf-8)"


def test_a_program_named_like_a_shell_word_is_quoted() -> None:
    """`time`, `if` or `A=B` as the program: printed bare, a shell would read a keyword or an assignment."""
    from profkit.escape import shell

    assert shell(["time", "x"]) == "'time' x" and shell(["A=B", "x"]) == "'A=B' x" and shell(["if"]) == "'if'"
    assert shell(["nsys", "time"]) == "nsys time"


@pytest.mark.parametrize(("failed", "said"), [
    (True, None), ("lots", None), (float("nan"), None), (-5, None), ([3], None), (None, None),
    (1e14, "100,000,000,000,000 of 100,000,000,000,984 requests failed (100.0%)")])
def test_a_failed_count_that_is_not_a_count(tmp_path: Path, h200_model_led: Path, failed, said) -> None:
    """Lease 27's defaults-run result (q_base r1) with its `failed` replaced (16 failed, 984 completed there): what is
    not a count of requests (a boolean, text, NaN, a negative, a list) is not read, and the run's figures stand; a
    huge count is said in one line and the model refuses the run, never a traceback."""
    data = json.loads((h200_model_led / "api" / "q_base" / "r1" / "bench.json").read_text())
    data["failed"] = failed
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(data))  # json writes NaN as the token JavaScript has, which vLLM's json would too
    r = profkit("report", "--bench", bench, "--format", "json")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)["facts"]
    summaries = [f["summary"] for f in json.loads(r.stdout)["findings"] if f["rule"] == "failed-requests"]
    assert facts["vllm.num_requests"] == data["completed"]
    if said is None:
        assert (facts["vllm.failed_requests"], facts["vllm.failed_share"], summaries) == (None, None, [])
    else:
        assert summaries and summaries[0].startswith(said)
        run = shutil.copytree(h200_model_led / "api" / "q_base" / "r1", tmp_path / "r1")
        shutil.copy(bench, run / "bench.json")
        one_error_line(profkit("predict", run, "--", "--max-num-seqs", "128"), "requests failed (100.0%)")
