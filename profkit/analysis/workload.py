"""Is this a vLLM run? vLLM flag changes need evidence that it is (issue: advice out of place).

A trace says so by vLLM's own names: its CUDA kernels live in the `vllm::` namespace (rms_norm_kernel,
reshape_and_cache_flash_kernel, act_and_mul_kernel...), its custom ops are `vllm::...` in torch traces, and its
profiler annotations read `execute_context_N(T)_generation_M(M)`. The other evidence is vLLM's own files.
"""

from __future__ import annotations

from profkit.traces.schema import Trace

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
