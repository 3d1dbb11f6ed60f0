"""Multi-GPU (issue 9, CPU side): per-rank traces read together, communication, overlap and imbalance.

The data are two real per-rank torch.profiler traces of one NCCL job (HTA's test data, ranks 0 and 1 of a
128-rank training run on A100s; `tests/data/foreign/README.md`): each rank ran 10 NCCL SendRecv kernels.
Every expected figure is computed here from the trace files themselves, or is HTA's.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path

import distributed  # declared test dependencies (HTA, Dask's distributed): missing, the module fails, not skips
import numpy as np
import pytest
from hta.trace_analysis import TraceAnalysis

from profkit.analysis.communication import merge_intervals, overlap_ns
from profkit.report import ReportOptions, build_report
from tests.cli import profkit

DATA = Path(__file__).parent / "data" / "foreign"
RANKS = [DATA / "hta_sampled_rank-0.json.gz", DATA / "hta_sampled_rank-1.json.gz"]


def kernels_of(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


def ns(us: float) -> int:
    return round(us * 1000)


@pytest.fixture(scope="module")
def joined() -> dict:
    return build_report(RANKS, options=ReportOptions(window="all", jobs=2)).document()


def test_rank_traces_report_as_one(joined: dict, tmp_path: Path) -> None:
    """Two traces, one report: a section per rank (rank from distributedInfo), counts from the files."""
    assert [r["rank"] for r in joined["ranks"]] == [0, 1]
    assert joined["source"]["traces"] == [str(p) for p in RANKS]
    for entry, path in zip(joined["ranks"], RANKS, strict=True):
        kernels = kernels_of(path)
        nccl = [k for k in kernels if "nccl" in k["name"]]
        assert entry["source"] == str(path) and entry["device"] == kernels[0]["args"]["device"]
        assert entry["kernels"] == {"count": len(kernels), "total_ns": sum(ns(k["dur"]) for k in kernels)}
        comm = entry["communication"]
        assert comm["count"] == len(nccl) == 10
        assert comm["total_ns"] == sum(ns(k["dur"]) for k in nccl)
        assert comm["share"] == pytest.approx(comm["total_ns"] / entry["kernels"]["total_ns"])
        categories = {c["category"]: c["total_ns"] for c in entry["categories"]}
        assert categories["communication"] == comm["total_ns"]
        assert sum(categories.values()) == entry["kernels"]["total_ns"]
    # the top-level sections are rank 0's own report
    alone = build_report(RANKS[0], options=ReportOptions(window="all")).document()
    assert "ranks" not in alone and "imbalance" not in alone  # one GPU: today's shape
    assert joined["kernels"] == alone["kernels"] and joined["gpu"] == alone["gpu"]
    assert joined["facts"]["ranks.count"] == 2

    # a folder of per-rank traces is the same report; so is --jobs 1 (in turn, no processes)
    folder = tmp_path / "ranks"
    folder.mkdir()
    for p in RANKS:
        shutil.copy(p, folder / p.name)
    from_folder = build_report(folder, options=ReportOptions(window="all", jobs=1)).document()
    assert from_folder["ranks"] == [{**r, "source": str(folder / Path(r["source"]).name)} for r in joined["ranks"]]
    assert from_folder["imbalance"] == joined["imbalance"]


def test_overlap_and_idle_equal_hta(joined: dict, tmp_path: Path) -> None:
    """HTA's comm/comp overlap (`get_comm_comp_overlap`) and temporal breakdown idle, per rank.

    HTA by default drops the last ProfilerStep's events (`include_last_profiler_step=False`: a step the
    profiler may have cut); here that is half of each trace, so HTA is asked to keep them, as profkit
    does with `--window all`. HTA calls a kernel communication when its name holds "nccl" (profkit's
    `communication` category also holds vLLM's custom all-reduce; these traces have only NCCL kernels), and
    rounds every event to whole microseconds: idle agrees to the microsecond."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    for p in RANKS:
        shutil.copy(p, tmp_path / p.name)
    ta = TraceAnalysis(trace_dir=str(tmp_path), include_last_profiler_step=True)
    overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    for entry in joined["ranks"]:
        assert round(100 * entry["communication"]["overlap_share"], 2) == overlap[entry["rank"]]
        assert abs(entry["gpu"]["idle_ns"] - 1000 * temporal.loc[entry["rank"], "idle_time(us)"]) <= 1000
    assert [round(100 * r["communication"]["overlap_share"], 2) for r in joined["ranks"]] == [14.95, 19.93]


def test_collective_wait_by_hand(joined: dict) -> None:
    """The k-th NCCL kernel of each rank is one collective: the later start is the arrival, the earlier rank
    waits the difference; the rank most often last is the straggler."""
    starts = np.array([sorted(ns(k["ts"]) for k in kernels_of(p) if "nccl" in k["name"]) for p in RANKS])
    arrival = starts.max(axis=0)
    spread = arrival - starts.min(axis=0)
    coll = joined["imbalance"]["collectives"]
    assert coll["collectives"] == 10 and coll["names_agree"] == 1.0
    assert coll["spread_ns"]["max"] == spread.max() and coll["spread_ns"]["median"] == np.median(spread)
    for i, row in enumerate(coll["ranks"]):
        assert row["wait_ns"] == (arrival - starts[i]).sum()
        assert row["last_share"] == (starts.argmax(axis=0) == i).mean()
    assert coll["straggler"] == {"rank": 1, "last_share": 0.8}
    busy = [r["gpu"]["busy_ns"] for r in joined["ranks"]]
    assert joined["imbalance"]["busy_ns"]["spread_share"] == pytest.approx((max(busy) - min(busy)) / max(busy))
    assert joined["facts"]["imbalance.straggler"] == 1
    assert "rank-imbalance" in {f["rule"] for f in joined["findings"]}


def test_overlap_of_merged_intervals_on_real_kernels() -> None:
    """The sweep over two interval unions equals a plain walk over every pair, on rank 0's real kernels."""
    kernels = kernels_of(RANKS[0])
    s = np.array([ns(k["ts"]) for k in kernels])
    e = s + np.array([ns(k["dur"]) for k in kernels])
    comm = np.array(["nccl" in k["name"] for k in kernels])
    a, b = merge_intervals(s[comm], e[comm]), merge_intervals(s[~comm], e[~comm])
    pairs = ((x, y) for x in zip(*a, strict=True) for y in zip(*b, strict=True))
    plain = sum(max(0, min(x[1], y[1]) - max(x[0], y[0])) for x, y in pairs)
    assert overlap_ns(a, b) == plain > 0


def test_dask_gives_the_local_report(joined: dict) -> None:
    """Each trace's analysis as a task on a Dask cluster (here a LocalCluster of two processes)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        on_dask = build_report(RANKS, options=ReportOptions(window="all", dask=c.scheduler_address)).document()
    local = dict(joined)
    for doc in (on_dask, local):
        doc.pop("profkit_version")
    assert on_dask == local


def test_rank_outputs_and_cli(tmp_path: Path) -> None:
    r = profkit("report", *map(str, RANKS), "--window", "all")
    assert r.returncode == 0, r.stderr
    assert "GPUs (2 ranks); 2 traces" in r.stdout and "straggler: rank 1, last in 80.0%" in r.stdout
    html = tmp_path / "r.html"
    assert profkit("report", *map(str, RANKS), "--format", "html", "-o", str(html)).returncode == 0
    page = html.read_text()
    assert "GPUs (2 ranks)" in page and page.count("<svg") >= 2
    md = profkit("report", *map(str, RANKS), "--format", "md").stdout
    assert "| 1 | ? (device 1) |" in md
    bad = profkit("report", *map(str, RANKS), "--dask", "tcp://127.0.0.1:9")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "--dask" in bad.stderr


def test_rank_table_joins_waits_once_for_every_format(joined: dict) -> None:
    """The rank table's rows carry each rank's wait in collectives and its last-arrival share (one join, read
    by text, Markdown and HTML); a rank the collectives did not match shows "-" in every format."""
    from profkit.render import render
    from profkit.render.sections.ranks import rank_table

    table = rank_table(joined)
    waits = {w["rank"]: w for w in joined["imbalance"]["collectives"]["ranks"]}
    assert table["waits"] and [(r["rank"], r["wait_ns"], r["last_share"]) for r in table["rows"]] == [
        (k, waits[k]["wait_ns"], waits[k]["last_share"]) for k in (0, 1)]
    assert rank_table({"ranks": []}) is None and rank_table({"ranks": joined["ranks"]})["waits"] is False
    one = {**joined, "imbalance": {**joined["imbalance"], "collectives": {
        **joined["imbalance"]["collectives"], "ranks": joined["imbalance"]["collectives"]["ranks"][:1]}}}
    text = render(one, "text")
    row = next(line for line in text.splitlines() if line.startswith("  1 "))
    assert row.split()[-2:] == ["-", "-"]
    html = render(one, "html")
    assert html.count('<td class="num">-</td><td class="num">-</td><td class="name">') == 1
