"""Hostile text in profkit's outputs (issue 29), one regression test per class, each with exact outcomes:

1. a rule file whose template or condition asks for a format width in the billions or a million-word string is
   one error line naming the file, line and part (nothing is built first: the run takes no memory to find out);
2. Markdown: link syntax, `|`, fences and escapes from kernel names, NVTX text, rule text, flag values and labels
   leave every table with its cells, make no link and no raw HTML, and each command of a code block stays one
   line, exactly the command;
3. printed commands (`capture --dry-run`, `tune --dry-run`) are one line each, free of control characters, and a
   shell reads each back to the exact argv; `rules explain` prints no control character from a rule file.

The helpers (Markdown structure, a shell's reading of a command line) serve tests/test_fuzz.py too."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from profkit.capture.plan import CaptureOptions, Plan, Step, commands_from_cli, plan
from tests.cli import one_error_line, profkit

# Every trick a value may try on Markdown: a cell break (plain and after a backslash), an inline link, an autolink,
# a reference definition, a fence, emphasis, raw HTML, an ESC sequence and a bidi override.
HOSTILE = "k|a\\|b](http://x) [l](http://e) <http://y> [r]: http://z ``` *e* _u_ <i>\x1b[31m\u202e"


# --- helpers --------------------------------------------------------------------------------------------------
def _unescaped(line: str) -> list[tuple[int, str]]:
    """(position, character) of each character of a Markdown line not escaped by a backslash."""
    out, escaped = [], False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        else:
            out.append((i, ch))
    return out


def md_problems(md: str) -> list[str]:
    """What is wrong with a rendered Markdown document: a table row with more or fewer cells than its header, an
    unescaped `](`, `][` or `]:` (a link), a raw `<` (HTML or an autolink), a character that is not printable, a
    code block line opening with a fence. Code blocks are checked for fences and characters only (in them text is
    inert)."""
    problems: list[str] = []
    fence, header = False, None
    for n, line in enumerate(md.split("\n"), 1):
        if not line.isprintable():
            problems.append(f"line {n}: a character that is not printable: {line!r}")
        if line.startswith("```"):
            fence, header = not fence, None
            continue
        if fence:
            continue
        plain = _unescaped(line)
        if line.startswith("|"):
            cells = sum(ch == "|" for _, ch in plain)
            if header is None:
                header = cells
            elif cells != header:
                problems.append(f"line {n}: {cells - 1} cells under a header of {header - 1}: {line!r}")
        else:
            header = None
        for i, ch in plain:
            if ch == "]" and line[i + 1:i + 2] in ("(", "[", ":"):
                problems.append(f"line {n}: a link: {line!r}")
            if ch == "<":
                problems.append(f"line {n}: raw HTML or an autolink: {line!r}")
    if fence:
        problems.append("a code block left open (a value closed or opened a fence)")
    return problems


def code_blocks(md: str) -> list[list[str]]:
    """The lines of each fenced code block."""
    blocks, current = [], None
    for line in md.split("\n"):
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def shell_words(line: str) -> list[str]:
    """The argv a shell (bash, in a UTF-8 locale) reads from a command line: what a person pasting it runs."""
    bash = shutil.which("bash")
    assert bash, "bash is needed to read printed command lines back"
    r = subprocess.run([bash, "-c", "printf '%s\\0' " + line], capture_output=True, check=True,
                       env={**os.environ, "LC_ALL": "C.UTF-8"})
    return [w.decode("utf-8", "surrogateescape") for w in r.stdout.split(b"\0")[:-1]]


def plan_steps(p: Plan) -> list[Step]:
    """The steps of a plan in the order `Plan.commands()` prints them."""
    steps = [s for run in p.runs for s in run]
    steps += [s for s in (p.server, p.bench, p.gpu_metrics_export(p.out) if p.bench else None) if s]
    return steps + p.exports


# --- 1. rule templates and conditions are bounded before anything is built ------------------------------------
BASE_RULE = {"id": "evil", "title": "t", "severity": "info", "when": "gpu.utilization < 2", "summary": "s"}
WIDTH = "format width 9999999999"
NOT_TEXT = "bad template: {} is not allowed (a rule template is text with {{{{ values }}}} and {{% if %}})"
REPEAT = "repetition too large in a rule (more than 10000 characters or items)"
BOUNDED_RULES = [  # (what the rule file says, the error line after "profkit: error: FILE:1: ")
    ({"summary": "{{ '%9999999999d' % 1 }}"}, f"summary: {WIDTH} in a %-format (at most 1000)"),
    ({"summary": "{{ '%(n(x))9999999999d' % {'n(x)': 1} }}"}, f"summary: {WIDTH} in a %-format (at most 1000)"),
    ({"summary": "{{ '%9999999999d' | format(1) }}"}, f"summary: {WIDTH} in a %-format (at most 1000)"),
    ({"summary": "{{ 'x' | center(9999999999) }}"}, f"summary: {WIDTH} in center() (at most 1000)"),
    ({"summary": "{{ f['gpu.utilization'] | num(9999999999) }}"}, f"summary: {WIDTH} in num() (at most 1000)"),
    ({"summary": "{{ '{:>9999999999}'.format(1) }}"}, "summary: " + NOT_TEXT.format("a call")),
    ({"summary": "{{ (['word'] * 1000000) | join(' ') }}"}, f"summary: {REPEAT}"),
    ({"summary": "{{ lipsum(1000000) }}"}, "summary: " + NOT_TEXT.format("a call")),
    ({"summary": "{% for w in range(1000000) %}word {% endfor %}"}, "summary: " + NOT_TEXT.format("`{% for %}`")),
    ({"summary": "{{ ('word ' * 2000) ~ ('word ' * 2000) ~ ('word ' * 2000) }}"},
     "summary: a `~` concatenation of more than 10000 characters or items"),
    ({"summary": "{{ 'word ' * 1900 }}" * 3}, "summary: template output of more than 20000 characters"),
    ({"when": "'%9999999999d' % gpu.utilization != ''"}, f"when: {WIDTH} in a %-format (at most 1000)"),
    ({"when": "f'{gpu.utilization:>9999999999}' != ''"}, f"when: {WIDTH} in an f-string (at most 1000)"),
    ({"when": "'word ' * 1000000 != ''"}, f"when: {REPEAT}"),
    ({"changes": [{"flag": "--max-num-seqs", "to": 8, "why": "{{ '%.9999999999f' % 1 }}"}]},
     f"why: {WIDTH} in a %-format (at most 1000)"),
    ({"changes": [{"flag": "--max-num-seqs", "to": "{{ '%9999999999d' % 8 }}", "why": "w"}]},
     f"to: {WIDTH} in a %-format (at most 1000)"),
]


@pytest.mark.parametrize(("rule", "error"), BOUNDED_RULES, ids=[e[:40] + str(i) for i, (_, e) in
                                                                 enumerate(BOUNDED_RULES)])
def test_a_rule_that_asks_for_a_huge_width_or_string_is_one_error_line(tmp_path: Path, sqlite_path, rule: dict,
                                                                        error: str) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "evil.yaml").write_text(json.dumps({**BASE_RULE, **rule}))  # one line of JSON (YAML): line 1
    # a child process with a time limit: a bound that regressed would take gigabytes, not this test's memory
    r = profkit("report", sqlite_path("eager_b1"), "--vllm-args", "--max-num-seqs 4", "--rules", rules, timeout=60)
    assert one_error_line(r) == f"profkit: error: {rules / 'evil.yaml'}:1: {error}"
    assert r.stdout == ""


# --- 2. Markdown: every table keeps its cells, no link, each command one line ----------------------------------
def test_markdown_keeps_its_tables_and_makes_no_link(tmp_path: Path, sqlite_path, h100_tune: Path) -> None:
    trace = tmp_path / "t.sqlite"
    shutil.copyfile(sqlite_path("eager_b1"), trace)
    with sqlite3.connect(trace) as conn:  # every kernel name, NVTX text and API name
        conn.execute("UPDATE StringIds SET value = value || ?", (HOSTILE,))
    conn.close()
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(json.dumps({
        **BASE_RULE, "title": HOSTILE, "summary": "{{ f['gpu.utilization'] | pct }} " + HOSTILE,
        "changes": [{"flag": "--max-num-seqs", "to": 8, "why": HOSTILE}]}))
    args = f"--max-num-seqs 4 --served-model-name {shlex.quote(HOSTILE + chr(10) + '```')}"
    db = tmp_path / "runs.db"
    common = ["--rules", rules, "--vllm-args", args]
    r = profkit("report", trace, *common, "--format", "md", "--save", db, "--label", HOSTILE)
    assert r.returncode == 0, r.stderr
    assert md_problems(r.stdout) == []
    doc = json.loads(profkit("report", trace, *common, "--format", "json").stdout)
    assert any(f["title"] == HOSTILE for f in doc["findings"])  # the hostile rule's text is in the report
    diff_block, command_block = code_blocks(r.stdout)
    argv = doc["command"]["suggested_argv"]
    assert argv[0][-2:] == ["--served-model-name", HOSTILE + "\n```"]
    # each command one line, exactly the command: a shell reads it back to the argv
    assert [shell_words(line) for line in command_block] == argv
    assert [shell_words(line[2:]) for line in diff_block] == [doc["command"]["original_argv"][0], argv[0]]

    for md in (profkit("diff", trace, trace, "--format", "md").stdout,
               profkit("history", db, "--format", "md").stdout):
        assert md_problems(md) == []
    tune = json.loads((h100_tune / "s2" / "tune.json").read_text())
    tune["objective"]["name"] = tune["steps"][1]["why"] = HOSTILE
    tune["best"]["commands"][0] += " --served-model-name " + shlex.quote(HOSTILE + "\n```")
    from profkit.render import render

    md = render(tune, "md")
    assert md_problems(md) == []
    assert [len(b) for b in code_blocks(md)] == [len(tune["best"]["commands"])]  # one line a command


# --- 3. printed commands: one line each, no control character, read back to the exact argv --------------------
def test_dry_run_prints_each_command_on_one_line_exactly(tmp_path: Path) -> None:
    out = tmp_path / "a\nb 'c' $(false)"  # a newline, quotes, a command substitution
    model = "m\x1bc\x1b]0;title\x07\u202e\udcff"  # a terminal reset, an OSC title, a bidi override, a non-UTF-8 byte
    r = profkit("capture", "--dry-run", "--out", out, "serve", "--model", model, "--server-args", "--max-num-seqs 4")
    assert r.returncode == 0, r.stderr
    expected = plan(CaptureOptions(out=out, user=commands_from_cli(["serve"], model, "--max-num-seqs 4", "", 8000)))
    lines = r.stdout.splitlines()
    assert [shell_words(line) for line in lines] == [s.argv for s in plan_steps(expected)]
    assert all(line.isprintable() for line in lines)
    # words a shell reads without escapes stay as shlex.quote writes them: shlex reads the line back too
    printable = tmp_path / "o p'q\"$x;`y`|z"
    r = profkit("capture", "--dry-run", "--out", printable, "--", "vllm", "bench", "throughput", "--model", "a b")
    expected = plan(CaptureOptions(out=printable, user=commands_from_cli(
        ["vllm", "bench", "throughput", "--model", "a b"], None, "", "", 8000)))
    assert [shlex.split(line, comments=True) for line in r.stdout.splitlines()] == \
        [s.argv for s in plan_steps(expected)]

    r = profkit("tune", "--dry-run", "--out", out, "--", "vllm", "bench", "throughput", "--model", model)
    assert r.returncode == 0, r.stderr
    assert all(line.isprintable() for line in r.stdout.splitlines())
    assert "--model $'m\\x1b'$'c\\x1b]0;title\\x07\\u202e\\xff'" in r.stdout


def test_rules_explain_prints_no_control_character(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    evil = "\x1b]0;pwned\x07\x1bc\u202e\x9b2J"

    def explain(text: str) -> list[str]:
        (rules / "r.yaml").write_text(json.dumps({
            **BASE_RULE, "title": "T" + text, "description": "one" + text + "\ntwo",
            "evidence": [{"fact": "gpu.utilization", "threshold": "< 2", "source": "S" + text}],
            "changes": [{"flag": "--max-num-seqs", "to": "8" + text, "why": "W" + text}]}))
        r = profkit("rules", "explain", "evil", "--rules", rules)
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()

    clean, hostile = explain(""), explain(evil)
    assert all(line.isprintable() for line in hostile)
    assert len(hostile) == len(clean)  # no value added a line
    assert hostile[0] == "evil (info): T]0;pwnedc2J"
    listed = profkit("rules", "list", "--rules", rules).stdout
    assert all(line.isprintable() for line in listed.splitlines())
    assert "evil                     info      T]0;pwnedc2J" in listed


def test_a_flag_in_predicts_markdown_is_inline_code() -> None:
    """`predict --format md` printed the changes as they were written, outside code: HTML and a table's pipe there
    were Markdown's to read. Inline code takes them literally: fenced by more backticks than the text holds, the
    pipes escaped (a table cell ends at one, even inside code)."""
    from profkit.render.markdown import code_span

    assert code_span("--max-num-seqs 128") == "`--max-num-seqs 128`"
    assert code_span("fp8<script>|x|") == "`fp8<script>\\|x\\|`"
    assert code_span("a``b`") == "``` a``b` ```"
    assert code_span("x\x1b[31my\nz") == "`x[31my z`"
    r = profkit("predict", "samples/vllm_14b_kv_bound", "--format", "md", "--", "--max-num-seqs", "128")
    assert "· changes: `--max-num-seqs 128`" in r.stdout, r.stdout
