"""`profkit tune`: diagnose, apply one candidate set of flag changes, re-run, keep what is measured to help.

Orchestration only, like capture: it calls capture, report, the suggested-command builder and diff,
and owns the loop (candidates, keep/revert, stop) and its folder.

The model of the run leads (`profkit.model.search`): after each measured configuration it is re-calibrated on every
configuration measured so far (the best's latest run, the others beside it), and the next candidate is the
best-ranked configuration not yet measured, every lever it knows combined, within the SLOs it can predict and the
user's leave on precision. Each step records its prediction beside what it measured. Changes on levers the model
does not know (a finding's, from the rules) come after, unpredicted; where the model cannot be calibrated on the run,
the findings' changes are the candidates, by their expected gain (`profkit.diagnose.priority`).

Noise is measured, not assumed: the baseline runs `replicates` times and a candidate counts as a gain
only when its objective moves beyond the spread of those replicates (a candidate close to the
threshold is run again; `candidate_runs` measures every candidate as often as the baseline, for an A/B
with replicates on both sides). Profiled runs (nsys) are for diagnosis only: their throughput is perturbed by
the profiler, so the objective always comes from runs with the same profiling as the baseline's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profkit.capture.plan import CaptureOptions, Plan, plan
from profkit.compare import metrics as m
from profkit.compare.diff import Side, diff_reports, prefix_cache_differs
from profkit.compare.diff import spread as replicate_spread
from profkit.compare.gate import Condition, parse_condition
from profkit.diagnose.priority import candidate_key, priority
from profkit.diagnose.suggestion import suggest
from profkit.errors import ProfkitError
from profkit.evidence.folder import CaptureFolder
from profkit.model import levers
from profkit.vllm.command import UserCommand, changes_precision, dest_of
from profkit.vllm.options import normalize_flag, spec_for, takes

SCHEMA = "profkit.tune/1"
MODEL_TOP = 12  # configurations of the model's ranking considered per step
PROFILE_MODES = ("never", "first", "always")

Say = Callable[[str], None]


@dataclass
class TuneOptions:
    out: Path
    user: UserCommand  # the baseline: offline one command; serve the server and its benchmark
    budget: int = 6  # runs in all, profiled and replicates included
    objective: str = "request_throughput"
    slos: list[Condition] = field(default_factory=list)
    profile: str = "first"
    replicates: int = 2  # runs of the baseline that measure the noise
    # runs of each candidate; None: as many as the baseline's replicates (1: a second only when the first lands near
    # the threshold)
    candidate_runs: int | None = None
    patience: int = 2  # stop after this many candidates in a row that did not help
    nsys: str = "nsys"
    timeout_s: float = 3600.0
    health_timeout_s: float = 600.0
    rules_dirs: list[Path] = field(default_factory=list)
    # changes that alter the model's numerics (FP8 weights or KV cache, any quantization) only when the user
    # allows them: a faster model that answers differently is the user's call, after an accuracy check
    allow_precision: bool = False
    gpu_metrics: bool = False  # nsys samples the GPU's counters around each unprofiled benchmark


@dataclass
class Run:
    folder: Path
    status: str  # ok | failed
    profiled: bool
    report: dict[str, Any] | None = None
    error: str | None = None
    server: str | None = None  # the server lifetime it ran against (a session folder), shared by its runs
    seed: int | None = None

    def to_json(self, objective: str) -> dict[str, Any]:
        metrics = m.run_metrics(self.report) if self.report else {}
        return {"folder": str(self.folder), "status": self.status, "profiled": self.profiled, "error": self.error,
                "objective": metrics.get(objective), "metrics": metrics, "server": self.server, "seed": self.seed}


def parse_slo(text: str) -> Condition:
    """`p99_ttft_ms<=2000`: a bound on a metric's value (the mean of a configuration's runs)."""
    cond = parse_condition(text, "--slo", "'p99_ttft_ms<=2000', 'request_throughput>=10'")
    if cond.kind != "value":
        raise ProfkitError(f"--slo {text!r}: an SLO bounds a value, e.g. 'p99_ttft_ms<=2000' (no sign, no %)")
    return cond


def allowed_flags(rules_dirs: list[Path] | None = None, allow_precision: bool = True) -> list[str]:
    """Every server flag the model searches (`profkit.model.levers`) or a rule can change: the only flags tune may
    ever apply. Benchmark-client flags (--max-concurrency, --request-rate) are left out: changing them changes the
    workload, not the server; so are flags that change the model's numerics unless `allow_precision`."""
    from profkit.diagnose.rule_files import load_rules

    server = spec_for(["serve"])
    flags = {normalize_flag(c.flag) for r in load_rules(rules_dirs) for c in r.changes}
    flags |= {lever.flag for lever in levers.LEVERS if lever.dest != "max_model_len"}
    return sorted(f for f in flags if (server is None or takes(server, f))
                  and (allow_precision or not changes_precision(f)))


