"""A step-level simulation of vLLM V1's scheduler over one benchmark's requests (the Vidur idea, at the granularity of
engine steps, with step costs calibrated on the user's own run instead of profiled offline).

Each engine step: the running requests that have their prompt decode one token each; prompts are computed in chunks
within the step's token budget (`--max-num-batched-tokens`, chunked prefill), first the running requests' then new
ones, admitted first come first served while fewer than `--max-num-seqs` run and the KV cache has room. A decoding
request that finds no free KV slot preempts the most recently admitted request (vLLM V1 recomputes it: its KV is
freed and it later computes its prompt and what it had generated again), and a step that preempted admits nobody. A
step's time is the engine's overhead, plus the larger of reading every weight once and the step's GEMM arithmetic,
plus the attention's KV reads and FLOPs, or the engine core's CPU time for the step where that is longer
(`StepCost`). Requests arrive all at once (`--request-rate inf`), at a steady rate, and never more than the client's
`--max-concurrency` in flight.

Pure and deterministic: the same inputs give the same run. One step costs a few vector operations over the requests
(numpy), so a benchmark of a thousand requests simulates in well under a second."""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

ARRIVAL_SEED = 0


class Infeasible(ValueError):
    """The configuration cannot serve the workload (a request needs more KV cache than there is): vLLM refuses to
    start, or never finishes the request."""


@dataclass(frozen=True)
class Workload:
    requests: int
    prompt_tokens: int  # per request
    output_tokens: int  # per request
    request_rate: float | None = None  # requests/s; None: all at once
    max_concurrency: int | None = None  # the client's cap on requests in flight
    offline: bool = False  # `vllm bench throughput`: every request handed to the engine at once, no client


@dataclass(frozen=True)
class Engine:
    kv_tokens: int  # the KV cache's capacity in tokens
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = 16  # vLLM allocates the cache in blocks of this many tokens
    reserve: float = 0.0  # share of the cache an admission leaves free (fitted to the run's own preemptions)


@dataclass(frozen=True)
class StepCost:
    """Seconds per unit of a step's work (per GPU: tensor parallelism already divides the work)."""

    overhead_s: float  # per step: scheduling, launches (large without CUDA graphs), sampling
    weights_s: float  # reading every weight once
    token_s: float  # the GEMMs of one token (2 x params FLOPs at the achieved rate)
    kv_token_s: float  # reading one cached token's K and V
    pair_s: float  # one (query, key) pair of attention arithmetic
    cpu_step_s: float = 0.0  # the engine core's CPU per step (scheduling, sampling, output processing) ...
    cpu_seq_s: float = 0.0  # ... and per request in the step
    comm_s: float = 0.0  # tensor parallelism's all-reduces per step: their latency ...
    comm_token_s: float = 0.0  # ... and per token of the step (its activations over NVLink)

    def step_s(self, tokens: float, kv_read: float, pairs: float, seqs: int = 0) -> float:
        """The GPU's time for the step, or the engine core's CPU time where that is longer (with asynchronous
        scheduling the CPU prepares the next step while the GPU runs this one)."""
        gpu = self.overhead_s + max(self.weights_s, tokens * self.token_s) + kv_read * self.kv_token_s \
            + pairs * self.pair_s + self.comm_s + tokens * self.comm_token_s
        return max(gpu, self.cpu_step_s + seqs * self.cpu_seq_s)


@dataclass(frozen=True)
class SimResult:
    elapsed_s: float
    request_throughput: float
    output_throughput: float
    ttft_mean_s: float
    tpot_mean_s: float
    ttft_p99_s: float
    tpot_p99_s: float
    preemptions: int
    steps: int
    batch_mean: float  # requests decoding per decode-bearing step
    batch_max: int
    decode_step_s: float  # the mean time of a step with no prompt tokens (nan: none)
    kv_full_share: float  # share of steps that ended with the KV cache (nearly) full
    prompt_tokens_computed: int  # prompts' tokens computed, recomputations after preemption included


