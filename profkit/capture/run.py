"""Run a capture plan: subprocess lifecycle, server health, metrics scrapes, signals, timeouts.

Failure is data too: whatever happens (a tool missing, vLLM crashing, Ctrl-C), the folder keeps
every file written so far and `manifest.json` says what ran, how it ended and where it stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from profkit.capture.host import HostSampler, start_sampler
from profkit.capture.manifest import Manifest, environment, start_manifest
from profkit.capture.plan import NSYS_FLUSH_MS, Plan, Step
from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.evidence import folder as files
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.vllm_log import start_failure

T = TypeVar("T")
STOP_GRACE_S = 180.0  # nsys needs time to flush a large report after SIGINT
GROUP_GRACE_S = 60.0  # for the server's children to exit after the server itself


class CaptureError(ProfkitError):
    """A capture that could not start or did not finish; the message says which step and why, and
    `interrupted` whether it was stopped (Ctrl-C, SIGTERM) rather than failed."""

    def __init__(self, message: str, interrupted: bool = False) -> None:
        super().__init__(message)
        self.interrupted = interrupted


def preflight(plan: Plan) -> None:
    """Refuse to start when a tool is missing or the port is taken: nothing has run yet."""
    steps = [s for run in plan.runs for s in run] + [s for s in (plan.server, plan.bench) if s] + plan.exports
    for exe in dict.fromkeys(s.argv[0] for s in steps):
        if shutil.which(exe) is None:
            raise CaptureError(f"{exe!r} not found on PATH: install it or pass its path (--nsys / --vllm)")
    if plan.port is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # As servers do (uvicorn, http.server): a port whose last server just exited (TIME_WAIT) is free
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", plan.port))
            except OSError:
                raise CaptureError(f"port {plan.port} is already in use: pick another with --port") from None
    if plan.folder.exists():
        raise CaptureError(f"{plan.out} already holds a capture: choose another --out")


def run_capture(plan: Plan, say: Callable[[str], None] = lambda _m: None) -> Path:
    """Execute the plan; returns the capture folder. Raises CaptureError after recording the failure."""
    preflight(plan)
    folder = plan.folder
    manifest = start_manifest(folder, plan)
    _model_config(plan, folder, manifest)
    server: subprocess.Popen | None = None
    try:
        if plan.kind == "offline":
            for run in plan.runs:
                for step in run:
                    bench = step.name.startswith("vllm bench")
                    sampler = _sampler(manifest) if bench and folder.host_path is None else None
                    try:
                        _run_step(step, plan.out, manifest, say, on_start=_watcher(sampler, "offline"))
                    finally:
                        _write_host(sampler, folder)
        else:
            assert plan.bench is not None  # a served plan has its benchmark client
            server = _start_server(plan, manifest, say)
            _scrape(plan, "before", manifest)
            sampler = _sampler(manifest)
            if sampler:
                sampler.watch("server", server.pid)
            try:
                _run_step(plan.bench, plan.out, manifest, say, on_start=_watcher(sampler, "client"))
            finally:
                _write_host(sampler, folder)
            _scrape(plan, "after", manifest)
            if (export := plan.gpu_metrics_export(plan.out)) is not None:
                _run_step(export, plan.out, manifest, say)
            if plan.nsys_exe:  # let nsys save the CUDA records of the benchmark's last moments before the stop
                time.sleep(3 * NSYS_FLUSH_MS / 1000)
            _stop(server, manifest, say)
            server = None
            for step in plan.exports:
                _run_step(step, plan.out, manifest, say)
        manifest.finish("ok")
    except KeyboardInterrupt:
        say("interrupted: stopping vLLM and letting nsys finish its report")
        if server is not None:
            _stop(server, manifest, say)
            server = None
            for step in plan.exports:  # the partial trace is still worth having
                with contextlib.suppress(CaptureError, KeyboardInterrupt):
                    _run_step(step, plan.out, manifest, say)
        manifest.finish("interrupted", where="Ctrl-C")
        raise CaptureError(f"interrupted; partial capture kept in {plan.out}", interrupted=True) from None
    except CaptureError as exc:
        if server is not None:
            _stop(server, manifest, say)
        manifest.finish("failed", where=str(exc))
        raise CaptureError(f"{exc} (logs and partial files kept in {plan.out})") from None
    return plan.out


class ServerSession:
    """One `vllm serve` lifetime and any number of benchmark runs against it: the server starts once (a start-up
    is minutes, a benchmark run tens of seconds), takes a warm-up batch, then each run sends its own prompts
    (its own `--seed`: the same prompts twice would be served from the prefix cache, measured at 1.9x).

        with ServerSession(plan, say) as session:
            first = session.run("r1")      # a capture folder: bench.json, logs, metrics, host.json, manifest
            second = session.run("r2")

    The session folder holds the server's whole log, the warm-up's result and `session.json` (the server's
    command, start-up time, the runs it served); each run is a capture folder of its own, its `server.log` the
    server's start-up lines and the lines written while it ran, its manifest naming the session."""

    def __init__(self, plan: Plan, say: Callable[[str], None] = lambda _m: None, warmup: bool = True) -> None:
        if plan.kind != "serve" or plan.nsys_exe or plan.vllm_profiler:
            raise CaptureError("a server session runs unprofiled `vllm serve` (profile one run on its own)")
        self.plan, self.say, self.warmup = plan, say, warmup
        self.server: subprocess.Popen | None = None
        self.manifest: Manifest | None = None
        self.environment: dict[str, Any] = {}
        self.startup_s = 0.0
        self.startup_end = 0  # bytes of the server log up to /health: the start-up lines every run's log keeps
        self.runs: list[dict[str, Any]] = []
        self.seed = plan.seed()

    @property
    def log_path(self) -> Path:
        return self.plan.out / files.SERVER_LOG

    def __enter__(self) -> ServerSession:
        plan = self.plan
        assert plan.server is not None  # a session is a served plan's (capture_runs checks it)
        preflight(plan)
        if (plan.out / files.SESSION).exists():
            raise CaptureError(f"{plan.out} already holds a session: choose another --out")
        plan.out.mkdir(parents=True, exist_ok=True)
        self.environment = environment(plan)
        self.manifest = Manifest.begin(plan.out / files.SESSION, {
            "kind": "serve-session", "server_command": plan.server.shell(),
            "user_commands": [c.argv() for c in plan.user.commands], "vllm_args": plan.vllm_args,
            "environment": self.environment, "runs": []})
        try:
            self.server = _start_server(plan, self.manifest, self.say)
            self.startup_s = round(time.time() - self.manifest.started, 1)
            self.startup_end = self.log_path.stat().st_size
            self.manifest.data["startup_s"] = self.startup_s
            if self.warmup:
                _run_step(plan.warmup_step(), plan.out, self.manifest, self.say)
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        return self

    def run(self, name: str, rate: float | None = None, prompts: int | None = None) -> Path:
        """One benchmark run into the capture folder `name` (its own --seed; `rate` and `prompts`: a sweep's
        point); raises CaptureError when it fails (the folder and its manifest say how), KeyboardInterrupt on
        Ctrl-C."""
        plan, server = self.plan, self.server
        assert server is not None and self.manifest is not None and plan.server is not None
        if exited(server):
            why = start_failure(self.log_path)
            raise CaptureError(f"vllm serve exited with code {server.returncode}"
                               f"{': ' + one_line(why, 600) if why else ''}; see {self.log_path}")
        folder = CaptureFolder(plan.out / name)
        folder.path.mkdir(parents=True, exist_ok=False)
        seed = self.seed + len(self.runs)
        step = plan.bench_step(folder.path, seed=seed, prompts=prompts, rate=rate)
        client = plan.client_for(seed, prompts, rate) if plan.client else None
        server_cmd = plan.user.role("server")
        manifest = Manifest.begin(folder.file(files.MANIFEST), {
            "kind": "serve", "commands": [plan.server.shell() + "   # shared: see ../" + files.SESSION, step.shell()],
            "user_commands": [c.argv() for c in (server_cmd, client) if c], "vllm_args": plan.vllm_args,
            "environment": self.environment,
            "session": {"folder": str(plan.out), "run": len(self.runs) + 1, "seed": seed,
                        "server_pid": server.pid, "server_startup_s": self.startup_s}})
        start = self.log_path.stat().st_size
        entry = {"run": name, "seed": seed, "status": "running"}
        self.runs.append(entry)
        try:
            _scrape(plan, "before", manifest, folder)
            sampler = _sampler(manifest)
            if sampler:
                sampler.watch("server", server.pid)
            try:
                _run_step(step, folder.path, manifest, self.say, on_start=_watcher(sampler, "client"))
            finally:
                _write_host(sampler, folder)
                self._slice_log(folder, start)
            _scrape(plan, "after", manifest, folder)
            _model_config(plan, folder, manifest)
            if (export := plan.gpu_metrics_export(folder.path)) is not None:
                _run_step(export, folder.path, manifest, self.say)
            manifest.finish("ok")
            entry["status"] = "ok"
        except KeyboardInterrupt:
            manifest.finish("interrupted", where="Ctrl-C")
            entry["status"] = "interrupted"
            raise
        except CaptureError as exc:
            manifest.finish("failed", where=str(exc))
            entry["status"] = "failed"
            raise
        finally:
            self.manifest.data["runs"] = self.runs
            self.manifest.save()
        return folder.path

    def _slice_log(self, folder: CaptureFolder, start: int) -> None:
        """The run's server log: the start-up lines (KV cache size, the flags), then what it logged meanwhile."""
        with self.log_path.open("rb") as f:
            head = f.read(self.startup_end)
            f.seek(start)
            tail = f.read()
        folder.file(files.SERVER_LOG).write_bytes(head + tail)

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if self.manifest is None:
            return
        if self.server is not None:
            _stop(self.server, self.manifest, self.say)
            self.server = None
        if kind is None:
            self.manifest.finish("ok")
        elif issubclass(kind, KeyboardInterrupt):
            self.manifest.finish("interrupted", where="Ctrl-C")
        else:
            self.manifest.finish("failed", where=str(exc))


