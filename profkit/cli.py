"""The `profkit` command: a thin Click layer over the library (profkit.report; every output through
profkit.render.render)."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import click

from profkit import __version__, units
from profkit.errors import ProfkitError
from profkit.escape import one_line, shell_word, terminal
from profkit.inputs import refuse_overwrite
from profkit.render import output_format, render
from profkit.resources import SCHEMA_KINDS, document_schema, give_back_freed_memory


def parse_window(text: str) -> str:
    """--window START:END, each end a duration with a unit since the trace's clock began (1.5s:4s,
    13687553ns:20464823ns), as the library's START_NS:END_NS; all, auto and nvtx:NAME pass through."""
    spec = text.strip()
    if spec in ("all", "auto") or spec.startswith("nvtx:") or ":" not in spec:
        return spec
    try:
        start, end = (units.parse_duration(end) for end in spec.split(":", 1))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: each end of START:END needs a unit, e.g. 1.5s:4s or "
                                 f"13687553ns:20464823ns ({exc})", param_hint="--window") from None
    return f"{start}:{end}"


def parse_duration(text: str, option: str) -> int:
    """'100us', '1.5ms', '2s', '2min' -> integer nanoseconds (units.parse_duration), as a Click error naming
    `option`."""
    try:
        return units.parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


@click.group()
@click.version_option(__version__, prog_name="profkit")
def cli() -> None:
    """Profile vLLM inference and turn traces into concrete flag changes."""


def output_options(fn: Callable) -> Callable:
    """--format and -o (report, predict, diff): the format is the one given, else -o's extension's, else text."""
    fn = click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                      help="write here, not stdout (.html, .md, .json: that format; anything else: text)")(fn)
    return click.option("--format", "fmt", type=click.Choice(["text", "json", "md", "html"]), default=None,
                        help="text for the terminal, md for a ticket, html (self-contained), json  [default: text, "
                             "or -o's extension's]")(fn)


def evidence_options(fn: Callable) -> Callable:
    """The run's evidence besides its traces (report, predict): each option one file or text that
    `Evidence.read` reads, a bad one failing with one line that names it."""
    for option in reversed([
        click.option("--bench", type=click.Path(dir_okay=False, path_type=Path),
                     help="vllm bench JSON (throughput --output-json, serve --save-result)"),
        click.option("--vllm-log", type=click.Path(dir_okay=False, path_type=Path), help="vLLM server/engine log"),
        click.option("--metrics", type=click.Path(dir_okay=False, path_type=Path), multiple=True,
                     help="Prometheus text from /metrics; give two (before, after) for counter deltas"),
        click.option("--vllm-args", help='the flags vLLM ran with, e.g. "--max-num-seqs 64 --enforce-eager"'),
        click.option("--host", "host_json", type=click.Path(dir_okay=False, path_type=Path),
                     help="per-process CPU samples (written by profkit capture)"),
        click.option("--model-config", type=click.Path(dir_okay=False, path_type=Path),
                     help="the model's config.json (its shape: FLOPs and bytes per token, for MFU and MBU)"),
        click.option("--gpu", "gpu", metavar="NAME",
                     help="the GPU the run used, where its evidence names none (or another): matched against "
                          "profkit's peak table, e.g. 'H100 SXM', 'H200 NVL', 'L40S'"),
    ]):
        fn = option(fn)
    return fn


@cli.command()
@click.argument("traces", type=click.Path(path_type=Path), nargs=-1)
@click.option("--window", default="auto", show_default=True,
              help="all | auto (the benchmark phase) | nvtx:NAME | START:END with units, e.g. 1.5s:4s")
@output_options
@click.option("--gap-threshold", default="100us", show_default=True,
              help="list GPU gaps at least this long (e.g. 100us, 1ms, 500ms)")
@click.option("--top", type=click.IntRange(min=1, max=1_000_000), default=10, show_default=True,
              help="rows per table in text and Markdown")
@click.option("--progress/--no-progress", default=None, help="progress on stderr (default: when a terminal)")
@evidence_options
@click.option("--rules", "rules_dirs", type=click.Path(file_okay=False, path_type=Path), multiple=True,
              help="extra folder of rule YAML files")
@click.option("--save", "save_db", type=click.Path(dir_okay=False, path_type=Path),
              help="also store the run in this history database (SQLite; see `profkit history`)")
@click.option("--label", help="with --save: a label for the run (runs with one label are replicates)")
@click.option("--jobs", type=click.IntRange(min=1, max=256), default=None,
              help="traces analysed at once, one process each (several traces; default: the cores)")
@click.option("--dask", "dask_address", metavar="ADDRESS",
              help="analyse each trace as a task on this Dask scheduler (pip install 'profkit[dask]')")