# --- one run ------------------------------------------------------------------------------------------

def plan_for(user: UserCommand, out: Path, tool: str, opts: TuneOptions) -> Plan:
    """The capture that runs `user`'s commands (offline: the bench command; serve: server and client)."""
    return plan(CaptureOptions(out=out, user=user, tool=tool, nsys=opts.nsys, timeout_s=opts.timeout_s,
                               health_timeout_s=opts.health_timeout_s, gpu_metrics=opts.gpu_metrics))


def report_run(folder: Path, profiled: bool, rules_dirs: list[Path], **extra: Any) -> Run:
    """The report of a captured run, kept in its folder (report.json)."""
    from profkit.render import render
    from profkit.report import ReportOptions, build_report

    report = build_report(folder, options=ReportOptions(rules_dirs=tuple(rules_dirs))).document()
    CaptureFolder(folder).write_report(render(report, "json"))
    return Run(folder, "ok", profiled, report=report, **extra)


def execute(plan: Plan, rules_dirs: list[Path], say: Say) -> Run:
    """One capture with its own start-up, then its report; a failed run is data (the loop reverts it), Ctrl-C is
    not."""
    from profkit.capture.run import CaptureError, run_capture

    profiled = plan.nsys_exe is not None
    try:
        run_capture(plan, say=say)
    except CaptureError as exc:
        if exc.interrupted:
            raise KeyboardInterrupt from None
        return Run(plan.out, "failed", profiled, error=str(exc))
    return report_run(plan.out, profiled, rules_dirs)


class Session:
    """The runs of one configuration. A served configuration that is not profiled shares one server lifetime (a
    `ServerSession`: one start-up, a warm-up batch, each run its own --seed); otherwise each run is a capture of
    its own (an offline benchmark starts its engine every time; a profiled server is traced alone). The runs'
    folders are `folder`/r1, r2, ..."""

    def __init__(self, user: UserCommand, folder: Path, profiled: bool, opts: TuneOptions, say: Say,
                 executor: Callable[[Plan, list[Path], Say], Run] | None = None) -> None:
        self.user, self.folder, self.profiled, self.opts, self.say = user, folder, profiled, opts, say
        self.executor = executor
        self.shared = executor is None and not profiled and user.role("server") is not None
        self.server: Any = None
        self.count = 0
        self.startup_s: float | None = None

    def __enter__(self) -> Session:
        if self.shared:
            from profkit.capture.run import CaptureError, ServerSession

            server = ServerSession(plan_for(self.user, self.folder, "none", self.opts), self.say)
            try:
                self.server = server.__enter__()
            except CaptureError as exc:
                if exc.interrupted:
                    raise KeyboardInterrupt from None
                raise SessionFailed(str(exc)) from None
            self.startup_s = server.startup_s
        return self

    def run(self) -> Run:
        self.count += 1
        name = CaptureFolder.replicate_name(self.count)
        tool = "nsys" if self.profiled else "none"
        if not self.shared:
            if self.executor is not None:
                return self.executor(plan_for(self.user, self.folder / name, tool, self.opts), self.opts.rules_dirs,
                                     self.say)
            return execute(plan_for(self.user, self.folder / name, tool, self.opts), self.opts.rules_dirs, self.say)
        from profkit.capture.run import CaptureError

        try:
            folder = self.server.run(name)
        except CaptureError as exc:
            return Run(self.folder / name, "failed", False, error=str(exc), server=self.folder.name)
        seed = (self.server.runs[-1] or {}).get("seed")
        return report_run(folder, False, self.opts.rules_dirs, server=self.folder.name, seed=seed)

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if self.server is not None:
            self.server.__exit__(kind, exc, tb)

    def to_json(self) -> dict[str, Any]:
        return {"folder": self.folder.name, "shared": self.shared, "profiled": self.profiled, "runs": self.count,
                "startup_s": self.startup_s, "commands": [c.shell() for c in self.user.commands]}


