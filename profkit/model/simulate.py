"""A step-level simulation of vLLM V1's scheduler over one benchmark's requests (the Vidur idea, at the granularity of
engine steps, with step costs calibrated on the user's own run instead of profiled offline).

Each engine step: the running requests that have their prompt decode one token each; prompts are computed in chunks
within the step's token budget (`--max-num-batched-tokens`, chunked prefill), first the running requests' then new
ones, admitted first come first served while fewer than `--max-num-seqs` run and the KV cache has room. A decoding
request that finds no free KV slot preempts the most recently admitted request (vLLM V1 recomputes it: its KV is
freed and it later computes its prompt and what it had generated again), and a step that preempted admits nobody. A
step's time is the engine's overhead, plus reading every weight once and the step's GEMM arithmetic,
plus the attention's KV reads and FLOPs, or the engine core's CPU time for the step where that is longer
(`StepCost`). With asynchronous scheduling (vLLM's default) a request that arrives while a step runs joins the
step after the next (the next one's requests were chosen when this one began). Requests arrive all at once
(`--request-rate inf`), at a steady rate, and never more than the client's `--max-concurrency` in flight.

Pure and deterministic: the same inputs give the same run. One step costs a few vector operations over the requests
(numpy), so a benchmark of a thousand requests simulates in well under a second."""

from __future__ import annotations

import functools
import heapq
import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

ARRIVAL_SEED = 0
LENGTH_SEED = 1


class Infeasible(ValueError):
    """The configuration cannot serve the workload (a request needs more KV cache than there is): vLLM refuses to
    start, or never finishes the request."""


# With requests waiting for the engine (full load: the scheduler admits from a queue every step), a step's CPU and
# GPU can overlap only in part: its time their root sum of squares (sqrt(cpu² + gpu²)), where with none waiting (a rate
# the server keeps up with) it is the larger of the two. Lease 10 (the 8B at 128/256 on one box, 2 and 4 API servers):
# at full load the engine core's CPU took about 40 ms a step (0.64-0.84 of a core) and the GPU about 38 ms (NVML
# 0.60-0.74) in steps of 52-63 ms (TPOT p50), with 360-550 requests waiting; at 40 and 48 req/s (none waiting) CPU
# 5.7-7 ms and GPU 6.4-7 ms in steps of 7-8. The larger alone put that configuration's full-load capacity at 74-78
# req/s where 52-62 was measured (leases 6, 7, 10). Not everywhere: runs whose GPU was kept busy (NVML >= 0.8) overlap
# (B's prescribed run: the engine core 0.80-0.91 of a core and the GPU 0.94 of the time, which a root sum of squares
# cannot give), so a run's model takes this only where its GPU was not (`predict._prior_cost`: StepCost.queued_overlap).
# Chosen on those runs, lease 10's after they ran (its pairs are not pre-registered for this).
QUEUED_OVERLAP = 2.0
# A step no longer than this times the engine core's CPU for it took the CPU's time: the GPU waited for the CPU (with
# requests waiting a step is sqrt(cpu² + gpu²): 1.05 is a GPU under a third of the CPU)
CPU_PACED = 1.05
# The times a run's output is profiled at (SimResult.token_profile): a 60 s run's to 0.5 s
PROFILE_POINTS = 128


@dataclass(frozen=True)
class Workload:
    requests: int
    prompt_tokens: int  # per request
    output_tokens: int  # per request
    request_rate: float | None = None  # requests/s; None: all at once
    max_concurrency: int | None = None  # the client's cap on requests in flight
    offline: bool = False  # `vllm bench throughput`: every request handed to the engine at once, no client
    length_spread: float = 0.0  # --random-range-ratio: each request's lengths drawn evenly within this share


