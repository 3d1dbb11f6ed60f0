"""`profkit attach URL`: watch a running vLLM server through its own endpoints and write a capture folder (kind
live) that `report`, `diff` and `history` read like any other.

Only GETs of what the server publishes (`/version`, `/v1/models`, `/metrics`), at most one a second, each with a
timeout and a size cap; a profile window (`/start_profile` ... `/stop_profile`) only when asked. Credentials come
from `--header` or the environment and are sent, never written to the folder or printed.

On the server's own machine (a loopback URL or one of this host's addresses) attach also finds the process that
listens on the port: its command line becomes the run's command (the report's suggested command is built on it),
its process tree is sampled as `capture` samples it (`host.json`), and the served model's config.json and the GPU's
name are kept beside the series. None of that is needed: a remote server is watched through its endpoints alone."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from profkit.capture.host import start_sampler
from profkit.capture.manifest import Manifest, gpu_identity
from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.evidence import folder as files
from profkit.evidence.metrics import MetricsScrape, counter_delta, parse_metrics

MIN_INTERVAL_S = 1.0  # a scrape a second at most: /metrics renders every series on the server's event loop
TIMEOUT_S = 5.0
MAX_METRICS_BYTES = 16 << 20  # a server with many LoRA adapters or label sets: a few MB; more is not /metrics
MAX_SMALL_BYTES = 256 << 10
TOKEN_ENV = ("PROFKIT_API_KEY", "VLLM_API_KEY")  # sent as "Authorization: Bearer ..." when no header is given
# The gauges and counters the watch line and the live report read, kept per scrape in the series.
SERIES_PREFIX = "vllm:"


class AttachError(ProfkitError):
    """The server cannot be watched (unreachable, refused, not vLLM, broken metrics): one line."""


@dataclass(frozen=True)
class AttachOptions:
    url: str
    out: Path
    duration_s: float = 60.0
    interval_s: float = 5.0
    every_s: float | None = None  # a progress line per interval
    profile_s: float | None = None  # a profile window of this many seconds, taken at the start
    headers: dict[str, str] = field(default_factory=dict)


def base_url(url: str) -> str:
    """The server's root URL: http(s) only, no credentials in it, no path beyond the root."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AttachError(f"{one_line(url, 120)}: not an http(s) URL of a server (e.g. http://127.0.0.1:8000)")
    if parts.username or parts.password:
        raise AttachError("credentials in the URL would be written down: give them with --header "
                          "'Authorization: Bearer ...' or PROFKIT_API_KEY")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def request_headers(given: dict[str, str]) -> dict[str, str]:
    headers = {"User-Agent": "profkit-attach", **given}
    if not any(k.lower() == "authorization" for k in headers):
        token = next((os.environ[k] for k in TOKEN_ENV if os.environ.get(k)), None)
        if token:
            headers["Authorization"] = f"Bearer {token}"
    return headers