class SessionFailed(ProfkitError):
    """The configuration's server did not start (the runs it would have served are failed runs)."""


# --- the loop -------------------------------------------------------------------------------------------

@dataclass
class Config:
    user: UserCommand
    runs: list[Run] = field(default_factory=list)  # runs that measure the objective
    diagnosis: list[dict[str, Any]] = field(default_factory=list)  # reports whose findings propose changes

    def reports(self) -> list[dict[str, Any]]:
        return [r.report for r in self.runs if r.report is not None]

    def key(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(c.argv()) for c in self.user.commands)


def candidates(best: Config, history: list[dict[str, Any]], allowed: set[str]) -> list[dict[str, Any]]:
    """One candidate per finding (its changes to flags tune may change), in the order to try them: the user's own
    missteps first, then the larger expected gain (`profkit.diagnose.priority`); the best config's findings
    before earlier ones among equals."""
    seen: set[str] = set()
    out = []
    for report in [*best.diagnosis, *history]:
        gpu = ((report.get("vllm") or {}).get("defaults") or {}).get("gpu")
        for finding in report.get("findings", []):
            kept = [c for c in finding.get("changes", []) if normalize_flag(c["flag"]) in allowed]
            if finding["rule"] in seen or not kept:
                continue
            seen.add(finding["rule"])
            p = priority(finding, kept, gpu)
            out.append({"rule": finding["rule"], "severity": finding["severity"],
                        "changes": [{"flag": normalize_flag(c["flag"]), "to": c.get("to"),
                                     "from_source": c.get("from_source")} for c in kept],
                        "gain": p.gain, "undoes": p.undo, "order": p.reason, "_key": candidate_key(p)})
    out.sort(key=lambda c: c.pop("_key"))
    return out


def model_candidates(best: Config, measured: list[Config], objective: str, slos: list[Condition],
                     allow_precision: bool, allowed: set[str], noise: float) -> tuple[list[dict[str, Any]] | None, str]:
    """The model's ranking of configurations from the best one, as candidates (best first; a candidate predicted to
    gain less than `noise` marked `skip`), and how the model was fitted; None and why where the model cannot lead (an
    objective it does not predict, a run it cannot be calibrated on or does not reproduce).

    The model is calibrated on the best configuration's latest run with every other configuration measured so far
    beside it (`profkit.model.predict.calibrate`), so a configuration that measured worse than predicted teaches
    it. SLOs on metrics it predicts bound the search; every SLO is still checked on what is measured."""
    from profkit.model.observe import Unobservable, observe
    from profkit.model.predict import calibrate
    from profkit.model.refusals import unreproduced
    from profkit.model.search import Bound, known_metrics, ranked

    objective = m.canonical(objective)
    if objective not in known_metrics():
        return None, f"it does not predict {objective} (it predicts {', '.join(known_metrics())})"
    reports = best.reports()
    if not reports:
        return None, "the best configuration has no report"
    try:
        obs = observe(reports[-1])
        others = []
        for config in measured:
            if config is not best and config.reports():
                try:
                    others.append(observe(config.reports()[-1]))
                except Unobservable:
                    continue
        cal = calibrate(obs, others)
    except Unobservable as exc:
        return None, f"it cannot be calibrated on the best configuration's run: {exc}"
    if (miss := unreproduced(cal)) is not None:
        return None, f"it does not reproduce the best configuration's run: {miss}"
    bounds = [Bound(m.canonical(c.metric), c.op, c.value) for c in slos
              if m.canonical(c.metric) in known_metrics() and c.op in ("<", "<=", ">", ">=")]
    # pruned at the noise tune measured (the report, without replicates, prunes at DEFAULT_NOISE): a change kept
    # in a candidate is one predicted to matter beyond what tune can tell apart
    found = ranked(cal, allow_precision, noise, bounds, noise, objective,
                   (m.direction(objective) or "higher") == "higher", top=MODEL_TOP)
    fitted = f"calibrated on {1 + len(others)} measured configuration(s)"
    out = []
    for rank, f in enumerate(found, 1):
        flags = [{"flag": levers.BY_DEST[d].flag, "to": v} for d, v in f.changes.items()]
        if not flags or any(c["flag"] not in allowed for c in flags) or f.miss > 0:
            continue
        g = f.gain()
        removed = [c["flag"] for c in flags if c["to"] is None]
        out.append({"rule": "model", "severity": None, "changes": flags, "gain": g,
                    "undoes": ", ".join(removed) if len(removed) == len(flags) else None,
                    "order": f"the model's rank {rank} ({fitted}): {objective} predicted {g * 100:+.1f} %",
                    "skip": g < noise,
                    "predicted": {**f.prediction.metrics[objective], "gain": g,
                                  "limit_after": f.prediction.limit_after}})
    return out, fitted


