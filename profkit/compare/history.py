"""The run history: a SQLite database of saved reports (`profkit report ... --save runs.db`, `profkit history`).

Plain tables a user can query with SQL or Datasette: `runs` (one row per saved report, one REAL column per
outcome/headline metric, and the whole report as JSON so a stored run can be diffed without its trace), and
`metrics`, `flags`, `findings`, `kernels` keyed by `run_id`. `meta` holds the schema name.
Storage and reading only: the listing (`history_document`) is rendered by profkit.render.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlite_utils

from profkit import __version__, escape
from profkit.compare.metrics import HEADLINE_FACTS, OUTCOME, effective_flags, run_metrics
from profkit.errors import ProfkitError
from profkit.inputs import refuse_overwrite
from profkit.render.json import finite

SCHEMA = "profkit.history/1"

# metric name -> column of `runs`; fixed in advance so every run has the same columns (null where unknown).
METRIC_COLUMNS: dict[str, str] = {name: name.replace(".", "_") for name in [*OUTCOME, *HEADLINE_FACTS]}

RUN_COLUMNS: dict[str, type] = {
    "id": int, "label": str, "saved_at": str, "source": str, "kind": str, "gpu": str, "vllm_version": str,
    "window_ns": int, "command": str,
    **{col: float for col in METRIC_COLUMNS.values()},
    "report_json": str,
}
CHILD_TABLES: dict[str, dict[str, type]] = {
    "metrics": {"run_id": int, "name": str, "value": float},
    "flags": {"run_id": int, "flag": str, "value": str},
    "findings": {"run_id": int, "rule": str, "severity": str, "title": str, "summary": str},
    "kernels": {"run_id": int, "name": str, "category": str, "count": int, "total_ns": int, "share": float},
}
TABLES = ("meta", "runs", *CHILD_TABLES)

SELECTOR = re.compile(r"(?:[0-9]+|last(?:-[0-9]+)?|label=.+)", re.DOTALL)
SQLITE_MAGIC = b"SQLite format 3\x00"


# ---------------------------------------------------------------------------------------------- checks

def _ro_connect(db_path: Path) -> sqlite3.Connection:
    # mode=ro: checking (or reading) a file must never change it, whatever the file turns out to be.
    return sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)


def _validate(db_path: Path, writing: bool) -> bool:
    """Raise unless db_path is usable; True when it is a new (missing or empty) file to initialise."""
    suffix = "; refusing to write into it" if writing else ""
    if not db_path.exists():
        if writing:
            if not db_path.parent.is_dir():
                raise ProfkitError(f"{db_path}: no such directory {db_path.parent}")
            return True
        raise ProfkitError(f"{db_path}: no such history database")
    if db_path.is_dir():
        raise ProfkitError(f"{db_path}: is a directory, not a history database")
    try:
        with db_path.open("rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise ProfkitError(f"{db_path}: cannot read ({exc.strerror})") from None
    if not head:
        if writing:  # an empty file is an empty SQLite database: initialise it
            return True
        raise ProfkitError(f"{db_path}: not a profkit history database (the file is empty)")
    if head != SQLITE_MAGIC:
        raise ProfkitError(f"{db_path}: not a profkit history database (not a SQLite file{suffix})")
    try:
        conn = _ro_connect(db_path)
        try:
            tables = [r[0] for r in conn.execute("select name from sqlite_master where type = 'table' order by name")]
            if not tables and writing:
                return True
            schema = None
            if "meta" in tables:
                try:
                    row = conn.execute("select value from meta where key = 'schema'").fetchone()
                except sqlite3.OperationalError:  # someone else's `meta` table, of another shape
                    row = None
                schema = row[0] if row else None
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise ProfkitError(f"{db_path}: damaged or unreadable history database ({_one_line(exc)})") from None
    if not isinstance(schema, str) or not schema.startswith("profkit.history/"):
        listed = ", ".join(tables[:8]) + (f", ... ({len(tables)} in all)" if len(tables) > 8 else "")
        has = f"it has tables {listed}" if tables else "it has no tables"
        raise ProfkitError(f"{db_path}: not a profkit history database ({has}{suffix})")
    if schema != SCHEMA:
        raise ProfkitError(f"{db_path}: history schema {schema!r} is not supported by this profkit "
                           f"(expects {SCHEMA})")
    missing = [t for t in TABLES if t not in tables]
    if missing:
        raise ProfkitError(f"{db_path}: damaged or unreadable history database (table {', '.join(missing)} missing)")
    return False


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


# ---------------------------------------------------------------------------------------------- writing

def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _flag_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _create_tables(db: sqlite_utils.Database) -> None:
    db.table("meta").create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db.table("runs").create(RUN_COLUMNS, pk="id", if_not_exists=True)
    for name, columns in CHILD_TABLES.items():
        db.table(name).create(columns, foreign_keys=[("run_id", "runs", "id")], if_not_exists=True)
        db.table(name).create_index(["run_id"], if_not_exists=True)
    db.table("meta").insert_all([{"key": "schema", "value": SCHEMA},
                                 {"key": "created_by", "value": f"profkit {__version__}"},
                                 {"key": "created_at", "value": _now()}], pk="key", ignore=True)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _run_row(report: dict[str, Any], label: str | None) -> dict[str, Any]:
    source = report.get("source") or {}
    environment = report.get("environment") or {}
    window = report.get("window")
    command = (report.get("command") or {}).get("original") or []
    metrics = run_metrics(report)
    return {
        "label": label,
        "saved_at": _now(),
        "source": source.get("path"),
        "kind": source.get("kind"),
        "gpu": source.get("gpu") or environment.get("gpu"),
        "vllm_version": environment.get("vllm"),
        "window_ns": window.get("duration_ns") if isinstance(window, dict) else None,
        "command": "\n".join(str(c) for c in command),
        **{col: _number(metrics.get(name)) for name, col in METRIC_COLUMNS.items()},
        # The whole report, so a stored run can be diffed and rendered later without its trace.
        "report_json": json.dumps(finite(report), ensure_ascii=False, allow_nan=False, default=str),
    }


def _child_rows(run_id: int, report: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {
        "metrics": [{"run_id": run_id, "name": k, "value": _number(v)} for k, v in run_metrics(report).items()],
        "flags": [{"run_id": run_id, "flag": k, "value": _flag_text(v)} for k, v in effective_flags(report).items()],
        "findings": [{"run_id": run_id, "rule": f.get("rule"), "severity": f.get("severity"),
                      "title": f.get("title"), "summary": f.get("summary")} for f in report.get("findings") or []],
        "kernels": [{"run_id": run_id, "name": k.get("name"), "category": k.get("category"), "count": k.get("count"),
                     "total_ns": k.get("total_ns"), "share": _number(k.get("share"))}
                    for k in report.get("kernels") or []],
    }


def save_run(db_path: Path, report: dict, label: str | None = None, inputs: list[Path] | None = None) -> int:
    """Append one report to the history database (created when missing); return the new run's id."""
    db_path = Path(db_path)
    if not isinstance(report, dict) or not isinstance(report.get("source"), dict):
        raise ProfkitError(f"{db_path}: refusing to save: not a profkit.report/1 document")
    refuse_overwrite(db_path, inputs or [], what="history")
    existed = db_path.exists()
    new = _validate(db_path, writing=True)
    run = _run_row(report, label)  # built before opening, so a report that cannot be encoded writes nothing
    try:
        db = sqlite_utils.Database(sqlite3.connect(str(db_path)))
    except sqlite3.DatabaseError as exc:
        raise ProfkitError(f"{db_path}: cannot open the history database ({_one_line(exc)})") from None
    try:
        # db.atomic(), not `with db.conn:`: sqlite-utils commits its own inserts unless a transaction is
        # already open, so only an explicit BEGIN makes the run (and a new DB's tables) all-or-nothing.
        with db.atomic():
            if new:
                _create_tables(db)
            runs = db.table("runs")
            runs.insert(run)
            assert runs.last_rowid is not None  # the row just inserted
            run_id = int(runs.last_rowid)
            for table, rows in _child_rows(run_id, report).items():
                if rows:
                    db.table(table).insert_all(rows)
    except sqlite3.OperationalError as exc:  # locked, read-only file, disk full
        db.close()
        _forget(db_path, existed)
        raise ProfkitError(f"{db_path}: cannot write the history database ({_one_line(exc)})") from None
    except sqlite3.DatabaseError as exc:
        db.close()
        _forget(db_path, existed)
        raise ProfkitError(f"{db_path}: damaged or unreadable history database ({_one_line(exc)})") from None
    except BaseException:
        db.close()
        _forget(db_path, existed)
        raise
    db.close()
    return run_id


