"""Would vLLM start with a command? Its words checked with vLLM's own parser and EngineArgs where vLLM is
importable (the GPU box), else against the option list recorded from vLLM 0.26.0 (profkit.vllm.options).
`VllmCommand.check()` adds the check of one spelling per setting.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

from profkit.vllm.options import RECORDED_VERSION, looks_like_option, normalize_flag, spec_for, spellings, vllm_parser


@dataclass
class CheckResult:
    """Would vLLM start with it (`ok`), what checked it (`by`), and why not (`problems`)."""

    ok: bool
    by: str  # "vLLM 0.26.0 parser" | "recorded vLLM 0.26.0 options" | ...
    problems: list[str] = field(default_factory=list)


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
                if i >= len(rest) or looks_like_option(rest[i]):
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
        while i < len(rest) and (not values or opt.many) and not looks_like_option(rest[i]):
            values.append(rest[i])
            i += 1
        if not values:
            problems.append(f"{name} needs a value")
        elif opt.choices is not None:
            bad = [v for v in values if v not in [str(c) for c in opt.choices]]
            if bad:
                problems.append(f"{name} {bad[0]!r}: not one of {', '.join(map(str, opt.choices))}")
    return CheckResult(not problems, by, problems)


def check_with_vllm(words: list[str]) -> CheckResult:  # pragma: no cover - needs vLLM (the GPU box)
    """vLLM's own parser, then its EngineArgs (which checks the flags against each other as far as it can
    without a model: quantization and its config, the config flags' JSON)."""
    import vllm

    by = f"vLLM {vllm.__version__} parser and EngineArgs"
    parser, cmds = vllm_parser(words)
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
