"""The `profkit.report/1` document as typed structures, built once (`profkit.report.build_report`) and never
patched: one trace's sections (or the first rank's: `profkit.analysis.sections.Sections`), vLLM's evidence, the
host samples, the facts, the findings with what the suggested command does with each change, and that command.
`Report.document()` is the JSON contract (`docs/design.md`); every renderer and comparison reads that
document."""

from __future__ import annotations

from typing import Any

import msgspec

from profkit.analysis.sections import Imbalance, Rank, Sections
from profkit.analysis.vllm import VllmSection
from profkit.diagnose.engine import Finding
from profkit.diagnose.suggestion import CommandSection

SCHEMA = "profkit.report/1"


class RunSection(msgspec.Struct, frozen=True):
    """What shows the run is vLLM's (empty: nothing does, and `note` says what that means for the advice)."""

    vllm: list[str]
    note: str | msgspec.UnsetType = msgspec.UNSET


class Report(msgspec.Struct, kw_only=True, frozen=True):
    schema: str
    profkit_version: str
    source: dict[str, Any]
    sections: Sections  # the trace's (empty: no trace, vLLM's evidence only); the document holds them at its top
    vllm: VllmSection
    findings: list[Finding]
    ranks: list[Rank] | msgspec.UnsetType = msgspec.UNSET  # several GPUs
    imbalance: Imbalance | msgspec.UnsetType = msgspec.UNSET  # across them
    environment: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # the capture's GPU, driver, versions
    run: RunSection
    host: dict[str, Any] | None
    efficiency: dict[str, Any] | None  # how far from the GPU's peak: MFU, MBU, GPU metrics (analysis/efficiency.py)
    facts: dict[str, Any]
    rules_skipped: list[dict[str, Any]]
    command: CommandSection
    suggested_command: str | None
    # one set of changes the model of the run chose and predicted (diagnose/prescription.py); None where no finding
    # proposes a lever the model knows, or the run is not shown to be vLLM's
    prescription: dict[str, Any] | None = None
    # what limits the run, the report's first word: {"limit", "by": the model of the run | the leading finding}
    verdict: dict[str, Any] | None = None

    def document(self) -> dict[str, Any]:
        """The JSON document as plain values (what `--format json` writes, NaN and Infinity aside): the
        sections in the report's place for them, each a key of its own."""
        return {key: value for name, part in msgspec.to_builtins(self).items()
                for key, value in (part.items() if name == "sections" else [(name, part)])}
