"""vLLM's command line as data: the ONE parser and editor of a `vllm ...` command.

`VllmCommand` parses a `vllm serve|bench ...` argv (or a bare flag list) once, knowing each subcommand's
options from vLLM's own parsers where vLLM is importable (the GPU box) and otherwise from the option list
recorded from vLLM 0.26.0 (`vllm_options/0.26.0.json`, written by `dump_options()`; the raw `--help` texts
are kept in tests/data/vllm_0.26.0_help/). It answers `.value(flag)`, `.flags()`, `.model`; edits with
`.apply(flag, to)` (the user's own spelling of a setting is edited in place, an alias included) and
`.without(flag, ...)`; and checks that a command parses. It also holds what vLLM does when a flag is not
given (`VLLM_DEFAULTS`, `default_max_num_seqs`) and where each setting's value came from
(`effective_config`). Capture, tune, report, diff and the rules all go through it, with one coercer
(`coerce`) for values given as text.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

RECORDED_VERSION = "0.26.0"
_RECORDED = Path(__file__).resolve().parent / "vllm_options" / f"{RECORDED_VERSION}.json"
# The subcommands profkit runs and suggests.
SUBCOMMANDS = (("serve",), ("bench", "throughput"), ("bench", "latency"), ("bench", "serve"))
VLLM_MODULE = "vllm.entrypoints.cli.main"

# --- what vLLM does when a flag is not given ---------------------------------------------------------------

# vLLM 0.26 defaults for the flags rules talk about, used (and labelled as defaults) when the run's own flags
# are unknown. gpu_memory_utilization and max_num_batched_tokens are what vLLM 0.26 logs for a run that did not
# set them (the fixture's log: "Desired GPU memory utilization is (0.92, ...)", "Chunked prefill is enabled with
# max_num_batched_tokens=16384" for the offline LLM entry point). The parser's default is often None ("decided
# later": prefix caching, async scheduling); this table says what it becomes.
VLLM_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "max_num_seqs": None,  # by GPU: default_max_num_seqs()
    "max_num_batched_tokens": None,  # depends on the entry point (8192 serve / 16384 offline on H100)
    "gpu_memory_utilization": 0.92,
    "max_model_len": None,  # the model's own context length
    "enforce_eager": False,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "kv_cache_dtype": "auto",
    "kv_cache_memory_bytes": None,
    "cpu_offload_gb": 0,
    "async_scheduling": True,
    "api_server_count": 1,  # data_parallel_size when not given
    "stream_interval": 1,
}
# vLLM 0.26 sizes --max-num-seqs by the GPU (EngineArgs._set_default_max_num_seqs_and_batched_tokens_args):
# 1024 on GPUs with 70 GiB or more that are not A100s (H100, H200, MI300x, ...), 256 elsewhere.
BIG_GPU_MAX_NUM_SEQS, SMALL_GPU_MAX_NUM_SEQS = 1024, 256
_BIG_GPUS = ("h100", "h200", "gh200", "b200", "gb200", "mi300", "mi325", "mi355")


def default_max_num_seqs(gpu: str | None) -> int | None:
    """vLLM 0.26's --max-num-seqs when not given, for this GPU (None when the GPU is not known)."""
    if not gpu:
        return None
    name = gpu.lower()
    if "a100" in name:
        return SMALL_GPU_MAX_NUM_SEQS
    size = re.search(r"(\d+)\s*gb", name)
    if any(g in name for g in _BIG_GPUS) or (size and int(size.group(1)) >= 75):
        return BIG_GPU_MAX_NUM_SEQS
    return SMALL_GPU_MAX_NUM_SEQS


def coerce(value: Any) -> Any:
    """A value given as text, typed as vLLM reads it: 'false' -> False, '600000000' -> 600000000, 'none' -> None,
    'fp8' stays text. Values that are not text are returned as they are."""
    if not isinstance(value, str):
        return value
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(value.strip())
        except ValueError:
            pass
    return value


# --- the option lists ------------------------------------------------------------------------------------------

