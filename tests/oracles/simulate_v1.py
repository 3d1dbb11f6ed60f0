"""The step-level simulation as first written (f668df1): each step walks every running request in Python over numpy
scalars. Kept as the oracle `profkit.model.simulate.simulate` must reproduce bit for bit (tests/test_simulate.py):
the fast one keeps per-step aggregates instead of walking the requests."""

from __future__ import annotations

from collections import deque

import numpy as np

from profkit.model.simulate import CPU_PACED, Engine, Infeasible, SimResult, StepCost, Workload, arrivals


def simulate(work: Workload, engine: Engine, cost: StepCost, max_steps: int = 2_000_000) -> SimResult:
    n, prompt, out = work.requests, work.prompt_tokens, work.output_tokens
    if n <= 0 or prompt < 0 or out <= 0 or engine.kv_tokens <= 0 or engine.max_num_seqs <= 0 \
            or engine.max_num_batched_tokens <= 0:
        raise ValueError("a workload and an engine of positive sizes")
    if prompt + out > engine.kv_tokens // engine.block_size * engine.block_size:
        raise Infeasible(f"a request of {prompt + out:,} tokens needs more than the KV cache's "
                         f"{engine.kv_tokens:,}")
    # `vllm bench serve --request-rate R` sends a Poisson stream (its default burstiness 1): bursts fill the cache
    # that evenly spaced arrivals would not. A fixed seed: the same workload simulates the same way every time.
    arrival = arrivals(work)  # the product's own (an input here: the steps are what this oracle checks)
    cap = work.max_concurrency or n
    # the client's free slots, by when each came free: a request held back by --max-concurrency is sent (and its
    # TTFT starts, as vllm bench measures it) when a slot frees, not when it was due
    slots = deque([0.0] * min(cap, n))
    sent = np.zeros(n)
    need = np.full(n, prompt, dtype=np.int64)  # tokens to compute before the request decodes
    done = np.zeros(n, dtype=np.int64)  # of those, computed
    generated = np.zeros(n, dtype=np.int64)
    kv = np.zeros(n, dtype=np.int64)  # KV tokens held
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    bs = engine.block_size
    capacity = engine.kv_tokens // bs * bs
    running: list[int] = []  # admission order
    waiting: list[int] = []
    next_arrival = 0
    clock = 0.0
    horizon = 0.0  # asynchronous scheduling: the start of the step before, when the coming step's requests were chosen
    preemptions = steps = computed = 0
    batch_sum = batch_steps = batch_max = 0
    decode_time = decode_steps = full_steps = 0
    busy_time, seqs_stepped, cpu_paced_time, capped_time = 0.0, 0, 0.0, 0.0
    in_flight = 0
    while steps < max_steps:
        # arrivals: those due, within the client's concurrency
        due = horizon if engine.async_scheduling else clock
        while next_arrival < n and in_flight < cap and max(arrival[next_arrival], slots[0]) <= due:
            sent[next_arrival] = max(arrival[next_arrival], slots.popleft())
            waiting.append(next_arrival)
            next_arrival += 1
            in_flight += 1
        if not running and not waiting:
            if next_arrival >= n:
                break
            clock = max(clock, arrival[next_arrival]) if in_flight < cap else clock
            horizon = clock
            continue
        budget = engine.max_num_batched_tokens
        held = -(-kv // bs) * bs  # whole blocks
        free = capacity - int(held.sum())
        # decode: one token each for running requests past their prompt (a new block for those whose blocks are
        # full); preempt from the back for room
        decoding = [r for r in running if done[r] >= need[r]]
        preempted = False
        while decoding and free < bs * sum(1 for r in decoding if kv[r] % bs == 0):
            victim = running.pop()
            free += int(held[victim])
            held[victim] = 0
            kv[victim] = 0
            need[victim] = prompt + generated[victim]  # recomputed: its prompt and what it had generated
            done[victim] = 0
            waiting.insert(0, victim)
            preemptions += 1
            preempted = True
            decoding = [r for r in running if done[r] >= need[r]]
        decoding = decoding[:budget]
        budget -= len(decoding)
        free -= bs * sum(1 for r in decoding if kv[r] % bs == 0)
        dec = np.asarray(decoding, dtype=np.int64)
        kv_read = float(kv[dec].sum()) if len(dec) else 0.0
        tokens = len(decoding)
        pairs = kv_read + len(decoding)
        chunks: list[tuple[int, int]] = []
        # prompts: running requests mid-prompt first, then admissions (first come, first served)
        for r in running:
            if budget <= 0 or free <= 0:
                break
            if done[r] < need[r]:
                c = int(min(need[r] - done[r], budget, free + held[r] - kv[r]))
                chunks.append((r, c))
                budget -= c
                free -= -(-(kv[r] + c) // bs) * bs - held[r]
        # as vLLM V1's scheduler: no admission in a step that preempted (the victim would come straight back)
        # the reserve keeps room for the running requests' next blocks; with none running it holds nothing back
        reserve = int(engine.reserve * capacity) if running else 0
        while not preempted and waiting and budget > 0 and free > reserve and len(running) < engine.max_num_seqs:
            r = waiting.pop(0)
            running.append(r)
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
            if len(running) < 2:
                raise Infeasible("the KV cache cannot hold one request's next token")
            victim = running.pop()
            kv[victim] = 0
            need[victim] = prompt + generated[victim]
            done[victim] = 0
            waiting.insert(0, victim)
            preemptions += 1
            continue
        # requests still waiting after the step's admissions: the queued step's partial overlap (added since f668df1)
        seqs = len(decoding) + len(chunks)
        dt = cost.step_s(tokens, kv_read, pairs, seqs, bool(waiting))
        horizon = clock
        clock += dt
        busy_time += dt  # the step-time aggregates (added since 97b3826)
        seqs_stepped += seqs
        if len(running) >= engine.max_num_seqs:
            capped_time += dt
        if dt <= CPU_PACED * (cost.cpu_step_s + seqs * cost.cpu_seq_s):
            cpu_paced_time += dt
        steps += 1
        if len(dec):
            kv[dec] += 1
            generated[dec] += 1
            batch_sum += len(dec)
            batch_steps += 1
            batch_max = max(batch_max, len(dec))
        if not chunks and len(dec):
            decode_time += dt
            decode_steps += 1
        for r, c in chunks:
            kv[r] += c
            done[r] += c
            if done[r] >= need[r]:  # the prompt is complete: its next token comes with this step
                generated[r] += 1
                if np.isnan(first[r]):
                    first[r] = clock
        finished = [r for r in running if generated[r] >= out]
        for r in finished:
            finish[r] = clock
            kv[r] = 0
            running.remove(r)
            in_flight -= 1
            slots.append(clock)
        if free <= 0.01 * capacity:
            full_steps += 1
    if np.isnan(finish).any():
        raise ValueError(f"the simulation did not finish within {max_steps:,} steps")
    start = float(arrival.min())
    elapsed = float(finish.max()) - start
    ttft = first - sent
    tpot = (finish - first) / max(out - 1, 1)
    return SimResult(
        elapsed_s=elapsed, request_throughput=n / elapsed, output_throughput=n * out / elapsed,
        ttft_mean_s=float(ttft.mean()), tpot_mean_s=float(tpot.mean()), ttft_p99_s=float(np.percentile(ttft, 99)),
        tpot_p99_s=float(np.percentile(tpot, 99)), preemptions=preemptions, steps=steps,
        batch_mean=batch_sum / batch_steps if batch_steps else 0.0, batch_max=batch_max,
        decode_step_s=decode_time / decode_steps if decode_steps else float("nan"),
        kv_full_share=full_steps / steps if steps else 0.0, prompt_tokens_computed=computed,
        step_mean_s=float(busy_time) / steps if steps else 0.0,
        cpu_step_mean_s=cost.cpu_step_s + cost.cpu_seq_s * seqs_stepped / steps if steps else 0.0,
        cpu_paced_share=float(cpu_paced_time) / float(busy_time) if busy_time else 0.0,
        seqs_capped_share=float(capped_time) / float(busy_time) if busy_time else 0.0)
