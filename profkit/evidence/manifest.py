"""A capture folder's `manifest.json` (written by `profkit capture`) -> `CaptureManifest`.

The file is the user's evidence and may have any JSON shape: what is not of the expected type is treated
as absent. Writing it is `profkit.evidence.folder`'s business."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

import msgspec

from profkit.errors import ProfkitError
from profkit.inputs import read_json


class CaptureManifest(msgspec.Struct, frozen=True):
    path: str
    status: str | None  # running | ok | failed | interrupted
    vllm_args: str | None  # the flags vLLM ran with, as one shell-quoted line
    user_commands: list[list[str]] | None  # the user's own commands (profkit >= the host work)
    commands: list[str] | None  # every command line run, profiler included
    environment: dict[str, Any] | None  # GPU, driver, versions: text and finite numbers only


def parse_manifest(data: Any, path: str) -> CaptureManifest:
    if not isinstance(data, dict):
        raise ProfkitError(f"{path}: not a capture manifest (expected a JSON object)")
    args = data.get("vllm_args")
    if isinstance(args, list):
        args = shlex.join(str(a) for a in args)
    recorded = data.get("user_commands")
    users = ([[str(w) for w in c] for c in recorded]
             if isinstance(recorded, list) and recorded and all(isinstance(c, list) for c in recorded) else None)
    lines = data.get("commands")
    env = data.get("environment")
    return CaptureManifest(
        path=path,
        status=data["status"] if isinstance(data.get("status"), str) else None,
        vllm_args=args if isinstance(args, str) and args else None,
        user_commands=users,
        commands=[str(line) for line in lines] if isinstance(lines, list) else None,
        # Infinity and NaN make no JSON
        environment={k: v for k, v in env.items()
                     if isinstance(v, (str, int)) or isinstance(v, float) and math.isfinite(v)}
        if isinstance(env, dict) else None,
    )


def read_manifest(path: Path) -> CaptureManifest:
    return parse_manifest(read_json(Path(path), "capture manifest"), str(path))