@dataclass
class Option:
    """One option string of a subcommand (`--max-num-seqs`, `--no-enforce-eager`, `-tp`)."""

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

    @cached_property
    def long_flags(self) -> dict[str, str]:
        """dest -> the option's `--long-name` (not a negation): the spelling profkit writes."""
        out: dict[str, str] = {}
        for name, opt in self.options.items():
            if name.startswith("--") and not opt.negation_of:
                out.setdefault(opt.dest, name)
        return out


@dataclass
class CheckResult:
    ok: bool
    by: str  # "vLLM 0.26.0 parser" | "recorded vLLM 0.26.0 options" | ...
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


def engine_spec() -> Spec | None:
    """A bare flag list is read as engine flags: what `vllm serve` and `bench throughput` share."""
    return spec_for(("serve",))


def flag_for(dest: str) -> str:
    """The command-line spelling of a setting (`max_num_seqs` -> `--max-num-seqs`)."""
    spec = engine_spec()
    return (spec.long_flags.get(dest) if spec else None) or "--" + dest.replace("_", "-")


def dest_of(flag: str) -> str:
    """The setting a flag sets (`--max-num-seqs`, `--max_num_seqs`, `-tp` -> its dest)."""
    spec = engine_spec()
    found = spec.find(flag) if spec else None
    if found:
        opt = found[1]
        return opt.dest
    return normalize_flag(flag).lstrip("-").replace("-", "_")


def _looks_like_option(word: str) -> bool:
    # argparse treats '-1' as a value (negative number), '--x' and '-O' as options
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit()


# --- one command -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Arg:
    """One option as written: where it stands in `args`, how many words it takes, what it sets."""

    at: int
    width: int
    name: str  # as written, before any '=' (`--max_num_seqs`, `-tp`)
    dest: str
    values: tuple[str, ...]  # the words given as its value (empty for a switch)
    negated: bool = False  # `--no-x`
    known: bool = True  # in the subcommand's option list

    @property
    def value(self) -> Any:
        """The value vLLM would read: a switch True (False when negated), else the typed text."""
        if not self.values:
            return not self.negated
        return coerce(self.values[0]) if len(self.values) == 1 else [coerce(v) for v in self.values]


