"""The levers the model of the run knows: one table, read by `predict` (what it can model), the search (the values it
tries), the prescription (every lever, combined) and tune (the flags it may change).

Each lever is a vLLM setting: its flag, the values the model may try besides the run's own and vLLM's default, whether
a change of it changes the model's numerics, and what the simulation does with it (`profkit.model.predict` reads each
one: the KV cache's size, the scheduler's caps, a step's costs, the host's ceilings, the GPUs' split). vLLM's defaults
come from profkit's record of vLLM 0.26 (`profkit.vllm.options.default_of`), by GPU and entry point."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from profkit.model.observe import Observation
from profkit.vllm.options import default_api_servers, default_of, flag_for, setting_value, spellings


@dataclass(frozen=True)
class Lever:
    dest: str  # vLLM's setting (its argparse dest)
    values: tuple[Any, ...]  # what the model may try, besides the run's own value and vLLM's default
    precision: bool  # a change of it changes the model's numerics: only with the user's leave
    reads: str  # what the simulation does with it, in words
    family: str  # the class of change it makes: a prediction's range comes from that class's held-out errors

    @property
    def flag(self) -> str:
        return flag_for(self.dest)


LEVERS: tuple[Lever, ...] = (
    Lever("max_num_seqs", (64, 128, 256, 512, 1024), False, "the most requests a step runs (the batch's cap)",
          "scheduler caps"),
    Lever("max_num_batched_tokens", (2048, 4096, 8192, 16384, 32768), False,
          "the most tokens a step computes (prompt chunks per step)", "scheduler caps"),
    Lever("gpu_memory_utilization", (0.85, 0.9, 0.92), False,
          "the GPU's memory vLLM may use: what the weights and activations leave of it is the KV cache",
          "KV cache size"),
    Lever("kv_cache_memory_bytes", (), False, "the KV cache's size set by hand (removed: vLLM sizes it)",
          "KV cache size"),
    Lever("kv_cache_dtype", ("auto", "fp8"), True, "a cached token's bytes (the cache's capacity) and its read cost",
          "precision"),
    Lever("quantization", (None, "fp8"), True,
          "the weights' bytes (memory freed for the KV cache, a step's reads) and the GEMMs' rate", "precision"),
    Lever("enforce_eager", (False,), False, "CUDA graphs: a step's launch overhead and the engine core's CPU",
          "CUDA graphs"),
    Lever("api_server_count", (1, 2, 4), False, "the API servers' ceiling on the tokens streamed", "API servers"),
    Lever("tensor_parallel_size", (), False, "the GPUs an engine spans: a GPU's share of the work, the all-reduces",
          "GPU layout"),
    Lever("data_parallel_size", (), False, "the engines the requests are spread over", "GPU layout"),
    Lever("max_model_len", (), False, "the longest request vLLM accepts (not searched: the workload sets it)",
          "workload"),
)
BY_DEST = {lever.dest: lever for lever in LEVERS}
MODELLED = frozenset(BY_DEST)
PRECISION = frozenset(lever.dest for lever in LEVERS if lever.precision)
PARALLEL = ("tensor_parallel_size", "data_parallel_size")


def families(changes: dict[str, Any]) -> tuple[str, ...]:
    """The classes of change a configuration change makes (its levers' families), each once, in the table's order;
    a flag the model does not know has none."""
    return tuple(dict.fromkeys(lever.family for lever in LEVERS if lever.dest in changes))


def vllm_default(dest: str, obs: Observation) -> Any:
    """What vLLM uses for `dest` where the run's command does not set it (its GPU, its entry point)."""
    if dest == "max_num_seqs":
        return obs.default_max_num_seqs or default_of(dest, obs.gpu) or 256
    if dest == "gpu_memory_utilization":
        return default_of(dest, obs.gpu)
    if dest == "kv_cache_memory_bytes":
        return None
    if dest == "api_server_count":  # one per engine (vLLM 0.26's internal load balancer; its modes are the log's)
        return default_api_servers({}, obs.data_parallel)
    return default_of(dest, obs.gpu, offline=obs.offline)


def with_defaults(changes: dict[str, Any], obs: Observation) -> dict[str, Any]:
    """A setting removed (None) is vLLM's default for it (the batch cap by the GPU, the token budget by the entry
    point, the memory share, CUDA graphs, one API server, the model's own precision)."""
    out = {}
    for dest, value in changes.items():
        if value is None and dest in BY_DEST and dest not in ("quantization", "kv_cache_memory_bytes"):
            value = vllm_default(dest, obs)
        out[dest] = value
    return out


def unreadable(dest: str, obs: Observation) -> str | None:
    """Why the run's evidence cannot say what a change of the lever would do, in words; None where it can. The
    search does not try such a lever and `predict` refuses it (`profkit.model.refusals`)."""
    if dest == "gpu_memory_utilization" and not (obs.memory.total_bytes and obs.memory.utilization):
        return "the run's evidence gives neither the GPU's memory nor the share vLLM took of it (vLLM's log has both)"
    if dest == "api_server_count" and obs.host.get("api_server_cpu") is None:
        return "the run has no host samples of its API servers, so what they carried is unknown (profkit capture " \
               "records them)"
    if dest == "quantization" and not obs.fp8_flops:
        return f"the {obs.gpu or 'GPU'} has no FP8 tensor cores (vLLM runs FP8 weights there as weight-only " \
               "kernels, which the model has not measured)"
    return None


def unknown_refusal(changes: dict[str, Any]) -> str | None:
    """Why the model refuses `changes` ({vLLM dest: value}) whatever the run: flags it does not know. Their effect
    is not "none": a prediction of the others would be said as the whole change's (`--stream-interval` moves a
    frontend-bound run, `--speculative-config` a decode-bound one)."""
    words = spellings()
    # a config flag's JSON keys are settings too (`--speculative-config`'s method): said as the flag that was written
    within = {dest for dest in changes if words.config_dests.get((words.settings.get(dest) or {}).get("config", ""))
              in changes}
    unknown = [flag_for(dest) for dest in changes if dest not in MODELLED and dest not in within]
    if not unknown:
        return None
    known = ", ".join(flag_for(dest) for dest in sorted(MODELLED))
    return (f"the model does not know what {', '.join(unknown)} would do (it models {known})"
            + ("; ask without it for the others" if set(changes) & MODELLED else ""))


def typed(changes: dict[str, Any]) -> dict[str, Any]:
    """The changes' values as vLLM reads them ('1K' -> 1024; max_model_len -1 -> None, vLLM's default); ValueError
    where vLLM would not take one (`refusal` says which first)."""
    return {dest: setting_value(dest, value) for dest, value in changes.items()}


def value_refusal(changes: dict[str, Any]) -> str | None:
    """The first value vLLM would not take among `changes` ({vLLM dest: value}), in words, or None."""
    for dest, value in changes.items():
        try:
            setting_value(dest, value)
        except ValueError as exc:
            return f"{flag_for(dest)} {value}: a value vLLM would not take (it takes {exc})"
    return None


def refusal(obs: Observation, changes: dict[str, Any]) -> str | None:
    """Why the table cannot answer `changes` ({vLLM dest: value}) on the run, or None: a flag it does not know, a
    value vLLM would not take, a lever whose effect the run's evidence cannot read. `predict` refuses these with
    `refusals.change_refusal`'s."""
    if (unknown := unknown_refusal(changes) or value_refusal(changes)) is not None:
        return unknown
    for dest in changes:
        if (why := unreadable(dest, obs)) is not None:
            return f"{flag_for(dest)}: {why}"
    return None


def space(obs: Observation, allow_precision: bool) -> dict[str, tuple[Any, ...]]:
    """The values the search tries per lever for this run: the run's own first, vLLM's default, the lever's values
    where the run's evidence lets the model read their effect (the GPU's memory, host samples, 16-bit weights on an
    FP8-capable GPU), each once; levers that cannot move left out."""
    config = obs.config
    out: dict[str, tuple[Any, ...]] = {}
    for lever in LEVERS:
        dest = lever.dest
        if lever.precision and not allow_precision or dest in PARALLEL or dest == "max_model_len":
            continue
        if unreadable(dest, obs) is not None \
                or dest == "kv_cache_memory_bytes" and not obs.memory.kv_given \
                or dest == "quantization" and obs.weight_bits <= 8 \
                or dest == "kv_cache_dtype" and str(config.get("kv_cache_dtype") or "auto").startswith("fp8") \
                or dest == "enforce_eager" and not config.get("enforce_eager"):
            continue
        own = config.get(dest)
        default = None if dest in ("kv_cache_memory_bytes", "quantization") else vllm_default(dest, obs)
        # vLLM's default is said once: as the flag removed (None) where the run set another value, else the run's own
        values = [own, *([None] if own != default else []), *(v for v in lever.values if v != default)]
        out[dest] = tuple(dict.fromkeys(values))
    return out


def layouts(obs: Observation) -> list[dict[str, Any]]:
    """Every other split of the run's GPUs into engines of equal size (4 GPUs: 1x4, 2x2, 4x1), as changes: starts of
    the search (the split is one unit, both flags together)."""
    gpus = obs.tensor_parallel * obs.data_parallel
    return [{"tensor_parallel_size": t, "data_parallel_size": gpus // t} for t in range(1, gpus + 1)
            if gpus % t == 0 and (t, gpus // t) != (obs.tensor_parallel, obs.data_parallel)]


def describe(changes: dict[str, Any]) -> str:
    """Changes as flags: `--max-num-seqs 512 --kv-cache-dtype fp8`, a removed flag `--max-num-seqs default` (vLLM's
    default: the spelling `predict` takes back)."""
    return " ".join(f"{flag_for(k)} {'default' if v is None else v}" for k, v in changes.items())
