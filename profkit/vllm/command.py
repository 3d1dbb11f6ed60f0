"""vLLM's command line as data: the ONE parser and editor of a `vllm ...` command.

`VllmCommand` parses a `vllm serve|bench ...` argv (or a bare flag list) once, knowing each subcommand's
options from vLLM's own parsers where vLLM is importable (the GPU box) and otherwise from the option list
recorded from vLLM 0.26.0 (`vllm_options/0.26.0.json`, written by `dump_options()`; the raw `--help` texts
are kept in tests/data/vllm_0.26.0_help/). It answers `.value(flag)`, `.flags()`, `.model`; edits with
`.apply(flag, to)` (the user's own spelling of a setting is edited in place, an alias included) and
`.without(flag, ...)`; and checks that vLLM would start with a command (its parser, and one spelling per setting:
`vllm_options/0.26.0.spellings.json`). It also holds what vLLM does when a flag is not
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
    # CUDA graphs are captured for batch sizes up to min(2 x max_num_seqs, 512) (config/vllm.py:1791-1798)
    "max_cudagraph_capture_size": None,
    "cudagraph_mode": "FULL_AND_PIECEWISE",  # -O2, vLLM 0.26's default level (config/vllm.py:205-303, 381)
    "quantization": None,  # the checkpoint's own (none: its dtype)
    "speculative_config": None,
}
# Settings whose default is "none" (not unknown): no quantization beyond the checkpoint's, no speculative decoding.
DEFAULT_IS_NONE = frozenset({"quantization", "speculative_config"})
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
    """`--max_num_seqs` -> `--max-num-seqs` (vLLM's FlexibleArgumentParser treats them alike); only the flag's own
    name, not a config flag's dotted key (`--compilation-config.cudagraph_mode` stays)."""
    if not name.startswith("--"):
        return name
    flag, dot, key = name.partition(".")
    return "--" + flag[2:].replace("_", "-") + dot + key


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


@lru_cache(maxsize=1)
def profiler_config_keys() -> frozenset[str]:
    """The keys `--profiler-config` takes (vLLM's ProfilerConfig fields): from vLLM where importable, else those
    recorded from vLLM 0.26.0 (its --help's default ProfilerConfig)."""
    if vllm_importable():
        try:
            return frozenset(_profiler_fields())
        except Exception:  # noqa: BLE001 - a broken vLLM install: the recorded list still serves
            pass
    if not _RECORDED.is_file():
        return frozenset()
    return frozenset(json.loads(_RECORDED.read_text(encoding="utf-8")).get("profiler_config_keys", []))


def _profiler_fields() -> list[str]:  # pragma: no cover - needs vLLM
    import dataclasses

    from vllm.config import ProfilerConfig

    return [f.name for f in dataclasses.fields(ProfilerConfig)]


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
    """The setting a flag sets (`--max-num-seqs`, `--max_num_seqs`, `-tp` -> its dest; a config flag's dotted key
    -> its setting: `--compilation-config.cudagraph_mode` -> `cudagraph_mode`)."""
    return VllmCommand([], ["serve"], []).setting(flag)


def changes_precision(flag: str) -> bool:
    """Does a change to this flag change the model's numerics (quantization, KV-cache dtype, dtype)?"""
    return dest_of(flag) in spellings().precision


def takes(spec: Spec | None, flag: str) -> bool:
    """Is `flag` one of the subcommand's spellings: an option, a config flag's dotted key, a short option (-O)?"""
    if spec is None:
        return False
    name = flag.split("=", 1)[0]
    base, dot, _ = name.partition(".")
    words = spellings()
    if dot and normalize_flag(base) in words.config_dests:
        return normalize_flag(base) in spec.options
    if name in words.short:
        return words.short[name] in spec.options
    return spec.find(name) is not None


@dataclass
class Spellings:
    """vLLM's spellings of one setting, recorded beside the option list (`vllm_options/0.26.0.spellings.json`):
    the config flags that take JSON or dotted keys, the settings a flat flag and a config key both set (vLLM
    refuses both at once: `exclusive`), the short options vLLM rewrites before argparse (`-O3`)."""

    config_dests: dict[str, str]  # every spelling of a config flag (aliases too) -> its dest
    config_flag: dict[str, str]  # dest -> the config flag's long spelling
    settings: dict[str, dict[str, Any]]  # setting -> {flag, config, key}
    by_key: dict[tuple[str, str], str]  # (config dest, key) -> setting
    exclusive: dict[str, str]  # setting -> vLLM's error when its flag and its config key are both given
    short: dict[str, str]  # "-O" -> "--optimization-level"
    version: str = RECORDED_VERSION
    precision: frozenset[str] = frozenset()  # settings that change the model's numerics

    def setting_of_key(self, dest: str, key: str) -> str:
        return self.by_key.get((dest, key), f"{dest}.{key}")


@lru_cache(maxsize=1)
def spellings() -> Spellings:
    path = _RECORDED.with_name(f"{RECORDED_VERSION}.spellings.json")
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config = data.get("config_flags", {})
    dests = {flag: c["dest"] for flag, c in config.items()}
    dests.update({alias: c["dest"] for c in config.values() for alias in c.get("aliases", [])})
    settings = data.get("settings", {})
    return Spellings(
        config_dests=dests, config_flag={c["dest"]: flag for flag, c in config.items()}, settings=settings,
        by_key={(config[v["config"]]["dest"], v["key"]): k for k, v in settings.items() if v.get("config")},
        exclusive={e["setting"]: e["error"] for e in data.get("exclusive", [])},
        short={k: v["flag"] for k, v in data.get("short_options", {}).items()},
        version=data.get("vllm_version", RECORDED_VERSION),
        precision=frozenset(data.get("precision", {}).get("settings", [])))


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
        while i < len(args):
            word = args[i]
            if not _looks_like_option(word):
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
                while j < len(args) and (j == i + 1 or many) and not (found and _looks_like_option(args[j])) \
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

    def prompt_lengths(self) -> tuple[int, int, float] | None:
        """The random dataset's (input, output, range ratio) tokens per request (vLLM 0.26's defaults 1024, 128,
        0.0), or None for another dataset or a command that is no benchmark."""
        if self.role not in ("client", "offline") or self.shared_prefixes() is None:
            return None
        spec = self.spec()

        def given(flag: str, fallback: Any) -> Any:
            default = spec.options[flag].default if spec and flag in spec.options else fallback
            value = self.value(flag, default)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else fallback

        return int(given("--random-input-len", 1024)), int(given("--random-output-len", 128)), \
            float(given("--random-range-ratio", 0.0))

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
                short_alias = last is not None and not last.arg.name.startswith("--")
                spelled = last.arg.name if short_alias else flat
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
        bases = {}
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
    out: dict[str, dict[str, Any]] = {}
    defaults = {**VLLM_DEFAULTS, "max_num_seqs": default_max_num_seqs(gpu)}
    for key, default in defaults.items():
        if key == "max_cudagraph_capture_size" and out["max_num_seqs"]["value"] is not None:
            default = min(2 * out["max_num_seqs"]["value"], 512)
        if key in flags:
            out[key] = {"value": flags[key], "source": "given"}
        elif logged.get(key) is not None:
            out[key] = {"value": logged[key], "source": "vLLM log"}
        else:
            known = default is not None or key in DEFAULT_IS_NONE
            out[key] = {"value": default, "source": "vLLM 0.26 default" if known else "unknown"}
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
        name = word.split("=", 1)[0]
        base, dot, _ = name.partition(".")
        words_ = spellings()
        if dot and normalize_flag(base) in words_.config_dests and normalize_flag(base) in spec.options:
            if "=" not in word:  # --compilation-config.mode 3: the value is the next word
                if i >= len(rest) or _looks_like_option(rest[i]):
                    problems.append(f"{name} needs a value")
                else:
                    i += 1
            continue
        short = next((s for s in words_.short if name.startswith(s) and not name.startswith("--")), None)
        if short and words_.short[short] in spec.options:  # -O3, -O=3, -O 3 (vLLM rewrites them)
            if word == short and i < len(rest) and rest[i] in ("0", "1", "2", "3"):
                i += 1
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


def _vllm_parser(words: list[str]):  # pragma: no cover - needs vLLM (the GPU box)
    """vLLM's own top-level parser, built as `vllm.entrypoints.cli.main.main` builds it. Without a GPU its
    platform is unspecified and the engine arguments cannot be built: the CPU platform stands in, as
    `vllm bench` does (entrypoints/cli/main.py), before the engine arguments are imported."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
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


def check_with_vllm(words: list[str]) -> CheckResult:  # pragma: no cover - needs vLLM (the GPU box)
    """vLLM's own parser, then its EngineArgs (which checks the flags against each other as far as it can
    without a model: quantization and its config, the config flags' JSON)."""
    import vllm

    by = f"vLLM {vllm.__version__} parser and EngineArgs"
    parser, cmds = _vllm_parser(words)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(words)
            if args.subparser in cmds:
                cmds[args.subparser].validate(args)
            if words[:1] == ["serve"] or words[:2] in (["bench", "throughput"], ["bench", "latency"]):
                from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

                if getattr(args, "model_tag", None):  # as `vllm serve` itself does before building its engine
                    args.model = args.model_tag
                (EngineArgs if words[:2] == ["bench", "latency"] else AsyncEngineArgs).from_cli_args(args)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return CheckResult(False, by, [lines[-1] if lines else "rejected by vLLM's parser"])
    except Exception as exc:  # noqa: BLE001 - vLLM raises various types for bad values
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
    out["profiler_config_keys"] = _profiler_fields()
    return out


if __name__ == "__main__":  # pragma: no cover - `python -m profkit.vllm.command > 0.26.0.json`
    json.dump(dump_options(), sys.stdout, indent=1, sort_keys=True)
