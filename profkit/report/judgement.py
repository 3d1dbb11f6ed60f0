"""The judgement of a run, once its sections are known: the facts rules read, the findings, the model's
prescription, and the command the user copies with its changes applied."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from profkit.diagnose.engine import Finding, ProposedChange, evaluate
from profkit.diagnose.facts import compute_facts
from profkit.diagnose.prescription import Prescription, prescribe, verdict
from profkit.diagnose.priority import order_findings
from profkit.diagnose.rule_files import Rule
from profkit.diagnose.suggestion import Suggestion, suggest
from profkit.report.sections import RunSections
from profkit.vllm.command import dest_of


@dataclass(frozen=True)
class Judgement:
    facts: dict[str, Any]
    findings: list[Finding]  # ordered: the user's missteps first, then the gain; annotated with the command's use
    skipped: list[dict[str, Any]]  # rules whose facts the run lacks
    prescription: Prescription | None
    suggestion: Suggestion
    verdict: dict[str, Any]  # what limits the run: the model's limit, else the leading finding


def judge(run: RunSections, rules: list[Rule]) -> Judgement:
    """Facts from the sections, the rules over them, the model's prescription over the findings, the command."""
    facts = compute_facts(run.sections if run.trace_part is not None else None, run.vllm, run.host, run.ranks,
                          run.imbalance, run.workload, run.efficiency)
    # Not shown to be vLLM's: the findings say what the trace shows, and no vLLM flag is proposed.
    findings, skipped = evaluate(rules, facts, propose_changes=bool(run.shown))
    findings = order_findings(findings, run.vllm.defaults.get("gpu"))
    prescription = None
    if run.shown:
        partial = msgspec.to_builtins({"vllm": run.vllm, "facts": facts, "efficiency": run.efficiency,
                                       "steps": run.sections.steps if run.trace_part is not None else None})
        prescription = prescribe(partial, findings)
    prescribed: list[ProposedChange | dict[str, Any]] = [
        {"flag": c["flag"], "to": c["to"], "from_source": (run.vllm.config.get(dest_of(c["flag"])) or {}).get("source")}
        for c in (prescription.changes if prescription else [])]
    # the command carries the prescription where there is one; else every finding's changes, most important first
    suggestion = suggest(run.command, prescribed) if prescribed else \
        suggest(run.command, [c for f in findings for c in f.changes])
    return Judgement(facts, suggestion.annotated(findings, prescribed=bool(prescribed)), skipped, prescription,
                     suggestion, verdict(prescription, findings, msgspec.to_builtins(run.efficiency)))