def report(traces: tuple[Path, ...], window: str, fmt: str | None, output: Path | None, gap_threshold: str, top: int,
           progress: bool | None, bench: Path | None, vllm_log: Path | None, metrics: tuple[Path, ...],
           vllm_args: str | None, host_json: Path | None, model_config: Path | None, gpu: str | None,
           rules_dirs: tuple[Path, ...],
           save_db: Path | None,
           label: str | None, jobs: int | None, dask_address: str | None) -> None:
    """Analyse TRACES and print the report.

    \b
    TRACES is one of:
      an nsys SQLite export   `nsys export --type sqlite` (nsys 2021 to 2026)
      a torch.profiler trace  .json or .json.gz (Kineto, torch 1.8 on; NVIDIA CUDA or AMD ROCm)
      a capture folder        what `profkit capture` wrote (trace, benchmark, logs, host samples)
      several traces          one per rank of a multi-GPU run (or a folder of them): one report with
                              a section per rank and the cross-rank imbalance

    vLLM flag changes are suggested only for a run shown to be vLLM's (its command, log, benchmark,
    metrics or flags, or vLLM's kernel names in the trace).

    Without a trace (an unprofiled capture folder, or only --bench/--vllm-log/--metrics/--vllm-args)
    the report holds vLLM's evidence and the findings it supports."""
    from profkit.evidence.record import Evidence
    from profkit.report import ReportOptions, build_report

    fmt = output_format(fmt, str(output) if output else None)  # before any work: a format that disagrees is one line
    if label is not None and save_db is None:
        raise click.UsageError("--label names the run stored with --save: add --save DB")
    show = sys.stderr.isatty() if progress is None else progress
    trace = list(traces) if len(traces) > 1 else (traces[0] if traces else None)
    options = ReportOptions(window=parse_window(window),
                            gap_threshold_ns=parse_duration(gap_threshold, "--gap-threshold"),
                            rules_dirs=rules_dirs, jobs=jobs, dask=dask_address)
    evidence = Evidence.read(bench=bench, log=vllm_log, metrics=metrics, vllm_args=vllm_args,
                             model_config=model_config, host=host_json, gpu=gpu)
    with _Steps(show) as steps:
        doc = build_report(trace, evidence, options, progress=steps.step)
    from profkit.evidence.folder import PROTECTED

    inputs = [p for p in (*traces, bench, vllm_log, host_json, model_config, *metrics) if p is not None]
    document = doc.document()
    if output:
        refuse_overwrite(output, inputs, protected=PROTECTED)
    if save_db:
        from profkit.compare.history import save_run

        run_id = save_run(save_db, document, label=label, inputs=inputs)
        click.echo(f"saved run {run_id} in {terminal(save_db)}", err=True)
    emit(render(document, fmt, top), output)


@cli.command("predict", context_settings={"ignore_unknown_options": True})
@click.argument("run", required=False)
@click.argument("changes", nargs=-1, type=click.UNPROCESSED)
@output_options
@evidence_options
@click.option("--noise", default=None, help="the run-to-run spread to assume, e.g. 3% (default: 3%)")
@click.option("--search", "do_search", is_flag=True, help="no CHANGES: the best values the model finds")
@click.option("--frontier", "do_frontier", is_flag=True,
              help="throughput against TTFT/TPOT/E2E percentiles over request rates (under CHANGES if given), and "
                   "with --slo the largest rate that meets them (goodput)")
@click.option("--slo", "slos", multiple=True, help="with --search: a bound a configuration must meet, e.g. "
              "'mean_ttft_ms<=5000' (a percentile, 'p99_ttft_ms<=2000', ranks by goodput); with --frontier a "
              "latency bound, e.g. 'p99_ttft_ms<=2000'")
@click.option("--allow-precision-changes", is_flag=True, help="with --search: FP8 weights and KV cache may be tried")
@click.option("--top", type=click.IntRange(min=1, max=100), default=5, show_default=True,
              help="with --search: configurations shown")