@dataclass(frozen=True)
class VllmCommand:
    """One vLLM command: `program` (`vllm`, or python -m ...), `subcommand`, then `args` in the user's order.

    A command known only as flags (`--vllm-args "--max-num-seqs 64"`) has neither program nor subcommand."""

    program: list[str]
    subcommand: list[str]
    args: list[str]

    # ways in -----------------------------------------------------------------------------------------------
    @classmethod
    def find_in(cls, argv: list[str]) -> VllmCommand | None:
        """The vLLM command inside a recorded command line (after `nsys profile ... -o X`, say)."""
        for i, word in enumerate(argv):
            rest = argv[i + 1:]
            if os.path.basename(word) == "vllm":
                program, after = argv[i:i + 1], rest
            elif word == "-m" and rest[:1] == [VLLM_MODULE] and i > 0:
                program, after = argv[i - 1:i + 2], rest[1:]
            else:
                continue
            if after[:1] == ["serve"]:
                return cls(program, ["serve"], after[1:])
            if after[:1] == ["bench"] and len(after) > 1:
                return cls(program, after[:2], after[2:])
        return None

    @classmethod
    def parse(cls, text: str) -> VllmCommand:
        """A full vLLM command (`vllm serve M --x 1`) or a bare flag list (`--max-num-seqs 64`)."""
        words = shlex.split(text, comments=True)
        found = cls.find_in(words)
        return found if found else cls([], [], words)

    # what it is ---------------------------------------------------------------------------------------------
    @property
    def role(self) -> str:
        """'server' (vllm serve), 'client' (vllm bench serve), 'offline' (bench throughput|latency), 'flags'."""
        if self.subcommand == ["serve"]:
            return "server"
        if self.subcommand == ["bench", "serve"]:
            return "client"
        return "offline" if self.subcommand[:1] == ["bench"] else "flags"

    def spec(self) -> Spec | None:
        return spec_for(self.subcommand or ["serve"])

    def argv(self) -> list[str]:
        return [*self.program, *self.subcommand, *self.args]

    def shell(self) -> str:
        return shlex.join(self.argv())

    @cached_property
    def parsed(self) -> tuple[list[Arg], list[int]]:
        """The options as written, and the positions of bare words (the model tag of `vllm serve`)."""
        spec = self.spec()
        items: list[Arg] = []
        bare: list[int] = []
        args = self.args
        i = 0
        while i < len(args):
            word = args[i]
            if not _looks_like_option(word):
                bare.append(i)
                i += 1
                continue
            name, eq, inline = word.partition("=")
            found = spec.find(word) if spec else None
            if found:
                opt = found[1]
                negated = bool(opt.negation_of)
                takes = opt.takes_value
                many = opt.many
                dest = opt.dest
            else:  # not in the option list: a value follows unless the next word is an option
                key = normalize_flag(name).lstrip("-").replace("-", "_")
                takes, many, negated, dest = True, False, False, key
                if not eq and (i + 1 >= len(args) or args[i + 1].startswith("--")):
                    takes = False
            if eq:
                values: tuple[str, ...] = (inline,) if takes else ()
                width = 1
            elif takes:
                j = i + 1
                while j < len(args) and (j == i + 1 or many) and not (found and _looks_like_option(args[j])) \
                        and not (not found and args[j].startswith("--")):
                    j += 1
                values, width = tuple(args[i + 1:j]), j - i
            else:
                values, width = (), 1
            items.append(Arg(i, width, name, dest, values, negated, bool(found)))
            i += width
        return items, bare

    def occurrences(self, flag: str) -> list[Arg]:
        """Every place the setting `flag` sets is given, whatever the spelling (alias, negation, underscores)."""
        dest = self._dest(flag)
        return [a for a in self.parsed[0] if a.dest == dest]

    def _dest(self, flag: str) -> str:
        spec = self.spec()
        found = spec.find(flag) if spec else None
        return found[1].dest if found else normalize_flag(flag).lstrip("-").replace("-", "_")

    def value(self, flag: str, default: Any = None) -> Any:
        """The value the command gives a setting (the last one given, as argparse keeps), typed; `default`
        when not given."""
        found = self.occurrences(flag)
        return found[-1].value if found else default

    def given(self, flag: str) -> str | None:
        """The setting's value exactly as written (the last one given), or None."""
        found = self.occurrences(flag)
        return " ".join(found[-1].values) if found else None

    def flags(self) -> dict[str, Any]:
        """Every setting the command gives, by name (`{'max_num_seqs': 64, 'enforce_eager': True}`)."""
        out: dict[str, Any] = {}
        for a in self.parsed[0]:
            out[a.dest] = a.value
        return out

    @property
    def model(self) -> str | None:
        """`vllm serve MODEL` (its model tag), else `--model`."""
        if self.role == "server" and self.parsed[1]:
            return self.args[self.parsed[1][0]]
        value = self.given("--model")
        return value or None

    # edits ----------------------------------------------------------------------------------------------------
    def with_args(self, args: list[str]) -> VllmCommand:
        return VllmCommand(self.program, self.subcommand, args)

    def without(self, *flags: str) -> VllmCommand:
        """The command without these settings (each occurrence with its value)."""
        drop = {self._dest(f) for f in flags}
        gone = {i for a in self.parsed[0] if a.dest in drop for i in range(a.at, a.at + a.width)}
        return self.with_args([w for i, w in enumerate(self.args) if i not in gone])

    def apply(self, flag: str, to: Any) -> tuple[VllmCommand, str, str]:
        """(new command, action, note) for one change: the setting's every occurrence goes, whatever its
        spelling, and the new value stands where the last one stood (argparse keeps the last); the user's other
        arguments keep their order. `to` None removes the setting; action is edit | add | remove | none."""
        spec = self.spec()
        opt = spec.options.get(flag) if spec else None
        negation = f"--no-{flag[2:]}"
        negatable = bool(spec and negation in spec.options)
        is_switch = isinstance(to, bool) or (opt is not None and not opt.takes_value)
        where = self.occurrences(flag)
        args = list(self.args)
        at = where[-1].at if where else None
        for a in reversed(where):
            del args[a.at:a.at + a.width]
            if at is not None and a.at < at:
                at -= a.width
        if to is None:
            new, action = [], "remove" if where else "none"
        elif is_switch:
            default = effective_default(opt)
            if bool(to) == bool(default):
                if not where:
                    return self, "none", f"{flag} is already at vLLM's default ({default})"
                new, action = [], "remove"  # back to vLLM's default: the flag is simply not given
            elif bool(to):
                new, action = [flag], "edit" if where else "add"
            elif negatable:
                new, action = [negation], "edit" if where else "add"
            else:
                return self, "none", f"{flag} cannot be switched off on the command line"
        else:
            new, action = [flag, str(to)], "edit" if where else "add"
        if at is None:
            at = len(args)
        args[at:at] = new
        return self.with_args(args), action, ""

    # checks -----------------------------------------------------------------------------------------------------
    def check(self) -> CheckResult:
        """Does the command parse? With vLLM's own parser where vLLM is importable, else the recorded options.
        A bare flag list is checked as engine flags."""
        words = ["serve", *self.args] if not self.subcommand else [*self.subcommand, *self.args]
        if vllm_importable():
            try:
                return check_with_vllm(words)
            except ImportError as exc:  # vLLM present but broken here: fall back to the recorded list
                fallback = check_recorded(words)
                fallback.by += f" (vLLM not importable: {exc})"
                return fallback
        return check_recorded(words)


