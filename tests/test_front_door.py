"""The front door, as a newcomer meets it: the README's two commands and its demo, `python -m profkit`, help on
every option, the library API, and one voice across formats (each item once through the CLI, on bundled real runs)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import click
import pytest

from profkit.api import render
from tests.cli import one_error_line, profkit

REPO = Path(__file__).resolve().parent.parent
KV_BOUND, PRESCRIBED = REPO / "samples" / "vllm_14b_kv_bound", REPO / "samples" / "vllm_14b_prescribed"
OUTSIDE = "../" + "shared"  # the folder beside a developer's checkout, which a clone does not have


def _bench(folder: Path) -> dict:
    return json.loads((folder / "bench.json").read_text())


def test_the_readme_fits_a_screen_or_two_and_has_exactly_two_set_up_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    setups = [b for b in re.findall(r"```\n(.*?)```", text, re.S) if "python3 -m venv" in b]
    assert len(setups) == 2
    demo, tests = setups
    assert "profkit report samples/vllm_14b_kv_bound" in demo and "pytest" in tests
    assert OUTSIDE not in text and "[capture]" in text
    for link in re.findall(r"\]\(((?!https?://)[^)#]+)", text):  # every link names a file of the repository
        assert (REPO / link).exists(), link


def test_the_repository_stands_alone() -> None:
    """No test, CI or docs file reaches outside the repository for its data."""
    for path in [*REPO.glob("tests/*.py"), REPO / ".ci" / "run", *REPO.glob("docs/*.md"), REPO / "mkdocs.yml"]:
        assert OUTSIDE not in path.read_text(), path


def test_the_demo_prescribes_a_change_with_its_expected_effect() -> None:
    """The README's first command, on a real 14B run on an H100: a verdict, a prescription with a predicted range,
    and the range holds what the prescribed configuration measured (the second sample, same workload, same GPU)."""
    text = profkit("report", KV_BOUND).stdout
    assert "Verdict: the limit is the KV cache's size" in text
    lead = text[text.index("Prescription"):text.index("Findings")]
    assert "--kv-cache-dtype auto (vLLM 0.26 default) -> fp8" in lead
    assert "--gpu-memory-utilization 0.6 -> not set (vLLM's default, 0.92)" in lead
    doc = json.loads(profkit("report", KV_BOUND, "--format", "json").stdout)
    rt = doc["prescription"]["predicted"]["request_throughput"]
    assert rt["before"] == _bench(KV_BOUND)["request_throughput"]
    measured = _bench(PRESCRIBED)["request_throughput"]
    assert rt["low"] <= measured <= rt["high"] and abs(rt["predicted"] / measured - 1) < 0.10
    for fmt, marker in (("md", "Prescription"), ("html", "Prescription")):
        out = profkit("report", KV_BOUND, "--format", fmt).stdout
        assert marker in out and f"{rt['predicted']:.2f}" in out


def test_python_dash_m_profkit_is_the_command_line() -> None:
    r = subprocess.run([sys.executable, "-m", "profkit", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("profkit, version ")


def test_every_option_says_what_it_does() -> None:
    from profkit.cli import cli

    missing = []

    def walk(cmd: click.Command, path: str) -> None:
        missing.extend(f"{path} {p.opts[0]}" for p in cmd.params if isinstance(p, click.Option) and not p.help)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")

    walk(cli, "profkit")
    assert missing == []


def test_the_library_gives_what_the_command_prints() -> None:
    from profkit.api import diff, predict, render, report

    doc = report(KV_BOUND)
    printed = json.loads(profkit("report", KV_BOUND, "--format", "json").stdout)
    assert doc["prescription"] == printed["prescription"] and doc["findings"] == printed["findings"]
    assert render(doc, "text").splitlines()[2:6] == profkit("report", KV_BOUND).stdout.splitlines()[2:6]
    d = diff(KV_BOUND, PRESCRIBED)
    row = next(m for m in d["metrics"] if m["name"] == "request_throughput")
    assert row["after"] == _bench(PRESCRIBED)["request_throughput"]
    p = predict(KV_BOUND, "--kv-cache-dtype fp8")
    assert p["schema"] == "profkit.prediction/1" and p["changes"] == {"kv_cache_dtype": "fp8"}


# ----------------------------------------------------------------------------------- one voice across formats

def test_text_findings_name_their_rule(sqlite_path) -> None:
    """`rules explain ID` needs the id: the text names it as Markdown and HTML do."""
    doc = json.loads(profkit("report", KV_BOUND, "--format", "json").stdout)
    text = profkit("report", KV_BOUND).stdout
    for f in doc["findings"]:
        assert f"] {f['title']} ({f['rule']})" in text


def test_gap_sizes_read_as_a_reader_says_them() -> None:
    trace = REPO / "samples" / "hostgap_b16.sqlite"
    for fmt in ("text", "html"):
        out = profkit("report", trace, "--format", fmt).stdout
        assert "20 us - 1 ms" in out and "lt 20us" not in out and "ge 100ms" not in out


def test_the_launch_figure_says_it_includes_queueing() -> None:
    trace = REPO / "samples" / "hostgap_b16.sqlite"
    for fmt in ("text", "md", "html"):
        out = profkit("report", trace, "--format", fmt).stdout
        assert "launch call to kernel start" in out and "launch latency" not in out


def test_the_diff_verdict_says_not_set_for_a_flag_never_given() -> None:
    line = next(x for x in profkit("diff", KV_BOUND, PRESCRIBED).stdout.splitlines() if x.startswith("AFTER: "))
    assert line.startswith("AFTER: request_throughput +97 %")
    # a flag the before side never set reads as a report's change reads it: vLLM's default, said to be one
    assert "--kv-cache-dtype auto (vLLM 0.26 default) -> fp8" in line and "(removed)" not in line


def test_durations_need_units() -> None:
    trace = REPO / "samples" / "hostgap_b16.sqlite"
    one_error_line(profkit("report", trace, "--gap-threshold", "5"), "give a unit")
    one_error_line(profkit("report", trace, "--window", "13687553:20464823"), "needs a unit")
    ok = json.loads(profkit("report", trace, "--window", "20ms:0.25s", "--format", "json").stdout)
    assert (ok["window"]["start_ns"], ok["window"]["end_ns"]) == (20_000_000, 250_000_000)
    # the trace's GPU work runs 16-303 ms: a window past it is a mistake, not an idle GPU
    one_error_line(profkit("report", trace, "--window", "1.5s:4s"), "holds none of the trace's GPU work")


def test_rules_explain_reads_as_prose() -> None:
    """A rule's computed values read as expressions over facts, not Jinja."""
    ids = [line.split()[0] for line in profkit("rules", "list").stdout.splitlines() if line.strip()]
    assert len(ids) > 10
    for rule in ids:
        out = profkit("rules", "explain", rule).stdout
        assert "{{" not in out and "{%" not in out and "f['" not in out, rule
    assert "--max-num-seqs -> config.max_num_seqs × 2" in profkit("rules", "explain", "host-gaps").stdout