def capture_runs(plan: Plan, replicates: int = 1, say: Callable[[str], None] = lambda _m: None) -> list[Path]:
    """The plan's capture (one folder), or `replicates` runs of an unprofiled served configuration against one
    server (a session folder of capture folders r1, r2, ...); returns the capture folders."""
    if replicates <= 1:
        return [run_capture(plan, say)]
    if plan.kind != "serve" or plan.nsys_exe or plan.vllm_profiler:
        raise CaptureError("replicates share one server: `profkit capture --tool none --replicates N serve ...` "
                           "(profile one run on its own)")
    return run_replicates(plan, replicates, say)


def run_replicates(plan: Plan, replicates: int, say: Callable[[str], None] = lambda _m: None) -> list[Path]:
    """`replicates` benchmark runs against one server lifetime (r1, r2, ...); returns their capture folders."""
    try:
        with ServerSession(plan, say) as session:
            return [session.run(CaptureFolder.replicate_name(i + 1)) for i in range(replicates)]
    except KeyboardInterrupt:
        raise CaptureError(f"interrupted; partial session kept in {plan.out}", interrupted=True) from None


def _model_config(plan: Plan, folder: CaptureFolder, manifest: Manifest) -> None:
    """The served model's config.json beside the run (its shape: FLOPs and bytes per token)."""
    if plan.model and not folder.write_model_config(plan.model):
        manifest.note(f"{files.MODEL_CONFIG} not written: {plan.model} is no local folder with a config.json "
                      "(give profkit report --model-config)")