def simulate(work: Workload, engine: Engine, cost: StepCost, max_steps: int = 2_000_000) -> SimResult:
    """The run of `work` on `engine` at `cost`, step by step.

    A step costs O(1) Python work plus its events (an arrival, an admission, a prompt's chunk, a finish, a
    preemption): every decoding request decodes in every step (vLLM needs --max-num-batched-tokens >=
    --max-num-seqs), so a decoding request's KV tokens and output are its values when it began decoding plus the
    steps since, the decoding batch's KV reads one running sum, the requests needing a new KV block this step a
    count by step number modulo the block size, and the next to finish the top of a heap. The arithmetic and its
    order are the first implementation's (tests/oracles/simulate_v1.py): the same inputs give the same bits."""
    n, prompt, out = work.requests, work.prompt_tokens, work.output_tokens
    if n <= 0 or prompt < 0 or out <= 0 or engine.kv_tokens <= 0 or engine.max_num_seqs <= 0 \
            or engine.max_num_batched_tokens <= 0:
        raise ValueError("a workload and an engine of positive sizes")
    if prompt + out > engine.kv_tokens // engine.block_size * engine.block_size:
        raise Infeasible(f"a request of {prompt + out:,} tokens needs more than the KV cache's "
                         f"{engine.kv_tokens:,}")
    if engine.max_num_batched_tokens < engine.max_num_seqs:  # vLLM's SchedulerConfig refuses it at start-up
        raise Infeasible(f"--max-num-batched-tokens {engine.max_num_batched_tokens:,} is below --max-num-seqs "
                         f"{engine.max_num_seqs:,}, which vLLM refuses")
    # `vllm bench serve --request-rate R` sends a Poisson stream (its default burstiness 1): bursts fill the cache
    # that evenly spaced arrivals would not. A fixed seed: the same workload simulates the same way every time.
    arrival_np = np.zeros(n) if not work.request_rate else \
        np.cumsum(np.random.default_rng(ARRIVAL_SEED).exponential(1.0 / work.request_rate, n)) - 1.0 / work.request_rate
    arrival = arrival_np.tolist()
    cap = work.max_concurrency or n
    # the client's free slots, by when each came free: a request held back by --max-concurrency is sent (and its
    # TTFT starts, as vllm bench measures it) when a slot frees, not when it was due
    slots = deque([0.0] * min(cap, n))
    sent = [0.0] * n
    need = [prompt] * n  # tokens to compute before the request decodes
    done = [0] * n  # of those, computed
    generated = [0] * n
    kv = [0] * n  # KV tokens held (a decoding request's: when it began decoding, see `entry`)
    first = [math.nan] * n
    finish = [math.nan] * n
    bs = engine.block_size
    capacity = engine.kv_tokens // bs * bs
    # running requests in admission order (finished ones left in place, skipped: `alive`); those mid-prompt apart
    running: list[int] = []
    alive = [False] * n
    n_running = 0
    prefilling: list[int] = []
    waiting: deque[int] = deque()
    # decoding requests: the step counter when each began (kv and generated grew by one a step since)
    decoding = [False] * n
    entry = [0] * n
    by_residue = [0] * bs  # decoding requests by (entry - kv) mod bs: those needing a block at step s have s mod bs
    n_decoding = 0
    kv_offset = 0  # sum over decoding requests of kv - entry: their KV tokens at step s are kv_offset + n_decoding * s
    finishing: list[tuple[int, int, int]] = []  # (step counter at which it finishes, request, epoch)
    epoch = [0] * n
    held_total = 0  # whole blocks held, in tokens
    next_arrival = 0
    clock = 0.0
    preemptions = steps = computed = 0
    batch_sum = batch_steps = batch_max = 0
    decode_time = 0.0
    decode_steps = full_steps = 0
    in_flight = 0

    def kv_of(r: int) -> int:
        return kv[r] + steps - entry[r] if decoding[r] else kv[r]

    def stop_decoding(r: int) -> None:
        nonlocal n_decoding, kv_offset
        kv[r] = kv[r] + steps - entry[r]
        generated[r] = generated[r] + steps - entry[r]
        decoding[r] = False
        by_residue[(entry[r] - entry_kv[r]) % bs] -= 1
        n_decoding -= 1
        kv_offset -= entry_kv[r] - entry[r]
        epoch[r] += 1

    entry_kv = [0] * n  # kv when it began decoding

    def evict(r: int) -> int:
        """Take a running request back to waiting (vLLM V1 recomputes it); returns the KV tokens it held."""
        nonlocal held_total, n_running, preemptions
        if decoding[r]:
            stop_decoding(r)
        elif r in prefilling:
            prefilling.remove(r)
        held = -(-kv[r] // bs) * bs
        held_total -= held
        kv[r] = 0
        need[r] = prompt + generated[r]  # recomputed: its prompt and what it had generated
        done[r] = 0
        alive[r] = False
        n_running -= 1
        waiting.appendleft(r)
        preemptions += 1
        return held

    def last_running() -> int:
        while not alive[running[-1]]:
            running.pop()
        return running.pop()

    while steps < max_steps:
        # arrivals: those due, within the client's concurrency
        while next_arrival < n and in_flight < cap and arrival[next_arrival] <= clock:
            sent[next_arrival] = max(arrival[next_arrival], slots.popleft())
            waiting.append(next_arrival)
            next_arrival += 1
            in_flight += 1
        if not n_running and not waiting:
            if next_arrival >= n:
                break
            clock = max(clock, arrival[next_arrival]) if in_flight < cap else clock
            continue
        budget = engine.max_num_batched_tokens
        free = capacity - held_total
        # decode: one token each for running requests past their prompt (a new block for those whose blocks are
        # full); preempt from the back for room
        preempted = False
        while n_decoding and free < bs * by_residue[steps % bs]:
            free += evict(last_running())
            preempted = True
        grow = by_residue[steps % bs]
        batch = n_decoding
        budget -= batch
        free -= bs * grow
        kv_read = float(kv_offset + batch * steps)
        tokens = batch
        pairs = kv_read + batch
        chunks: list[tuple[int, int]] = []
        # prompts: running requests mid-prompt first, then admissions (first come, first served)
        for r in prefilling:
            if budget <= 0 or free <= 0:
                break
            held = -(-kv[r] // bs) * bs
            c = int(min(need[r] - done[r], budget, free + held - kv[r]))
            chunks.append((r, c))
            budget -= c
            free -= -(-(kv[r] + c) // bs) * bs - held
        # as vLLM V1's scheduler: no admission in a step that preempted (the victim would come straight back)
        # the reserve keeps room for the running requests' next blocks; with none running it holds nothing back
        reserve = int(engine.reserve * capacity) if n_running else 0
        while not preempted and waiting and budget > 0 and free > reserve and n_running < engine.max_num_seqs:
            r = waiting.popleft()
            running.append(r)
            alive[r] = True
            n_running += 1
            prefilling.append(r)
            c = int(min(need[r] - done[r], budget, free - reserve))
            if c > 0:
                chunks.append((r, c))
                budget -= c
                free -= -(-c // bs) * bs
        for r, c in chunks:
            computed += c
            kv_read += done[r]
            pairs += c * done[r] + c * (c + 1) / 2
            tokens += c
        if tokens == 0:  # nothing fits: the newest request gives its blocks back (vLLM preempts it), or none can
            if n_running < 2:
                raise Infeasible("the KV cache cannot hold one request's next token")
            evict(last_running())
            continue
        dt = cost.step_s(tokens, kv_read, pairs, batch + len(chunks))
        clock += dt
        held_total += bs * grow
        steps += 1
        if batch:
            batch_sum += batch
            batch_steps += 1
            batch_max = max(batch_max, batch)
            if not chunks:
                decode_time += dt
                decode_steps += 1
        for r, c in chunks:
            before = -(-kv[r] // bs) * bs
            kv[r] += c
            done[r] += c
            held_total += -(-kv[r] // bs) * bs - before
            if done[r] >= need[r]:  # the prompt is complete: its next token comes with this step
                generated[r] += 1
                if math.isnan(first[r]):
                    first[r] = clock
                prefilling.remove(r)
                decoding[r] = True
                entry[r], entry_kv[r] = steps, kv[r]
                by_residue[(steps - kv[r]) % bs] += 1
                n_decoding += 1
                kv_offset += kv[r] - steps
                heapq.heappush(finishing, (steps + out - generated[r], r, epoch[r]))
        while finishing and finishing[0][0] <= steps:
            _, r, e = heapq.heappop(finishing)
            if e != epoch[r] or not decoding[r]:
                continue
            stop_decoding(r)
            finish[r] = clock
            held_total -= -(-kv[r] // bs) * bs
            kv[r] = 0
            alive[r] = False
            n_running -= 1
            in_flight -= 1
            slots.append(clock)
        if free <= 0.01 * capacity:
            full_steps += 1
    finish_np, first_np, sent_np = np.array(finish), np.array(first), np.array(sent)
    if np.isnan(finish_np).any():
        raise ValueError(f"the simulation did not finish within {max_steps:,} steps")
    start = float(arrival_np.min())
    elapsed = float(finish_np.max()) - start
    ttft = first_np - sent_np
    tpot = (finish_np - first_np) / max(out - 1, 1)
    return SimResult(
        elapsed_s=elapsed, request_throughput=n / elapsed, output_throughput=n * out / elapsed,
        ttft_mean_s=float(ttft.mean()), tpot_mean_s=float(tpot.mean()), ttft_p99_s=float(np.percentile(ttft, 99)),
        tpot_p99_s=float(np.percentile(tpot, 99)), preemptions=preemptions, steps=steps,
        batch_mean=batch_sum / batch_steps if batch_steps else 0.0, batch_max=batch_max,
        decode_step_s=decode_time / decode_steps if decode_steps else float("nan"),
        kv_full_share=full_steps / steps if steps else 0.0, prompt_tokens_computed=computed)


def simulate_engines(work: Workload, engine: Engine, cost: StepCost, engines: int = 1) -> SimResult:
    """`engines` data-parallel engines (--data-parallel-size), each with `engine`'s settings: vLLM's API server sends
    each request to the least loaded, so each serves an even share of the requests, the rate and the client's
    slots; throughputs add up, latencies are one engine's."""
    if engines <= 1:
        return simulate(work, engine, cost)
    share = replace(work, requests=max(1, round(work.requests / engines)),
                    request_rate=work.request_rate / engines if work.request_rate else None,
                    max_concurrency=max(1, math.ceil(work.max_concurrency / engines)) if work.max_concurrency else None)
    r = simulate(share, engine, cost)
    return replace(r, request_throughput=r.request_throughput * engines,
                   output_throughput=r.output_throughput * engines,
                   preemptions=r.preemptions * engines, prompt_tokens_computed=r.prompt_tokens_computed * engines)
