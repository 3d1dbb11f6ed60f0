"""vLLM's command line as data: the ONE parser and editor of a `vllm ...` command.

`VllmCommand` parses a `vllm serve|bench ...` argv (or a bare flag list) once, knowing each subcommand's
options from profkit.vllm.options (vLLM's own parsers where vLLM is importable, else the option list recorded
from vLLM 0.26.0). It answers `.value(flag)`, `.flags()`, `.model`; edits with
`.apply(flag, to)` (the user's own spelling of a setting is edited in place, an alias included) and
`.without(flag, ...)`; and checks that vLLM would start with a command (profkit.vllm.check, and one spelling per
setting: `vllm_options/0.26.0.spellings.json`). `UserCommand` holds the commands of one run. Capture, tune,
report, diff and the rules all go through it.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from profkit.vllm.check import CheckResult, check_recorded, check_with_vllm
from profkit.vllm.options import (
    Spec,
    coerce,
    effective_default,
    looks_like_option,
    normalize_flag,
    spec_for,
    spellings,
    vllm_importable,
)

VLLM_MODULE = "vllm.entrypoints.cli.main"

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
    key: str | None = None  # a config flag's dotted key (`-cc.cudagraph_mode=NONE`: "cudagraph_mode")
    setting: str = ""  # what it sets: its dest, or the setting a config key or flat flag stands for

    @property
    def value(self) -> Any:
        """The value vLLM would read: a switch True (False when negated), else the typed text (a dotted config
        key's value is JSON where it parses, as vLLM reads it)."""
        if not self.values:
            return not self.negated
        if self.key is not None:
            return _json_or_text(self.values[0])
        return coerce(self.values[0]) if len(self.values) == 1 else [coerce(v) for v in self.values]

    @property
    def json(self) -> dict[str, Any] | None:
        """A config flag's JSON value as a dict (None: not a config flag, or not a JSON object)."""
        if self.key is not None or self.dest not in spellings().config_flag or len(self.values) != 1:
            return None
        try:
            value = json.loads(self.values[0])
        except (ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Occurrence:
    """Where a command gives a setting: as a whole option (`--max-cudagraph-capture-size 8`, `-cc.x=8`) or as
    the key `json_key` inside a config flag's JSON (`-cc '{"max_cudagraph_capture_size": 8}'`)."""

    arg: Arg
    json_key: str | None = None

    @property
    def value(self) -> Any:
        return (self.arg.json or {}).get(self.json_key) if self.json_key is not None else self.arg.value

    @property
    def spelling(self) -> str:
        return "json" if self.json_key is not None else "dotted" if self.arg.key is not None else "flag"


def _dotted(value: Any) -> str:
    """A value as a dotted config key takes it (`-cc.cudagraph_mode=NONE`, `-cc.max_cudagraph_capture_size=8`)."""
    return value if isinstance(value, str) else json.dumps(value)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


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
        """The command as one pasteable line (profkit.escape.shell: shlex quoting; `$'...'` for a word with a
        control character, so a newline or ESC in an argument is neither a line break nor a terminal escape)."""
        from profkit.escape import shell

        return shell(self.argv())

    @cached_property
    def parsed(self) -> tuple[list[Arg], list[int]]:
        """The options as written, and the positions of bare words (the model tag of `vllm serve`)."""
        spec = self.spec()
        words = spellings()
        items: list[Arg] = []
        bare: list[int] = []
        args = self.args
        i = 0
        values: tuple[str, ...]
        while i < len(args):
            word = args[i]
            if not looks_like_option(word):
                bare.append(i)
                i += 1
                continue
            name, eq, inline = word.partition("=")
            short = next((s for s in words.short if name.startswith(s) and not name.startswith("--")), None)
            base, dot, key = name.partition(".")
            if short and spec and words.short[short] in spec.options:  # -O3, -O=3, -O 3
                dest = spec.options[words.short[short]].dest
                rest = word[len(short):].removeprefix("=")
                if rest:
                    values, width = (rest,), 1
                elif i + 1 < len(args) and args[i + 1] in ("0", "1", "2", "3"):
                    values, width = (args[i + 1],), 2
                else:
                    values, width = (), 1
                items.append(Arg(i, width, short, dest, values, setting=dest))
                i += width
                continue
            if dot and normalize_flag(base) in words.config_dests:  # -cc.cudagraph_mode=NONE, --x.key value
                dest = words.config_dests[normalize_flag(base)]
                values, width = ((inline,), 1) if eq else ((args[i + 1],), 2) if i + 1 < len(args) else ((), 1)
                items.append(Arg(i, width, base, dest, values, key=key, setting=words.setting_of_key(dest, key)))
                i += width
                continue
            found = spec.find(word) if spec else None
            if found:
                opt = found[1]
                negated = bool(opt.negation_of)
                takes = opt.takes_value
                many = opt.many
                dest = opt.dest
            else:  # not in the option list: a value follows unless the next word is an option
                dest = normalize_flag(name).lstrip("-").replace("-", "_")
                takes, many, negated = True, False, False
                if not eq and (i + 1 >= len(args) or args[i + 1].startswith("--")):
                    takes = False
            if eq:
                values = (inline,) if takes else ()
                width = 1
            elif takes:
                j = i + 1
                while j < len(args) and (j == i + 1 or many) and not (found and looks_like_option(args[j])) \
                        and not (not found and args[j].startswith("--")):
                    j += 1
                values, width = tuple(args[i + 1:j]), j - i
            else:
                values, width = (), 1
            items.append(Arg(i, width, name, dest, values, negated, bool(found), setting=dest))
            i += width
        return items, bare

    def setting(self, flag: str) -> str:
        """The setting a flag or config key sets, whatever the spelling: `--max_num_seqs`, `-tp`, `-O`,
        `--compilation-config.cudagraph_mode`, `-cc.max_cudagraph_capture_size` (the same setting as
        `--max-cudagraph-capture-size`) or a setting's own name (`cudagraph_mode`)."""
        words = spellings()
        if flag in words.settings:
            return flag
        name = flag.split("=", 1)[0]
        base, dot, key = name.partition(".")
        if dot and normalize_flag(base) in words.config_dests:
            return words.setting_of_key(words.config_dests[normalize_flag(base)], key)
        spec = self.spec()
        if name in words.short and spec and words.short[name] in spec.options:
            return spec.options[words.short[name]].dest
        found = spec.find(name) if spec else None
        return found[1].dest if found else normalize_flag(name).lstrip("-").replace("-", "_")

    def occurrences(self, flag: str) -> list[Occurrence]:
        """Every place the setting `flag` sets is given, whatever the spelling (alias, negation, underscores, a
        config flag's dotted key or JSON key)."""
        target = self.setting(flag)
        words = spellings()
        out = []
        for a in self.parsed[0]:
            if a.setting == target:
                out.append(Occurrence(a))
            elif (doc := a.json) is not None:
                out += [Occurrence(a, k) for k in doc if words.setting_of_key(a.dest, k) == target]
        return out

    def _dest(self, flag: str) -> str:
        return self.setting(flag)

    def value(self, flag: str, default: Any = None) -> Any:
        """The value the command gives a setting (the last one given, as argparse keeps), typed; `default`
        when not given."""
        found = self.occurrences(flag)
        return found[-1].value if found else default

    def given(self, flag: str) -> str | None:
        """The setting's value exactly as written (the last one given), or None."""
        found = self.occurrences(flag)
        if not found:
            return None
        last = found[-1]
        return " ".join(last.arg.values) if last.json_key is None else json.dumps(last.value)

    def flags(self) -> dict[str, Any]:
        """Every setting the command gives, by name (`{'max_num_seqs': 64, 'enforce_eager': True}`); a config
        flag's JSON keys also under their setting's name (`cudagraph_mode`, `compilation_config.mode`)."""
        out: dict[str, Any] = {}
        words = spellings()
        for a in self.parsed[0]:
            out[a.setting] = a.value
            for key, value in (a.json or {}).items():
                out[words.setting_of_key(a.dest, key)] = value
        return out

    def shared_prefixes(self) -> bool | None:
        """Do the benchmark's prompts share prefixes (what the prefix cache can serve)? False for the random
        dataset without --random-prefix-len; True for a prefix length or the prefix_repetition dataset; None
        where the command (not a benchmark) or the dataset (real text) does not tell."""
        if self.role not in ("client", "offline"):
            return None
        spec = self.spec()
        default = spec.options["--dataset-name"].default if spec and "--dataset-name" in spec.options else None
        dataset = self.value("--dataset-name", default)
        if dataset == "prefix_repetition":
            return True
        if dataset == "random":
            prefix = self.value("--random-prefix-len", 0)
            return bool(prefix) if isinstance(prefix, int) else None
        return None

    def prompt_lengths(self) -> tuple[int, int, float, int] | None:
        """The random dataset's (input, output, range ratio, prefix) tokens per request (vLLM 0.26's defaults 1024,
        128, 0.0, 0), or None for another dataset or a command that is no benchmark. A prompt is the prefix, then
        an input drawn within the range ratio either side of its length (vLLM's RandomDataset: prefix_len +
        input_len)."""
        if self.role not in ("client", "offline") or self.shared_prefixes() is None:
            return None
        spec = self.spec()

        def given(flag: str, fallback: Any) -> Any:
            default = spec.options[flag].default if spec and flag in spec.options else fallback
            value = self.value(flag, default)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else fallback

        return int(given("--random-input-len", 1024)), int(given("--random-output-len", 128)), \
            float(given("--random-range-ratio", 0.0)), int(given("--random-prefix-len", 0))

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
        """The command without these settings (each occurrence, in every spelling, with its value)."""
        cmd = self
        for flag in flags:
            cmd = cmd.apply(flag, None)[0]
        return cmd

    def apply(self, flag: str, to: Any) -> tuple[VllmCommand, str, str]:
        """(new command, action, note) for one change to a setting: every occurrence of it goes, whatever its
        spelling, and the new value is given once, in the spelling the user gave it last, where it stood (argparse
        keeps the last); the user's other arguments keep their order. Never a second spelling of one setting: a
        key of a config flag's JSON is edited inside that JSON, a dotted key stays dotted, an alias stays the
        alias. `to` None removes the setting; action is edit | add | remove | none."""
        spec = self.spec()
        words = spellings()
        target = self.setting(flag)
        record = words.settings.get(target) or {}
        name = flag.split("=", 1)[0]
        flat = (name if spec and name in spec.options else record.get("flag") if "flag" in record
                else spec.long_flags.get(target) if spec else None)
        if flat is None and not record and "." not in name:
            flat = normalize_flag(name)  # an option this vLLM does not list: as written
        opt = spec.options.get(flat) if spec and flat else None
        where = self.occurrences(flag)
        last = where[-1] if where else None
        slots: list[str | None] = list(self.args)
        documents: dict[int, dict[str, Any]] = {}  # a config flag's JSON as edited, by the arg's position
        for o in where:
            if o.json_key is not None:
                documents.setdefault(o.arg.at, dict(o.arg.json or {})).pop(o.json_key, None)
            else:
                for i in range(o.arg.at, o.arg.at + o.arg.width):
                    slots[i] = None
        inserts: dict[int, list[str]] = {}
        action = "edit" if where else "add"
        if to is None:
            action = "remove" if where else "none"
        elif last is not None and last.json_key is not None:
            documents[last.arg.at][last.json_key] = to
        elif last is not None and last.arg.key is not None:
            inserts[last.arg.at] = [f"{last.arg.name}.{last.arg.key}={_dotted(to)}"]
        elif last is not None and last.arg.name in words.short:
            inserts[last.arg.at] = [f"{last.arg.name}{to}"]
        elif flat is not None:
            is_switch = isinstance(to, bool) or (opt is not None and not opt.takes_value)
            if is_switch:
                default = effective_default(opt)
                negation = f"--no-{flat[2:]}"
                if bool(to) == bool(default):
                    if not where:
                        return self, "none", f"{flag} is already at vLLM's default ({default})"
                    action = "remove"  # back to vLLM's default: the flag is simply not given
                    new = []
                elif bool(to):
                    new = [flat]
                elif spec and negation in spec.options:
                    new = [negation]
                else:
                    return self, "none", f"{flag} cannot be switched off on the command line"
            else:
                # a short alias stays (`-tp 4`); a long name is written as vLLM spells it (`--max-num-seqs`)
                spelled = last.arg.name if last is not None and not last.arg.name.startswith("--") else flat
                new = [spelled, str(to)]
            inserts[last.arg.at if last is not None else len(slots)] = new
        else:  # a key only a config flag sets, not given yet: into the user's JSON or dotted keys of that flag
            config_dest = words.config_dests.get(record.get("config", ""), target.partition(".")[0])
            key = record.get("key") or target.partition(".")[2]
            mine = [a for a in self.parsed[0] if a.dest == config_dest]
            host = next((a for a in reversed(mine) if a.json is not None), None)
            dotted = next((a for a in reversed(mine) if a.key is not None), None)
            if host is not None:
                documents.setdefault(host.at, dict(host.json or {}))[key] = to
            elif dotted is not None:
                inserts[len(slots)] = [f"{dotted.name}.{key}={_dotted(to)}"]
            else:
                inserts[len(slots)] = [words.config_flag.get(config_dest, flag), json.dumps({key: to})]
        for at, doc in documents.items():
            arg = next(a for a in self.parsed[0] if a.at == at)
            if not doc:
                for i in range(arg.at, arg.at + arg.width):
                    slots[i] = None
            elif arg.width == 1:  # --compilation-config={...}
                slots[at] = f"{self.args[at].split('=', 1)[0]}={json.dumps(doc)}"
            else:
                slots[at + 1] = json.dumps(doc)
        out: list[str] = []
        for i, word in enumerate([*slots, None]):
            out += inserts.get(i, [])
            if word is not None and i < len(slots):
                out.append(word)
        return self.with_args(out), action, ""

    def spelling_problems(self) -> list[str]:
        """One setting given two ways: the pairs vLLM refuses at start-up although argparse accepts them (a flag
        and the same key of a config flag: its `exclusive` record), and spellings that silently replace each
        other (a config flag's JSON and its dotted keys, `-cc.x` and `--compilation-config.x`)."""
        words = spellings()
        problems: list[str] = []
        seen: dict[str, set[str]] = {}
        for a in self.parsed[0]:
            seen.setdefault(a.setting, set()).add("dotted" if a.key is not None else f"flag:{a.setting}")
            for key in a.json or {}:
                seen.setdefault(words.setting_of_key(a.dest, key), set()).add("json")
        for setting, kinds in seen.items():
            if len(kinds) < 2:
                continue
            error = words.exclusive.get(setting)
            problems.append(f"{setting} given {len(kinds)} ways: " + (f"vLLM {words.version} refuses it ({error})"
                            if error and any(k.startswith("flag:") for k in kinds)
                            else "one spelling silently replaces the other"))
        bases: dict[str, set[str]] = {}
        for a in self.parsed[0]:
            if a.dest in words.config_flag:
                bases.setdefault(a.dest, set()).add(a.name if a.key is not None else "json")
        for dest, spelled in bases.items():
            if len(spelled) > 1:
                problems.append(f"{words.config_flag[dest]} given as {' and '.join(sorted(spelled))}: vLLM keeps "
                                "only the last of them")
        return problems

    # checks -----------------------------------------------------------------------------------------------------
    def check(self) -> CheckResult:
        """Would vLLM start with it? The parse, with vLLM's own parser and EngineArgs where vLLM is importable,
        else against the recorded option list; and one spelling per setting, against the record of the spellings
        vLLM refuses together at start-up although its parser accepts them. A bare flag list is checked as engine
        flags."""
        words = ["serve", *self.args] if not self.subcommand else [*self.subcommand, *self.args]
        result = None
        if vllm_importable():
            try:
                result = check_with_vllm(words)
            except Exception as exc:  # noqa: BLE001 - vLLM present but broken here: the recorded list still serves
                result = check_recorded(words)
                result.by += f" (vLLM's parser not usable here: {type(exc).__name__})"
        if result is None:
            result = check_recorded(words)
        record = spellings()
        result.by += f"; one spelling per setting ({len(record.exclusive)} pairs vLLM {record.version} refuses)"
        problems = self.spelling_problems()
        if problems:
            result.ok = False
            result.problems += problems
        return result


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
            elif spec is not None and negation in spec.options:
                words.append(negation)
        else:
            words += [flag, str(value)]
    source = ("vLLM log's non-default args (the command you ran is not known: its program, benchmark "
              "arguments and flag spelling are reconstructed)")
    return UserCommand([VllmCommand(["vllm"], sub, words)], source)


def dest_of(flag: str) -> str:
    """The setting a flag sets (`--max-num-seqs`, `--max_num_seqs`, `-tp` -> its dest; a config flag's dotted key
    -> its setting: `--compilation-config.cudagraph_mode` -> `cudagraph_mode`)."""
    return VllmCommand([], ["serve"], []).setting(flag)


def changes_precision(flag: str) -> bool:
    """Does a change to this flag change the model's numerics (quantization, KV-cache dtype, dtype)?"""
    return dest_of(flag) in spellings().precision
