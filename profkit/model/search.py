"""`profkit predict --search`: the values of the levers the model knows that it predicts best for the run, within
the user's constraints (SLOs, precision). A coordinate search from the run's own settings: each round tries every
value of every lever with the others held, keeps the best move, and stops when no move gains more than the noise;
every configuration tried is kept, and the best that meet the SLOs are returned."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from profkit.model.predict import DEFAULT_NOISE, Calibrated, Prediction, predict
from profkit.model.simulate import Infeasible

OBJECTIVE = "request_throughput"


def levers(cal: Calibrated, allow_precision: bool) -> dict[str, tuple[Any, ...]]:
    """The values tried per setting: the run's own first, then vLLM-safe alternatives."""
    config = cal.observation.config
    out: dict[str, tuple[Any, ...]] = {
        "max_num_seqs": (128, 256, 512, 1024),
        "max_num_batched_tokens": (8192, 16384),
    }
    if cal.observation.memory.total_bytes and cal.observation.memory.utilization:
        out["gpu_memory_utilization"] = (0.85, 0.9, 0.92)
    if cal.observation.host.get("api_server_cpu") is not None:
        out["api_server_count"] = (1, 2, 4)
    if allow_precision:
        out["kv_cache_dtype"] = ("auto", "fp8")
        out["quantization"] = (None, "fp8")
    return {k: tuple(dict.fromkeys((config.get(k), *v))) for k, v in out.items()}


def search(cal: Calibrated, allow_precision: bool = False, accept: Callable[[Prediction], bool] = lambda _p: True,
           top: int = 5, noise: float | None = None, rounds: int = 3) -> list[Prediction]:
    """The `top` predicted configurations (best objective first) among those tried that `accept` (the SLOs)."""
    space = levers(cal, allow_precision)
    seen: dict[tuple, Prediction] = {}

    def tried(changes: dict[str, Any]) -> Prediction | None:
        key = tuple(sorted((k, str(v)) for k, v in changes.items()))
        if key not in seen:
            try:
                seen[key] = predict(cal, {k: v for k, v in changes.items() if v is not None or k == "quantization"},
                                    noise=noise)
            except Infeasible:
                return None
        return seen[key]

    def value(p: Prediction | None) -> float:
        return objective(p) if p is not None and accept(p) else float("-inf")

    current: dict[str, Any] = {}
    best = tried(current)
    threshold = max(noise if noise is not None else DEFAULT_NOISE, 0.02)
    for _ in range(rounds):
        moves = [({**current, k: v}, tried({**current, k: v})) for k, values in space.items() for v in values
                 if current.get(k, cal.observation.config.get(k)) != v]
        if not moves:
            break
        changes, p = max(moves, key=lambda m: value(m[1]))
        if value(p) <= value(best) * (1 + threshold):
            break
        current, best = changes, p
    ranked = sorted((p for p in seen.values() if accept(p)), key=lambda p: -objective(p))
    return ranked[:top]


def objective(p: Prediction) -> float:
    """The prediction's objective (request throughput), -inf where it has none."""
    v = p.metrics[OBJECTIVE]["predicted"]
    return float("-inf") if v is None else v
