"""The command line a user copies: the command they ran, with the findings' flag changes applied.

One function builds it (`suggest`), and report, diff and tune all call it. The user's command comes,
best first, from the capture manifest (`user_commands`, or its recorded command lines with the
profiler wrapped around them taken off), from `--vllm-args`, and only when nothing better is known
from the vLLM log's "non-default args" line (said as such). Changes are applied in place: the same
program and subcommand, the user's arguments in their order, only the changed flags edited, added
or removed, spelled as vLLM spells them. Profiler-only arguments that capture added are dropped.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from profkit.analysis.vllm import VLLM_DEFAULTS
from profkit.diagnose.vllm_cli import Option, Spec, check_command, normalize_flag, spec_for

# What `profkit capture` adds to a user's command so a profiler or the capture folder gets its data.
PROFILER_ONLY_WITH_VALUE = {"--profiler-config"}
PROFILER_ONLY_FLAGS = {"--profile"}
CAPTURE_OUTPUT_NAMES = {"bench.json", "bench-torch.json"}
VLLM_MODULE = "vllm.entrypoints.cli.main"


@dataclass
class VllmCommand:
    """One vLLM command: `program` (`vllm`, or python -m ...), `subcommand`, then `args` in the user's order.

    A command known only as flags (`--vllm-args "--max-num-seqs 64"`) has neither program nor subcommand."""

    program: list[str]
    subcommand: list[str]
    args: list[str]

    @property
    def role(self) -> str:
        """'server' (vllm serve), 'client' (vllm bench serve), 'offline' (bench throughput|latency), 'flags'."""
        if self.subcommand == ["serve"]:
            return "server"
        if self.subcommand == ["bench", "serve"]:
            return "client"
        return "offline" if self.subcommand[:1] == ["bench"] else "flags"

    def argv(self) -> list[str]:
        return [*self.program, *self.subcommand, *self.args]

    def shell(self) -> str:
        return shlex.join(self.argv())

    def spec(self) -> Spec | None:
        # A bare flag list is checked as engine flags (what `vllm serve` and `bench throughput` share).
        return spec_for(self.subcommand or ["serve"])


@dataclass
class UserCommand:
    """The commands of one run (offline: one; serve: the server and its benchmark) and where they came from."""

    commands: list[VllmCommand]
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "argv": [c.argv() for c in self.commands]}


def split_vllm(argv: list[str]) -> VllmCommand | None:
    """Find the vLLM command inside a recorded command line (after `nsys profile ... -o X`, say)."""
    for i, word in enumerate(argv):
        rest = argv[i + 1:]
        if os.path.basename(word) == "vllm":
            program, after = argv[i:i + 1], rest
        elif word == "-m" and rest[:1] == [VLLM_MODULE] and i > 0:
            program, after = argv[i - 1:i + 2], rest[1:]
        else:
            continue
        if after[:1] == ["serve"]:
            return VllmCommand(program, ["serve"], after[1:])
        if after[:1] == ["bench"] and len(after) > 1:
            return VllmCommand(program, after[:2], after[2:])
    return None


def parse_command_text(text: str) -> VllmCommand:
    """A full vLLM command (`vllm serve M --x 1`) or a bare flag list (`--max-num-seqs 64`)."""
    words = shlex.split(text, comments=True)
    found = split_vllm(words)
    return found if found else VllmCommand([], [], words)


def drop_capture_args(cmd: VllmCommand) -> VllmCommand:
    """Take off what `profkit capture` added for the profiler and the folder (--profile, --output-json X, ...)."""
    out: list[str] = []
    args = cmd.args
    result_file = _value_of(args, "--result-filename")
    i = 0
    while i < len(args):
        word = args[i]
        name = normalize_flag(word.split("=", 1)[0])
        has_inline = "=" in word
        step = 1 if has_inline else 2
        if name in PROFILER_ONLY_FLAGS:
            i += 1
            continue
        if name in PROFILER_ONLY_WITH_VALUE:
            i += step
            continue
        if name == "--output-json" and os.path.basename(_value_at(args, i) or "") in CAPTURE_OUTPUT_NAMES:
            i += step
            continue
        if result_file in CAPTURE_OUTPUT_NAMES and name in ("--result-dir", "--result-filename"):
            i += step
            continue
        if result_file in CAPTURE_OUTPUT_NAMES and name == "--save-result":
            i += 1
            continue
        out.append(word)
        i += 1
    return VllmCommand(cmd.program, cmd.subcommand, out)


def _value_at(args: list[str], i: int) -> str | None:
    if "=" in args[i]:
        return args[i].split("=", 1)[1]
    return args[i + 1] if i + 1 < len(args) else None


def _value_of(args: list[str], flag: str) -> str | None:
    for i, word in enumerate(args):
        if normalize_flag(word.split("=", 1)[0]) == flag:
            return _value_at(args, i)
    return None


def from_manifest(manifest: dict[str, Any]) -> UserCommand | None:
    """The user's commands from a capture manifest: `user_commands` when written, else the recorded lines."""
    recorded = manifest.get("user_commands")
    if isinstance(recorded, list) and recorded and all(isinstance(c, list) for c in recorded):
        cmds = [split_vllm([str(w) for w in c]) for c in recorded]
        if all(cmds):
            return UserCommand([c for c in cmds if c], "capture manifest")
    lines = manifest.get("commands")
    if not isinstance(lines, list):
        return None
    cmds = []
    for line in lines:
        try:
            found = split_vllm(shlex.split(str(line), comments=True))
        except ValueError:
            continue
        if found:
            cmds.append(drop_capture_args(found))
    return UserCommand(cmds, "capture manifest (recorded command lines, profiler arguments removed)") if cmds else None


