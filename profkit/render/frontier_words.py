"""What stands beside a predicted frontier, in words, for `predict --frontier` and the report's frontier alike: the
step at a rate where it is not the fit's, what the recorded sweeps of its class measured against the model, and whose
its every-request-at-once point is."""

from __future__ import annotations

from typing import Any

# the every-request-at-once point is `predict`'s, the rows at a rate the simulation's (model.frontier): said beside it
ANCHORED = "anchored to the measured run as the prediction's figures are; the rows at a rate are the simulation's"


def _pct(x: float) -> str:
    return f"{x * 100:+.0f} %"


def missed_by_words(missed: dict[str, Any] | None) -> str | None:
    """What the recorded sweeps of the frontier's class measured against the model at a rate, in words."""
    if not missed:
        return None
    ttft, tpot = missed["p99_ttft_ms"], missed["p99_tpot_ms"]
    return (f"on {missed['sweeps']} recorded sweep(s) of {missed['of']} the measured p99 TTFT was "
            f"{_pct(ttft['low'])} to {_pct(ttft['high'])} and p99 TPOT {_pct(tpot['low'])} to {_pct(tpot['high'])} "
            f"from the model's ({_ends(ttft, tpot)} of their points)")


def _ends(*bands: dict[str, Any]) -> str:
    return " and ".join(dict.fromkeys(b["ends"] for b in bands))


def gpu_scale_words(f: dict[str, Any]) -> str | None:
    """The step at a rate, where it is not the fit's (`gpu_scale_at_a_rate`), in words."""
    scale = f.get("gpu_scale_at_a_rate", 1.0)
    if scale == 1.0:
        return None
    return (f"At a rate each step's GPU time is the fit's x {scale:.2f}, the run's GPU busy share (NVML): an "
            "empirical correction, checked against measured sweeps (docs/prediction.md)")


def frontier_notes(f: dict[str, Any]) -> list[str]:
    """What stands beside a predicted frontier: the step at a rate where it is not the fit's, and what the recorded
    sweeps of its class measured against the model (each rate's range carries it)."""
    out = [words] if (words := gpu_scale_words(f)) else []
    if words := missed_by_words(f.get("missed_by")):
        out.append(f"At a rate, {words}: each rate's range carries it")
    return out