def _forget(db_path: Path, existed: bool) -> None:
    # A first save that failed leaves no empty database behind to be mistaken for a history later.
    if not existed:
        for path in (db_path, Path(str(db_path) + "-journal")):
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- reading

def open_history(db_path: Path) -> sqlite_utils.Database:
    """Open an existing history database read-only (after the same checks as save_run)."""
    db_path = Path(db_path)
    _validate(db_path, writing=False)
    try:
        return sqlite_utils.Database(_ro_connect(db_path))
    except sqlite3.DatabaseError as exc:
        raise ProfkitError(f"{db_path}: damaged or unreadable history database ({_one_line(exc)})") from None


def _query(db_path: Path, sql: str, params: tuple = ()) -> list[dict[str, Any]]:
    db = open_history(db_path)
    try:
        return list(db.query(sql, params))
    except sqlite3.DatabaseError as exc:
        raise ProfkitError(f"{db_path}: damaged or unreadable history database ({_one_line(exc)})") from None
    finally:
        db.close()


def history_document(rows: list[dict]) -> dict[str, Any]:
    """The listing as a document, `{"schema": "profkit.history/1", "runs": [...]}` (without the report JSON),
    for profkit.render.render."""
    return {"schema": SCHEMA, "runs": [{k: v for k, v in r.items() if k != "report_json"} for r in rows]}


