"""The scheduler simulation keeps per-step aggregates (a running KV sum, blocks due by step number, a heap of
finishes) instead of walking every request each step: it must give the first implementation's results bit for bit
(tests/oracles/simulate_v1.py) on every workload, engine and cost, including preemption, client caps, Poisson
arrivals and configurations vLLM refuses."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.model.simulate import PROFILE_POINTS, Engine, Infeasible, StepCost, Workload, _Run, simulate
from tests.oracles.simulate_v1 import simulate as first_implementation


def _outcome(fn, work: Workload, engine: Engine, cost: StepCost) -> object:
    try:  # the token profile came after the first implementation (test_the_token_profile_counts_each_requests_tokens)
        return repr(replace(fn(work, engine, cost), token_profile=()))
    except Infeasible as exc:  # the message says why, the same way
        return ("infeasible", str(exc))


workloads = st.builds(Workload, requests=st.integers(1, 160), prompt_tokens=st.integers(1, 3000),
                      output_tokens=st.integers(1, 300),
                      request_rate=st.one_of(st.none(), st.floats(0.2, 80.0)),
                      max_concurrency=st.one_of(st.none(), st.integers(1, 96)))


@st.composite
def engines(draw: st.DrawFn) -> Engine:
    seqs = draw(st.sampled_from([2, 8, 32, 128, 512]))
    return Engine(kv_tokens=draw(st.integers(300, 120_000)), max_num_seqs=seqs,
                  max_num_batched_tokens=seqs * draw(st.integers(1, 64)), block_size=draw(st.sampled_from([1, 16])),
                  reserve=draw(st.sampled_from([0.0, 0.01, 0.1])), async_scheduling=draw(st.booleans()))


costs = st.builds(StepCost, overhead_s=st.floats(1e-5, 5e-3), weights_s=st.floats(1e-4, 5e-2),
                  token_s=st.floats(1e-8, 1e-5), kv_token_s=st.floats(1e-10, 1e-7), pair_s=st.floats(1e-13, 1e-10),
                  cpu_step_s=st.sampled_from([0.0, 5e-4, 5e-3]), cpu_seq_s=st.sampled_from([0.0, 2e-6]),
                  comm_s=st.sampled_from([0.0, 1e-4]), comm_token_s=st.sampled_from([0.0, 1e-8]))


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, engines(), costs)
def test_the_simulation_gives_the_first_implementations_bits(work: Workload, engine: Engine, cost: StepCost) -> None:
    assert _outcome(simulate, work, engine, cost) == _outcome(first_implementation, work, engine, cost)


def test_a_kv_bound_run_preempts_as_vllm_does_and_matches_the_first_implementation() -> None:
    """The README sample's shape: 400 requests of 1024/256 at once into 115,024 KV tokens (it preempted 84 times)."""
    work = Workload(400, 1024, 256)
    engine = Engine(kv_tokens=115_024, max_num_seqs=1024, max_num_batched_tokens=8192, reserve=0.0)
    cost = StepCost(overhead_s=5e-4, weights_s=8e-3, token_s=3e-6, kv_token_s=2e-8, pair_s=1e-11)
    new, old = simulate(work, engine, cost), first_implementation(work, engine, cost)
    assert replace(new, token_profile=()) == old and new.preemptions > 0 and not math.isnan(new.decode_step_s)


@pytest.mark.parametrize("rate", [None, 6.0])
def test_the_token_profile_counts_each_requests_tokens(rate: float | None) -> None:
    """SimResult.token_profile against each request's tokens counted one by one at each profiled time: its first at
    its first token's time, the rest evenly until its last (preemptions included: the README sample's shape)."""
    work = Workload(400, 1024, 256, request_rate=rate, length_spread=0.5)
    engine = Engine(kv_tokens=115_024, max_num_seqs=1024, max_num_batched_tokens=8192, reserve=0.0)
    cost = StepCost(overhead_s=5e-4, weights_s=8e-3, token_s=3e-6, kv_token_s=2e-8, pair_s=1e-11)
    run = _Run(work, engine, cost)
    r = run.run(2_000_000)
    first, finish, out = np.array(run.first), np.array(run.finish), np.array(run.output_len, dtype=float)
    start = float(run.arrival_np.min())
    counted = []
    for t in start + r.elapsed_s * np.linspace(0.0, 1.0, PROFILE_POINTS + 1):
        made = sum((1.0 if t >= f else 0.0) + (n - 1) * min(max((t - f) / (e - f), 0.0), 1.0) if e > f else
                   (n if t >= e else 0.0) for f, e, n in zip(first, finish, out, strict=True))
        counted.append(made / out.sum())
    assert r.preemptions > 0 or rate
    assert len(r.token_profile) == PROFILE_POINTS + 1 and r.token_profile[0] == 0.0 and r.token_profile[-1] == 1.0
    assert r.token_profile == pytest.approx(counted, abs=1e-9)
    assert all(b >= a for a, b in zip(r.token_profile[:-1], r.token_profile[1:], strict=True))


def test_vllms_refusals_are_infeasible() -> None:
    cost = StepCost(1e-3, 1e-2, 1e-6, 1e-8, 1e-11)
    with pytest.raises(Infeasible, match="--max-num-batched-tokens 128 is below --max-num-seqs 256"):
        simulate(Workload(10, 100, 10), Engine(10_000, max_num_seqs=256, max_num_batched_tokens=128), cost)


def test_request_lengths_are_drawn_as_the_random_dataset_draws_them() -> None:
    """--random-range-ratio 0.5 at 512/512 (tests/data/h200_model_led's start C): each request's lengths from
    int(512 x 0.5) to int(512 x 1.5), both included, their mean the workload's; a fixed seed; output tokens counted
    per request, and TPOT over each request's own tokens."""

    from profkit.model.simulate import lengths, simulate_latencies

    work = Workload(900, 512, 512, request_rate=30.0, length_spread=0.5)
    prompts, outputs = lengths(work)
    assert lengths(work) == (prompts, outputs) and prompts != outputs
    for drawn in (prompts, outputs):
        assert min(drawn) >= 256 and max(drawn) <= 768 and min(drawn) < 270 and max(drawn) > 755
        assert sum(drawn) / len(drawn) == pytest.approx(512, rel=0.02)
    engine = Engine(kv_tokens=600_000, max_num_seqs=256, max_num_batched_tokens=8192)
    cost = StepCost(overhead_s=5e-4, weights_s=7e-3, token_s=4.5e-5, kv_token_s=5e-8, pair_s=1e-11)
    r, lat = simulate_latencies(work, engine, cost)
    assert r.output_throughput == pytest.approx(sum(outputs) / r.elapsed_s)
    fixed, _ = simulate_latencies(replace(work, length_spread=0.0), engine, cost)
    assert fixed.output_throughput == pytest.approx(900 * 512 / fixed.elapsed_s)
    assert lat.tpot_s.shape == (900,) and float(lat.e2el_s.max()) > float(lat.e2el_s.min()) * 1.5
    with pytest.raises(Infeasible, match="1,536 tokens"):  # the longest request drawn must fit the cache
        simulate(work, Engine(kv_tokens=1_500, max_num_seqs=8, max_num_batched_tokens=2048), cost)
