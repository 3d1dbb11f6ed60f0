"""The `profkit.report/1` document as typed structures, built once (`profkit.report.build_report`) and never
patched: one trace's sections (or the first rank's), vLLM's evidence, the host samples, the facts, the findings
with what the suggested command does with each change, and that command. `Report.document()` is the JSON
contract (`../shared/DESIGN.md`); every renderer and comparison reads that document."""

from __future__ import annotations

from typing import Any

import msgspec

from profkit.analysis.sections import Rank
from profkit.diagnose.engine import Finding
from profkit.diagnose.suggestion import CommandSection
from profkit.diagnose.vllm_run import VllmSection

SCHEMA = "profkit.report/1"


class RunSection(msgspec.Struct, frozen=True):
    """What shows the run is vLLM's (empty: nothing does, and `note` says what that means for the advice)."""

    vllm: list[str]
    note: str | msgspec.UnsetType = msgspec.UNSET


class Report(msgspec.Struct, kw_only=True, frozen=True):
    schema: str
    profkit_version: str
    source: dict[str, Any]
    window: dict[str, Any] | None  # None: no trace (vLLM's evidence only)
    gpu: dict[str, Any] | None
    timeline: Any
    kernels: list[dict[str, Any]]
    categories: list[dict[str, Any]]
    memops: list[dict[str, Any]]
    memory_kinds: list[dict[str, Any]]
    api: list[dict[str, Any]]
    sync: list[dict[str, Any]]
    nvtx: list[dict[str, Any]]
    cpu_ops: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    gap_classes: dict[str, Any]
    steps: dict[str, Any] | None
    sched: dict[str, Any] | None
    launch: dict[str, Any]
    vllm: VllmSection
    findings: list[Finding]
    ranks: list[Rank] | msgspec.UnsetType = msgspec.UNSET  # several GPUs
    imbalance: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # across them
    environment: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET  # the capture's GPU, driver, versions
    run: RunSection
    host: dict[str, Any] | None
    efficiency: dict[str, Any] | None  # how far from the GPU's peak: MFU, MBU, GPU metrics (analysis/efficiency.py)
    facts: dict[str, Any]
    rules_skipped: list[dict[str, Any]]
    command: CommandSection
    suggested_command: str | None

    def document(self) -> dict[str, Any]:
        """The JSON document as plain values (what `--format json` writes, NaN and Infinity aside)."""
        return msgspec.to_builtins(self)