class Tuner:
    """The loop's state; `run()` drives it and always leaves tune.json describing what happened."""

    def __init__(self, opts: TuneOptions, say: Say = lambda _m: None,
                 executor: Callable[[Plan, list[Path], Say], Run] | None = None) -> None:
        if opts.profile not in PROFILE_MODES:
            raise ProfkitError(f"--profile must be one of {', '.join(PROFILE_MODES)}")
        if opts.budget < opts.replicates + (1 if opts.profile == "first" else 0):
            raise ProfkitError(f"--budget {opts.budget} leaves no run for a candidate after the baseline's "
                               f"{opts.replicates} runs{' and its profiled run' if opts.profile == 'first' else ''}")
        self.opts, self.say, self.executor = opts, say, executor
        self.allowed = set(allowed_flags(opts.rules_dirs, opts.allow_precision))
        self.steps: list[dict[str, Any]] = []
        self.used = 0
        self.tried: set[tuple[tuple[str, ...], ...]] = set()
        self.history: list[dict[str, Any]] = []
        self.baseline: Config | None = None
        self.best: Config | None = None
        self.noise: dict[str, Any] = {}
        self.stopped = ""
        self.started = time.time()
        self.pending: list[Run] = []  # the baseline's runs until its step is written
        self.sessions: list[Session] = []  # each configuration's runs: one server lifetime where they share one
        self.measured: list[Config] = []  # every configuration measured: the model is calibrated on them all
        self.model = ""  # how the model was fitted for the latest step, or why it could not lead

    # runs ----------------------------------------------------------------------------------------------
    def _session(self, user: UserCommand, label: str, profiled: bool) -> Session:
        folder = self.opts.out / "runs" / f"{self.used + 1:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', label)}"
        session = Session(user, folder, profiled, self.opts, self.say, self.executor)
        self.sessions.append(session)
        return session

    def _runs(self, session: Session, n: int, into: Config | None = None) -> list[Run]:
        """Up to `n` runs of an open session (within the budget), stopping at the first that fails."""
        runs: list[Run] = []
        for _ in range(n):
            if self.used >= self.opts.budget:
                break
            self.used += 1
            self.say(f"run {self.used}/{self.opts.budget}: {session.folder.name}/r{session.count + 1}")
            run = session.run()
            runs.append(run)
            if run.status != "ok":
                self.say(f"run {self.used} failed: {run.error}")
                break
            if into is not None:
                into.runs.append(run)
                if run.report is not None:
                    into.diagnosis.append(run.report)
        return runs

    def _measure(self, user: UserCommand, label: str, profiled: bool, n: int, into: Config | None = None,
                 judge: Callable[[], bool] | None = None) -> list[Run]:
        """`n` runs of one configuration in one session; while it is open, `judge()` may ask for one more (a result
        near the threshold is measured again against the same server)."""
        session = self._session(user, label, profiled)
        try:
            with session:
                runs = self._runs(session, n, into)
                if judge is not None and runs and runs[-1].status == "ok" and judge():
                    runs += self._runs(session, 1, into)
                return runs
        except SessionFailed as exc:
            self.used += 1
            return [Run(session.folder, "failed", profiled, error=str(exc), server=session.folder.name)]

    def _objective(self, config: Config) -> float | None:
        return _mean_metric(config.reports(), self.opts.objective)

    def _step(self, kind: str, config: Config, runs: list[Run], decision: str, why: str,
              candidate: dict[str, Any] | None = None, comparison: dict[str, Any] | None = None) -> None:
        self.steps.append({
            "step": len(self.steps), "kind": kind, "candidate": candidate,
            "commands": [c.shell() for c in config.user.commands],
            "runs": [r.to_json(self.opts.objective) for r in runs],
            "objective": self._objective(Config(config.user, runs)) if runs else None,
            "decision": decision, "why": why, "comparison": comparison,
        })
        self.save()

    # the loop ------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.opts.out.mkdir(parents=True, exist_ok=True)
        try:
            self._baseline()
            if self.best is not None and not self.stopped:
                self._search()
        except KeyboardInterrupt:
            self.stopped = "interrupted (Ctrl-C): the best configuration so far is kept"
        except ProfkitError as exc:  # e.g. a rule file that no longer loads: say so, keep what was measured
            self.stopped = f"error: {exc}"
        if self.baseline is None and self.pending:  # stopped inside the baseline: its runs still count
            self._step("baseline", Config(self.opts.user), self.pending, "incomplete", self.stopped)
        return self.save()

    def _baseline(self) -> None:
        opts = self.opts
        base = Config(opts.user)
        self.tried.add(base.key())
        if opts.profile == "first":
            run = self._measure(opts.user, "baseline-profiled", True, 1)[0]
            if run.report:
                base.diagnosis.append(run.report)
            self._step("profile", base, [run], "diagnose", "profiled once for diagnosis; its figures are "
                       "perturbed by the profiler and do not count toward the objective")
        self.pending = base.runs  # the baseline's runs so far, should the loop stop inside it
        runs = self._measure(opts.user, "baseline", opts.profile == "always", opts.replicates, into=base)
        if not runs or runs[-1].status != "ok":
            failed = runs[-1] if runs else None
            self._step("baseline", base, runs, "failed",
                       f"the baseline run failed: {failed.error if failed else 'no run'}")
            self.stopped = "the baseline did not run"
            return
        if self._objective(base) is None:
            self.stopped = f"the baseline's benchmark has no {opts.objective!r}"
            self._step("baseline", base, base.runs, "failed", self.stopped)
            return
        values = [m.run_metrics(r)[opts.objective] for r in base.reports()]
        mean = sum(values) / len(values)
        spread = replicate_spread(values)
        self.noise = {"baseline_runs": values, "spread_pct": None if spread is None else 100 * spread,
                      "how": "(max - min) / mean of the baseline's runs; a candidate must move the objective "
                             "beyond it (or beyond 2 % when the replicates happen to agree closely)"}
        self.baseline = self.best = base
        self.measured.append(base)
        self.pending = []
        self._step("baseline", base, base.runs, "baseline",
                   f"{len(values)} run(s); objective {opts.objective} = {mean:.4g}"
                   + (f", spread {100 * spread:.1f} %" if spread is not None else ""))

    def _candidate_runs(self) -> int:
        """Runs per candidate: as many as the baseline's replicates unless told (they share one server)."""
        return self.opts.candidate_runs if self.opts.candidate_runs is not None else self.opts.replicates

    def _threshold(self) -> float:
        spread = self.noise.get("spread_pct")
        return max(0.02, spread / 100) if spread is not None else 0.05

    def _search(self) -> None:
        opts = self.opts
        misses = 0
        while True:
            if self.used >= opts.budget:
                self.stopped = f"the budget of {opts.budget} runs is spent"
                return
            if misses >= opts.patience:
                self.stopped = f"{misses} candidate(s) in a row gained less than the noise"
                return
            cand, user = self._next_candidate()
            if cand is None:
                self.stopped = self._stop_without_candidate()
                return
            self.tried.add(tuple(tuple(c.argv()) for c in user.commands))
            config = Config(user)
            verdict: dict[str, Any] = {}

            def near_threshold(config: Config = config, verdict: dict[str, Any] = verdict,
                               cand: dict[str, Any] = cand) -> bool:
                verdict["result"] = self._judge(config, cand)
                return verdict["result"][0] == "close" and len(config.runs) == 1

            runs = self._measure(user, cand["rule"], opts.profile == "always",
                                 max(1, min(self._candidate_runs(), opts.budget - self.used)), into=config,
                                 judge=near_threshold)
            failed = next((r for r in runs if r.status != "ok"), None)
            if failed is not None:
                self._step("candidate", config, runs, "revert", f"the run failed ({failed.error}); reverted",
                           candidate=cand)
                misses += 1
                continue
            self.measured.append(config)
            decision, why, comparison = self._judge(config, cand)
            if decision == "keep":
                assert self.best is not None  # the baseline measured: there is a best
                self.history = [*self.best.diagnosis, *self.history]
                self.best = config
                misses = 0
            else:
                decision = "revert"
                misses += 1
            self._step("candidate", config, config.runs, decision, why, candidate=cand, comparison=comparison)

    def _next_candidate(self) -> tuple[dict[str, Any] | None, UserCommand]:
        """The first candidate in order whose command is new and passes the checks: the model's ranking, then the
        findings' changes on levers it does not know (or, where the model cannot lead, the findings' changes by
        their expected gain). The ones passed over, and the order of those still waiting, ride along into
        tune.json."""
        assert self.best is not None
        ranking, self.model = model_candidates(self.best, self.measured, self.opts.objective, self.opts.slos,
                                               self.opts.allow_precision, self.allowed, self._threshold())
        rules = candidates(self.best, self.history, self.allowed)
        if ranking is None:
            queue = rules
        else:
            unpredicted = [c for c in rules if not any(dest_of(ch["flag"]) in levers.MODELLED for ch in c["changes"])]
            queue = ranking + [{**c, "order": f"unpredicted (the model does not know {c['changes'][0]['flag']}); "
                                              + c["order"]} for c in unpredicted]
        passed: list[dict[str, Any]] = []
        within_noise = False
        for i, cand in enumerate(queue):
            if cand.get("skip"):
                if not within_noise:  # the ranking is best first: the rest are within the noise too
                    passed.append({"rule": cand["rule"], "why": f"predicted {cand['predicted']['gain'] * 100:+.1f} %"
                                                                f" {self.opts.objective}: within the noise"})
                within_noise = True
                continue
            sug = suggest(self.best.user, cand["changes"])
            applied = [a for a in sug.applied if a.action != "none"]
            if not applied or not sug.commands:
                continue
            failed = [p for c in sug.checks if not c.ok for p in c.problems]
            if failed:  # never run a command vLLM would refuse
                passed.append({"rule": cand["rule"], "why": "; ".join(failed)})
                continue
            user = UserCommand(sug.commands, self.best.user.source)
            if tuple(tuple(c.argv()) for c in user.commands) in self.tried:
                continue
            cand = {**{k: v for k, v in cand.items() if k != "skip"},
                    "changes": [{"flag": a.flag, "to": a.to, "action": a.action} for a in applied],
                    "checked": [c.by for c in sug.checks][:1], "passed_over": passed,
                    "waiting": [{"rule": c["rule"], "order": c["order"]} for c in queue[i + 1:] if not c.get("skip")]}
            return cand, user
        return None, self.best.user

    def _stop_without_candidate(self) -> str:
        if self.model.startswith("calibrated"):
            return (f"no configuration the model knows is predicted to beat the best by more than the noise "
                    f"({self._threshold() * 100:.1f} %), and no finding proposes an untried change it cannot predict")
        return f"no finding proposes an untried change; the model does not lead here: {self.model}"

    def _judge(self, config: Config, cand: dict[str, Any] | None = None) -> tuple[str, str, dict[str, Any]]:
        """keep, revert or close (near the threshold: measure once more). A change that undoes the user's own
        misstep (back to vLLM's default) is kept unless it measures worse: the user's setting had no measured
        benefit either, and vLLM's default is the configuration its developers tune."""
        assert self.best is not None
        threshold = self._threshold()
        doc = diff_reports(Side("best", self.best.reports()), Side("candidate", config.reports()), noise=threshold)
        row = next((r for r in doc["metrics"] if r["name"] == self.opts.objective), None)
        if row is None:
            return "revert", f"the candidate's benchmark has no {self.opts.objective!r}", {}
        # The measured spread of the best side decides; never below the 2 % floor.
        threshold = max(threshold, row["threshold_pct"] / 100)
        change = row["change_pct"] or 0.0
        better = m.direction(self.opts.objective) or "higher"
        gain = change if better == "higher" else -change
        comparison = {"objective": self.opts.objective, "best": row["before"], "candidate": row["after"],
                      "change_pct": row["change_pct"], "threshold_pct": 100 * threshold,
                      "findings": doc["findings"], "comparability": doc["comparability"]["differs"]}
        cache = prefix_cache_differs(Side("best", self.best.reports()), Side("candidate", config.reports()),
                                     doc["comparability"]["prefix_cache_hit_rate"])
        if cache:  # the prefix cache measured, not the change: never kept
            return "revert", "not comparable: " + "; ".join(cache), comparison
        broken = [c.text for c in self.opts.slos if not c.holds(_mean_metric(config.reports(), c.metric))]
        if broken:
            return "revert", f"SLO not met: {', '.join(broken)}", comparison
        if gain > 100 * threshold:
            return "keep", f"{self.opts.objective} {change:+.1f} % beyond the noise ({100 * threshold:.1f} %)", \
                comparison
        if gain > 50 * threshold and len(config.runs) == 1:
            return "close", "", comparison
        if cand and cand.get("undoes") and gain >= -100 * threshold:
            return "keep", (f"back to vLLM's default ({cand['undoes']}): {self.opts.objective} {change:+.1f} %, "
                            f"not worse beyond the noise ({100 * threshold:.1f} %)"), comparison
        return "revert", f"{self.opts.objective} {change:+.1f} %: within the noise ({100 * threshold:.1f} %)" \
            if abs(gain) <= 100 * threshold else f"{self.opts.objective} {change:+.1f} %: worse", comparison

    # output --------------------------------------------------------------------------------------------
    def save(self) -> dict[str, Any]:
        doc = self.document()
        tmp = self.opts.out / "tune.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.opts.out / "tune.json")
        return doc

    def document(self) -> dict[str, Any]:
        opts = self.opts
        best, base = self.best, self.baseline
        summary = None
        if best is not None and base is not None:
            b, a = self._objective(base), self._objective(best)
            kept = [s["step"] for s in self.steps if s["decision"] in ("keep", "baseline")]
            summary = {"baseline": b, "best": a, "change_pct": (a - b) / abs(b) * 100 if b and a is not None else None,
                       "best_step": kept[-1] if kept else None,
                       "commands": [c.shell() for c in best.user.commands],
                       "argv": [c.argv() for c in best.user.commands]}
        diff_doc = None
        if best is not None and base is not None and best is not base:
            diff_doc = diff_reports(Side("baseline", base.reports()), Side("best", best.reports()),
                                    noise=self._threshold())
        return {
            "schema": SCHEMA,
            "objective": {"name": opts.objective, "better": m.direction(opts.objective) or "higher"},
            "slos": [c.text for c in opts.slos],
            "budget": opts.budget, "runs_used": self.used, "profile": opts.profile,
            "replicates": opts.replicates, "candidate_runs": self._candidate_runs(),
            "allowed_flags": sorted(self.allowed), "allow_precision": opts.allow_precision,
            "baseline_commands": [c.shell() for c in opts.user.commands],
            "noise": self.noise,
            "model": self.model or None,
            "steps": self.steps,
            "best": summary,
            "stopped": self.stopped or "running",
            "diff": diff_doc,
            # Which runs shared a server: one entry per configuration measured (a server lifetime where shared)
            "servers": [s.to_json() for s in self.sessions],
            "start_ups": sum(1 if s.shared else s.count for s in self.sessions),
            "seconds": round(time.time() - self.started, 1),
        }


