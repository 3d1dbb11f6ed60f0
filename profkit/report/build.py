"""Build the `profkit.report/1` document once: evidence -> trace sections -> facts -> rules -> suggested command.

This is the library entry point behind `profkit report`; everything here is usable from Python:

    from profkit.evidence.record import Evidence
    from profkit.report import ReportOptions, build_report
    report = build_report("run.sqlite")  # a trace, several, a capture folder; the default options
    report = build_report("run.sqlite", Evidence.read(bench=Path("run/bench.json")), ReportOptions(window="all"))
    report.sections.gpu.utilization, report.findings[0].title, report.document()  # the JSON contract
"""

from __future__ import annotations

from profkit import __version__
from profkit.analysis.vllm import NOT_VLLM_NOTE
from profkit.diagnose.rule_files import load_rules
from profkit.evidence.record import Evidence
from profkit.report.judgement import Judgement, judge
from profkit.report.model import SCHEMA, Report, RunSection
from profkit.report.options import ReportOptions
from profkit.report.sections import Progress, RunSections, TraceInput, run_sections


def build_report(traces: TraceInput = None, evidence: Evidence | None = None, options: ReportOptions | None = None,
                 progress: Progress | None = None) -> Report:
    """Analyse the traces, join the run's evidence, run the rules; return the report.

    `traces`: one trace; several (one per rank of a multi-GPU run), or a folder of them: one report with a
    section per rank (`ranks`) and the cross-rank `imbalance`; a capture folder, whose evidence fills in what
    `evidence` lacks (an explicit option beats the folder: `Evidence.over`); or None. Without a trace (None, or
    a capture folder of an unprofiled run) the report holds the evidence alone: its facts, and the findings whose
    facts are known (the rest in `rules_skipped`). `evidence`: what the run left besides its traces (default:
    nothing); `options`: how to analyse them (default: `ReportOptions()`); `progress`: told each stage's name."""
    options = options or ReportOptions()
    rules = load_rules(list(options.rules_dirs))  # validate the rules before spending time on the trace
    run = run_sections(traces, evidence or Evidence(), options, progress)
    return assemble(run, judge(run, rules))


def assemble(run: RunSections, judgement: Judgement) -> Report:
    """The report of a run's sections and their judgement (the JSON contract's order of keys)."""
    extra: dict = {}
    if run.ranks:
        extra.update(ranks=run.ranks, imbalance=run.imbalance)
    if run.environment:
        extra["environment"] = run.environment
    p = judgement.prescription
    return Report(
        schema=SCHEMA, profkit_version=__version__, source=run.source, sections=run.sections, vllm=run.vllm,
        findings=judgement.findings, **extra,
        run=RunSection(run.shown) if run.shown else RunSection(run.shown, note=NOT_VLLM_NOTE),
        host=run.host, efficiency=run.efficiency, facts=judgement.facts, rules_skipped=judgement.skipped,
        command=judgement.suggestion.section(), suggested_command=judgement.suggestion.text(),
        prescription=p.document() if p else None, verdict=judgement.verdict,
    )