def effective_default(opt: Option | None) -> Any:
    """What vLLM does when a switch is not given (the table above, else the parser's default)."""
    if opt is None:
        return None
    known = VLLM_DEFAULTS.get(opt.dest)
    return known if known is not None else opt.default


@dataclass
class UserCommand:
    """The commands of one run (offline: one; serve: the server and its benchmark) and where they came from."""

    commands: list[VllmCommand]
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "argv": [c.argv() for c in self.commands]}

    def role(self, role: str) -> VllmCommand | None:
        return next((c for c in self.commands if c.role == role), None)


def from_non_default_args(non_default: dict[str, Any], offline: bool) -> UserCommand | None:
    """Last resort: a command rebuilt from vLLM's logged "non-default args" (only flags vLLM knows, not at their
    default; values vLLM filled in itself, like the tokenizer path, left out). Said as such."""
    args = dict(non_default)
    model = args.pop("model", None) or args.pop("model_tag", None)
    if not model:
        return None
    sub = ["bench", "throughput"] if offline else ["serve"]
    spec = spec_for(sub)
    words = ["--model", str(model)] if offline else [str(model)]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        opt = spec.options.get(flag) if spec else None
        if opt is None or value is None or value == effective_default(opt) or (key == "tokenizer" and value == model):
            continue
        if isinstance(value, bool):
            negation = f"--no-{flag[2:]}"
            if value:
                words.append(flag)
            elif negation in spec.options:
                words.append(negation)
        else:
            words += [flag, str(value)]
    source = ("vLLM log's non-default args (the command you ran is not known: its program, benchmark "
              "arguments and flag spelling are reconstructed)")
    return UserCommand([VllmCommand(["vllm"], sub, words)], source)


def effective_config(flags: dict[str, Any], logged: dict[str, Any], gpu: str | None) -> dict[str, dict[str, Any]]:
    """Every setting rules may name: its value and where it came from (given / vLLM log / vLLM 0.26 default).
    `flags`: the settings the command gave; `logged`: what the log says the run set (its non-default args and the
    values vLLM logs it chose)."""
    out = {}
    defaults = {**VLLM_DEFAULTS, "max_num_seqs": default_max_num_seqs(gpu)}
    for key, default in defaults.items():
        if key in flags:
            out[key] = {"value": flags[key], "source": "given"}
        elif logged.get(key) is not None:
            out[key] = {"value": logged[key], "source": "vLLM log"}
        else:
            out[key] = {"value": default, "source": "vLLM 0.26 default" if default is not None else "unknown"}
    return out


# --- checking against the option lists -------------------------------------------------------------------------

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


if __name__ == "__main__":  # pragma: no cover - `python -m profkit.diagnose.vllm_command > 0.26.0.json`
    json.dump(dump_options(), sys.stdout, indent=1, sort_keys=True)