def _mean_metric(reports: list[dict[str, Any]], name: str) -> float | None:
    values = [v for r in reports if (v := m.run_metrics(r).get(name)) is not None]
    return sum(values) / len(values) if values else None


def dry_run_lines(opts: TuneOptions) -> list[str]:
    """What `--dry-run` prints: the baseline's exact commands, the loop's settings, the allow-list, and the order
    candidates will be tried in."""
    from profkit.vllm.command import dest_of
    from profkit.vllm.options import default_of

    per_candidate = opts.candidate_runs if opts.candidate_runs is not None else opts.replicates
    served = opts.user.role("server") is not None
    lines = [f"objective: {opts.objective} ({m.direction(opts.objective) or 'higher'} is better)",
             f"budget: {opts.budget} runs (baseline x{opts.replicates}"
             + (" + 1 profiled for diagnosis" if opts.profile == "first" else "")
             + (f", then {per_candidate} runs per candidate)" if per_candidate > 1
                else ", then one run per candidate)"),
             f"profile: {opts.profile}", f"SLOs: {', '.join(c.text for c in opts.slos) or 'none'}"]
    if served and opts.profile != "always":
        lines.append("start-ups: one server per configuration; a warm-up batch, then its runs against it, each with "
                     "its own --seed (the prefix cache cannot serve one run's prompts to the next)")
    if opts.profile == "first":  # counted in the budget: its commands said too
        lines.append("profiled once for diagnosis (its figures perturbed by the profiler: not the objective's):")
        profiled = plan_for(opts.user, opts.out / "runs" / "01-baseline-profiled", "nsys", opts)
        lines += ["  " + line for line in profiled.commands()]
    lines.append("baseline:")
    tool = "nsys" if opts.profile == "always" else "none"
    first = 2 if opts.profile == "first" else 1  # the profiled run comes first
    plan = plan_for(opts.user, opts.out / "runs" / f"{first:02d}-baseline", tool, opts)
    if served and tool == "none":
        lines += ["  " + line for line in plan.session_commands(opts.replicates)]
    else:
        lines += ["  " + line for line in plan.commands()]
    allowed = allowed_flags(opts.rules_dirs, opts.allow_precision)
    lines.append("flags tune may change (named by the rules): " + " ".join(allowed))
    numerics = [f for f in allowed_flags(opts.rules_dirs) if changes_precision(f)]
    lines.append(("changes of model precision, allowed (--allow-precision-changes): " if opts.allow_precision else
                  "changes of model precision, tried only with --allow-precision-changes: ") + " ".join(numerics)
                 + " (check accuracy before shipping)")
    engine = opts.user.role("server") or opts.user.role("offline")
    mine = [f"{flag} {value}" for flag, value in _given(engine, allowed)
            if default_of(dest_of(flag), None) != value]
    lines.append("order: the model of the run's ranking, every lever it knows combined (re-calibrated after every "
                 "measured configuration on all of them), the best configuration not yet measured next; flags you "
                 "set away from vLLM's default"
                 + (f" (yours: {', '.join(mine)})" if mine else " (none in this command)")
                 + " are among its levers, vLLM's default one of their values; changes the model cannot predict "
                   "come after, by each finding's expected gain (and lead where the model cannot be calibrated); "
                   "the loop stops when the budget is spent, after --patience misses in a row, or when nothing is "
                   "predicted to beat the best by more than the noise; tune.json says why each candidate came when "
                   "it did")
    return lines


def _given(cmd: Any, allowed: list[str]) -> list[tuple[str, Any]]:
    """The settings `cmd` gives that a rule may change, as (flag, value)."""
    if cmd is None:
        return []
    from profkit.vllm.command import dest_of

    by_setting = {dest_of(f): f for f in allowed}
    return [(by_setting[a.setting], a.value) for a in cmd.parsed[0] if a.setting in by_setting]
