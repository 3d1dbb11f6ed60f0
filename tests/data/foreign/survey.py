"""The survey behind this folder: every trace under the given folders through `build_report` (window `all`),
its kernel count and total checked against the file's own events (JSON or SQL). Not a test: the 46 traces
it ran over (see README.md) are not all redistributable.

    python tests/data/foreign/survey.py DIR [DIR ...]
"""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from pathlib import Path

from profkit.errors import ProfkitError
from profkit.report import ReportOptions, build_report


def own_counts(path: Path) -> tuple[int | None, int | None]:
    if path.suffix == ".sqlite":
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return conn.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        except sqlite3.Error:
            return None, None
        finally:
            conn.close()
    with gzip.open(path) if path.suffix == ".gz" else path.open("rb") as f:
        doc = json.load(f)
    events = doc if isinstance(doc, list) else doc.get("traceEvents", [])
    kernels = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
               and str(e.get("cat", "")).lower() == "kernel"]
    return len(kernels), sum(round(e.get("dur", 0) * 1000) for e in kernels)


def main() -> None:
    files = sorted(p for d in sys.argv[1:] for p in Path(d).rglob("*") if p.name.endswith((".sqlite", ".json",
                                                                                        ".json.gz")))
    for path in files:
        count, total = own_counts(path)
        try:
            rep = build_report(path, options=ReportOptions(window="all")).document()
        except ProfkitError as exc:
            print(f"REFUSED {path}: {exc}")
            continue
        f = rep["facts"]
        same = f["kernels.count"] == count and f["kernels.total_ns"] == total
        print(f"{'OK     ' if same else 'DIFFERS'} {path}: {f['kernels.count']} kernels (file: {count}), "
              f"GPU {rep['source'].get('gpu')!r}, launches {f['launch.calls']}, graph share "
              f"{f['kernels.graph_share']:.2f}, vLLM run: {bool(rep['run']['vllm'])}")


if __name__ == "__main__":
    main()
