"""The manifest as a capture goes: `manifest.json` saved whole after every step, with the environment it ran in.
Its file name and every other file of the folder are `profkit.evidence.folder`'s; reading a finished manifest is
`profkit.evidence.manifest`'s."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit import __version__
from profkit.evidence.folder import MANIFEST, SESSION, CaptureFolder, write_atomic


def start_manifest(folder: CaptureFolder, plan: Any) -> Manifest:
    """Create the folder and its manifest for `plan` (a capture.plan.Plan): status "running"."""
    folder.path.mkdir(parents=True, exist_ok=True)
    return Manifest.start(folder.file(MANIFEST), plan)


def _version(argv: list[str], timeout: float = 60.0) -> str | None:
    """First line a tool prints about its version, or None (best effort: never fails a capture)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in (out.stdout or out.stderr).splitlines() if line.strip()]
    return lines[-1] if out.returncode == 0 and lines else None


def gpu_identity() -> dict[str, str | None]:
    """This machine's GPU name and driver (nvidia-smi's last GPU; both None without one)."""
    gpu = _version(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], timeout=20)
    return {"gpu": gpu.split(",")[0].strip() if gpu else None,
            "driver": gpu.split(",")[1].strip() if gpu and "," in gpu else None}


def environment(plan: Any) -> dict[str, Any]:
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        **gpu_identity(),
        "nsys": _version([plan.nsys_exe, "--version"]) if plan.nsys_exe else None,
        "vllm": _version([plan.vllm_exe, "--version"]),
        "torch": _version(["python3", "-c", "import torch; print(torch.__version__)"]),
    }


@dataclass
class Manifest:
    """`manifest.json` while a capture runs: saved whole (a temporary file renamed) after every change."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0

    @classmethod
    def begin(cls, path: Path, data: dict[str, Any]) -> Manifest:
        """A manifest of the given contents, status "running", saved now."""
        now = time.time()
        m = cls(path=path, started=now, data={"profkit_version": __version__, "status": "running",
                                               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
                                               **data, "steps": [], "notes": []})
        m.save()
        return m

    @classmethod
    def start(cls, path: Path, plan: Any) -> Manifest:
        now = time.time()
        m = cls(path=path, started=now, data={
            "profkit_version": __version__,
            "kind": plan.kind,
            "status": "running",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now)),
            "commands": plan.commands(),
            "user_commands": [c.argv() for c in plan.user.commands],
            "vllm_args": plan.vllm_args,
            "environment": environment(plan),
            "steps": [],
            "notes": [],
        })
        m.save()
        return m

    def save(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=2) + "\n")

    def step(self, step: Any, started: float, exit_code: int | None, note: str | None = None) -> None:
        entry = {"name": step.name, "command": step.shell(), "log": step.log, "exit_code": exit_code,
                 "seconds": round(time.time() - started, 3)}
        if note:
            entry["note"] = note
        self.data["steps"].append(entry)
        self.save()

    def server_started(self, step: Any, pid: int) -> None:
        self.data["server"] = {"command": step.shell(), "log": step.log, "pid": pid}
        self.save()

    def server_exit(self, code: int | None) -> None:
        self.data.setdefault("server", {})["exit_code"] = code
        self.save()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    def finish(self, status: str, where: str | None = None) -> None:
        self.data["status"] = status
        if where:
            self.data["failed_at"] = where
        self.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.data["seconds"] = round(time.time() - self.started, 3)
        self.data["files"] = sorted(str(p.relative_to(self.path.parent)) for p in self.path.parent.rglob("*")
                                    if p.is_file() and p.name not in (MANIFEST, SESSION))
        self.save()
