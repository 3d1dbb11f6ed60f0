"""The one render entry (profkit.render.render) and the one escaper per format (profkit.escape)."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

from profkit import escape
from profkit.errors import ProfkitError
from profkit.render import RENDERERS, SCHEMAS, render

HOSTILE = "a|b `c` [x](y) <i>&_*~\\ \u202eRTL\u200b\u00ad\u2028 \t\x1b[31m\x9b\r\nz\x7f"


def test_every_kind_and_format_is_listed_once() -> None:
    assert set(SCHEMAS.values()) == {k for k, _ in RENDERERS}
    assert {f for k, f in RENDERERS if k == "report"} == {"text", "json", "md", "html"}
    assert {f for k, f in RENDERERS if k == "history"} == {"text", "json", "md"}
    assert {f for k, f in RENDERERS if k == "tune"} == {"text", "md", "html"}


def test_unknown_schema_and_format_are_one_error() -> None:
    with pytest.raises(ProfkitError, match=r"cannot render a document of schema 'profkit\.host/1'"):
        render({"schema": "profkit.host/1"}, "text")
    with pytest.raises(ProfkitError, match=r"cannot render a document of schema None"):
        render({}, "json")
    with pytest.raises(ProfkitError, match=r"unknown tune format 'json' \(text, md or html\)"):
        render({"schema": "profkit.tune/1"}, "json")


def test_a_struct_renders_as_its_dict() -> None:
    class History(msgspec.Struct):
        schema: str
        runs: list[dict]

    doc = History("profkit.history/1", [{"id": 1, "label": "x", "gpu_utilization": float("nan")}])
    assert render(doc, "json") == render(msgspec.to_builtins(doc), "json")
    assert json.loads(render(doc, "json"))["runs"][0]["gpu_utilization"] is None


def test_json_and_text_never_import_the_plotting_library() -> None:
    code = ("import sys; from profkit.render import render; "
            "render({'schema': 'profkit.history/1', 'runs': []}, 'json'); "
            "render({'schema': 'profkit.history/1', 'runs': []}, 'text'); "
            "render({'schema': 'profkit.history/1', 'runs': []}, 'md'); "
            "print('matplotlib' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_terminal_keeps_one_line_of_visible_text() -> None:
    out = escape.terminal(HOSTILE)
    assert out == "a|b `c` [x](y) <i>&_*~\\ RTL  [31m z"
    assert out.isprintable() and escape.terminal(42) == "42"


def test_document_keeps_lines_and_tabs_only() -> None:
    assert escape.document("a\x1b[1m\tb\r\nc\x9b\x7f\n") == "a[1m\tb\nc\n"


def test_markdown_leaves_nothing_markdown_or_html_acts_on() -> None:
    out = escape.markdown(HOSTILE)
    assert out == "a\\|b 'c' \\[x\\](y) &lt;i&gt;&amp;\\_\\*\\~\\\\ RTL  \\[31m z"
    assert "<" not in out and "`" not in out and "\n" not in out


def test_one_line_is_bounded() -> None:
    assert escape.one_line("bad\x1b[31m  value\t here\x00") == "bad[31m value here"
    assert escape.one_line("x" * 400, 10) == "x" * 9 + "…"


@pytest.mark.parametrize("sample, labels", [
    ("samples/vllm_14b_kv_bound", ["req/s", "output tok/s", "mean TTFT ms", "p99 TTFT ms", "mean TPOT ms",
                                   "preemptions", "peak KV usage"]),
    ("samples/capture_thr_torch", ["req/s"])])  # vllm bench throughput: its JSON has the rate alone
def test_vllms_figures_are_the_same_in_every_format(sample: str, labels: list[str]) -> None:
    """The text's head gave req/s, output tok/s, mean and p99 TTFT, mean TPOT, preemptions and the KV cache's peak;
    Markdown left out three and HTML four (a first-hour review). One list now feeds all three, and each figure, as
    the text prints it, is in the Markdown and the HTML too."""
    from profkit.render.sections.header import outcomes
    from profkit.report import build_report

    doc = build_report(sample).document()
    figures = outcomes(doc)
    assert [o["label"] for o in figures] == labels
    text, md, html = (render(doc, fmt) for fmt in ("text", "md", "html"))
    for o in figures:
        assert f"{o['label']} {o['value']}" in text
        assert f"{o['label']} {o['value']}" in md
        assert f"{o['label']}<b>{o['value']}</b>" in html


def test_a_torch_traces_cpu_operators_are_in_every_format() -> None:
    """The CPU operators were HTML's alone; text and Markdown show the top ones as they show the CUDA API's."""
    from profkit.report import build_report

    doc = build_report("samples/capture_thr_torch").document()
    top = doc["cpu_ops"][0]
    assert top["name"] == "aten::mm" and top["count"] == 161  # the sample's busiest operator by host time
    text, md, html = (render(doc, fmt) for fmt in ("text", "md", "html"))
    assert "CPU operators (torch)" in text and "| aten::mm | 161 | 45.8 ms | 284 us |" in md
    assert "aten::mm" in html and text.count("aten::mm") == 1


def test_a_search_reads_the_same_in_every_format() -> None:
    """Ranked by goodput, the text said so and gave each goodput; Markdown and HTML said 'best predicted request
    throughput first' and had no goodput column. Each now says the order, what is left out, and the goodputs."""
    from profkit.model.search import Bound
    from profkit.report.predict import search_run

    doc = search_run("samples/vllm_14b_kv_bound", bounds=[Bound("p99_ttft_ms", "<=", 20000.0)])
    text, md, html = (render(doc, fmt) for fmt in ("text", "md", "html"))
    goodput = doc["search"][0]["goodput"]
    for out in (text, md, html):
        assert "best predicted goodput first" in out and "is left out" in out
        assert f"{goodput['rate']:.1f} ({goodput['low']:.1f}-{goodput['high']:.1f})" in out
