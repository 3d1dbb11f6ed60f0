"""The copy-paste vLLM command line with every finding's flag changes applied."""

from __future__ import annotations

import shlex
from typing import Any

# Flags that are client-side (vllm bench serve), not server flags.
CLIENT_FLAGS = {"--max-concurrency", "--request-rate"}


def suggested_command(report: dict[str, Any]) -> str | None:
    """`vllm serve MODEL <the run's flags with the changes applied>`; None when nothing changes."""
    changes = [c for f in report.get("findings", []) for c in f.get("changes", []) if c["flag"] not in CLIENT_FLAGS]
    if not changes:
        return None
    vllm = report.get("vllm") or {}
    # The run's flags: those the log lists as non-default, overridden by those given.
    known = {k: v for k, v in ((vllm.get("log") or {}).get("non_default_args") or {}).items()
             if v is not None and k != "model_tag"}
    known.update(vllm.get("flags") or {})
    flags: dict[str, Any] = {f"--{k.replace('_', '-')}": v for k, v in known.items()}
    model = flags.pop("--model", None) or "MODEL"
    changed: set[str] = set()
    for c in changes:  # findings come most severe first: the first change to a flag wins
        if c["flag"] not in changed:
            changed.add(c["flag"])
            flags[c["flag"]] = c["to"]
    words = ["vllm", "serve", str(model)]
    for flag, value in flags.items():
        text = str(value).strip("'") if isinstance(value, str) else value
        if text is True or str(text).lower() == "true":
            words.append(flag)
        elif text is False or str(text).lower() == "false":
            if flag.startswith("--enable-"):
                words.append("--no-" + flag[2:])
        else:
            words += [flag, str(text)]
    return shlex.join(words)