def list_runs(db_path: Path, label: str | None = None, last: int | None = None) -> list[dict]:
    """The saved runs without their report JSON, oldest first; `last` keeps the newest N."""
    if last is not None and last < 0:
        raise ProfkitError(f"{db_path}: --last must be 0 or more (got {last})")
    columns = ", ".join(c for c in RUN_COLUMNS if c != "report_json")
    where, params = ("where label = ?", (label,)) if label is not None else ("", ())
    rows = _query(Path(db_path), f"select {columns} from runs {where} order by id", params)
    return rows[len(rows) - last:] if last is not None and last < len(rows) else rows


def load_runs(db_path: Path, selector: str) -> list[tuple[int, dict]]:
    """The (id, report) pairs a selector names: ID, last, last-N (N before the newest) or label=NAME."""
    db_path = Path(db_path)
    if not SELECTOR.fullmatch(selector):
        raise ProfkitError(f"{db_path}: bad run selector {selector!r} (expected ID, last, last-N or label=NAME)")
    ids = [r["id"] for r in _query(db_path, "select id from runs order by id")]
    if selector.isdigit():
        wanted = [int(selector)]
        if wanted[0] not in ids:
            held = f"runs {ids[0]}-{ids[-1]}" if ids else "it holds no runs"
            raise ProfkitError(f"{db_path}: no run {int(selector)} ({held})")
    elif selector.startswith("last"):
        back = int(selector[5:]) if selector != "last" else 0
        if back >= len(ids):
            held = f"only {len(ids)} run{'s' if len(ids) != 1 else ''}" if ids else "it holds no runs"
            raise ProfkitError(f"{db_path}:{selector}: {held}")
        wanted = [ids[-1 - back]]
    else:
        name = selector[len("label="):]
        wanted = [r["id"] for r in _query(db_path, "select id from runs where label = ? order by id", (name,))]
        if not wanted:
            labels = [r["label"] for r in _query(db_path, "select distinct label from runs where label is not null "
                                                          "order by label")]
            known = f"labels: {', '.join(escape.terminal(x) for x in labels[:10])}" if labels else "no run has a label"
            raise ProfkitError(f"{db_path}:{selector}: no run labelled {escape.terminal(name)!r} ({known})")
    out: list[tuple[int, dict]] = []
    for run_id in wanted:
        row = _query(db_path, "select report_json from runs where id = ?", (run_id,))[0]
        try:
            report = json.loads(row["report_json"])
        except (TypeError, ValueError, RecursionError) as exc:  # ValueError: bad JSON or a 4,300-digit integer
            raise ProfkitError(f"{db_path}: damaged or unreadable history database (run {run_id}: report JSON "
                               f"{_one_line(exc)})") from None
        out.append((run_id, report))
    return out


def parse_db_spec(text: str) -> tuple[Path, str] | None:
    """'runs.db:ID' / 'x.db:last-1' / 'x.db:label=NAME' -> (path, selector); None for anything else.

    The path is the part before the last ':' (or before ':label=', so a label may hold colons); it must name
    an existing file or end with '.db'. A text that names an existing file as a whole stays a plain path."""
    if ":" not in text or Path(text).exists():
        return None
    head, _, selector = text.rpartition(":")
    candidates = [(head, selector)]
    if ":label=" in text:
        at = text.index(":label=")
        candidates.append((text[:at], text[at + 1:]))
    for path, sel in candidates:
        if path and SELECTOR.fullmatch(sel) and (Path(path).is_file() or path.endswith(".db")):
            return Path(path), sel
    return None