def _watcher(sampler: HostSampler | None, tree: str) -> Callable[[subprocess.Popen], None] | None:
    """What to do once a step's process starts: have the sampler watch its tree (none without a sampler)."""
    if sampler is None:
        return None
    return lambda proc: sampler.watch(tree, proc.pid)


def _sampler(manifest: Manifest) -> HostSampler | None:
    """Per-process CPU sampling while the benchmark runs (host.json); never fails a capture."""
    sampler = start_sampler()
    if sampler is None:
        manifest.note(f"{files.HOST} not written: psutil is not installed")
    return sampler


def _write_host(sampler: HostSampler | None, folder: CaptureFolder) -> None:
    if sampler is not None:
        folder.write_host(sampler.stop())


def _run_step(step: Step, out: Path, manifest: Manifest, say: Callable[[str], None],
              on_start: Callable[[subprocess.Popen], None] | None = None) -> None:
    say(f"{step.name}: {step.shell()}")
    started = time.time()
    with (out / step.log).open("ab") as log:
        proc = subprocess.Popen(step.argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **step.env},
                                start_new_session=True)
        if on_start:
            on_start(proc)
        try:
            if not exited(proc, step.timeout_s):
                _signal_group(proc, signal.SIGINT)
                _wait_or_kill(proc, STOP_GRACE_S)
                manifest.step(step, started, proc.returncode, note=f"timed out after {step.timeout_s:g} s")
                raise CaptureError(f"{step.name} timed out after {step.timeout_s:g} s")
            code = proc.returncode
        except KeyboardInterrupt:
            _signal_group(proc, signal.SIGINT)
            _wait_or_kill(proc, STOP_GRACE_S)
            manifest.step(step, started, proc.returncode, note="interrupted")
            raise
    manifest.step(step, started, code)
    if code != 0:
        raise CaptureError(f"{step.name} exited with code {code}; see {out / step.log}")