def test_one_number_format_in_every_format() -> None:
    """The same figure reads the same in text, Markdown and HTML: thousands separated, the same decimals."""
    outs = {fmt: profkit("report", KV_BOUND, "--format", fmt).stdout for fmt in ("text", "md", "html")}
    bench = _bench(KV_BOUND)
    rps, p99 = f"{bench['request_throughput']:,.2f}", f"{bench['p99_ttft_ms']:,.1f}"
    assert (rps, p99) == ("9.16", "35,110.6")
    for fmt, out in outs.items():
        assert rps in out and p99 in out and "35110" not in out, fmt
    assert "output tok/s 2,346" in outs["text"]
    trace = REPO / "samples" / "hostgap_b16.sqlite"
    for fmt, shown in (("text", "kernels 9,127 ("), ("md", "· 9,127 kernels ("), ("html", "kernels<b>9,127</b>")):
        assert shown in profkit("report", trace, "--format", fmt).stdout, fmt


def test_the_diff_shows_shares_in_points_and_arrows_that_follow_the_number(tmp_path: Path) -> None:
    """KV usage 100.0% -> 78.4% is -21.6 points (not -21.6 %, which it happens to equal here, nor a relative
    change of a share); a TTFT that fell reads ▼ with its verdict, better; a GPU that differs comes first."""
    text = profkit("diff", KV_BOUND, PRESCRIBED).stdout
    row = next(x for x in text.splitlines() if x.strip().startswith("vllm.kv_cache_usage_max"))
    assert "-21.6 pts" in row
    html = profkit("diff", KV_BOUND, PRESCRIBED, "--format", "html").stdout
    assert 'mean_ttft_ms<b class="better">▼ -62.5% <small>better</small>' in html
    assert 'request_throughput<b class="better">▲ +96.6% <small>better</small>' in html
    doc = json.loads(profkit("report", PRESCRIBED, "--format", "json").stdout)
    doc["source"]["gpu"] = "NVIDIA A100-SXM4-80GB"
    other = tmp_path / "a100.json"
    other.write_text(json.dumps(doc))
    verdict = next(x for x in profkit("diff", KV_BOUND, other).stdout.splitlines() if "AFTER:" in x)
    assert verdict.startswith("NOT COMPARABLE: ") and verdict.index("NOT COMPARABLE") < verdict.index("AFTER:")


