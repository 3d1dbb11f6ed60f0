"""The run history database: real reports (H100 nsys traces, a real vLLM serve run) saved, queried, refused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlite_utils

from profkit import __version__
from profkit.compare import history
from profkit.compare.history import (
    SCHEMA,
    history_document,
    list_runs,
    load_runs,
    open_history,
    parse_db_spec,
    save_run,
)
from profkit.compare.metrics import effective_flags, run_metrics
from profkit.errors import ProfkitError
from profkit.render import render

SERVE = Path(__file__).resolve().parent / "data" / "vllm_serve_kv300mb"
HOSTILE = "a|b `code` [x](javascript:x) <i>&_y\x1b[31m\nz\\|w"


@pytest.fixture(scope="module")
def evidence_report() -> dict:
    from profkit.evidence.record import Evidence
    from profkit.report import build_report

    evidence = Evidence.read(bench=SERVE / "bench.json", log=SERVE / "server.log",
                             metrics=[SERVE / "metrics-before.txt", SERVE / "metrics-after.txt"])
    return build_report(None, evidence).document()


@pytest.fixture
def two_runs(tmp_path: Path, report_all) -> Path:
    db = tmp_path / "runs.db"
    assert save_run(db, report_all("eager_b1"), label="eager") == 1
    assert save_run(db, report_all("graphs_b1"), label="graphs") == 2
    return db


def normalised(report: dict) -> dict:
    return json.loads(json.dumps(report))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


# ------------------------------------------------------------------------------------------- round trip

def test_round_trip_by_id_last_and_label(two_runs: Path, report_all) -> None:
    eager, graphs = report_all("eager_b1"), report_all("graphs_b1")
    rows = list_runs(two_runs)
    assert [(r["id"], r["label"], r["kind"]) for r in rows] == [(1, "eager", "nsys-sqlite"),
                                                                (2, "graphs", "nsys-sqlite")]
    assert rows[0]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert rows[0]["window_ns"] == eager["window"]["duration_ns"] and rows[0]["window_ns"] > 0
    assert rows[1]["source"] == graphs["source"]["path"]
    assert "report_json" not in rows[0]

    [(run_id, loaded)] = load_runs(two_runs, "1")
    assert run_id == 1
    assert loaded["facts"] == eager["facts"]
    assert loaded["kernels"] == eager["kernels"]
    assert loaded["findings"] == normalised(eager["findings"])
    assert loaded == normalised(eager)  # the whole document survives (JSON-equal)
    assert load_runs(two_runs, "last")[0][0] == 2
    assert load_runs(two_runs, "last")[0][1]["kernels"] == graphs["kernels"]
    assert load_runs(two_runs, "last-1")[0][1]["facts"] == eager["facts"]
    assert load_runs(two_runs, "last-0")[0][0] == 2

    # A replicate of one configuration: label= gives every run with that label, oldest first.
    assert save_run(two_runs, graphs, label="graphs") == 3
    replicates = load_runs(two_runs, "label=graphs")
    assert [i for i, _ in replicates] == [2, 3]
    assert all(r["facts"] == graphs["facts"] for _, r in replicates)
    assert [r["id"] for r in list_runs(two_runs, label="graphs")] == [2, 3]
    assert [r["id"] for r in list_runs(two_runs, last=2)] == [2, 3]
    assert [r["id"] for r in list_runs(two_runs, label="eager", last=5)] == [1]
    assert list_runs(two_runs, last=0) == []


def test_tables_hold_what_sql_users_expect(two_runs: Path, report_all) -> None:
    eager, graphs = report_all("eager_b1"), report_all("graphs_b1")
    conn = sqlite3.connect(two_runs)
    share = dict(conn.execute("select id, kernels_graph_share from runs").fetchall())
    assert share == {1: eager["facts"]["kernels.graph_share"], 2: graphs["facts"]["kernels.graph_share"]}
    assert share[1] == 0.0 and share[2] > 0.5  # eager launches vs CUDA-graph replays
    util = conn.execute("select gpu_utilization from runs where id = 1").fetchone()[0]
    assert util == eager["gpu"]["utilization"]
    for run_id, report in ((1, eager), (2, graphs)):
        count, total = conn.execute("select count(*), sum(total_ns) from kernels where run_id = ?",
                                    (run_id,)).fetchone()
        assert count == len(report["kernels"]) > 0
        assert total == sum(k["total_ns"] for k in report["kernels"])
        top = conn.execute("select name, category, count, total_ns, share from kernels where run_id = ? "
                           "order by total_ns desc limit 1", (run_id,)).fetchone()
        k0 = max(report["kernels"], key=lambda k: k["total_ns"])
        assert top == (k0["name"], k0["category"], k0["count"], k0["total_ns"], k0["share"])
        metrics = dict(conn.execute("select name, value from metrics where run_id = ?", (run_id,)).fetchall())
        assert metrics == run_metrics(report)
        findings = conn.execute("select rule, severity, title, summary from findings where run_id = ?",
                                (run_id,)).fetchall()
        assert findings == [(f["rule"], f["severity"], f["title"], f["summary"]) for f in report["findings"]]
    assert "launch-overhead" in {r for (r,) in conn.execute("select rule from findings where run_id = 1")}
    # Outcome columns exist for every run; a trace without a benchmark leaves them null.
    assert conn.execute("select request_throughput, p99_ttft_ms from runs where id = 1").fetchone() == (None, None)
    assert dict(conn.execute("select key, value from meta").fetchall())["schema"] == SCHEMA
    assert dict(conn.execute("select key, value from meta").fetchall())["created_by"] == f"profkit {__version__}"
    conn.close()

    db = sqlite_utils.Database(two_runs)
    for table in ("metrics", "flags", "findings", "kernels"):
        fks = db.table(table).foreign_keys
        assert [(f.column, f.other_table, f.other_column) for f in fks] == [("run_id", "runs", "id")]
        assert [ix.columns for ix in db.table(table).indexes] == [["run_id"]]
    assert db.table("runs").pks == ["id"]
    assert db.table("runs").columns_dict["kernels_graph_share"] is float
    db.close()


def test_evidence_only_report_saves_with_null_window(tmp_path: Path, evidence_report: dict) -> None:
    db = tmp_path / "serve.db"
    run_id = save_run(db, evidence_report, label="kv300mb", inputs=[SERVE / "bench.json", SERVE / "server.log"])
    [row] = list_runs(db)
    assert row["id"] == run_id == 1
    assert row["kind"] == "evidence" and row["window_ns"] is None
    assert row["request_throughput"] == 11.066771364919576
    assert row["vllm_preemptions"] == 29.0
    assert row["mean_ttft_ms"] == run_metrics(evidence_report)["mean_ttft_ms"] > 1000
    assert row["command"] == "\n".join(evidence_report["command"]["original"]) == (
        "vllm serve /tmp/tiny --port 8011 --max-model-len 2048 --kv-cache-memory-bytes 300000000")
    conn = sqlite3.connect(db)
    flags = dict(conn.execute("select flag, value from flags").fetchall())
    assert flags == {k: str(v) for k, v in effective_flags(evidence_report).items()}
    assert flags["--kv-cache-memory-bytes"] == "300000000"
    assert conn.execute("select count(*) from kernels").fetchone()[0] == 0
    assert "kv-preemption" in {r for (r,) in conn.execute("select rule from findings")}
    conn.close()
    assert load_runs(db, "last")[0][1]["vllm"] == normalised(evidence_report["vllm"])


def test_a_failed_save_leaves_no_partial_run(tmp_path: Path, report_all, monkeypatch) -> None:
    db = tmp_path / "runs.db"
    save_run(db, report_all("eager_b1"), label="ok")
    before = digest(db)
    real = sqlite_utils.db.Table.insert_all

    def failing(self, records, *args, **kwargs):
        if self.name == "kernels":
            raise sqlite3.OperationalError("disk I/O error")
        return real(self, records, *args, **kwargs)

    monkeypatch.setattr(sqlite_utils.db.Table, "insert_all", failing)
    with pytest.raises(ProfkitError) as exc:
        save_run(db, report_all("graphs_b1"), label="broken")
    assert one_line_error(exc) == f"{db}: cannot write the history database (disk I/O error)"
    assert digest(db) == before
    assert [r["label"] for r in list_runs(db)] == ["ok"]
    # A first save that fails leaves no database behind.
    fresh = tmp_path / "fresh.db"
    with pytest.raises(ProfkitError):
        save_run(fresh, report_all("graphs_b1"))
    assert not fresh.exists()


# ------------------------------------------------------------------------------------------- refusals

def test_refuses_a_foreign_sqlite_file(tmp_path: Path, sqlite_path, report_all) -> None:
    trace = tmp_path / "trace_copy.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    before = digest(trace)
    with pytest.raises(ProfkitError) as exc:
        save_run(trace, report_all("eager_b1"))
    msg = one_line_error(exc)
    assert msg.startswith(f"{trace}: not a profkit history database (it has tables ")
    assert msg.endswith("; refusing to write into it)")
    assert digest(trace) == before
    for read in (lambda: open_history(trace), lambda: list_runs(trace), lambda: load_runs(trace, "1")):
        with pytest.raises(ProfkitError, match="not a profkit history database"):
            read()
    assert digest(trace) == before


def test_refuses_another_schema(tmp_path: Path, report_all) -> None:
    db_path = tmp_path / "future.db"
    db = sqlite_utils.Database(db_path)
    db.table("meta").insert_all([{"key": "schema", "value": "profkit.history/2"}], pk="key")
    db.close()
    before = digest(db_path)
    with pytest.raises(ProfkitError) as exc:
        save_run(db_path, report_all("eager_b1"))
    assert one_line_error(exc) == (f"{db_path}: history schema 'profkit.history/2' is not supported by this "
                                   f"profkit (expects profkit.history/1)")
    with pytest.raises(ProfkitError, match="profkit.history/2"):
        list_runs(db_path)
    assert digest(db_path) == before


def test_refuses_a_file_that_is_not_sqlite(tmp_path: Path, evidence_report: dict) -> None:
    bench = tmp_path / "bench.json"
    shutil.copyfile(SERVE / "bench.json", bench)
    before = digest(bench)
    with pytest.raises(ProfkitError) as exc:
        save_run(bench, evidence_report)
    assert one_line_error(exc) == (f"{bench}: not a profkit history database "
                                   f"(not a SQLite file; refusing to write into it)")
    assert digest(bench) == before
    with pytest.raises(ProfkitError, match="not a SQLite file"):
        list_runs(bench)
    with pytest.raises(ProfkitError, match="is a directory"):
        save_run(tmp_path, evidence_report)
    with pytest.raises(ProfkitError) as exc:
        list_runs(tmp_path / "missing.db")
    assert one_line_error(exc) == f"{tmp_path / 'missing.db'}: no such history database"
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(ProfkitError, match="no such directory"):
        save_run(tmp_path / "nodir" / "runs.db", evidence_report)


def test_damaged_database_is_one_line_not_a_traceback(two_runs: Path, report_all, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(two_runs.read_bytes()[:2048] + b"\xde\xad\xbe\xef" * 4096)
    for action in (lambda: save_run(damaged, report_all("eager_b1")), lambda: list_runs(damaged),
                   lambda: load_runs(damaged, "last"), lambda: open_history(damaged)):
        with pytest.raises(ProfkitError) as exc:
            action()
        assert one_line_error(exc).startswith(f"{damaged}: damaged or unreadable history database (")


def test_refuses_to_write_over_an_input(tmp_path: Path, two_runs: Path, report_all, sqlite_path) -> None:
    before = digest(two_runs)
    with pytest.raises(ProfkitError) as exc:
        save_run(two_runs, report_all("eager_b1"), inputs=[two_runs])
    assert one_line_error(exc) == f"{two_runs}: is one of the inputs; refusing to write the history over it"
    assert digest(two_runs) == before

    # The same file by another name: a symlink to the input, and the input by a relative path.
    link = tmp_path / "link.db"
    link.symlink_to(two_runs)
    with pytest.raises(ProfkitError, match="is one of the inputs"):
        save_run(link, report_all("eager_b1"), inputs=[Path(os.path.relpath(two_runs))])
    assert digest(two_runs) == before and len(list_runs(two_runs)) == 2

    trace = tmp_path / "trace.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    trace_link = tmp_path / "trace_link.db"
    trace_link.symlink_to(trace)
    with pytest.raises(ProfkitError) as exc:
        save_run(trace_link, report_all("eager_b1"), inputs=[trace])
    assert one_line_error(exc) == (f"{trace_link}: is one of the inputs ({trace}); "
                                   f"refusing to write the history over it")
    assert digest(trace) == digest(sqlite_path("eager_b1"))


# ------------------------------------------------------------------------------------------- selectors

def test_bad_selectors(two_runs: Path, tmp_path: Path, report_all) -> None:
    cases = {
        "7": f"{two_runs}: no run 7 (runs 1-2)",
        "last-5": f"{two_runs}:last-5: only 2 runs",
        "last-2": f"{two_runs}:last-2: only 2 runs",
        "label=nope": f"{two_runs}:label=nope: no run labelled 'nope' (labels: eager, graphs)",
        "first": f"{two_runs}: bad run selector 'first' (expected ID, last, last-N or label=NAME)",
        "last-x": f"{two_runs}: bad run selector 'last-x' (expected ID, last, last-N or label=NAME)",
        "label=": f"{two_runs}: bad run selector 'label=' (expected ID, last, last-N or label=NAME)",
        "-1": f"{two_runs}: bad run selector '-1' (expected ID, last, last-N or label=NAME)",
    }
    for selector, message in cases.items():
        with pytest.raises(ProfkitError) as exc:
            load_runs(two_runs, selector)
        assert one_line_error(exc) == message

    # A database with its tables but no runs yet.
    empty = tmp_path / "empty.db"
    shutil.copyfile(two_runs, empty)
    with sqlite3.connect(empty) as conn:
        for table in ("metrics", "flags", "findings", "kernels", "runs"):
            conn.execute(f"delete from {table}")
    conn.close()
    assert list_runs(empty) == []
    with pytest.raises(ProfkitError) as exc:
        load_runs(empty, "last")
    assert one_line_error(exc) == f"{empty}:last: it holds no runs"
    with pytest.raises(ProfkitError) as exc:
        load_runs(empty, "1")
    assert one_line_error(exc) == f"{empty}: no run 1 (it holds no runs)"
    with pytest.raises(ProfkitError, match="no run has a label"):
        load_runs(empty, "label=x")
    # An unknown id names the range of ids the database holds.
    assert save_run(empty, report_all("eager_b1")) >= 1
    with pytest.raises(ProfkitError, match=r"no run 99 \(runs \d+-\d+\)"):
        load_runs(empty, "99")


def test_parse_db_spec(tmp_path: Path, sqlite_path, monkeypatch) -> None:
    existing = tmp_path / "history.sqlite"
    existing.write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert parse_db_spec("runs.db:3") == (Path("runs.db"), "3")
    assert parse_db_spec("path/to/x.db:last-1") == (Path("path/to/x.db"), "last-1")
    assert parse_db_spec("x.db:last") == (Path("x.db"), "last")
    assert parse_db_spec("x.db:label=foo") == (Path("x.db"), "label=foo")
    assert parse_db_spec("x.db:label=tp=2:fp8") == (Path("x.db"), "label=tp=2:fp8")
    assert parse_db_spec(f"{existing}:2") == (existing, "2")  # any existing file, whatever its suffix
    # Plain paths pass through: no colon, a colon inside a directory name, a bad selector, no .db.
    assert parse_db_spec(str(sqlite_path("eager_b1"))) is None
    assert parse_db_spec("dir:with/colon/trace.sqlite") is None
    assert parse_db_spec("x.db:first") is None
    assert parse_db_spec("x.db:") is None
    assert parse_db_spec(":3") is None
    assert parse_db_spec("missing.sqlite:1") is None
    assert parse_db_spec("x.db:-1") is None
    # A file whose own name has the colon is that file, not a selector.
    odd = tmp_path / "odd.db:1"
    odd.write_bytes(b"")
    assert parse_db_spec("odd.db:1") is None


# ------------------------------------------------------------------------------------------- rendering

def test_render_history_formats_and_escaping(tmp_path: Path, report_all, evidence_report: dict) -> None:
    db = tmp_path / "runs.db"
    save_run(db, report_all("eager_b1"), label=HOSTILE)
    save_run(db, evidence_report, label="kv300mb")
    rows = list_runs(db)
    assert rows[0]["label"] == HOSTILE  # stored as given; escaped only when shown

    text = render(history_document(rows), "text")
    lines = text.splitlines()
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1  # aligned
    assert lines[0].split()[:3] == ["id", "label", "saved_at"]
    assert "\x1b" not in text and "\\x1b" not in text
    eager_line, serve_line = lines[1], lines[2]
    # profkit.escape.terminal, as for every terminal output: ESC out, the newline a space
    assert eager_line.lstrip().startswith("1  a|b `code` [x](javascript:x) <i>&_y[31m z\\|w")
    assert "10.7%" in eager_line and "0.0%" in eager_line and "NVIDIA H100 80GB HBM3" in eager_line
    assert serve_line.split()[:2] == ["2", "kv300mb"]
    cells = serve_line.split()
    assert "11.07" in cells and "29" in cells and "9,039.0" in cells and "17,451.7" in cells
    assert cells[-2:] == ["-", "-"]  # no trace: no GPU utilization, no graph share

    doc = json.loads(render(history_document(rows), "json"))
    assert doc["schema"] == "profkit.history/1"
    assert [r["id"] for r in doc["runs"]] == [1, 2]
    assert doc["runs"][0]["label"] == HOSTILE
    assert doc["runs"][1]["request_throughput"] == 11.066771364919576
    assert doc["runs"][1]["window_ns"] is None
    assert "report_json" not in doc["runs"][0]

    md = render(history_document(rows), "md")
    md_lines = md.splitlines()
    assert len(md_lines) == 4
    assert "\x1b" not in md and "<i>" not in md
    assert re.search(r"(?<!\\)\]\(", md) is None  # no live link: every ']' is escaped
    unescaped_pipes = [line.replace("\\\\", "").replace("\\|", "").count("|") for line in md_lines]
    assert unescaped_pipes == [12, 12, 12, 12]
    # profkit.escape.markdown, as for every Markdown output: a backtick becomes ' (safe inside a code span too)
    assert ("a\\|b 'code' \\[x\\](javascript:x) &lt;i&gt;&amp;\\_y\\[31m z\\\\\\|w" in md_lines[2])
    assert "| 11.07 |" in md_lines[3] and "| 29 |" in md_lines[3]

    assert render(history_document([]), "text") == "no runs\n"
    assert json.loads(render(history_document([]), "json")) == {"schema": SCHEMA, "runs": []}
    with pytest.raises(ProfkitError, match="unknown history format 'csv'"):
        render(history_document(rows), "csv")


def test_schema_sql_is_fixed(two_runs: Path, tmp_path: Path, evidence_report: dict) -> None:
    # Every database has the same tables and columns, whatever its first run held (evidence: no kernels).
    other = tmp_path / "other.db"
    save_run(other, evidence_report)

    def schema(path: Path) -> list[tuple]:
        with sqlite3.connect(path) as conn:
            return conn.execute("select type, name, sql from sqlite_master order by name").fetchall()

    assert schema(two_runs) == schema(other)
    columns = [c.name for c in sqlite_utils.Database(other).table("runs").columns]
    assert columns[:9] == ["id", "label", "saved_at", "source", "kind", "gpu", "vllm_version", "window_ns", "command"]
    assert columns[-1] == "report_json"
    assert set(history.METRIC_COLUMNS.values()) <= set(columns)
    assert {"request_throughput", "mean_ttft_ms", "p99_ttft_ms", "gpu_utilization", "kernels_graph_share",
            "vllm_preemptions"} <= set(columns)