def predict_cmd(run: str | None, changes: tuple[str, ...], fmt: str | None, output: Path | None, bench: Path | None,
                vllm_log: Path | None, metrics: tuple[Path, ...], vllm_args: str | None, host_json: Path | None,
                model_config: Path | None, gpu: str | None, noise: str | None, do_search: bool, do_frontier: bool,
                slos: tuple[str, ...], allow_precision_changes: bool, top: int) -> None:
    """Predict what CHANGES (vLLM flags, after --) do to RUN (a capture folder, a trace, or the evidence alone):
    request and output throughput, mean TTFT and TPOT, each with a range, the limit before and after, and why.
    With --search, the best values the model finds for the levers it knows, within --slo. With --frontier, the
    throughput and latency percentiles over request rates and the largest rate within --slo.

    \b
      profkit predict samples/vllm_14b_kv_bound -- --kv-cache-dtype fp8 --gpu-memory-utilization 0.95
      profkit predict samples/vllm_14b_kv_bound --frontier --slo "p99_tpot_ms<=60"
    """
    from profkit.evidence.record import Evidence
    from profkit.report.predict import predict_run

    fmt = output_format(fmt, str(output) if output else None)
    if run is not None and run.startswith("-"):  # `--bench B -- --flag V`: no RUN, the evidence alone
        changes, run = (run, *changes), None
    evidence = Evidence.read(bench=bench, log=vllm_log, metrics=metrics, vllm_args=vllm_args,
                             model_config=model_config, host=host_json, gpu=gpu)
    spread = _parse_share(noise, "--noise") if noise else None
    if slos and not (do_search or do_frontier):
        raise click.UsageError("--slo bounds a search or a frontier: add --search or --frontier")
    if do_search and do_frontier:
        raise click.UsageError("--search or --frontier, not both")
    # options that only a search reads were silently ignored without one
    if do_search and changes:
        raise click.UsageError("--search starts from the run's own settings: give CHANGES without --search")
    given = click.get_current_context().get_parameter_source
    if not do_search and (allow_precision_changes or given("top") is not click.core.ParameterSource.DEFAULT):
        raise click.UsageError("--top and --allow-precision-changes shape a search: add --search")
    if do_frontier:
        from profkit.report.predict import frontier_run
        from profkit.tune.loop import parse_slo

        latency_bounds = [(c.metric, c.op, c.value) for c in (parse_slo(s) for s in slos)]
        doc = frontier_run(run, shlex.join(changes) if changes else None, evidence, latency_bounds, noise=spread)
    elif do_search:
        from profkit.model.search import Bound
        from profkit.report.predict import search_run
        from profkit.tune.loop import parse_slo

        bounds = [Bound(c.metric, c.op, c.value) for c in (parse_slo(s) for s in slos)]
        doc = search_run(run, evidence, allow_precision=allow_precision_changes, bounds=bounds, top=top,
                         noise=spread)
    else:
        doc = predict_run(run, shlex.join(changes), evidence, noise=spread)
    if output:
        refuse_overwrite(output, [Path(p) for p in (run, bench, vllm_log, host_json, model_config, *metrics) if p])
    emit(render(doc, fmt), output)


@cli.command("diff")
@click.argument("before")
@click.argument("after")
@output_options
@click.option("--noise", default="5%", show_default=True,
              help="threshold assumed where a side has a single run (replicates measure it)")
@click.option("--fail-on", "fail_on", multiple=True,
              help='exit 3 when a condition holds, e.g. "request_throughput<-5%" "p99_ttft_ms>+10%"')
@click.option("--top", type=click.IntRange(min=1, max=1_000_000), default=10, show_default=True,
              help="rows per table in text and Markdown")
@click.option("--slo", "slos", multiple=True,
              help='with two sweep folders: a latency bound whose goodput each measured, e.g. "p99_tpot_ms<=15"')
def diff_cmd(before: str, after: str, fmt: str | None, output: Path | None, noise: str, fail_on: tuple[str, ...],
             top: int, slos: tuple[str, ...]) -> None:
    """Compare two runs: BEFORE and AFTER are each a trace, a capture folder (with or without a trace),
    a folder of capture folders (replicates), a saved report JSON, or history runs (runs.db:ID,
    runs.db:last, runs.db:last-1, runs.db:label=L). Or two sweep folders (`profkit sweep`): their curves rate by
    rate, and with --slo each bound's goodput."""
    from profkit.compare.diff import diff
    from profkit.compare.gate import check, parse_condition
    from profkit.compare.sweep import diff_sweeps, is_sweep_folder

    fmt = output_format(fmt, str(output) if output else None)
    conditions = [parse_condition(c) for c in fail_on]  # bad conditions fail before any work
    threshold = _parse_share(noise, "--noise")
    sweeps = [is_sweep_folder(Path(p)) for p in (before, after)]
    if any(sweeps):
        if not all(sweeps):
            sweep, other = (before, after) if sweeps[0] else (after, before)
            raise ProfkitError(f"{sweep} is a sweep folder and {other} is not: profkit diff compares two sweeps, or "
                               f"two runs (profkit sweep --show {sweep} --from RUN puts a run's predicted curve "
                               "beside a sweep)")
        if conditions:
            raise click.UsageError("--fail-on gates a diff of two runs, not of two sweeps")
        if output:
            refuse_overwrite(output, [Path(before), Path(after)])
        from profkit.tune.loop import parse_slo

        bounds = [(c.metric, c.op, c.value) for c in map(parse_slo, slos)]
        emit(render(diff_sweeps(Path(before), Path(after), bounds, noise=threshold), fmt, top), output)
        return
    if slos:
        raise click.UsageError("--slo applies to two sweep folders")
    if output:
        from profkit.evidence.folder import PROTECTED

        refuse_overwrite(output, [Path(before.rsplit(":", 1)[0]), Path(after.rsplit(":", 1)[0]), Path(before),
                                  Path(after)], protected=PROTECTED)
    doc = diff(before, after, noise=threshold)
    failed = check(doc, conditions)
    doc["gate"] = {"conditions": [c.text for c in conditions], "failed": failed}
    emit(render(doc, fmt, top), output)
    if failed:
        for line in failed:
            click.echo(f"profkit: gate failed: {terminal(line)}", err=True)
        sys.exit(3)


