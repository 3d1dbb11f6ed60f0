"""Every example runs: each `profkit ...` command line in the README, in docs/ and in the commands' --help texts is
run through the CLI on the bundled samples, with the stand-in `vllm` and `nsys` (tests/fakes) for capture and a
stand-in server replaying a real vLLM server's /metrics for attach. Where the docs show the output after a `$
profkit ...` line, those lines must be in what the command prints. A synopsis (placeholders: TRACE, [--opt],
a|b, ...) is not run, but every option it names must be one its command takes. Nothing shown can go stale."""

from __future__ import annotations

import functools
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from profkit.cli import cli
from tests.cli import profkit
from tests.test_attach import StandIn
from tests.test_capture import FAKES
from tests.test_rules import REAL_SERVE

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md",
        *sorted(p for p in (REPO / "docs").glob("*.md") if p.name not in ("commands.md", "index.md"))]
# docs/commands.md is the --help texts and docs/index.md the README (scripts/make_docs.py writes both): their
# examples are read where they are written.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]+\b|\.\.\.|\[|\||<[a-z]")
SERVER = re.compile(r"http://(HOST|127\.0\.0\.1|localhost):(8000|PORT)")  # an example's server: the stand-in's


@dataclass(frozen=True)
class Example:
    where: str
    command: str
    shown: tuple[str, ...] = ()  # the output the docs show after it

    @property
    def words(self) -> list[str]:
        return shlex.split(SERVER.sub("http://STANDIN", self.command))[1:]

    @property
    def synopsis(self) -> bool:
        return bool(PLACEHOLDER.search(SERVER.sub("", self.command).replace("STANDIN", "")))


def _blocks(text: str, where: str) -> list[Example]:
    """Command lines of fenced code blocks (continuations joined), with the output shown after a `$ ` one; and
    inline `profkit ...` spans that give a command its arguments (a bare `profkit report` is a name, not an
    example)."""
    out = []
    for body in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines = body.split("\n")
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            prompt = line.startswith("$ ")
            line = line.removeprefix("$ ")
            if line.startswith("profkit "):
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1].rstrip() + " " + lines[i].strip()
                shown = []
                while prompt and i + 1 < len(lines) and lines[i + 1].strip() and \
                        not lines[i + 1].lstrip().startswith(("$ ", "profkit ")):
                    i += 1
                    shown.append(lines[i])
                out.append(Example(where, line, tuple(shown)))
            i += 1
    for span in re.findall(r"`(profkit [^`]+)`", text):
        words = span.split()
        group = words[1] in cli.commands and isinstance(cli.commands[words[1]], click.Group)
        if len(words) > (3 if group else 2) and not all(w.startswith("-") for w in words[2:]):
            out.append(Example(where, span))
    return out


def _help_examples() -> list[Example]:
    """The lines of each command's --help that show a command (its examples and usage lines)."""
    out = []
    commands = [(name, cmd) for name, cmd in cli.commands.items()]
    commands += [(f"{name} {sub}", c) for name, g in cli.commands.items() if isinstance(g, click.Group)
                 for sub, c in g.commands.items()]
    for name, cmd in commands:
        with click.Context(cmd, info_name=f"profkit {name}") as ctx:
            text = cmd.get_help(ctx)
        out += [Example(f"profkit {name} --help", line.strip()) for line in text.splitlines()
                if line.strip().startswith("profkit ")]
    return out


EXAMPLES = [e for doc in DOCS for e in _blocks(doc.read_text(), doc.relative_to(REPO).as_posix())] + _help_examples()
RUN = list(dict.fromkeys(e for e in EXAMPLES if not e.synopsis))
SYNOPSES = list(dict.fromkeys(e for e in EXAMPLES if e.synopsis))


def test_the_docs_have_examples_to_run() -> None:
    where = {e.where for e in RUN}
    assert {"README.md", "docs/contracts.md", "profkit predict --help", "profkit attach --help"} <= where
    assert any(e.shown for e in RUN if e.where == "README.md")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh folder with the bundled samples beside it (examples name samples/...) and a history database holding
    one run (examples name runs.db): where every example runs."""
    (tmp_path / "samples").symlink_to(REPO / "samples")
    monkeypatch.chdir(tmp_path)
    assert profkit("report", "samples/vllm_14b_kv_bound", "--save", "runs.db").returncode == 0
    return tmp_path


@pytest.mark.parametrize("example", RUN, ids=[f"{e.where}: {e.command[:60]}" for e in RUN])
def test_every_example_runs(example: Example, workdir: Path, sqlite_path, monkeypatch: pytest.MonkeyPatch) -> None:
    words = example.words
    if words[0] in ("capture", "tune"):  # the stand-in vLLM and nsys, on PATH, in a child process
        env = {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}",
               "FAKE_NSYS_SQLITE": str(sqlite_path("hostgap_b16")), "FAKE_METRICS_DIR": str(REAL_SERVE),
               "FAKE_VLLM_PERF": str(workdir)}
        if "--port" not in words and "serve" in words:
            from tests.test_capture import free_port

            words = [*words, "--port", str(free_port())]
        r = profkit(*words, env=env, timeout=600)
    elif words[0] == "attach":  # a real vLLM server's recorded /metrics, watched on a fake clock
        from profkit.capture import attach as module
        from tests.test_attach import FakeClock

        fake = FakeClock()
        monkeypatch.setattr(module, "attach", functools.partial(module.attach, clock=fake.clock, sleep=fake.sleep))
        texts = [(REAL_SERVE / f"metrics-{n}.txt").read_text() for n in ("before", "after")]
        with StandIn(texts) as server:
            r = profkit(*[w.replace("http://STANDIN", server.url) for w in words])
    else:
        r = profkit(*words)
    assert r.returncode == 0, f"{example.where}: {example.command}\n{r.stderr}"
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    out = r.stdout
    for line in example.shown:
        want = line.strip()
        if want == "...":
            continue
        if want.endswith("..."):  # the docs cut a long line: its start must be printed
            assert any(got.strip().startswith(want[:-3].rstrip()) for got in out.splitlines()), (example.where, want)
        else:
            assert any(got.strip() == want for got in out.splitlines()), (example.where, want, out)


@pytest.mark.parametrize("example", SYNOPSES, ids=[f"{e.where}: {e.command[:60]}" for e in SYNOPSES])
def test_every_option_a_synopsis_names_exists(example: Example) -> None:
    words = example.command.split()[1:]
    cmd: click.Command = cli
    while isinstance(cmd, click.Group) and words and words[0] in cmd.commands:
        cmd = cmd.commands[words.pop(0)]
    assert not isinstance(cmd, click.Group), example
    if "--" in words:  # vLLM's own flags follow a bare --
        words = words[:words.index("--")]
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    named = {m.group(1) for w in words for m in [re.match(r"\[?(--?[a-z][a-z0-9-]*)", w)] if m}
    assert named <= known, f"{example.where}: {example.command}: {sorted(named - known)} unknown"