@dataclass(frozen=True)
class Engine:
    kv_tokens: int  # the KV cache's capacity in tokens
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = 16  # vLLM allocates the cache in blocks of this many tokens
    reserve: float = 0.0  # share of the cache an admission leaves free (fitted to the run's own preemptions)
    # vLLM's asynchronous scheduling (its default in 0.26; the log says 'Asynchronous scheduling is enabled'): the
    # scheduler picks a step's requests while the step before runs, so a request that arrives during a step waits
    # for the next one to end before its prompt is computed
    async_scheduling: bool = False


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
    queued_overlap: float = math.inf  # with requests waiting, the norm a step's CPU and GPU combine in (QUEUED_OVERLAP)

    def times(self, f: float) -> StepCost:
        """Every cost, the GPU's and the engine core's CPU's, `f` times as long: a step as long as a range's end."""
        return replace(self, overhead_s=self.overhead_s * f, weights_s=self.weights_s * f, token_s=self.token_s * f,
                       kv_token_s=self.kv_token_s * f, pair_s=self.pair_s * f, cpu_step_s=self.cpu_step_s * f,
                       cpu_seq_s=self.cpu_seq_s * f, comm_s=self.comm_s * f, comm_token_s=self.comm_token_s * f)

    def step_s(self, tokens: float, kv_read: float, pairs: float, seqs: int = 0, queued: bool = False) -> float:
        """The GPU's time for the step, or the engine core's CPU time where that is longer (with asynchronous
        scheduling the CPU prepares the next step while the GPU runs this one); with requests `queued` for the
        engine, the two overlapping only in part where `queued_overlap` is finite (QUEUED_OVERLAP). The weights'
        read and the GEMMs' arithmetic add up rather than overlap (a step's time linear in its tokens, with an
        intercept, as measured step times are): with the larger of the two alone, the sweeps' TPOT below full load
        came out 16-40 % short on the 14B; with the sum, within -15 to +20 % (p99)."""
        gpu = self.overhead_s + self.weights_s + tokens * self.token_s + kv_read * self.kv_token_s \
            + pairs * self.pair_s + self.comm_s + tokens * self.comm_token_s
        cpu = self.cpu_step_s + seqs * self.cpu_seq_s
        q = self.queued_overlap
        if not queued or cpu <= 0 or math.isinf(q):
            return max(gpu, cpu)
        return (gpu ** q + cpu ** q) ** (1.0 / q)


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
    step_mean_s: float  # the mean time of a step, prompts' chunks included (0: none)
    cpu_step_mean_s: float  # the engine core's CPU in it (StepCost.cpu_step_s and cpu_seq_s)
    cpu_paced_share: float  # share of the steps' time in steps the engine core's CPU paced (CPU_PACED)
    seqs_capped_share: float  # share of the steps' time with --max-num-seqs requests running (the cap held)
    # the share of the output tokens produced by each of PROFILE_POINTS + 1 evenly spaced times over the run (its
    # first arrival to its last token): where a frontend process streaming them falls behind, and for how long
    # (`predict.stream_end`)
    token_profile: tuple[float, ...] = ()


@dataclass(frozen=True)
class Latencies:
    """Each request's latencies as `vllm bench serve` measures them (seconds, from when the client sent it)."""

    ttft_s: np.ndarray  # to its first token
    tpot_s: np.ndarray  # per output token after the first
    e2el_s: np.ndarray  # to its last token

    def percentile(self, metric: str, q: float) -> float:
        """`metric` one of ttft, tpot, e2el; `q` in 0-100 (numpy's linear interpolation, as vllm bench's)."""
        return float(np.percentile(getattr(self, f"{metric}_s"), q))


def simulate_latencies(work: Workload, engine: Engine, cost: StepCost, engines: int = 1,
                       max_steps: int = 2_000_000) -> tuple[SimResult, Latencies]:
    """`simulate_engines`, with every request's latencies (one engine's where there are several)."""
    r, lat = _simulated(_share(work, engines) if engines > 1 else work, engine, cost, max_steps)
    return (_scaled_up(r, engines) if engines > 1 else r), lat


