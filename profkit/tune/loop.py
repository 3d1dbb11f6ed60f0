"""`profkit tune`: diagnose, apply one candidate set of flag changes, re-run, keep what is measured to help.

Orchestration only, like capture: it calls capture, report, the suggested-command builder and diff,
and owns the loop (candidates, keep/revert, stop) and its folder. Rules stay the single source of
what may change: a candidate is one finding's flag changes, applied to the best command so far.

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
from profkit.compare.diff import Side, diff_reports
from profkit.compare.diff import spread as replicate_spread
from profkit.compare.gate import Condition, parse_condition
from profkit.diagnose.suggestion import suggest
from profkit.diagnose.vllm_command import UserCommand, normalize_flag, spec_for
from profkit.errors import ProfkitError

SCHEMA = "profkit.tune/1"
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
    candidate_runs: int = 1  # runs of each candidate (1: a second only when the first lands near the threshold)
    patience: int = 2  # stop after this many candidates in a row that did not help
    nsys: str = "nsys"
    timeout_s: float = 3600.0
    health_timeout_s: float = 600.0
    rules_dirs: list[Path] = field(default_factory=list)


@dataclass
class Run:
    folder: Path
    status: str  # ok | failed
    profiled: bool
    report: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self, objective: str) -> dict[str, Any]:
        metrics = m.run_metrics(self.report) if self.report else {}
        return {"folder": str(self.folder), "status": self.status, "profiled": self.profiled, "error": self.error,
                "objective": metrics.get(objective), "metrics": metrics}


def parse_slo(text: str) -> Condition:
    """`p99_ttft_ms<=2000`: a bound on a metric's value (the mean of a configuration's runs)."""
    cond = parse_condition(text)
    if cond.kind != "value":
        raise ProfkitError(f"--slo {text!r}: an SLO bounds a value, e.g. 'p99_ttft_ms<=2000' (no sign, no %)")
    return cond


def allowed_flags(rules_dirs: list[Path] | None = None) -> list[str]:
    """Every server flag a rule can change: the only flags tune may ever apply. Benchmark-client flags
    (--max-concurrency, --request-rate) are left out: changing them changes the workload, not the server."""
    from profkit.diagnose.engine import load_rules

    server = spec_for(["serve"])
    flags = {normalize_flag(c.flag) for r in load_rules(rules_dirs) for c in r.changes}
    return sorted(f for f in flags if server is None or f in server.options)


# --- one run ------------------------------------------------------------------------------------------

def plan_for(user: UserCommand, out: Path, tool: str, opts: TuneOptions) -> Plan:
    """The capture that runs `user`'s commands (offline: the bench command; serve: server and client)."""
    return plan(CaptureOptions(out=out, user=user, tool=tool, nsys=opts.nsys, timeout_s=opts.timeout_s,
                               health_timeout_s=opts.health_timeout_s))


def execute(plan: Plan, rules_dirs: list[Path], say: Say) -> Run:
    """Capture, then report on the folder; a failed run is data (the loop reverts it), Ctrl-C is not."""
    from profkit.capture.run import CaptureError, run_capture
    from profkit.render import render
    from profkit.report import build_report

    profiled = plan.nsys_exe is not None
    try:
        run_capture(plan, say=say)
    except CaptureError as exc:
        if exc.interrupted:
            raise KeyboardInterrupt from None
        return Run(plan.out, "failed", profiled, error=str(exc))
    report = build_report(plan.out, rules_dirs=rules_dirs).document()
    plan.folder.write_report(render(report, "json"))
    return Run(plan.out, "ok", profiled, report=report)


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
    """One candidate per finding, most severe first: the best config's own findings, then earlier ones."""
    seen: set[str] = set()
    out = []
    for report in [*best.diagnosis, *history]:
        for finding in report.get("findings", []):
            changes = [{"flag": normalize_flag(c["flag"]), "to": c.get("to"), "from_source": c.get("from_source")}
                       for c in finding.get("changes", []) if normalize_flag(c["flag"]) in allowed]
            if finding["rule"] in seen or not changes:
                continue
            seen.add(finding["rule"])
            out.append({"rule": finding["rule"], "severity": finding["severity"], "changes": changes})
    return out


