"""vLLM's options as data, per vLLM version: each subcommand's option list (read from vLLM's own parsers where
vLLM is importable, the GPU box, and otherwise from the list recorded from vLLM 0.26.0, `vllm_options/0.26.0.json`,
written by `dump_options()`; the raw `--help` texts are kept in tests/data/vllm_0.26.0_help/), the spellings of one
setting (`vllm_options/0.26.0.spellings.json`: config flags, their dotted keys, the pairs vLLM refuses together,
short options), what vLLM does when a flag is not given (`VLLM_DEFAULTS`, `default_max_num_seqs`,
`effective_default`) and where each setting's value came from (`effective_config`), with one coercer (`coerce`)
for values given as text.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from profkit.escape import one_line

RECORDED_VERSION = "0.26.0"
_RECORDED = Path(__file__).resolve().parent / "vllm_options" / f"{RECORDED_VERSION}.json"
# The subcommands profkit runs and suggests.
SUBCOMMANDS = (("serve",), ("bench", "throughput"), ("bench", "latency"), ("bench", "serve"))

# --- what vLLM does when a flag is not given ---------------------------------------------------------------

# vLLM 0.26 defaults for the flags rules talk about, used (and labelled as defaults) when the run's own flags
# are unknown. gpu_memory_utilization and max_num_batched_tokens are what vLLM 0.26 logs for a run that did not
# set them (the fixture's log: "Desired GPU memory utilization is (0.92, ...)", "Chunked prefill is enabled with
# max_num_batched_tokens=16384" for the offline LLM entry point). The parser's default is often None ("decided
# later": prefix caching, async scheduling); this table says what it becomes.
VLLM_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "data_parallel_size": 1,
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
    "api_server_count": 1,  # data_parallel_size when not given (effective_config; entrypoints/cli/serve.py)
    "stream_interval": 1,
    # CUDA graphs are captured for batch sizes up to min(2 x max_num_seqs, 512) (config/vllm.py:1791-1798)
    "max_cudagraph_capture_size": None,
    "cudagraph_mode": "FULL_AND_PIECEWISE",  # -O2, vLLM 0.26's default level (config/vllm.py:205-303, 381)
    "quantization": None,  # the checkpoint's own (none: its dtype)
    "speculative_config": None,
}
# The settings above that vLLM reads as numbers, and as switches: a value of another type is no value of theirs.
NUMERIC_SETTINGS = frozenset({"tensor_parallel_size", "data_parallel_size", "max_num_seqs", "max_num_batched_tokens",
                              "gpu_memory_utilization", "max_model_len", "kv_cache_memory_bytes", "cpu_offload_gb",
                              "api_server_count", "stream_interval", "max_cudagraph_capture_size"})
SWITCHES = frozenset({"enforce_eager", "enable_chunked_prefill", "enable_prefix_caching", "async_scheduling"})
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


# --max-num-batched-tokens when not given, by vLLM 0.26's entry point (its log: "Chunked prefill is enabled with
# max_num_batched_tokens=..."): the OpenAI server's, and the offline LLM class's (`vllm bench throughput`).
SERVER_MAX_NUM_BATCHED_TOKENS, OFFLINE_MAX_NUM_BATCHED_TOKENS = 8192, 16384


def default_of(setting: str, gpu: str | None, offline: bool = False) -> Any:
    """vLLM's value for a setting the command does not give (None: not known here): by the GPU where it depends on
    it, by the entry point for the token budget."""
    if setting == "max_num_seqs":
        return default_max_num_seqs(gpu)
    if setting == "max_cudagraph_capture_size":
        seqs = default_max_num_seqs(gpu)
        return min(2 * seqs, 512) if seqs else None
    if setting == "max_num_batched_tokens":
        return OFFLINE_MAX_NUM_BATCHED_TOKENS if offline else SERVER_MAX_NUM_BATCHED_TOKENS
    return VLLM_DEFAULTS.get(setting)


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
            number = cast(value.strip())  # ValueError too past Python's 4,300 digits: stays text
        except ValueError:
            continue
        return number if cast is int or math.isfinite(number) else value  # 'nan', 'inf': no setting's number
    return value


# vLLM 0.26's types for the settings profkit's model changes (its `--help`: tests/data/vllm_0.26.0_help): whole
# numbers of at least 1, a share of the GPU's memory in (0, 1], human-readable sizes ("1k" 1,000, "1K" 1,024, "25.6k"
# 25,600; -1 or "auto": the longest that fits, vLLM's default) and switches (SWITCHES)
WHOLE_AT_LEAST_ONE = ("max_num_seqs", "tensor_parallel_size", "data_parallel_size", "api_server_count")
HUMAN_READABLE = ("kv_cache_memory_bytes", "max_model_len", "max_num_batched_tokens")  # "Parse human-readable" there
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def human_readable_int(value: Any) -> int:
    """vLLM's human-readable integer: '1k' 1,000, '1K' 1,024, '25.6k' 25,600 (no decimals with a binary suffix), or
    a whole number (a finite number from Python: its whole part); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("not a whole number")
    if isinstance(value, (int, float)):  # a number from Python (bytes computed): whole bytes
        if not math.isfinite(value):
            raise ValueError("not a whole number")
        return int(value)
    text = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmgtKMGT])", text)
    if match is None:
        return int(text)  # ValueError for '1e9', '2.5', 'lots'
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    return int(number) * _BINARY[suffix]  # ValueError for '1.5K', as vLLM's