@cli.command("history")
@click.argument("db", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md"]), default="text", show_default=True,
              help="text for the terminal, md for a ticket, json")
@click.option("--label", help="only runs with this label")
@click.option("--last", type=click.IntRange(min=1), help="only the newest N runs")
def history_cmd(db: Path, fmt: str, label: str | None, last: int | None) -> None:
    """List the runs stored in a history database (`profkit report ... --save DB`) with their KPIs."""
    from profkit.compare.history import history_document, list_runs

    click.echo(render(history_document(list_runs(db, label=label, last=last)), fmt), nl=False)


@cli.command("attach")
@click.argument("url")
@click.option("--duration", default="60s", show_default=True, help="how long to watch, with a unit (90s, 5min, 1h)")
@click.option("--interval", default="5s", show_default=True,
              help="time between two /metrics scrapes (1s at least: a scrape renders every series on the server)")
@click.option("--every", default=None, help="print a line per interval of this length, e.g. 30s")
@click.option("--profile", "profile", default=None,
              help="take a profile window of this length at the start (POST /start_profile, /stop_profile; the "
                   "server must have been started with --profiler-config)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="capture folder (default: attach-YYYYmmdd-HHMMSS)")
@click.option("--header", "headers", multiple=True, metavar="'NAME: VALUE'",
              help="sent with every request, e.g. 'Authorization: Bearer ...' (else PROFKIT_API_KEY or "
                   "VLLM_API_KEY as a bearer token); never written down")
def attach_cmd(url: str, duration: str, interval: str, every: str | None, profile: str | None, out: Path | None,
               headers: tuple[str, ...]) -> None:
    """Watch a running vLLM server through its own endpoints (/metrics, /version, /v1/models) and write a capture
    folder (kind live) for `profkit report`, `diff` and `history`. Only reads, at most one scrape a second.

    \b
      profkit attach http://127.0.0.1:8000 --duration 2min --every 30s --out before-deploy"""
    import time

    from profkit.capture.attach import AttachOptions, attach

    parsed = {}
    for h in headers:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter("expected 'NAME: VALUE' (the value is not shown)", param_hint="--header")
        parsed[name.strip()] = value.strip()
    seconds = {k: parse_duration(v, f"--{k}") / 1e9 if v else None for k, v in
               (("every", every), ("profile", profile))}
    folder = out or Path(time.strftime("attach-%Y%m%d-%H%M%S"))
    opts = AttachOptions(url=url, out=folder, duration_s=parse_duration(duration, "--duration") / 1e9,
                         interval_s=parse_duration(interval, "--interval") / 1e9, every_s=seconds["every"],
                         profile_s=seconds["profile"], headers=parsed)
    done = attach(opts, say=lambda m: click.echo(f"profkit: {terminal(m)}", err=True))
    click.echo(f"profkit: live capture complete: {terminal(done)} (profkit report {shell_word(str(done))})", err=True)


@cli.command("schema")
@click.argument("kind", type=click.Choice(SCHEMA_KINDS), default="report")
def schema_cmd(kind: str) -> None:
    """Print the JSON Schema of a document kind (what `--format json` writes; `tune.json` for tune)."""
    import json

    click.echo(json.dumps(document_schema(kind), indent=1))


def _parse_share(text: str, option: str) -> float:
    m = re.fullmatch(r"\s*(\d{1,3}(?:\.\d+)?)\s*(%?)\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r}: expected a share such as 5% or 0.05", param_hint=option)
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not 0 <= value < 1:
        raise click.BadParameter(f"{text!r}: expected a share below 100 %", param_hint=option)
    return value


def emit(text: str, output: Path | None) -> None:
    """stdout, or a file written whole: a temporary file beside it renamed into place (no half reports)."""
    if not output:
        click.echo(text, nl=False)
        return
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise ProfkitError(f"{output}: folder {folder} does not exist")
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:  # a folder that cannot be written (permissions, a read-only file system, /proc)
        raise ProfkitError(f"{output}: cannot write there ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:  # a path's non-UTF-8 byte: "?"
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report is an ordinary file
        os.replace(tmp, output)
    except OSError as exc:  # the disk filled, the file system went read-only mid-write
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ProfkitError(f"{output}: cannot write there ({exc.strerror or exc})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    click.echo(f"wrote {terminal(output)}", err=True)


def serve_run_options(fn: Callable) -> Callable:
    """The options of a run that may serve (capture, tune): the model, both commands' flags, the port, the
    waits, and the command after `--` (or `serve`)."""
    for option in reversed([
        click.option("--timeout", type=float, default=3600, show_default=True, help="seconds per step"),
        click.option("--model", help="serve: the model to serve and benchmark"),
        click.option("--server-args", default="", help='serve: flags for vllm serve, e.g. "--max-num-seqs 64"'),
        click.option("--bench-args", default="", help='serve: flags for vllm bench serve, e.g. "--num-prompts 200"'),
        click.option("--port", type=int, default=8000, show_default=True,
                     help="serve: the port the server listens on and the benchmark client targets"),
        click.option("--health-timeout", type=float, default=600, show_default=True,
                     help="serve: seconds to wait for the server's /health before giving up (start-up of a large "
                          "model with compilation takes minutes)"),
        click.argument("command", nargs=-1, type=click.UNPROCESSED),
    ]):
        fn = option(fn)
    return fn


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--tool", type=click.Choice(["nsys", "torch", "both", "none"]), default="nsys", show_default=True,
              help="profiler to record with; none: an unprofiled run (benchmark result, logs, metrics, flags)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="capture folder (default: capture-YYYYmmdd-HHMMSS)")
@click.option("--dry-run", is_flag=True, help="print every command it would run, exactly, and stop")
@click.option("--capture-range", is_flag=True,
              help="nsys records only between vLLM's profiler start/stop (--profile, profiler cuda)")
@click.option("--delay", type=float, help="nsys --delay seconds")
@click.option("--duration", type=float, help="nsys --duration seconds")
@click.option("--cpu-switches", is_flag=True,
              help="nsys also traces the process tree's CPU context switches (per-process CPU time in the trace)")
@click.option("--nsys", "nsys_exe", default="nsys", show_default=True, help="nsys executable")
@click.option("--vllm", "vllm_exe", default="vllm", show_default=True, help="vllm executable")
@click.option("--gpu-metrics", is_flag=True,
              help="nsys samples the GPU's counters (SM, tensor-core, DRAM activity) at 1 kHz: in the trace, or "
                   "with --tool none around the benchmark client (serve)")
@click.option("--replicates", type=click.IntRange(min=1, max=100), default=1, show_default=True,
              help="serve, unprofiled: this many benchmark runs against one server (a warm-up first, each run "
                   "its own --seed), into OUT/r1, OUT/r2, ...")
@serve_run_options
def capture(tool: str, out: Path | None, dry_run: bool, capture_range: bool, delay: float | None, replicates: int,
            gpu_metrics: bool,
            duration: float | None, cpu_switches: bool, nsys_exe: str, vllm_exe: str, timeout: float,
            model: str | None, server_args: str, bench_args: str, port: int, health_timeout: float,
            command: tuple[str, ...]) -> None:
    """Profile a vLLM benchmark into a capture folder.

    \b
    profkit capture [options] -- vllm bench throughput|latency ARGS...
    profkit capture [options] serve --model M [--server-args "..."] [--bench-args "..."]
    """
    import time

    from profkit.capture.plan import CaptureOptions, commands_from_cli
    from profkit.capture.plan import plan as make_plan
    from profkit.capture.run import capture_runs, main_interrupt_safe

    folder = out or Path(time.strftime("capture-%Y%m%d-%H%M%S"))
    user = commands_from_cli(list(command), model, server_args, bench_args, port, vllm=vllm_exe, verb="capture")
    plan = make_plan(CaptureOptions(out=folder, user=user, tool=tool, nsys=nsys_exe, capture_range=capture_range,
                                    delay_s=delay, duration_s=duration, cpu_switches=cpu_switches, timeout_s=timeout,
                                    health_timeout_s=health_timeout, gpu_metrics=gpu_metrics))
    if dry_run:  # each command one line, exactly as it runs (capture.plan quotes it: profkit.escape.shell)
        for line in plan.commands() if replicates == 1 else plan.session_commands(replicates):
            click.echo(terminal(line))
        return
    done = main_interrupt_safe(lambda: capture_runs(plan, replicates,
                                                    say=lambda m: click.echo(f"profkit: {terminal(m)}", err=True)))
    first, where = shell_word(str(done[0])), shell_word(str(folder))
    if len(done) == 1:
        click.echo(f"profkit: capture complete: {terminal(done[0])} (profkit report {first})", err=True)
    else:
        click.echo(f"profkit: {len(done)} runs against one server in {terminal(folder)} (profkit report {where}: "
                   f"its median run; profkit diff {where} OTHER)", err=True)


MAX_SWEEP_RATE = 10_000  # req/s: each rate sends 40 s of prompts; past this a typo, not a load


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--rates", help="request rates to measure, comma-separated, e.g. 5,10,15 (default: chosen from --from's "
                               "predicted frontier: its knee and the --slo bounds' edge)")
@click.option("--from", "from_run", help="a full-load run of this configuration: the model calibrated on it predicts "
                                         "each point, shown beside the measurement (and chooses the rates)")
@click.option("--slo", "slos", multiple=True, help='with --from: a latency bound whose edge is measured, e.g. '
                                                   '"p99_ttft_ms<=2000"')
@click.option("--changes", help='with --from: the swept server is the run\'s configuration with these vLLM flags, e.g. '
                                '"--api-server-count 2" (its frontier predicted as `profkit predict RUN --frontier -- '
                                'CHANGES` predicts it: a prescription\'s, measured)')
@click.option("--replicates", type=click.IntRange(min=1, max=20), default=1, show_default=True,
              help="runs at each rate (each its own --seed)")
@click.option("--runs", "max_runs", type=click.IntRange(min=1), default=None,
              help="with --from and no --rates: at most this many benchmark runs in all (rates x replicates), the "
                   "rates that decide the goodput first, then the knee's")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="sweep folder (default: sweep-YYYYmmdd-HHMMSS)")
@click.option("--dry-run", is_flag=True, help="print the rates and every command it would run, and stop")
@click.option("--show", "show", type=click.Path(path_type=Path), default=None,
              help="a sweep folder already measured: its points (beside today's model with --from), no run")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="what it prints")
@click.option("--vllm", "vllm_exe", default="vllm", show_default=True, help="vllm executable")
@serve_run_options
def sweep(rates: str | None, from_run: str | None, slos: tuple[str, ...], changes: str | None, replicates: int,
          max_runs: int | None, out: Path | None,
          dry_run: bool, show: Path | None, fmt: str, vllm_exe: str, timeout: float, model: str | None,
          server_args: str, bench_args: str, port: int, health_timeout: float, command: tuple[str, ...]) -> None:
    """Measure a served configuration at a few request rates against one server (the measured frontier).

    \b
    profkit sweep --from RUN [--slo "p99_ttft_ms<=2000"] serve --model M [--server-args ".."] [--bench-args ".."]
    profkit sweep --from RUN --changes "--max-num-seqs 64" serve --model M --server-args "--max-num-seqs 64"
    profkit sweep --from RUN --slo "p99_tpot_ms<=50" --replicates 3 --runs 15 serve --model M
    profkit sweep --rates 5,10,15 serve --model M ...
    profkit sweep --show FOLDER [--from RUN --slo "p99_tpot_ms<=15"]
    """
    import time

    from profkit.capture.plan import CaptureOptions, commands_from_cli
    from profkit.capture.plan import plan as make_plan
    from profkit.capture.run import main_interrupt_safe
    from profkit.compare.sweep import (
        chosen_rates,
        folder_name,
        predictor,
        prompts_for,
        recorded_changes,
        run_order,
        run_sweep,
        show_sweep,
        unserved_changes,
    )
    from profkit.render.sweep import sweep_text
    from profkit.tune.loop import parse_slo

    if slos and not from_run:
        raise click.UsageError("--slo chooses rates from a predicted frontier: add --from RUN")
    if changes is not None and not from_run:
        raise click.UsageError("--changes says how the swept server differs from --from's run: add --from RUN")
    if max_runs is not None and (rates or not from_run):
        raise click.UsageError("--runs limits the rates chosen from --from's predicted frontier: give --from RUN "
                               "and no --rates")
    if max_runs is not None and max_runs < replicates:
        raise click.BadParameter(f"{max_runs} run(s) cannot hold one rate's {replicates} replicates",
                                 param_hint="--runs")
    bounds = [(c.metric, c.op, c.value) for c in (parse_slo(s) for s in slos)]
    if show is not None:
        import json

        # the changes the sweep was predicted with, unless told: a 2-API-server sweep is not the run's own
        changes = recorded_changes(show, from_run, changes)
        shown = show_sweep(show, predictor(from_run, bounds, changes) if from_run else None)
        click.echo(json.dumps(shown, indent=2) if fmt == "json" else sweep_text(shown), nl=fmt == "json")
        return
    if list(command[:1]) != ["serve"]:  # said before the offline benches' usage line, which would send one astray
        raise click.UsageError("a sweep measures a server: profkit sweep ... serve --model M ...")
    folder = out or Path(time.strftime("sweep-%Y%m%d-%H%M%S"))
    user = commands_from_cli(list(command), model, server_args, bench_args, port, vllm=vllm_exe, verb="sweep")
    plan = make_plan(CaptureOptions(out=folder, user=user, tool="none", timeout_s=timeout,
                                    health_timeout_s=health_timeout))
    if plan.kind != "serve":
        raise click.UsageError("a sweep measures a server: profkit sweep ... serve --model M ...")
    if changes is not None and (unserved := unserved_changes(changes, user.role("server"))):
        raise click.UsageError(f"--changes {unserved}: the swept server's flags do not set it so (give it in "
                               "--server-args too)")
    predicted = predictor(from_run, bounds, changes) if from_run else None
    front = predicted.frontier if predicted else None
    if rates:
        try:
            chosen = sorted({float(r) for r in rates.split(",") if r.strip()})
        except ValueError:
            raise click.BadParameter(f"{rates!r}: request rates, e.g. 5,10,15", param_hint="--rates") from None
        if not chosen or chosen[0] <= 0 or not all(map(math.isfinite, chosen)) or chosen[-1] > MAX_SWEEP_RATE:
            raise click.BadParameter(f"{rates!r}: positive request rates up to {MAX_SWEEP_RATE:,} req/s, e.g. "
                                     "5,10,15", param_hint="--rates")
    elif front is not None:
        chosen = chosen_rates(front, max_runs // replicates if max_runs is not None else None)
    else:
        raise click.UsageError("give --rates, or --from RUN to choose them from its predicted frontier")
    if dry_run:
        click.echo(f"rates: {', '.join(f'{r:g}' for r in chosen)} req/s")
        assert plan.server is not None
        click.echo(terminal(plan.server.shell()))
        click.echo(terminal(plan.warmup_step().shell()))
        for i, (r, k) in enumerate(run_order(chosen, replicates)):
            click.echo(terminal(plan.bench_step(folder / folder_name(r) / f"r{k}", seed=plan.seed() + i,
                                                prompts=prompts_for(r), rate=r).shell()))
        return
    doc = main_interrupt_safe(lambda: run_sweep(plan, chosen, replicates,
                                                say=lambda m: click.echo(f"profkit: {terminal(m)}", err=True),
                                                predicted=predicted))
    click.echo(sweep_text(doc), nl=False)


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--budget", type=click.IntRange(min=2), default=6, show_default=True,
              help="runs in all: baseline, its replicates, a profiled run, candidates")
@click.option("--objective", default="request_throughput", show_default=True,
              help="the metric to improve: a vLLM bench metric or a fact (see `profkit diff`)")
@click.option("--slo", "slos", multiple=True, help='a bound every kept step must meet, e.g. "p99_ttft_ms<=2000"')
@click.option("--profile", type=click.Choice(["never", "first", "always"]), default="first", show_default=True,
              help="nsys: never; once, for the baseline's diagnosis; or on every run")
@click.option("--replicates", type=click.IntRange(min=1), default=2, show_default=True,
              help="baseline runs that measure the run-to-run noise")
@click.option("--candidate-runs", type=click.IntRange(min=1), default=None,
              help="runs of each candidate [default: as many as --replicates; they share one server] "
                   "(1: a second only when the first is near the noise threshold)")
@click.option("--patience", type=click.IntRange(min=1), default=2, show_default=True,
              help="stop after this many candidates in a row that did not help")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="tune folder (default: tune-YYYYmmdd-HHMMSS)")