def from_log(non_default: dict[str, Any], bench: dict[str, Any] | None) -> UserCommand | None:
    """Last resort: a command rebuilt from the log's "non-default args" (only flags vLLM knows, not at their
    default; values vLLM filled in itself, like the tokenizer path, left out). Said as such."""
    args = dict(non_default)
    model = args.pop("model", None) or args.pop("model_tag", None)
    if not model:
        return None
    offline = bool(bench) and "requests_per_second" in bench and "ttft_mean_ms" not in bench
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


@dataclass
class AppliedChange:
    flag: str
    action: str  # edit | add | remove | none
    to: Any
    command: int | None  # index into the run's commands
    note: str = ""


@dataclass
class Suggestion:
    original: UserCommand | None
    commands: list[VllmCommand] = field(default_factory=list)
    applied: list[AppliedChange] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)

    def text(self) -> str | None:
        return "\n".join(c.shell() for c in self.commands) if self.commands else None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.original.source if self.original else None,
            "original": [c.shell() for c in self.original.commands] if self.original else [],
            "original_argv": [c.argv() for c in self.original.commands] if self.original else [],
            "suggested": [c.shell() for c in self.commands],
            "suggested_argv": [c.argv() for c in self.commands],
            "changes": [asdict(a) for a in self.applied],
            "checks": self.checks,
        }


def typed(value: Any) -> Any:
    """A change's value as JSON should hold it: 'false' -> False, '600000000' -> 600000000, 'fp8' stays."""
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


def _target(cmds: list[VllmCommand], flag: str) -> int | None:
    """Which command a flag belongs to: the server/offline/flags command for engine flags, the benchmark
    client for client-side flags (--request-rate, --max-concurrency)."""
    engine = next((i for i, c in enumerate(cmds) if c.role in ("server", "offline", "flags")), None)
    client = next((i for i, c in enumerate(cmds) if c.role == "client"), None)
    engine_spec = cmds[engine].spec() if engine is not None else None
    if engine is not None and (engine_spec is None or flag in engine_spec.options):
        return engine
    client_spec = spec_for(["bench", "serve"])
    if client is not None and client_spec and flag in client_spec.options:
        return client
    return None


def _occurrences(args: list[str], flag: str, negation: str | None) -> list[int]:
    names = {flag} | ({negation} if negation else set())
    return [i for i, w in enumerate(args) if w.startswith("--") and normalize_flag(w.split("=", 1)[0]) in names]