def setting_value(dest: str, value: Any) -> Any:
    """A value of a setting the model changes, as vLLM 0.26 reads it ('1K' -> 1024, max_model_len -1 or 'auto' ->
    None: vLLM's default), or ValueError saying what the setting takes (its message: "a whole number of at least
    1"). Other settings' values pass as they are."""
    if value is None:
        return None
    if dest in WHOLE_AT_LEAST_ONE:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("a whole number of at least 1")
        return value
    if dest == "gpu_memory_utilization":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError("a share of the GPU's memory above 0 and at most 1")
        return value
    if dest in HUMAN_READABLE:
        if dest == "max_model_len" and str(value).strip().lower() in ("-1", "auto"):
            return None
        try:
            number = human_readable_int(value)
        except ValueError:
            raise ValueError("a whole number, or one like 1k (1,000) or 1K (1,024)") from None
        if number < 1:
            raise ValueError("a whole number of at least 1" + (" (or -1, auto)" if dest == "max_model_len"
                                                                      else ""))
        return number
    if dest in SWITCHES and not isinstance(value, bool):
        raise ValueError("no value: it is a switch (vLLM's default: without it)")
    return value


def read_as_vllm(dest: str, value: Any) -> Any:
    """`setting_value` where vLLM would take the value, else the value as given (evidence that says what was
    written: a run's own flags, a server's command)."""
    try:
        return setting_value(dest, value)
    except ValueError:
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


def looks_like_option(word: str) -> bool:
    # argparse treats '-1' as a value (negative number), '--x' and '-O' as options
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit()


def effective_default(opt: Option | None) -> Any:
    """What vLLM does when a switch is not given (VLLM_DEFAULTS, else the parser's default)."""
    if opt is None:
        return None
    known = VLLM_DEFAULTS.get(opt.dest)
    return known if known is not None else opt.default


def effective_config(flags: dict[str, Any], logged: dict[str, Any], gpu: str | None) -> dict[str, dict[str, Any]]:
    """Every setting rules may name: its value and where it came from (given / vLLM log / vLLM 0.26 default).
    `flags`: the settings the command gave; `logged`: what the log says the run set (its non-default args and the
    values vLLM logs it chose)."""
    out: dict[str, dict[str, Any]] = {}
    defaults = {**VLLM_DEFAULTS, "max_num_seqs": default_max_num_seqs(gpu)}
    for key, default in defaults.items():
        if key == "max_cudagraph_capture_size" and out["max_num_seqs"]["value"] is not None:
            default = min(2 * out["max_num_seqs"]["value"], 512)
        if key == "api_server_count":
            default = default_api_servers({**logged, **flags}, out["data_parallel_size"]["value"])
        if key in flags:
            out[key] = _typed(key, flags[key], "given")
        elif logged.get(key) is not None:
            out[key] = _typed(key, logged[key], "vLLM log")
        else:
            known = default is not None or key in DEFAULT_IS_NONE
            out[key] = {"value": default, "source": "vLLM 0.26 default" if known else "unknown"}
    return out


def default_api_servers(given: dict[str, Any], data_parallel: Any) -> int:
    """vLLM 0.26's --api-server-count where the command does not give it (entrypoints/cli/serve.py): one per engine
    (its internal load balancer, the default); the local engines' count in the hybrid mode; one where an external
    load balancer or the multi-port mode spreads the requests, or with --headless (none: taken as one)."""
    if any(given.get(k) for k in ("data_parallel_external_lb", "data_parallel_multi_port_external_lb", "headless")) \
            or given.get("data_parallel_rank") is not None:
        return 1
    count = data_parallel
    if given.get("data_parallel_hybrid_lb") or given.get("data_parallel_start_rank") is not None:
        count = given.get("data_parallel_size_local")
    return int(count) if isinstance(count, (int, float)) and not isinstance(count, bool) and count >= 1 else 1


def _typed(key: str, value: Any, source: str) -> dict[str, Any]:
    """A setting's value where it has the type vLLM reads it as (a number, true/false for a switch); else no value,
    and the source says what was given (vLLM would refuse it)."""
    # '10G', '32k', 'auto': vLLM's own spellings (read as a number or None, never the text given)
    if key in HUMAN_READABLE and isinstance(value, str) and (read := read_as_vllm(key, value)) is not value:
        return {"value": read, "source": source}
    number = key in NUMERIC_SETTINGS
    wrong = (number and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)))) \
        or (key in SWITCHES and not isinstance(value, bool))
    if wrong:
        return {"value": None, "source": f"{source}: {one_line(repr(value), 40)} is not a "
                                         f"{'number' if number else 'true/false'} (vLLM would refuse it)"}
    return {"value": value, "source": source}


# --- vLLM's own parsers (the GPU box) --------------------------------------------------------------------------

def vllm_parser(words: list[str]):  # pragma: no cover - needs vLLM (the GPU box)
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


def dump_options() -> dict[str, Any]:  # pragma: no cover - run on the GPU box to record the option list
    """Every option string of the subcommands profkit uses, from vLLM's own parsers."""
    import argparse

    import vllm

    out: dict[str, Any] = {"vllm_version": vllm.__version__, "commands": {}}
    for sub in SUBCOMMANDS:
        parser, _ = vllm_parser(list(sub))
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


if __name__ == "__main__":  # pragma: no cover - `python -m profkit.vllm.options > 0.26.0.json`
    json.dump(dump_options(), sys.stdout, indent=1, sort_keys=True)