@click.option("--dry-run", is_flag=True, help="print the baseline run, the settings and the flags tune may change")
@click.option("--nsys", "nsys_exe", default="nsys", show_default=True, help="nsys executable")
@click.option("--rules", "rules_dirs", type=click.Path(file_okay=False, path_type=Path), multiple=True,
              help="extra folder of rule YAML files")
@click.option("--allow-precision-changes", "allow_precision", is_flag=True,
              help="also try changes that alter the model's numerics (FP8 weights or KV cache, quantization); "
                   "check accuracy before shipping what it finds")
@click.option("--gpu-metrics", is_flag=True, help="nsys samples the GPU's counters around each benchmark run")
@serve_run_options
def tune(budget: int, objective: str, slos: tuple[str, ...], profile: str, replicates: int,
         candidate_runs: int | None,
         patience: int, out: Path | None,
         dry_run: bool, nsys_exe: str, timeout: float, model: str | None, server_args: str, bench_args: str,
         port: int, health_timeout: float, rules_dirs: tuple[Path, ...], allow_precision: bool, gpu_metrics: bool,
         command: tuple[str, ...]) -> None:
    """Diagnose, apply the suggested flag changes, re-run, keep what is measured to help.

    \b
    profkit tune [options] -- vllm bench throughput|latency ARGS...
    profkit tune [options] serve --model M [--server-args "..."] [--bench-args "..."]
    """
    import time

    from profkit.capture.plan import commands_from_cli
    from profkit.compare.metrics import canonical
    from profkit.tune.loop import TuneOptions, Tuner, dry_run_lines, parse_slo

    folder = out or Path(time.strftime("tune-%Y%m%d-%H%M%S"))
    user = commands_from_cli(list(command), model, server_args, bench_args, port, verb="tune")
    opts = TuneOptions(out=folder, user=user,
                       budget=budget, objective=canonical(objective), slos=[parse_slo(s) for s in slos],
                       profile=profile,
                       replicates=replicates, candidate_runs=candidate_runs, patience=patience, nsys=nsys_exe,
                       timeout_s=timeout,
                       health_timeout_s=health_timeout, rules_dirs=list(rules_dirs), allow_precision=allow_precision,
                       gpu_metrics=gpu_metrics)
    if dry_run:
        for line in dry_run_lines(opts):
            click.echo(terminal(line))
        return
    if (folder / "tune.json").exists():
        raise ProfkitError(f"{folder} already holds a tune run: choose another --out")
    from profkit.capture.run import main_interrupt_safe

    # SIGTERM stops the loop like Ctrl-C: the run in flight is stopped cleanly and tune.json keeps the best so far
    doc = main_interrupt_safe(Tuner(opts, say=lambda msg: click.echo(f"profkit: {terminal(msg)}", err=True)).run)
    for fmt, name in (("md", "tune.md"), ("html", "tune.html")):
        (folder / name).write_text(render(doc, fmt), encoding="utf-8")
    click.echo(render(doc, "text"), nl=False)
    click.echo(f"profkit: tune folder {terminal(folder)} (tune.json, tune.md, tune.html, runs/)", err=True)
    if doc["stopped"].startswith("interrupted"):
        sys.exit(130)
    if doc["stopped"].startswith("error: "):
        click.echo(f"profkit: error: {one_line(doc['stopped'][7:], 600)}", err=True)
        sys.exit(1)


