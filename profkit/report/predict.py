"""`profkit predict RUN -- CHANGES`: the model of the run, calibrated on RUN's report, asked what CHANGES (vLLM
flags as the user writes them) would do. The library entry behind the command:

    from profkit.report.predict import predict_run
    doc = predict_run("capture-folder", "--kv-cache-dtype fp8 --quantization fp8")   # profkit.prediction/1
    doc = search_run("capture-folder", allow_precision=True)   # the best values the model finds
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from profkit.errors import ProfkitError
from profkit.evidence.record import Evidence
from profkit.model import levers
from profkit.model.observe import Unobservable, observe
from profkit.model.predict import Calibrated, Configured, calibrate, configured, host_bound, predict
from profkit.model.refusals import Refused, unreproduced
from profkit.model.search import Bound, check_bounds, known_metrics, search
from profkit.model.simulate import Infeasible
from profkit.report.build import build_report
from profkit.vllm.command import VllmCommand
from profkit.vllm.options import HUMAN_READABLE


def parse_changes(text: str) -> dict[str, Any]:
    """vLLM flags as written (`--kv-cache-dtype fp8 --max-num-seqs 256`) -> {setting: value}."""
    try:
        command = VllmCommand.parse(text)
        flags = command.flags()
    except ValueError as exc:  # shlex: an unclosed quote
        raise ProfkitError(f"changes: {exc}") from None
    spec = command.spec()
    for arg in command.parsed[0]:  # `--api-server-count` alone would read as True (== 1)
        found = spec.find(arg.name) if spec and arg.key is None else None
        if found and found[1].takes_value and not any(arg.values):  # `--max-num-seqs=` too
            raise ProfkitError(f"changes: {arg.name} takes a value (e.g. {arg.name} 2, or {arg.name}=2)")
    if not flags:
        raise ProfkitError(f"changes: no vLLM flag in {text!r} (give them after --, e.g. -- --max-num-seqs 256)")
    removed = _removed_switches(command, spec)
    # `--flag default`: the flag removed, vLLM's default in force (what the prescription writes as "not set"); a
    # human-readable size as written ('2.5' is no whole number to vLLM, though it reads as one here)
    asked = {}
    for k, v in flags.items():
        written = command.given(k) if k in HUMAN_READABLE else None  # looked up once: it walks every argument
        asked[k] = None if k in removed or isinstance(v, str) and v.lower() in ("default", "none") \
            else written if isinstance(written, str) else v
    if (problem := levers.value_refusal(asked)) is not None:
        raise ProfkitError(f"changes: {problem}")
    return levers.typed(asked)


def _switch_hint(arg: Any, spec: Any) -> str:
    """What turns a switch off, in words: its `--no-` form where vLLM has one, and `default`."""
    off = f"--no-{arg.name.lstrip('-')}"
    return f"{arg.name} is a switch and takes no value; " + (
        f"off: {off}; " if not arg.negated and spec is not None and spec.find(off) else "") + \
        f"vLLM's default: {arg.name} default"


def _removed_switches(command: VllmCommand, spec: Any) -> set[str]:
    """The switches written `--switch default` (vLLM's default: the word stands apart from the switch); any other
    bare word is a mistake vLLM would refuse (`--enforce-eager false` is not "off"), as a switch given a value is
    (`--enforce-eager=false`). A whole command's positionals (`vllm serve MODEL ...`) are its own."""
    args, bare = command.parsed
    for a in args:
        if a.known and a.key is None and not a.values and "=" in command.args[a.at]:
            raise ProfkitError(f"changes: {command.args[a.at]}: {_switch_hint(a, spec)}")
    positionals = spec.positionals if command.subcommand and spec is not None else 0
    removed = set()
    for at in bare:
        word = command.args[at]
        switch = next((a for a in args if a.at + a.width == at and not a.values), None)
        if switch is not None and word.lower() in ("default", "none"):
            removed.add(switch.setting)
        elif switch is None and positionals > 0:
            positionals -= 1
        else:
            raise ProfkitError(f"changes: {word!r} is not a flag" + (
                f" ({_switch_hint(switch, spec)})" if switch is not None else " (give flags and their values)"))
    return removed


def known_changes(text: str) -> dict[str, Any]:
    """The changes as written, parsed, or one line where the model does not know a flag among them (said before the
    run is read: no run can make it known)."""
    asked = parse_changes(text)
    if (unknown := levers.unknown_refusal(asked)) is not None:
        raise ProfkitError(f"changes: not predicted: {unknown}")
    return asked


def calibrated(run: str | os.PathLike | None, evidence: Evidence | None = None) -> Calibrated:
    """The model calibrated on the run (a capture folder, a trace, or None with the evidence alone), or one line: a
    run it cannot model, or whose own outcome it does not reproduce (the report's rule: no prediction from it)."""
    doc = build_report(run, evidence).document()
    try:
        cal = calibrate(observe(doc))
    except Unobservable as exc:
        raise ProfkitError(f"{run or 'the evidence'}: cannot model this run: {exc}") from None
    if (miss := unreproduced(cal)) is not None:
        raise ProfkitError(f"{run or 'the evidence'}: not predicted: the model does not reproduce this run ({miss})")
    return cal


@dataclass(frozen=True)
class FrontierQuestion:
    """What `profkit predict RUN --frontier [--slo ...] -- CHANGES` asks the model, checked: the calibrated run, the
    changes ({vLLM dest: value}), the configuration they make, the bounds. `profkit sweep --from` asks the same."""

    cal: Calibrated
    changes: dict[str, Any]
    configured: Configured
    bounds: list[Bound]


def frontier_question(run: str | os.PathLike | None, changes: str | None = None,
                      slos: Sequence[tuple[str, str, float]] = (), evidence: Evidence | None = None
                      ) -> FrontierQuestion:
    """The question checked, or one line: a bound on a metric the frontier does not predict, a change as written
    that is not vLLM's, a run the model cannot calibrate or has no frontier, a change refused or vLLM would not
    serve the workload with."""
    from profkit.model.frontier import bounds_of

    try:
        bounds = bounds_of(slos)
    except ValueError as exc:
        raise ProfkitError(f"--slo: {exc}") from None
    asked = known_changes(changes) if changes is not None else {}
    cal = calibrated(run, evidence)
    frontier_of(cal, run)
    return FrontierQuestion(cal, asked, configured_for(cal, asked, changes), bounds)


# what a run that could not be fitted stands on (the reasoning gives the GPU's factor and the engine core's CPU)
UNFITTED_SAID = " (the GPU's step as the runs fitted on this GPU found it, else the hardware's peaks)"
GOODPUT_CANDIDATES = 8  # the search's best configurations whose frontiers a goodput ranking compares


@contextmanager
def said_of(changes: str | None) -> Iterator[None]:
    """The model's refusal of `changes`, or a configuration vLLM could not serve the workload with: one line."""
    said = changes or "(the run's own settings)"
    try:
        yield
    except Refused as exc:
        raise ProfkitError(f"changes: not predicted: {exc}") from None
    except Infeasible as exc:
        raise ProfkitError(f"changes: {said}: vLLM could not serve this workload so ({exc})") from None


def configured_for(cal: Calibrated, asked: dict[str, Any], changes: str | None) -> Configured:
    """The run under the changes as the simulation reads them, or one line: a refused change, one vLLM could not
    serve, a value a flag does not take ('--max-num-seqs many')."""
    with said_of(changes):
        try:
            return configured(cal, asked)
        except (Refused, Infeasible):
            raise  # said_of says these
        except (ValueError, TypeError) as exc:
            raise ProfkitError(f"changes: {changes}: a value vLLM would not take ({exc}; `--flag default` removes "
                               "a flag)") from None


def frontier_of(cal: Calibrated, run: str | os.PathLike | None) -> None:
    """One line where the run has no frontier (an offline run has no request rate)."""
    from profkit.model.frontier import no_frontier

    if (why := no_frontier(cal)) is not None:
        raise ProfkitError(f"{run or 'the evidence'}: no frontier: {why}")


def search_run(run: str | os.PathLike | None, evidence: Evidence | None = None, allow_precision: bool = False,
               bounds: Sequence[Bound] = (), top: int = 5, noise: float | None = None) -> dict[str, Any]:
    """The `top` configurations the model predicts best for the run (`profkit predict --search`), within `bounds`
    (the user's SLOs: those that meet them first). Bounds on latency percentiles (`p99_ttft_ms<=2000`) are the
    frontier's: the search's best configurations are then ranked by their goodput under them (the largest request
    rate each serves within every such bound, `profkit.model.frontier`)."""
    from profkit.model.frontier import canonical_metric, frontier

    means = [b for b in bounds if b.metric in known_metrics()]
    try:
        percentiles = [Bound(canonical_metric(b.metric), b.op, b.value) for b in bounds if b not in means]
        check_bounds(means)
    except ValueError as exc:
        raise ProfkitError(f"--slo: {exc.args[0].split(' (it predicts')[0]} (it predicts "
                           f"{', '.join(known_metrics())}; by goodput: p50, p90, p99 and mean of ttft, tpot, "
                           "e2el, e.g. p99_ttft_ms)") from None
    cal = calibrated(run, evidence)
    found = search(cal, allow_precision=allow_precision, bounds=means, top=max(top, GOODPUT_CANDIDATES) if
                   percentiles else top, noise=noise)
    goodputs: dict[int, dict[str, Any]] = {}
    if percentiles:
        for i, f in enumerate(found):
            try:
                goodputs[i] = frontier(cal, f.changes, percentiles, noise=noise).goodput or {}
            except ValueError:  # Infeasible included: no frontier for it
                goodputs[i] = {"rate": 0.0, "low": 0.0, "high": 0.0, "binding": None}
        order = sorted(range(len(found)), key=lambda i: (found[i].miss, -goodputs[i]["rate"]))
        found, goodputs = [found[i] for i in order][:top], {k: goodputs[i] for k, i in enumerate(order[:top])}

    def listed(i: int, f: Any) -> dict[str, Any]:
        good = goodputs.get(i)
        return {**f.prediction.document(), "meets_bounds": f.miss == 0 and (good is None or good["rate"] > 0),
                "changes_text": levers.describe(f.changes) or "(the run's own settings)",
                **({"goodput": good} if good is not None else {})}

    rows = [listed(i, f) for i, f in enumerate(found)]
    meets = [r for r in rows if r["meets_bounds"]]
    return {"schema": "profkit.prediction/1", "source": {"path": None if run is None else str(run),
                                                         "gpu": cal.observation.gpu},
            "search": meets,
            # where none meets the bounds: the one that misses them least, said as such
            "closest": rows[0] if rows and not meets else None,
            "bounds": [f"{b.metric}{b.op}{b.value:g}" for b in [*means, *percentiles]],
            "ranked_by": "goodput" if percentiles else "request_throughput",
            "calibration": {"fit_error": cal.fit_error, "scale": cal.memory_factor}}


def predict_run(run: str | os.PathLike | None, changes: str, evidence: Evidence | None = None,
                noise: float | None = None) -> dict[str, Any]:
    """The prediction document (`profkit.prediction/1`) for `changes` on the run at `run` (a capture folder, a
    trace, or None with the evidence alone)."""
    asked = known_changes(changes)
    cal = calibrated(run, evidence)
    obs = cal.observation
    configured_for(cal, asked, changes)
    with said_of(changes):
        prediction = predict(cal, asked, noise=noise).document()
    bound = host_bound(obs)
    prediction.update(
        source={"path": None if run is None else str(run), "gpu": obs.gpu},
        changes_text=" ".join(changes.split()),
        calibration={"fit_error": cal.fit_error, "scale": cal.memory_factor,
                     "calibrated_on": (f"{bound.replace('_', ' ')}'s pace (host samples: it was saturated)" if bound
                                       else "the benchmark's duration (the GPU's step costs)") if cal.fit_error else
                     ("not calibrated: a frontend process set the pace, so the run's duration hides the engine's "
                      "speed" if bound else
                      "not calibrated: neither the GPU (not kept busy) nor one host process set the pace, so the run's "
                      "duration cannot say how much of a step was the GPU's") + UNFITTED_SAID})
    return prediction


def frontier_run(run: str | os.PathLike | None, changes: str | None = None, evidence: Evidence | None = None,
                 slos: Sequence[tuple[str, str, float]] = (), noise: float | None = None) -> dict[str, Any]:
    """The run's predicted SLO frontier (`profkit predict --frontier`), under `changes` where given: throughput and
    the latency percentiles over request rates, and within `slos` ((metric, op, value): `p99_ttft_ms <= 2000`) the
    largest rate that meets them all (`profkit.model.frontier`)."""
    from profkit.model.frontier import frontier

    q = frontier_question(run, changes, slos, evidence)
    cal = q.cal
    with said_of(changes):
        f = frontier(cal, q.changes, q.bounds, noise=noise, conf=q.configured)
    return {"schema": "profkit.prediction/1", "source": {"path": None if run is None else str(run),
                                                         "gpu": cal.observation.gpu},
            "changes_text": " ".join((changes or "").split()) or "(the run's own settings)",
            "frontier": f.document(), "calibration": {"fit_error": cal.fit_error, "scale": cal.memory_factor}}