def simulate(work: Workload, engine: Engine, cost: StepCost, max_steps: int = 2_000_000) -> SimResult:
    """The run of `work` on `engine` at `cost`, step by step.

    A step costs O(1) Python work plus its events (an arrival, an admission, a prompt's chunk, a finish, a
    preemption): every decoding request decodes in every step (vLLM needs --max-num-batched-tokens >=
    --max-num-seqs), so a decoding request's KV tokens and output are its values when it began decoding plus the
    steps since, the decoding batch's KV reads one running sum, the requests needing a new KV block this step a
    count by step number modulo the block size, and the next to finish the top of a heap. The arithmetic and its
    order are the first implementation's (tests/oracles/simulate_v1.py): the same inputs give the same bits."""
    return _simulated(work, engine, cost, max_steps)[0]


@functools.lru_cache(maxsize=512)
def _simulated(work: Workload, engine: Engine, cost: StepCost, max_steps: int) -> tuple[SimResult, Latencies]:
    """One run, kept for the process: a report's search, its prescription and its frontiers simulate many of the
    same configurations (a third of a 14B report's 213 runs were repeats). Pure, so a repeat is the same result;
    the latencies' arrays are read-only."""
    _check(work, engine)
    run = _Run(work, engine, cost)
    r = run.run(max_steps)
    first, finish, sent = np.array(run.first), np.array(run.finish), np.array(run.sent)
    lat = Latencies(first - sent, (finish - first) / run.decoded_np, finish - sent)
    for a in (lat.ttft_s, lat.tpot_s, lat.e2el_s):
        a.flags.writeable = False
    return r, lat


def _check(work: Workload, engine: Engine) -> None:
    if work.requests <= 0 or work.prompt_tokens < 0 or work.output_tokens <= 0 or engine.kv_tokens <= 0 \
            or engine.max_num_seqs <= 0 or engine.max_num_batched_tokens <= 0:
        raise ValueError("a workload and an engine of positive sizes")
    longest = work.prompt_tokens + work.output_tokens if not work.length_spread else \
        sum(_bounds(n, work.length_spread)[1] for n in (work.prompt_tokens, work.output_tokens))
    if longest > engine.kv_tokens // engine.block_size * engine.block_size:
        raise Infeasible(f"a request of {longest:,} tokens needs more than the KV cache's {engine.kv_tokens:,}")
    if engine.max_num_batched_tokens < engine.max_num_seqs:  # vLLM's SchedulerConfig refuses it at start-up
        raise Infeasible(f"--max-num-batched-tokens {engine.max_num_batched_tokens:,} is below --max-num-seqs "
                         f"{engine.max_num_seqs:,}, which vLLM refuses")


def _bounds(mean: int, spread: float) -> tuple[int, int]:
    """The lengths `vllm bench`'s random dataset draws from for a mean and a range ratio: int(mean x (1 - r)) to
    int(mean x (1 + r)), both included (at least one token)."""
    return max(1, int(mean * (1 - spread))), max(1, int(mean * (1 + spread)))


def lengths(work: Workload) -> tuple[list[int], list[int]]:
    """Each request's prompt and output tokens: the means where the lengths do not vary, else drawn as the random
    dataset draws them (evenly within the range ratio; a fixed seed, as the arrivals')."""
    n = work.requests
    if not work.length_spread:
        return [work.prompt_tokens] * n, [work.output_tokens] * n
    rng = np.random.default_rng(LENGTH_SEED)
    drawn = [rng.integers(lo, hi + 1, n).tolist()
             for lo, hi in (_bounds(m, work.length_spread) for m in (work.prompt_tokens, work.output_tokens))]
    return drawn[0], drawn[1]


