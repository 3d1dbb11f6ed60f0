"""What the run served: is it vLLM at all, and the benchmark's workload.

Is this a vLLM run? vLLM flag changes need evidence that it is (issue: advice out of place).

A trace says so by vLLM's own names: its CUDA kernels live in the `vllm::` namespace (rms_norm_kernel,
reshape_and_cache_flash_kernel, act_and_mul_kernel...), its custom ops are `vllm::...` in torch traces, and its
profiler annotations read `execute_context_N(T)_generation_M(M)`. The other evidence is vLLM's own files.
"""

from __future__ import annotations

from typing import Any

from profkit.evidence.bench import BenchResult
from profkit.traces.schema import Trace
from profkit.vllm.command import VllmCommand

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


def workload_section(bench_cmd: VllmCommand | None, bench: BenchResult | None) -> dict[str, Any]:
    """What the benchmark's command and result say of its workload (`workload.*` facts): tokens per request (the
    result's means, else the command's random lengths), the most a request needs, and whether prompts share
    prefixes."""
    lengths = bench_cmd.prompt_lengths() if bench_cmd else None
    # the command's prompt: its fixed prefix, then the input drawn around --random-input-len
    asked = (float(lengths[3] + lengths[0]), float(lengths[1])) if lengths else None
    mean = (bench.request_tokens() if bench else None) or _offline_tokens(asked, lengths[2] if lengths else None, bench)
    per_request = mean[0] + mean[1] if mean else asked[0] + asked[1] if asked else None
    return {"shared_prefixes": bench_cmd.shared_prefixes() if bench_cmd else None,
            "tokens_per_request": per_request,
            "prompt_tokens": mean[0] if mean else None, "output_tokens": mean[1] if mean else None,
            "max_tokens_per_request": int(lengths[3] + (lengths[0] + lengths[1]) * (1 + lengths[2])) if lengths
            else None,
            "length_spread": lengths[2] if lengths else None,
            # what the command asked, beside what the server got: vLLM's random dataset decodes random ids to text
            # that the server's tokenizer encodes again, to other lengths where the two disagree
            "asked_prompt_tokens": asked[0] if asked else None}


def _offline_tokens(asked: tuple[float, float] | None, spread: float | None,
                    bench: BenchResult | None) -> tuple[float, float] | None:
    """`vllm bench throughput` writes only the total of prompt and output tokens: the command's random lengths
    (`asked`: prompt and output) split it where every request had them (no range ratio: `spread` 0) and they add up
    to that total within 1 %."""
    if not asked or spread is None or spread or bench is None or not bench.num_requests \
            or not bench.tokens_per_second or not bench.elapsed_s:
        return None
    total = bench.tokens_per_second * bench.elapsed_s
    expected = bench.num_requests * (asked[0] + asked[1])
    return asked if abs(total / expected - 1) <= 0.01 else None
