"""vLLM's command line as data: which options each subcommand takes, and whether a command parses.

A suggested command must run, so every one is checked: with vLLM's own argument parser when vLLM
is importable (the GPU box), otherwise against the option list recorded from vLLM 0.26.0's parsers
(`vllm_options/0.26.0.json`, written by `dump_options()` on the GPU box; the raw `--help` texts it
came from are kept in tests/data/vllm_0.26.0_help/).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

RECORDED_VERSION = "0.26.0"
_RECORDED = Path(__file__).resolve().parent / "vllm_options" / f"{RECORDED_VERSION}.json"
# The subcommands profkit runs and suggests.
SUBCOMMANDS = (("serve",), ("bench", "throughput"), ("bench", "latency"), ("bench", "serve"))


@dataclass
class Option:
    """One option string of a subcommand (`--max-num-seqs`, `--no-enforce-eager`)."""

    dest: str
    takes_value: bool
    many: bool = False  # nargs '+' / '*': takes words up to the next option
    choices: list[Any] | None = None
    default: Any = None
    negation_of: str | None = None  # `--no-x` -> `--x` (argparse.BooleanOptionalAction)


@dataclass
class Spec:
    """The options of one subcommand (`serve`, `bench throughput`, ...)."""

    options: dict[str, Option]
    positionals: int = 0  # at most this many bare words (serve: the model tag)

    def find(self, word: str) -> tuple[str, Option] | None:
        """`--max_num_seqs=4` -> ('--max-num-seqs', Option); vLLM accepts underscores in names."""
        name = normalize_flag(word.split("=", 1)[0])
        opt = self.options.get(name)
        return (name, opt) if opt else None


@dataclass
class CheckResult:
    ok: bool
    by: str  # "vLLM 0.26.0 parser" | "recorded vLLM 0.26.0 options" | "not checked: ..."
    problems: list[str] = field(default_factory=list)


def normalize_flag(name: str) -> str:
    """`--max_num_seqs` -> `--max-num-seqs` (vLLM's FlexibleArgumentParser treats them alike)."""
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


@lru_cache(maxsize=1)
def recorded_specs() -> dict[tuple[str, ...], Spec]:
    """The option lists of the subcommands (keys: ('serve',), ('bench', 'throughput'), ...): read from
    vLLM's own parsers where vLLM is importable, else the list recorded from vLLM 0.26.0."""
    data = None
    if vllm_importable():
        try:
            data = dump_options()
        except Exception:  # noqa: BLE001 - a broken vLLM install: the recorded list still serves
            data = None
    if data is None:
        if not _RECORDED.is_file():  # an installation without its option list: nothing can be checked
            return {}
        data = json.loads(_RECORDED.read_text(encoding="utf-8"))
    out = {}
    for key, spec in data["commands"].items():
        out[tuple(key.split())] = Spec(options={k: Option(**v) for k, v in spec["options"].items()},
                                       positionals=spec.get("positionals", 0))
    return out


def spec_for(subcommand: tuple[str, ...] | list[str]) -> Spec | None:
    return recorded_specs().get(tuple(subcommand))


def check_command(argv: list[str], subcommand_at: int) -> CheckResult:
    """Does `argv` parse? `subcommand_at` is the index of the subcommand (`serve`, `bench`) in argv."""
    if vllm_importable():
        try:
            return check_with_vllm(argv[subcommand_at:])
        except ImportError as exc:  # vLLM present but broken here: fall back to the recorded list
            fallback = check_recorded(argv[subcommand_at:])
            fallback.by += f" (vLLM not importable: {exc})"
            return fallback
    return check_recorded(argv[subcommand_at:])


def check_recorded(words: list[str]) -> CheckResult:
    """Check `serve ...` / `bench throughput ...` against the recorded option list."""
    by = f"recorded vLLM {RECORDED_VERSION} options"
    sub = tuple(words[:2]) if words[:1] == ["bench"] else tuple(words[:1])
    spec = spec_for(sub)
    if spec is None:
        return CheckResult(False, by, [f"unknown subcommand {' '.join(sub)!r}"])
    problems: list[str] = []
    positionals = 0
    rest = words[len(sub):]
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if not word.startswith("-") or word == "-":
            positionals += 1
            if positionals > spec.positionals:
                problems.append(f"unexpected argument {word!r}")
            continue
        found = spec.find(word)
        if not found:
            problems.append(f"unknown option {word.split('=', 1)[0]!r} for `vllm {' '.join(sub)}`")
            continue
        name, opt = found
        inline = word.split("=", 1)[1] if "=" in word else None
        if not opt.takes_value:
            if inline is not None:
                problems.append(f"{name} takes no value (got {inline!r})")
            continue
        values = [inline] if inline is not None else []
        while i < len(rest) and (not values or opt.many) and not _looks_like_option(rest[i]):
            values.append(rest[i])
            i += 1
        if not values:
            problems.append(f"{name} needs a value")
        elif opt.choices is not None:
            bad = [v for v in values if v not in [str(c) for c in opt.choices]]
            if bad:
                problems.append(f"{name} {bad[0]!r}: not one of {', '.join(map(str, opt.choices))}")
    return CheckResult(not problems, by, problems)


def _looks_like_option(word: str) -> bool:
    # argparse treats '-1' as a value (negative number), '--x' and '-O' as options
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit()


def _vllm_parser(words: list[str]):  # pragma: no cover - needs vLLM (GPU box)
    """vLLM's own top-level parser, built as `vllm.entrypoints.cli.main.main` builds it."""
    import vllm.entrypoints.cli.benchmark.main
    import vllm.entrypoints.cli.serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    saved = sys.argv
    sys.argv = ["vllm", *words]  # the bench subparsers are only built when argv[1] is `bench`
    try:
        parser = FlexibleArgumentParser(prog="vllm")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        cmds = {}
        for module in (vllm.entrypoints.cli.serve, vllm.entrypoints.cli.benchmark.main):
            for cmd in module.cmd_init():
                cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
                cmds[cmd.name] = cmd
    finally:
        sys.argv = saved
    return parser, cmds


def check_with_vllm(words: list[str]) -> CheckResult:  # pragma: no cover - needs vLLM (GPU box)
    import vllm

    by = f"vLLM {vllm.__version__} parser"
    parser, cmds = _vllm_parser(words)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(words)
            if args.subparser in cmds:
                cmds[args.subparser].validate(args)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return CheckResult(False, by, [lines[-1] if lines else "rejected by vLLM's parser"])
    except Exception as exc:  # noqa: BLE001 - vLLM's validate raises various types for bad values
        return CheckResult(False, by, [f"{type(exc).__name__}: {exc}"])
    return CheckResult(True, by)


def dump_options() -> dict[str, Any]:  # pragma: no cover - run on the GPU box to record the option list
    """Every option string of the subcommands profkit uses, from vLLM's own parsers."""
    import argparse

    import vllm

    out: dict[str, Any] = {"vllm_version": vllm.__version__, "commands": {}}
    for sub in SUBCOMMANDS:
        parser, _ = _vllm_parser(list(sub))
        node = parser
        for word in sub:
            action = next(a for a in node._actions if isinstance(a, argparse._SubParsersAction))
            node = action.choices[word]
        options: dict[str, Any] = {}
        positionals = 0
        for action in node._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if not action.option_strings:
                positionals += 1
                continue
            takes_value = action.nargs != 0
            many = action.nargs in ("+", "*", argparse.REMAINDER)
            default = action.default if isinstance(action.default, (str, int, float, bool, type(None))) else None
            choices = [c for c in action.choices] if action.choices is not None else None
            if choices is not None and not all(isinstance(c, (str, int, float)) for c in choices):
                choices = [str(c) for c in choices]
            positive = [s for s in action.option_strings if not s.startswith("--no-")]
            for s in action.option_strings:
                negation = isinstance(action, argparse.BooleanOptionalAction) and s.startswith("--no-")
                options[s] = {"dest": action.dest, "takes_value": takes_value, "many": many, "choices": choices,
                              "default": default, "negation_of": positive[0] if negation and positive else None}
        out["commands"][" ".join(sub)] = {"positionals": positionals, "options": options}
    return out


if __name__ == "__main__":  # pragma: no cover - `python -m profkit.diagnose.vllm_cli > 0.26.0.json`
    json.dump(dump_options(), sys.stdout, indent=1, sort_keys=True)