def arrivals(work: Workload) -> np.ndarray:
    """When each request is due: all at once, or `vllm bench serve --request-rate R`'s Poisson stream (its default
    burstiness 1: bursts fill the cache that evenly spaced arrivals would not). A fixed seed: the same workload
    simulates the same way every time."""
    if not work.request_rate:
        return np.zeros(work.requests)
    gaps = np.random.default_rng(ARRIVAL_SEED).exponential(1.0, work.requests)
    # scaled so that their mean is the rate's exactly: the bursts kept, not one draw's drift (seed 0's first 266
    # gaps average 1.14: a run of 40 s of prompts simulated 12 % slower than it was sent)
    gaps *= 1.0 / (work.request_rate * gaps.mean())
    return np.cumsum(gaps) - gaps[0]


class _Run:
    """One simulated run: the scheduler's state between steps, and what the result counts."""

    def __init__(self, work: Workload, engine: Engine, cost: StepCost) -> None:
        n = work.requests
        self.work, self.engine, self.cost = work, engine, cost
        self.arrival_np = arrivals(work)
        self.arrival = self.arrival_np.tolist()
        self.cap = work.max_concurrency or n
        # the client's free slots, by when each came free: a request held back by --max-concurrency is sent (and its
        # TTFT starts, as vllm bench measures it) when a slot frees, not when it was due
        self.slots = deque([0.0] * min(self.cap, n))
        self.sent = [0.0] * n
        self.prompt_len, self.output_len = lengths(work)
        # the tokens each decodes after its first (TPOT's denominator, as vllm bench's: at least one)
        self.decoded_np = np.maximum(np.array(self.output_len, dtype=float) - 1, 1)
        self.need = list(self.prompt_len)  # tokens to compute before the request decodes
        self.done = [0] * n  # of those, computed
        self.generated = [0] * n
        self.kv = [0] * n  # KV tokens held (a decoding request's: when it began decoding, see `entry`)
        self.first = [math.nan] * n
        self.finish = [math.nan] * n
        self.bs = engine.block_size
        self.capacity = engine.kv_tokens // self.bs * self.bs
        # running requests in admission order (finished ones left in place, skipped: `alive`); those mid-prompt apart
        self.running: list[int] = []
        self.alive = [False] * n
        self.n_running = 0
        self.prefilling: list[int] = []
        self.waiting: deque[int] = deque()
        # decoding requests: the step counter when each began (kv and generated grew by one a step since)
        self.decoding = [False] * n
        self.entry = [0] * n
        self.entry_kv = [0] * n  # kv when it began decoding
        self.by_residue = [0] * self.bs  # decoding requests by (entry - kv) mod bs: those due a block at s mod bs
        self.n_decoding = 0
        self.kv_offset = 0  # sum over decoding requests of kv - entry: their KV at step s is kv_offset + n * s
        self.finishing: list[tuple[int, int, int]] = []  # (step counter at which it finishes, request, epoch)
        self.epoch = [0] * n
        self.held_total = 0  # whole blocks held, in tokens
        self.next_arrival = 0
        self.clock = 0.0
        self.horizon = 0.0  # when the scheduler chose the coming step's requests: what arrived by then is in it
        self.preemptions = self.steps = self.computed = 0
        self.batch_sum = self.batch_steps = self.batch_max = 0
        self.decode_time = 0.0
        self.decode_steps = self.full_steps = 0
        self.busy_time = self.cpu_paced_time = 0.0
        self.seqs_stepped = 0  # requests summed over steps (decoding and prompts' chunks)
        self.capped_time = 0.0
        self.in_flight = 0

    def run(self, max_steps: int) -> SimResult:
        while self.steps < max_steps:
            self._arrive()
            if not self.n_running and not self.waiting:
                if self.next_arrival >= self.work.requests:
                    break
                if self.in_flight < self.cap:
                    self.clock = max(self.clock, self.arrival[self.next_arrival])
                self.horizon = self.clock  # an idle engine schedules as a request comes
                continue
            self._step()
        return self._result(max_steps)

    def _arrive(self) -> None:
        """Those due, within the client's concurrency."""
        n = self.work.requests
        horizon = self.horizon if self.engine.async_scheduling else self.clock
        while self.next_arrival < n and self.in_flight < self.cap \
                and max(self.arrival[self.next_arrival], self.slots[0]) <= horizon:
            r = self.next_arrival
            self.sent[r] = max(self.arrival[r], self.slots.popleft())
            self.waiting.append(r)
            self.next_arrival += 1
            self.in_flight += 1

    def _step(self) -> None:
        """One engine step: decode the running requests (preempting from the back for their blocks), compute prompt
        chunks within the token budget, admit, and advance the clock by the step's cost."""
        bs, steps = self.bs, self.steps
        free = self.capacity - self.held_total
        preempted = False
        while self.n_decoding and free < bs * self.by_residue[steps % bs]:
            free += self._evict(self._last_running())
            preempted = True
        grow = self.by_residue[steps % bs]
        batch = self.n_decoding
        budget = self.engine.max_num_batched_tokens - batch
        free -= bs * grow
        kv_read = float(self.kv_offset + batch * steps)
        chunks, budget, free = self._chunks(budget, free, preempted)
        tokens, pairs = batch, kv_read + batch
        for r, c in chunks:
            self.computed += c
            kv_read += self.done[r]
            pairs += c * self.done[r] + c * (c + 1) / 2
            tokens += c
        if tokens == 0:  # nothing fits: the newest request gives its blocks back (vLLM preempts it), or none can
            if self.n_running < 2:
                raise Infeasible("the KV cache cannot hold one request's next token")
            self._evict(self._last_running())
            return
        seqs = batch + len(chunks)
        dt = self.cost.step_s(tokens, kv_read, pairs, seqs, bool(self.waiting))
        self.horizon = self.clock
        self.clock += dt
        self.busy_time += dt
        self.seqs_stepped += seqs
        if self.n_running >= self.engine.max_num_seqs:
            self.capped_time += dt
        if dt <= CPU_PACED * (self.cost.cpu_step_s + seqs * self.cost.cpu_seq_s):
            self.cpu_paced_time += dt
        self.held_total += bs * grow
        self.steps += 1
        if batch:
            self.batch_sum += batch
            self.batch_steps += 1
            self.batch_max = max(self.batch_max, batch)
            if not chunks:
                self.decode_time += dt
                self.decode_steps += 1
        self._complete(chunks)
        self._finish()
        if free <= 0.01 * self.capacity:
            self.full_steps += 1

    def _chunks(self, budget: int, free: int, preempted: bool) -> tuple[list[tuple[int, int]], int, int]:
        """Prompts' chunks this step: running requests mid-prompt first, then admissions (first come, first served).
        Returns the chunks and the budget and free KV tokens they leave."""
        bs, chunks = self.bs, []
        for r in self.prefilling:
            if budget <= 0 or free <= 0:
                break
            held = -(-self.kv[r] // bs) * bs
            c = int(min(self.need[r] - self.done[r], budget, free + held - self.kv[r]))
            chunks.append((r, c))
            budget -= c
            free -= -(-(self.kv[r] + c) // bs) * bs - held
        # as vLLM V1's scheduler: no admission in a step that preempted (the victim would come straight back)
        # the reserve keeps room for the running requests' next blocks; with none running it holds nothing back
        reserve = int(self.engine.reserve * self.capacity) if self.n_running else 0
        while not preempted and self.waiting and budget > 0 and free > reserve \
                and self.n_running < self.engine.max_num_seqs:
            r = self.waiting.popleft()
            self.running.append(r)
            self.alive[r] = True
            self.n_running += 1
            self.prefilling.append(r)
            c = int(min(self.need[r] - self.done[r], budget, free - reserve))
            if c > 0:
                chunks.append((r, c))
                budget -= c
                free -= -(-c // bs) * bs
        return chunks, budget, free

    def _complete(self, chunks: list[tuple[int, int]]) -> None:
        """The step's chunks computed; a prompt complete starts decoding (its next token comes with this step)."""
        bs = self.bs
        for r, c in chunks:
            before = -(-self.kv[r] // bs) * bs
            self.kv[r] += c
            self.done[r] += c
            self.held_total += -(-self.kv[r] // bs) * bs - before
            if self.done[r] < self.need[r]:
                continue
            self.generated[r] += 1
            if math.isnan(self.first[r]):
                self.first[r] = self.clock
            self.prefilling.remove(r)
            self.decoding[r] = True
            self.entry[r], self.entry_kv[r] = self.steps, self.kv[r]
            self.by_residue[(self.steps - self.kv[r]) % bs] += 1
            self.n_decoding += 1
            self.kv_offset += self.kv[r] - self.steps
            heapq.heappush(self.finishing, (self.steps + self.output_len[r] - self.generated[r], r,
                                            self.epoch[r]))

    def _finish(self) -> None:
        """The requests whose last token came with this step: their blocks freed, their client slot too."""
        while self.finishing and self.finishing[0][0] <= self.steps:
            _, r, e = heapq.heappop(self.finishing)
            if e != self.epoch[r] or not self.decoding[r]:
                continue
            self._stop_decoding(r)
            self.finish[r] = self.clock
            self.held_total -= -(-self.kv[r] // self.bs) * self.bs
            self.kv[r] = 0
            self.alive[r] = False
            self.n_running -= 1
            self.in_flight -= 1
            self.slots.append(self.clock)

    def _stop_decoding(self, r: int) -> None:
        grown = self.steps - self.entry[r]
        self.kv[r] += grown
        self.generated[r] += grown
        self.decoding[r] = False
        self.by_residue[(self.entry[r] - self.entry_kv[r]) % self.bs] -= 1
        self.n_decoding -= 1
        self.kv_offset -= self.entry_kv[r] - self.entry[r]
        self.epoch[r] += 1

    def _evict(self, r: int) -> int:
        """Take a running request back to waiting (vLLM V1 recomputes it); returns the KV tokens it held."""
        if self.decoding[r]:
            self._stop_decoding(r)
        elif r in self.prefilling:
            self.prefilling.remove(r)
        held = -(-self.kv[r] // self.bs) * self.bs
        self.held_total -= held
        self.kv[r] = 0
        self.need[r] = self.prompt_len[r] + self.generated[r]  # recomputed: its prompt and what it generated
        self.done[r] = 0
        self.alive[r] = False
        self.n_running -= 1
        self.waiting.appendleft(r)
        self.preemptions += 1
        return held

    def _last_running(self) -> int:
        while not self.alive[self.running[-1]]:
            self.running.pop()
        return self.running.pop()

    def _result(self, max_steps: int) -> SimResult:
        finish, first, sent = np.array(self.finish), np.array(self.first), np.array(self.sent)
        if np.isnan(finish).any():
            raise ValueError(f"the simulation did not finish within {max_steps:,} steps")
        n, out = self.work.requests, sum(self.output_len)
        start = float(self.arrival_np.min())
        elapsed = float(finish.max()) - start
        ttft = first - sent
        tpot = (finish - first) / self.decoded_np
        steps = self.steps
        return SimResult(
            elapsed_s=elapsed, request_throughput=n / elapsed, output_throughput=out / elapsed,
            ttft_mean_s=float(ttft.mean()), tpot_mean_s=float(tpot.mean()), ttft_p99_s=float(np.percentile(ttft, 99)),
            tpot_p99_s=float(np.percentile(tpot, 99)), preemptions=self.preemptions, steps=steps,
            batch_mean=self.batch_sum / self.batch_steps if self.batch_steps else 0.0, batch_max=self.batch_max,
            decode_step_s=self.decode_time / self.decode_steps if self.decode_steps else float("nan"),
            kv_full_share=self.full_steps / steps if steps else 0.0, prompt_tokens_computed=self.computed,
            step_mean_s=self.busy_time / steps if steps else 0.0,
            cpu_step_mean_s=self.cost.cpu_step_s + self.cost.cpu_seq_s * self.seqs_stepped / steps if steps else 0.0,
            cpu_paced_share=self.cpu_paced_time / self.busy_time if self.busy_time else 0.0,
            seqs_capped_share=self.capped_time / self.busy_time if self.busy_time else 0.0,
            token_profile=token_profile(first, finish, np.array(self.output_len, dtype=float), start, elapsed))


def token_profile(first: np.ndarray, finish: np.ndarray, output_len: np.ndarray, start: float,
                  elapsed: float, points: int = PROFILE_POINTS) -> tuple[float, ...]:
    """The share of the output tokens produced by each of `points` + 1 evenly spaced times from `start` over
    `elapsed`: a request's first token at `first`, the rest evenly until `finish` (at once where it finished in the
    step that began it). Each request is a ramp, so the tokens by a time are the ramps begun by then less those
    ended: sums over the sorted times, searched (no array of times by requests)."""
    total = float(output_len.sum())
    if not total or not elapsed > 0:
        return ()
    t = start + elapsed * np.linspace(0.0, 1.0, points + 1)
    rest, span = output_len - 1.0, finish - first
    slope = np.divide(rest, span, out=np.zeros_like(rest), where=span > 0)
    made = (_by(first, np.ones_like(rest), t)[0] + _ramps(first, slope, t) - _ramps(finish, slope, t)
            + _by(finish, np.where(span > 0, 0.0, rest), t)[0])
    shares = np.minimum(made, total) / total
    shares[-1] = 1.0  # every token by the run's last (the sums' rounding aside)
    return tuple(float(v) for v in shares)


def _by(times: np.ndarray, weights: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At each of `t`: the sum of `weights`, and of `weights` * `times`, over the times by then."""
    order = np.argsort(times, kind="stable")
    at, w = times[order], weights[order]
    k = np.searchsorted(at, t, side="right")
    return np.concatenate(([0.0], np.cumsum(w)))[k], np.concatenate(([0.0], np.cumsum(w * at)))[k]


def _ramps(times: np.ndarray, slopes: np.ndarray, t: np.ndarray) -> np.ndarray:
    """At each of `t`: the sum of slope * (t - time) over the ramps begun by then."""
    slope_sum, weighted = _by(times, slopes, t)
    return slope_sum * t - weighted


def simulate_engines(work: Workload, engine: Engine, cost: StepCost, engines: int = 1) -> SimResult:
    """`engines` data-parallel engines (--data-parallel-size), each with `engine`'s settings: vLLM's API server sends
    each request to the least loaded, so each serves an even share of the requests, the rate and the client's
    slots; throughputs add up, latencies are one engine's."""
    if engines <= 1:
        return simulate(work, engine, cost)
    return _scaled_up(simulate(_share(work, engines), engine, cost), engines)


def _share(work: Workload, engines: int) -> Workload:
    """One of `engines` data-parallel engines' share of the workload."""
    return replace(work, requests=max(1, round(work.requests / engines)),
                   request_rate=work.request_rate / engines if work.request_rate else None,
                   max_concurrency=max(1, math.ceil(work.max_concurrency / engines)) if work.max_concurrency else None)


def _scaled_up(r: SimResult, engines: int) -> SimResult:
    """One engine's result as the `engines` together serve it: throughputs add up, latencies are one engine's."""
    return replace(r, request_throughput=r.request_throughput * engines,
                   output_throughput=r.output_throughput * engines,
                   preemptions=r.preemptions * engines, prompt_tokens_computed=r.prompt_tokens_computed * engines)