@cli.group()
def rules() -> None:
    """List and explain the diagnosis rules."""


@rules.command("list")
@click.option("--rules", "rules_dirs", type=click.Path(file_okay=False, path_type=Path), multiple=True,
              help="extra folder of rule YAML files")
def rules_list(rules_dirs: tuple[Path, ...]) -> None:
    """Every rule: id, severity, title."""
    from profkit.diagnose.rule_files import load_rules

    for r in load_rules(list(rules_dirs)):
        click.echo(f"{terminal(r.id):24} {r.severity:9} {terminal(r.title)}")


@rules.command("explain")
@click.argument("rule_id")
@click.option("--rules", "rules_dirs", type=click.Path(file_okay=False, path_type=Path), multiple=True,
              help="extra folder of rule YAML files")
def rules_explain(rule_id: str, rules_dirs: tuple[Path, ...]) -> None:
    """What a rule looks for, its thresholds and their sources, and the flags it changes."""
    from profkit.diagnose.explain import explain
    from profkit.diagnose.rule_files import load_rules

    found = [r for r in load_rules(list(rules_dirs)) if r.id == rule_id]
    if not found:
        raise ProfkitError(f"no rule {rule_id!r}; see `profkit rules list`")
    click.echo(explain(found[0]))  # terminal-safe line by line (diagnose.explain)