def fetch(root: str, path: str, headers: dict[str, str], limit: int, method: str = "GET") -> str:
    """One request; its body as text, or AttachError naming the endpoint and what went wrong."""
    url = root + path
    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 (scheme checked in base_url)
            body = resp.read(limit + 1)
    except urllib.error.HTTPError as exc:
        why = {401: "401 unauthorized: give a token (--header 'Authorization: Bearer ...' or PROFKIT_API_KEY)",
               403: "403 forbidden", 404: "404 not found"}.get(exc.code, f"HTTP {exc.code}")
        raise AttachError(f"{url}: {why}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AttachError(f"{url}: cannot reach the server ({one_line(reason, 160)})") from None
    if len(body) > limit:
        raise AttachError(f"{url}: the answer is larger than {limit >> 20 or limit >> 10} "
                          f"{'MB' if limit >> 20 else 'kB'}: not what a vLLM server sends")
    return body.decode("utf-8", errors="replace")


def _json(root: str, path: str, headers: dict[str, str]) -> Any:
    try:
        return json.loads(fetch(root, path, headers, MAX_SMALL_BYTES))
    except json.JSONDecodeError:
        return None
    except AttachError:
        return None  # identity is a nicety: /metrics decides whether this is vLLM


def scrape(root: str, headers: dict[str, str]) -> tuple[str, MetricsScrape]:
    text = fetch(root, "/metrics", headers, MAX_METRICS_BYTES)
    try:
        parsed = parse_metrics(text)
    except ProfkitError as exc:
        raise AttachError(f"{root}/metrics: {exc}") from None
    if not any(k.startswith(SERIES_PREFIX) for k in parsed.values):
        raise AttachError(f"{root}/metrics: no vllm: series: not a vLLM server's metrics")
    return text, parsed


def watch_line(t: float, first: MetricsScrape, before: MetricsScrape, now: MetricsScrape, dt: float) -> str:
    """One interval, as `--every` prints it."""
    interval = counter_delta(before, now)
    done = interval.get("vllm:request_success_total", 0.0)
    gen = interval.get("vllm:generation_tokens_total", 0.0)
    v = now.values
    usage = v.get("vllm:kv_cache_usage_perc", v.get("vllm:gpu_cache_usage_perc"))
    preempted = counter_delta(first, now).get("vllm:num_preemptions_total", 0.0)
    parts = [f"{t:6.0f} s", f"{done / dt:6.2f} req/s", f"{gen / dt:8.0f} tok/s",
             f"running {v.get('vllm:num_requests_running', 0):.0f}",
             f"waiting {v.get('vllm:num_requests_waiting', 0):.0f}"]
    if usage is not None:
        parts.append(f"KV {usage * 100:.0f} %")
    parts.append(f"preemptions {preempted:.0f}")
    return "  ".join(parts)


def attach(opts: AttachOptions, say: Callable[[str], None] = lambda _m: None,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Path:
    """Watch the server for `opts.duration_s`; the capture folder written."""
    if not (math.isfinite(opts.duration_s) and opts.duration_s > 0):
        raise AttachError("--duration must be a positive duration")
    root, headers = base_url(opts.url), request_headers(opts.headers)
    interval = max(MIN_INTERVAL_S, opts.interval_s)
    if interval != opts.interval_s:
        say(f"--interval {opts.interval_s:g} s: scraping every {MIN_INTERVAL_S:g} s, the least (a scrape renders every "
            "series on the server's event loop)")
    if opts.out.exists():
        raise AttachError(f"{opts.out} already exists: choose another --out")
    before_text, first = scrape(root, headers)  # before the folder: an endpoint that is no vLLM leaves nothing
    version = _json(root, "/version", headers)
    models = _json(root, "/v1/models", headers)
    local = local_server(root)
    if opts.profile_s:  # refused before the folder exists: a server without a profiler leaves nothing behind
        _start_profile(root, headers)
    opts.out.mkdir(parents=True)
    folder = files.CaptureFolder(opts.out)
    model = _model(models)
    identity = {"url": root, "vllm": (version or {}).get("version") if isinstance(version, dict) else None,
                "model": model.get("id"), "max_model_len": model.get("max_model_len"),
                "authenticated": any(k.lower() == "authorization" for k in headers)}
    environment: dict[str, Any] = {"vllm": identity["vllm"]} if identity["vllm"] else {}
    ran: dict[str, Any] = {}
    if local is not None:
        identity["pid"] = local.pid
        flags = local.argv[2:]  # the flags vLLM ran with, without the model's name (as capture records them)
        ran = {"user_commands": [local.argv],
               "vllm_args": flags[1:] if flags and not flags[0].startswith("-") else flags}
        environment.update({k: v for k, v in gpu_identity().items() if v})
    manifest = Manifest.begin(folder.file(files.MANIFEST), {
        "kind": "live", "commands": [f"profkit attach {root} --duration {opts.duration_s:g}s",
                                     *([shlex.join(local.argv) + "   # the server, found on this host"]
                                       if local else [])],
        **ran, "live": {k: v for k, v in identity.items() if v is not None}, "environment": environment})
    served = (local.model if local else None) or model.get("root")
    if served and local and not folder.write_model_config(served):
        manifest.note(f"{files.MODEL_CONFIG} not written: {served} is no local folder with a config.json")
    sampler = _sampler(local.pid) if local else None
    folder.file(files.METRICS_BEFORE).write_text(before_text)
    say(f"attached to {root}" + (f" (vLLM {identity['vllm']}" + (f", {model.get('id')}" if model.get("id") else "")
                                 + ")" if identity["vllm"] else ""))
    profiled = _profile(root, headers, opts.profile_s, say, sleep) if opts.profile_s else None
    start = clock()
    series = [msgspec.structs.replace(_vllm_only(first), t=0.0)]
    lost: AttachError | None = None
    last_text, mark, marked = before_text, start, first
    with open(folder.file(files.METRICS_SERIES), "wb") as out:
        out.write(msgspec.json.encode(series[0]) + b"\n")
        while (now := clock()) - start < opts.duration_s:
            sleep(min(interval, max(0.0, opts.duration_s - (now - start))))
            try:
                last_text, current = scrape(root, headers)
            except AttachError as exc:  # the server went away (a restart, a deploy): the window so far is kept
                lost = exc
                break
            t = clock() - start
            record = msgspec.structs.replace(_vllm_only(current), t=round(t, 3))
            out.write(msgspec.json.encode(record) + b"\n")
            series.append(record)
            if opts.every_s and t - (mark - start) >= opts.every_s:
                say(watch_line(t, first, marked, current, max(t - (mark - start), 1e-9)))
                mark, marked = start + t, current
    folder.file(files.METRICS_AFTER).write_text(last_text)
    if sampler is not None:
        folder.write_host(sampler.stop())
    manifest.note(f"{len(series)} scrapes over {series[-1].t or 0:.0f} s, one every {interval:g} s")
    if profiled:
        manifest.note(profiled)
    if lost is not None:
        manifest.finish("interrupted", where=str(lost))
        raise AttachError(f"{lost}: the window ends at {series[-1].t or 0:.0f} s; {opts.out} keeps it "
                          f"(profkit report {opts.out})")
    manifest.finish("ok")
    return opts.out


def _vllm_only(scrape_: MetricsScrape) -> MetricsScrape:
    # gauges and counters only: the histograms' buckets and the `*_info` labels are in metrics-before/after.txt
    return MetricsScrape({k: v for k, v in scrape_.values.items() if k.startswith(SERIES_PREFIX)})


def _model(models: Any) -> dict[str, Any]:
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    return {k: first[k] for k in ("id", "root", "max_model_len") if isinstance(first.get(k), (str, int))}


# --- the server's own machine ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalServer:
    """The `vllm serve` process behind a URL on this machine."""

    pid: int  # the root of the server's process tree
    argv: list[str]  # its command line as `vllm serve ...`
    model: str | None  # the model it serves, as given (a local folder or a hub id)


def serve_argv(cmdline: list[str]) -> list[str] | None:
    """A server process's command line as `vllm serve ...` (`vllm serve`, `python -m vllm.entrypoints.cli.main
    serve`, `python -m vllm.entrypoints.openai.api_server`), or None when it is none of them."""
    for i, word in enumerate(cmdline):
        name = word.rsplit("/", 1)[-1]
        if name in ("vllm", "vllm.entrypoints.cli.main") and cmdline[i + 1:i + 2] == ["serve"]:
            return ["vllm", "serve", *cmdline[i + 2:]]
        if name == "vllm.entrypoints.openai.api_server":
            return ["vllm", "serve", *cmdline[i + 1:]]
    return None


def _this_host(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::") or host.startswith("127."):
        return True
    with contextlib.suppress(OSError):
        if host in (socket.gethostname(), socket.getfqdn()):
            return True
    try:
        import psutil
    except ImportError:
        return False
    return any(a.address.split("%")[0] == host for addrs in psutil.net_if_addrs().values() for a in addrs)


def local_server(root: str) -> LocalServer | None:
    """The vLLM server listening on `root`'s port when it runs on this machine and this user may see it (psutil);
    None otherwise: attach then works from the endpoints alone."""
    parts = urllib.parse.urlsplit(root)
    if not parts.hostname or not _this_host(parts.hostname):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        import psutil
    except ImportError:
        return None
    try:
        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.pid and c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    except (psutil.Error, OSError):
        return None
    for pid in sorted(pids):
        # With several API servers the listener is a child (its title set by vLLM): the command is its parent's.
        try:
            proc: Any = psutil.Process(pid)
            while proc is not None:
                argv = serve_argv(proc.cmdline())
                if argv is not None:
                    return LocalServer(proc.pid, argv, _served_model(argv))
                proc = proc.parent()
        except psutil.Error:
            continue
    return None


def _served_model(argv: list[str]) -> str | None:
    from profkit.vllm.command import VllmCommand

    command = VllmCommand.find_in(argv)
    try:
        return command.model if command else None
    except (ProfkitError, ValueError):
        return None


def _sampler(pid: int) -> Any:
    """The server's process tree sampled as `capture` samples it; None without psutil (never fails attach)."""
    sampler = start_sampler(interval_s=0.5)
    if sampler is not None:
        sampler.watch("server", pid)
    return sampler


def _start_profile(root: str, headers: dict[str, str]) -> None:
    try:
        fetch(root, "/start_profile", headers, MAX_SMALL_BYTES, method="POST")
    except AttachError as exc:
        raise AttachError(f"{exc} (a profile window needs a server started with --profiler-config)") from None


def _profile(root: str, headers: dict[str, str], seconds: float, say: Callable[[str], None],
             sleep: Callable[[float], None]) -> str:
    """The rest of the profile window started before the folder (the server's own profiler writes the trace where
    its --profiler-config says)."""
    say(f"profiling for {seconds:g} s")
    sleep(seconds)
    fetch(root, "/stop_profile", headers, MAX_SMALL_BYTES, method="POST")
    return f"a {seconds:g} s profile window was taken at the start; the trace is where the server's " \
           "--profiler-config writes it"