@pytest.fixture(scope="module")
def phases_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The profiled 14B runs, bf16 and FP8 (tests/data/h100_phases): vLLM names each engine step in NVTX, and
    FlashAttention's kernels differ only in their template arguments."""
    folder = tmp_path_factory.mktemp("front_door_phases")
    for name in ("bf16", "fp8"):
        with tarfile.open(REPO / "tests" / "data" / "h100_phases" / f"{name}.tar.xz") as tar:
            tar.extractall(folder, filter="data")
    return {name: folder / name for name in ("bf16", "fp8")}


def test_engine_step_annotations_are_one_row_per_kind_of_step(phases_pair: dict[str, Path]) -> None:
    folder = phases_pair["bf16"]
    out = profkit("report", str(folder), "--window", "all", "--format", "json")
    assert out.returncode == 0, out.stderr
    rows = {r["range"]: r for r in json.loads(out.stdout)["nvtx"]}
    # ground truth read here with SQL: every step annotation, split by whether it carried prompt tokens
    conn = sqlite3.connect(f"file:{folder / 'trace.sqlite'}?mode=ro", uri=True)
    texts = [t for (t,) in conn.execute("SELECT coalesce(s.value, n.text) FROM NVTX_EVENTS n "
                                        "LEFT JOIN StringIds s ON n.textId = s.id")]
    conn.close()
    steps = [t for t in texts if t and re.match(r"execute_\d+_context_\d+\(", t)]
    decode = sum(1 for t in steps if re.match(r"execute_\d+_context_0\(", t))
    assert len(steps) > 20 and 0 < decode < len(steps)
    assert rows[":vLLM engine steps, decode only (execute_*_context_0_generation_*)"]["count"] == decode
    assert rows[":vLLM engine steps with prompt tokens (execute_*_context_N_generation_*)"]["count"] == \
        len(steps) - decode
    assert not [r for r in rows if "execute_" in r and "vLLM engine steps" not in r]
    text = profkit("report", str(folder), "--window", "all").stdout
    assert "vLLM engine steps, decode only" in text and "execute_156_context_0" not in text


def test_templated_kernels_read_differently_in_the_report_and_the_diff(phases_pair: dict[str, Path]) -> None:
    out = profkit("report", str(phases_pair["bf16"]), "--format", "json")
    kernels = json.loads(out.stdout)["kernels"]
    flash = [k for k in kernels if k["short_name"] == "device_kernel"]
    assert len(flash) == 3  # FlashAttention's forward kernel at two tile sizes and its combine kernel
    assert sorted(k["label"] for k in flash) == ["device_kernel<FlashAttnFwdCombine>",
                                                 "device_kernel<FlashAttnFwdSm90 … 128>",
                                                 "device_kernel<FlashAttnFwdSm90 … 64>"]
    assert len({k["label"] for k in kernels}) == len(kernels)
    text = render(json.loads(out.stdout), "text", top=20)
    assert "device_kernel<FlashAttnFwdSm90 … 64>" in text
    assert not re.search(r"\sdevice_kernel\s*$", text, re.M)
    # the diff labels both sides together: a kernel new after FP8 and one gone read differently
    diff = profkit("diff", str(phases_pair["bf16"]), str(phases_pair["fp8"]), "--format", "json", "--top", "100")
    rows = json.loads(diff.stdout)["gpu"]["kernels"]["rows"]
    shown = [r["label"] for r in rows]
    assert len(set(shown)) == len(shown)
    clipped = [r["name"][:80] for r in rows]
    assert len(set(clipped)) < len(clipped)  # the names clipped as before would have read the same
    md = render(json.loads(diff.stdout), "md", top=100)
    kernel_cells = [line.split(" | ")[0].lstrip("| ") for line in md.splitlines()
                    if line.startswith("| ") and (" | new | " in line or " | vanished | " in line)]
    assert len(kernel_cells) == len(set(kernel_cells)) > 10