@rules.command("facts")
def rules_facts() -> None:
    """The facts rule conditions may read: name, unit, what it is."""
    from profkit.diagnose.facts import FACTS

    for name in sorted(FACTS):
        click.echo(f"{name:34} {FACTS[name].unit:7} {FACTS[name].doc}")


class _Steps:
    """A click progress bar over the analysis stages (shown only on a terminal)."""

    STAGES = ["open trace", "GPU timeline", "kernels", "CUDA API"]

    def __init__(self, show: bool) -> None:
        self.bar = click.progressbar(length=len(self.STAGES), label="analysing", file=sys.stderr) if show else None
        self.done = 0

    def __enter__(self) -> _Steps:
        if self.bar:
            self.bar.__enter__()
        return self

    def step(self, name: str) -> None:
        if self.bar:
            self.bar.label = name.ljust(18)
            # a report made again (a check of its one read failed: the stages run twice) keeps the bar full
            if self.done and self.bar.pos < len(self.STAGES):
                self.bar.update(1)
            self.done += 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.bar:
            self.bar.update(max(0, len(self.STAGES) - self.bar.pos))
            self.bar.__exit__(kind, exc, tb)


def main() -> None:
    """Console entry point: bad input becomes one clear line on stderr and a non-zero exit."""
    give_back_freed_memory()
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("profkit: interrupted", err=True)
        sys.exit(130)
    except click.UsageError as exc:  # one line, like every other input error (click's own is four)
        where = exc.ctx.command_path if exc.ctx else "profkit"
        click.echo(f"profkit: error: {one_line(exc.format_message(), 600)} (see: {where} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ProfkitError as exc:
        click.echo(f"profkit: error: {one_line(exc, 600)}", err=True)
        sys.exit(1)
    except sqlite3.DatabaseError as exc:
        click.echo(f"profkit: error: damaged or unreadable trace database ({one_line(exc, 200)})", err=True)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - last resort: never a traceback unless asked
        if os.environ.get("PROFKIT_DEBUG"):
            raise
        click.echo(f"profkit: internal error: {type(exc).__name__}: {one_line(exc, 300)} "
                   "(set PROFKIT_DEBUG=1 for the traceback)", err=True)
        sys.exit(70)  # EX_SOFTWARE: 3 is the diff gate's


if __name__ == "__main__":
    main()