class Tuner:
    """The loop's state; `run()` drives it and always leaves tune.json describing what happened."""

    def __init__(self, opts: TuneOptions, say: Say = lambda _m: None,
                 executor: Callable[[Plan, list[Path], Say], Run] = execute) -> None:
        if opts.profile not in PROFILE_MODES:
            raise ProfkitError(f"--profile must be one of {', '.join(PROFILE_MODES)}")
        if opts.budget < opts.replicates + (1 if opts.profile == "first" else 0):
            raise ProfkitError(f"--budget {opts.budget} leaves no run for a candidate after the baseline's "
                               f"{opts.replicates} runs{' and its profiled run' if opts.profile == 'first' else ''}")
        self.opts, self.say, self.executor = opts, say, executor
        self.allowed = set(allowed_flags(opts.rules_dirs))
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

    # runs ----------------------------------------------------------------------------------------------
    def _run(self, user: UserCommand, label: str, profiled: bool) -> Run:
        self.used += 1
        folder = self.opts.out / "runs" / f"{self.used:02d}-{re.sub(r'[^A-Za-z0-9_.-]+', '-', label)}"
        self.say(f"run {self.used}/{self.opts.budget}: {label}")
        run = self.executor(plan_for(user, folder, "nsys" if profiled else "none", self.opts),
                            self.opts.rules_dirs, self.say)
        if run.status != "ok":
            self.say(f"run {self.used} failed: {run.error}")
        return run

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
            run = self._run(opts.user, "baseline-profiled", profiled=True)
            if run.report:
                base.diagnosis.append(run.report)
            self._step("profile", base, [run], "diagnose", "profiled once for diagnosis; its figures are "
                       "perturbed by the profiler and do not count toward the objective")
        for i in range(opts.replicates):
            run = self._run(opts.user, "baseline" if i == 0 else f"baseline-replicate-{i}",
                            profiled=opts.profile == "always")
            if run.status != "ok":
                self._step("baseline", base, [*base.runs, run], "failed", f"the baseline run failed: {run.error}")
                self.stopped = "the baseline did not run"
                return
            base.runs.append(run)
            self.pending = list(base.runs)
            base.diagnosis.append(run.report)
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
        self.pending = []
        self._step("baseline", base, base.runs, "baseline",
                   f"{len(values)} run(s); objective {opts.objective} = {mean:.4g}"
                   + (f", spread {100 * spread:.1f} %" if spread is not None else ""))

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
                self.stopped = "no finding proposes an untried change"
                return
            self.tried.add(tuple(tuple(c.argv()) for c in user.commands))
            config = Config(user)
            failed = None
            for i in range(max(1, min(opts.candidate_runs, opts.budget - self.used))):
                run = self._run(user, cand["rule"] if i == 0 else f"{cand['rule']}-replicate-{i}",
                                profiled=opts.profile == "always")
                if run.status != "ok":
                    failed = run
                    break
                config.runs.append(run)
                config.diagnosis.append(run.report)
            if failed is not None:
                self._step("candidate", config, [*config.runs, failed], "revert",
                           f"the run failed ({failed.error}); reverted", candidate=cand)
                misses += 1
                continue
            decision, why, comparison = self._judge(config)
            if decision == "close" and self.used < opts.budget:  # near the threshold: measure it again
                again = self._run(user, f"{cand['rule']}-replicate", profiled=opts.profile == "always")
                if again.status == "ok":
                    config.runs.append(again)
                decision, why, comparison = self._judge(config)
            if decision == "keep":
                self.history = [*self.best.diagnosis, *self.history]
                self.best = config
                misses = 0
            else:
                decision = "revert"
                misses += 1
            self._step("candidate", config, config.runs, decision, why, candidate=cand, comparison=comparison)

    def _next_candidate(self) -> tuple[dict[str, Any] | None, UserCommand]:
        assert self.best is not None
        for cand in candidates(self.best, self.history, self.allowed):
            sug = suggest(self.best.user, cand["changes"])
            applied = [a for a in sug.applied if a.action != "none"]
            if not applied or not sug.commands:
                continue
            if sug.checks and not all(c.ok for c in sug.checks):
                continue  # never run a command vLLM's parser rejects
            user = UserCommand(sug.commands, self.best.user.source)
            if tuple(tuple(c.argv()) for c in user.commands) in self.tried:
                continue
            cand = {**cand, "changes": [{"flag": a.flag, "to": a.to, "action": a.action} for a in applied]}
            return cand, user
        return None, self.best.user

    def _judge(self, config: Config) -> tuple[str, str, dict[str, Any]]:
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
                      "findings": doc["findings"]}
        broken = [c.text for c in self.opts.slos if not c.holds(_mean_metric(config.reports(), c.metric))]
        if broken:
            return "revert", f"SLO not met: {', '.join(broken)}", comparison
        if gain > 100 * threshold:
            return "keep", f"{self.opts.objective} {change:+.1f} % beyond the noise ({100 * threshold:.1f} %)", \
                comparison
        if gain > 50 * threshold and len(config.runs) == 1:
            return "close", "", comparison
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
            "replicates": opts.replicates, "candidate_runs": opts.candidate_runs,
            "allowed_flags": sorted(self.allowed),
            "baseline_commands": [c.shell() for c in opts.user.commands],
            "noise": self.noise,
            "steps": self.steps,
            "best": summary,
            "stopped": self.stopped or "running",
            "diff": diff_doc,
            "seconds": round(time.time() - self.started, 1),
        }


def _mean_metric(reports: list[dict[str, Any]], name: str) -> float | None:
    values = [m.run_metrics(r).get(name) for r in reports]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def dry_run_lines(opts: TuneOptions) -> list[str]:
    """What `--dry-run` prints: the baseline's exact commands, the loop's settings and the allow-list."""
    lines = [f"objective: {opts.objective} ({m.direction(opts.objective) or 'higher'} is better)",
             f"budget: {opts.budget} runs (baseline x{opts.replicates}"
             + (" + 1 profiled for diagnosis" if opts.profile == "first" else "")
             + (f", then {opts.candidate_runs} runs per candidate)" if opts.candidate_runs > 1
                else ", then one run per candidate)"),
             f"profile: {opts.profile}", f"SLOs: {', '.join(c.text for c in opts.slos) or 'none'}",
             "baseline run:"]
    plan = plan_for(opts.user, opts.out / "runs" / "01-baseline", "nsys" if opts.profile == "always" else "none", opts)
    lines += ["  " + line for line in plan.commands()]
    lines.append("flags tune may change (named by the rules): " + " ".join(allowed_flags(opts.rules_dirs)))
    return lines
