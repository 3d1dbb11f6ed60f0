"""Is this a vLLM run? vLLM flag changes need evidence that it is (issue: advice out of place).

A trace says so by vLLM's own names: its CUDA kernels live in the `vllm::` namespace (rms_norm_kernel,
reshape_and_cache_flash_kernel, act_and_mul_kernel...), its custom ops are `vllm::...` in torch traces, and its
profiler annotations read `execute_context_N(T)_generation_M(M)`. The other evidence is vLLM's own files.
"""

from __future__ import annotations

from typing import Any

from profkit.traces.model import Trace

# LIKE patterns over the trace's names (kernel, API and op names share the strings table; NVTX has its own
# text). The kernel must be vLLM's own (`void vllm::...`): other engines reuse vLLM kernels whose template
# arguments name `vllm::` (SGLang's ROCm paged attention on an MI300X trace), and that is no vLLM run.
VLLM_NAME_PATTERNS = ("vllm::%", "void vllm::%", "vllm.%", "execute_context_%")


def trace_mentions_vllm(trace: Trace) -> bool:
    """A scan of the names (no index helps a LIKE) that stops at the first vLLM name."""
    where = " OR ".join(["value LIKE ?"] * len(VLLM_NAME_PATTERNS))
    if trace.query(f"SELECT 1 FROM strings WHERE {where} LIMIT 1", VLLM_NAME_PATTERNS):
        return True
    if trace.has("nvtx"):
        where = " OR ".join(["name LIKE ?"] * len(VLLM_NAME_PATTERNS))
        return bool(trace.query(f"SELECT 1 FROM nvtx WHERE {where} LIMIT 1", VLLM_NAME_PATTERNS))
    return False


def vllm_run_evidence(evidence: dict[str, Any], has_command: bool, trace_names: bool) -> list[str]:
    """What shows the run is vLLM's, in words (empty: nothing does)."""
    found = []
    if has_command:
        found.append("the run's vLLM command")
    for key, words in (("bench", "a vLLM benchmark result"), ("log", "a vLLM log"),
                       ("metrics", "vLLM /metrics"), ("flags", "vLLM flags")):
        if evidence.get(key):
            found.append(words)
    if trace_names:
        found.append("vLLM kernel or annotation names in the trace")
    return found


NOT_VLLM_NOTE = ("no evidence this is a vLLM run (no vLLM command, log, benchmark, metrics or flags, and no "
                 "vLLM kernel or annotation names in the trace): the findings say what the trace shows; no "
                 "vLLM flags are suggested. Give --vllm-log or --vllm-args (or capture with profkit) for them.")
