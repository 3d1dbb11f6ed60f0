"""The HTML report as a person sees it: self-contained, within budget, rendered by headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from profkit.evidence.record import Evidence
from profkit.render.html import render_html
from profkit.render.markdown import render_markdown
from profkit.report import build_report
from tests.conftest import FIXTURES, TOY
from tests.test_torch_traces import TORCH

HOSTILE = "<script>alert(1)</script>"
BUDGET = 2 * 1024 * 1024


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium not installed here")
    return exe


def browse(html: Path, tmp: Path) -> tuple[str, str, Path]:
    """(DOM after load, Chromium's log, screenshot) of a local file, with the network cut off."""
    args = [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tempfile.mkdtemp(dir=tmp)}", "--enable-logging=stderr", "--v=0",
            "--proxy-server=127.0.0.1:9", "--window-size=1200,1600"]
    shot = tmp / "shot.png"
    dom = subprocess.run([*args, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120)
    pic = subprocess.run([*args, f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True, timeout=120)
    return dom.stdout, dom.stderr + pic.stderr, shot


def assert_not_blank(png: Path) -> None:
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.std() > 0.05  # a white page has std 0
    dark = (pixels[..., :3].mean(axis=2) < 0.5).mean()
    assert dark > 0.005  # some text and chart ink


def write(tmp: Path, report: dict) -> Path:
    out = tmp / "report.html"
    out.write_text(render_html(report), encoding="utf-8")
    return out


@pytest.mark.parametrize("name", TOY + ["thr_graphs"])
def test_every_nsys_fixture_renders_within_budget(name: str, sqlite_path, tmp_path: Path) -> None:
    html = render_html(build_report(sqlite_path(name)).document())
    assert len(html.encode()) < BUDGET
    assert "<script" not in html.lower()  # no JavaScript at all: reads with scripts off
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?https?:""", html)  # no network
    assert html.count("<svg") >= 3 and 'id="findings"' in html


@pytest.mark.parametrize("name", list(TORCH))
def test_every_torch_fixture_renders_within_budget(name: str, tmp_path: Path) -> None:
    html = render_html(build_report(TORCH[name]).document())
    assert len(html.encode()) < BUDGET and html.count("<svg") >= 3


def test_chromium_renders_the_vllm_report(sqlite_path, tmp_path: Path) -> None:
    vllm = FIXTURES / "h100_vllm"
    report = build_report(sqlite_path("thr_graphs"),
                          Evidence.read(bench=vllm / "thr_graphs.json", log=vllm / "thr_graphs.log")).document()
    dom, log, shot = browse(write(tmp_path, report), tmp_path)
    assert "CONSOLE" not in log and "Uncaught" not in log
    assert "Findings (3)" in dom and "GPU waits on the host between steps" in dom
    assert dom.count("<svg") >= 5  # timeline, categories, kernels, memory, API
    assert "req/s<b>144.98</b>" in dom  # the benchmark's own throughput in the header, as the text report gives it
    assert_not_blank(shot)


def test_hostile_kernel_name_renders_as_text(sqlite_path, tmp_path: Path) -> None:
    trace = tmp_path / "hostile.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    trace.chmod(0o644)
    with sqlite3.connect(trace) as conn:
        demangled, short = conn.execute(
            "SELECT demangledName, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY demangledName "
            "ORDER BY sum(end - start) DESC LIMIT 1").fetchone()
        conn.execute("UPDATE StringIds SET value = ? WHERE id IN (?, ?)", (HOSTILE, demangled, short))
    report = build_report(trace).document()
    assert report["kernels"][0]["name"] == HOSTILE
    html = render_html(report)
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # tables (Jinja autoescape) and SVG labels
    assert "<script" not in html.lower()
    md = render_markdown(report)
    assert HOSTILE not in md and "&lt;script&gt;" in md
    dom, log, shot = browse(write(tmp_path, report), tmp_path)
    assert "alert" not in log and "CONSOLE" not in log
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom  # shown as text in the page
    assert_not_blank(shot)


def test_capture_folder_html(sqlite_path, tmp_path: Path) -> None:
    from tests.test_rules import REAL_SERVE

    folder = tmp_path / "capture"
    folder.mkdir()
    shutil.copyfile(sqlite_path("hostgap_b16"), folder / "trace.sqlite")
    for name in ("bench.json", "server.log", "metrics-before.txt", "metrics-after.txt"):
        shutil.copyfile(REAL_SERVE / name, folder / name)
    html = render_html(build_report(folder).document())
    assert "Requests preempted for lack of KV cache" in html
    # No manifest: the command is rebuilt from the log's non-default args, and says so; the cap is struck out.
    assert "from the vLLM log&#39;s non-default args" in html
    assert "<del>--kv-cache-memory-bytes</del> <del>300000000</del>" in html
    assert "<pre>vllm serve /tmp/tiny --port 8011 --max-model-len 2048</pre>" in html
    assert "refuses): ok</p>" in html


def test_markdown_for_a_ticket(sqlite_path) -> None:
    from tests.test_rules import REAL_SERVE

    evidence = Evidence.read(log=REAL_SERVE / "server.log",
                             metrics=[REAL_SERVE / "metrics-before.txt", REAL_SERVE / "metrics-after.txt"])
    report = build_report(sqlite_path("hostgap_b16"), evidence).document()
    md = render_markdown(report)
    assert "**[critical] Requests preempted for lack of KV cache** (kv-preemption)" in md
    assert "| `--kv-cache-memory-bytes` | 300000000 (vLLM log) | **not set (vLLM's default)** | remove |" in md
    # before -> after as a diff block, then the command alone, unescaped, to copy
    assert ("```diff\n- vllm serve /tmp/tiny --port 8011 --max-model-len 2048 --kv-cache-memory-bytes 300000000\n"
            "+ vllm serve /tmp/tiny --port 8011 --max-model-len 2048\n```") in md
    assert "```\nvllm serve /tmp/tiny --port 8011 --max-model-len 2048\n```" in md
    assert "| category | kernels | time | share |" in md


def test_the_readme_picture_is_made_by_one_command(tmp_path: Path) -> None:
    """docs/img/report.png is scripts/make_screenshot.py's output: the script draws the bundled sample's report as
    it renders today (not a picture that drifts from it)."""
    chromium()
    shot = tmp_path / "report.png"
    r = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "scripts" / "make_screenshot.py"),
                        "--out", str(shot)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert_not_blank(shot)
    import matplotlib.image

    assert matplotlib.image.imread(shot).shape[:2] == (1000, 1100)