def _start_server(plan: Plan, manifest: Manifest, say: Callable[[str], None]) -> subprocess.Popen:
    step = plan.server
    assert step is not None and plan.port is not None
    say(f"{step.name}: {step.shell()}")
    log = (plan.out / step.log).open("ab")
    proc = subprocess.Popen(step.argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **step.env},
                            start_new_session=True)
    log.close()
    manifest.server_started(step, proc.pid)
    deadline = time.time() + plan.health_timeout_s
    url = f"http://127.0.0.1:{plan.port}/health"
    while time.time() < deadline:
        if exited(proc):
            manifest.server_exit(proc.returncode)
            why = start_failure(plan.out / step.log)
            raise CaptureError(f"vllm serve exited with code {proc.returncode} before it was healthy"
                               f"{': ' + one_line(why, 600) if why else ''}; see {plan.out / step.log}")
        if _get(url, timeout=2.0) is not None:
            say(f"server healthy after {time.time() - manifest.started:.0f} s")
            return proc
        time.sleep(1.0)
    _stop(proc, manifest, say)
    why = start_failure(plan.out / step.log)  # a server whose workers died may hang instead of exiting
    raise CaptureError(f"vllm serve was not healthy within {plan.health_timeout_s:g} s"
                       f"{': ' + one_line(why, 600) if why else ''}; see {plan.out / step.log}")


def _scrape(plan: Plan, which: str, manifest: Manifest, folder: CaptureFolder | None = None) -> None:
    """/metrics `before` or `after` the benchmark, into `folder` (the plan's own by default)."""
    text = _get(f"http://127.0.0.1:{plan.port}/metrics", timeout=10.0)
    if text is None:
        manifest.note(f"could not scrape /metrics {which} the benchmark")
        return
    (folder or plan.folder).write_metrics(which, text)


def _get(url: str, timeout: float) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback only
            return resp.read().decode("utf-8", "replace") if resp.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def exited(proc: subprocess.Popen, timeout: float | None = 0.0) -> bool:
    """Whether `proc` has exited (its returncode then set), waiting up to `timeout` seconds (None: until it does).

    Not Popen.wait or poll: they take Popen's internal lock with a non-blocking acquire just before a `try`, and a
    KeyboardInterrupt (raised by `main_interrupt_safe`'s handler) landing between the two leaves it held. Every later
    wait then blocks for ever (a Ctrl-C during a loaded test run hung `profkit tune` with its benchmark a zombie).
    os.waitpid takes no lock."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while proc.returncode is None:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped already, its status lost to an interrupt: gone, its code unknown (None)
            return True
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            break
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_or_kill(proc: subprocess.Popen, grace: float) -> None:
    if not exited(proc, grace):
        _signal_group(proc, signal.SIGTERM)
        if not exited(proc, 30.0):
            _signal_group(proc, signal.SIGKILL)
            exited(proc, None)


def _stop(proc: subprocess.Popen, manifest: Manifest, say: Callable[[str], None]) -> None:
    """SIGINT to the server's process group (vLLM shuts down, nsys finalizes its report), then wait."""
    if not exited(proc):
        say("stopping vllm serve (SIGINT)")
        _signal_group(proc, signal.SIGINT)
        _wait_or_kill(proc, STOP_GRACE_S)
    # vLLM's EngineCore and workers are children in the server's process group and hold the GPU memory:
    # the next run (a replicate, a tune step) must not start while they linger.
    if not _group_gone(proc.pid, GROUP_GRACE_S):
        _signal_group(proc, signal.SIGKILL)
        _group_gone(proc.pid, 10.0)
        manifest.note("server processes outlived the server; killed")
    manifest.server_exit(proc.returncode)


def _group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        time.sleep(0.2)
    return False


def main_interrupt_safe(fn: Callable[[], T]) -> T:
    """Run `fn` with SIGINT and SIGTERM raising KeyboardInterrupt, so a stopped capture stops vLLM and keeps files.

    SIGINT is set too, not left to Python: a process started with SIGINT ignored (a background job of a shell
    script, which ignores it for its `&` children) gets no KeyboardInterrupt from Python, so a `kill -INT` was lost
    and the run went on to exit 0 as if complete. A handled signal is also reset to its default in the programs
    started here (vLLM, nsys), where an ignored one would be inherited and their own stop on SIGINT lost."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        return fn()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        sys.stdout.flush()