def apply_change(cmd: VllmCommand, flag: str, to: Any) -> tuple[VllmCommand, str, str]:
    """(new command, action, note) for one change; the user's other arguments keep their order."""
    spec = cmd.spec()
    opt = spec.options.get(flag) if spec else None
    negation = f"--no-{flag[2:]}"
    negatable = bool(spec and negation in spec.options)
    is_switch = isinstance(to, bool) or (opt is not None and not opt.takes_value)
    args = list(cmd.args)
    where = _occurrences(args, flag, negation if negatable else None)
    # Drop every occurrence; argparse keeps the last one, so the edit goes where the last one stood.
    at = where[-1] if where else None
    for i in reversed(where):
        width = 1 if (is_switch or "=" in args[i]) else 2
        del args[i:i + width]
        if at is not None and i < at:
            at -= width
    if to is None:
        new, action = [], "remove" if where else "none"
    elif is_switch:
        default = effective_default(opt)
        if bool(to) == bool(default):
            if not where:
                return cmd, "none", f"{flag} is already at vLLM's default ({default})"
            new, action = [], "remove"  # back to vLLM's default: the flag is simply not given
        elif bool(to):
            new, action = [flag], "edit" if where else "add"
        elif negatable:
            new, action = [negation], "edit" if where else "add"
        else:
            return cmd, "none", f"{flag} cannot be switched off on the command line"
    else:
        new, action = [flag, str(to)], "edit" if where else "add"
    if at is None:
        at = len(args)
    args[at:at] = new
    return VllmCommand(cmd.program, cmd.subcommand, args), action, ""


def effective_default(opt: Option | None) -> Any:
    """What vLLM does when a switch is not given. The parser's default is often None ("decided later":
    prefix caching, async scheduling); profkit's table of vLLM 0.26's effective defaults says what it becomes."""
    if opt is None:
        return None
    known = VLLM_DEFAULTS.get(opt.dest)
    return known if known is not None else opt.default


def _check(cmd: VllmCommand) -> dict[str, Any]:
    if not cmd.subcommand:
        argv, at = ["serve", *cmd.args], 0  # bare flags: check them as engine flags
    else:
        argv, at = cmd.argv(), len(cmd.program)
    result = check_command(argv, at)
    return {"command": cmd.shell(), "ok": result.ok, "by": result.by, "problems": result.problems}


def suggest(original: UserCommand | None, changes: list[dict[str, Any]], check: bool = True) -> Suggestion:
    """Apply `changes` ({flag, to}, most important first: the first change to a flag wins) to the run's commands."""
    out = Suggestion(original=original)
    cmds = list(original.commands) if original else []
    seen: set[str] = set()
    for change in changes:
        flag = normalize_flag(change["flag"])
        if flag in seen:
            continue
        seen.add(flag)
        to = change.get("to")
        if not cmds:
            action = "remove" if to is None else "edit" if change.get("from_source") == "given" else "add"
            out.applied.append(AppliedChange(flag, action, to, None, "the command you ran is not known"))
            continue
        idx = _target(cmds, flag)
        if idx is None:
            out.applied.append(AppliedChange(flag, "none", to, None, "not an option of the commands this run used"))
            continue
        cmds[idx], action, note = apply_change(cmds[idx], flag, to)
        out.applied.append(AppliedChange(flag, action, to, idx, note))
    if original and any(a.action != "none" for a in out.applied):
        out.commands = cmds
        if check:
            out.checks = [_check(c) for c in cmds]
    return out


def report_changes(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding's changes, most severe finding first (the order findings are in)."""
    return [c for f in report.get("findings", []) for c in f.get("changes", [])]


def user_command(report: dict[str, Any], given: UserCommand | None) -> UserCommand | None:
    """The best-known command of the run a report describes (see the module docstring for the order)."""
    if given:
        return given
    vllm = report.get("vllm") or {}
    non_default = (vllm.get("log") or {}).get("non_default_args")
    return from_log(non_default, vllm.get("bench")) if non_default else None


def annotate(report: dict[str, Any], suggestion: Suggestion) -> None:
    """Put each change's action (edit/add/remove/none) on the findings' change rows."""
    by_flag = {a.flag: a for a in suggestion.applied}
    for finding in report.get("findings", []):
        for c in finding.get("changes", []):
            a = by_flag.get(normalize_flag(c["flag"]))
            if a is not None:
                c["action"] = a.action if a.to == c.get("to") else "none"
                if a.to != c.get("to"):
                    c["note"] = "a more severe finding sets this flag"
