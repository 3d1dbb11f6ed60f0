"""The report's head: where it came from, the window and the GPU's busy time (a trace), vLLM's own figures, and a
live window's load and latencies (profkit attach) with speculative decoding's counters."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.units import ns, number, pct


def view(report: dict[str, Any], top: int) -> dict[str, Any]:
    src = report["source"]
    return {"report": report, "live": live_lines(report), "preempt_where": preemptions_window(report),
            "session": session_line(report), "outcomes": outcomes(report),
            "trace_read": src["traces"][0] if read_in_folder(src) else None}


def text(v: dict[str, Any]) -> list[str]:
    report = v["report"]
    src, win, gpu, facts = report["source"], report["window"], report["gpu"], report["facts"]
    if gpu is None:
        return [f"profkit report: {terminal(src['path'] or 'vLLM evidence')} (no trace: vLLM's own evidence only)",
                *([f"  {terminal(v['session'])}"] if v["session"] else []), *outcome_lines(report), *v["live"]]
    return [
        f"profkit report: {terminal(src['path'])}",
        *([f"  {terminal(v['session'])}"] if v["session"] else []),
        *([f"  trace read: {terminal(src['traces'][0])}"] if read_in_folder(src) else []),
        f"  {terminal(src.get('tool', src['kind']))} {terminal(src.get('tool_version') or '')} | GPU "
        f"{terminal(src.get('gpu') or '?')} | driver {terminal(src.get('driver') or '?')}",
        f"  window: {ns(win['duration_ns'])} ({terminal(win['how'])}: {terminal(win['detail'])})",
        *([f"  TRACE INCONSISTENT: {terminal(src['inconsistent'])}"] if src.get("inconsistent") else []),
        f"  GPU utilization {pct(gpu['utilization'])}: busy {ns(gpu['busy_ns'])}, idle {ns(gpu['idle_ns'])}",
        f"  kernels {facts['kernels.count']:,} ({pct(facts['kernels.graph_share'])} from CUDA graphs, "
        f"{pct(facts['kernels.short_share'])} shorter than 10 us); launch call to kernel start median "
        f"{ns(facts['launch.latency_median_ns'])} (queueing behind earlier GPU work included)",
        *outcome_lines(report),
        *v["live"],
    ]


def read_in_folder(source: dict[str, Any]) -> bool:
    """A folder given, one trace read in it: named, since a folder may hold others (several are ranks: their own
    section says them)."""
    traces = source.get("traces") or []
    return len(traces) == 1 and traces[0] != source.get("path")


def session_line(report: dict[str, Any]) -> str | None:
    """A session folder's runs (replicates against one server) and which of them the report reads."""
    session = report["source"].get("session")
    if not session:
        return None
    rates = ", ".join("?" if r["request_throughput"] is None else f"{r['request_throughput']:,.2f}"
                      for r in session["runs"])
    return (f"Session {session['path']}: {len(session['runs'])} runs against one server ({rates} req/s); this "
            f"report is {session['run']}'s, the median")


def outcomes(report: dict[str, Any]) -> list[dict[str, str]]:
    """vLLM's own figures, each once for every format (label, value, where it was counted): the benchmark's throughput
    and latency, preemptions, the KV cache's peak use."""
    f = report["facts"]
    out = []
    for key, label, fmt in (("vllm.requests_per_second", "req/s", "{:,.2f}"),
                            ("vllm.output_throughput", "output tok/s", "{:,.0f}"),
                            ("vllm.ttft_mean_ms", "mean TTFT ms", "{:,.1f}"),
                            ("vllm.ttft_p99_ms", "p99 TTFT ms", "{:,.1f}"),
                            ("vllm.tpot_mean_ms", "mean TPOT ms", "{:,.2f}"),
                            ("vllm.preemptions", "preemptions", "{:,.0f}"),
                            ("vllm.kv_cache_usage_max", "peak KV usage", None)):
        value = f.get(key)
        if value is not None:
            out.append({"label": label, "value": pct(value) if fmt is None else fmt.format(value),
                        "where": preemptions_window(report) if key == "vllm.preemptions" else ""})
    return out


def outcome_lines(report: dict[str, Any]) -> list[str]:
    """vLLM's own figures as the text's line (`outcomes`)."""
    parts = [f"{o['label']} {o['value']}" + (f" ({o['where']})" if o["where"] else "") for o in outcomes(report)]
    return ["  vLLM: " + ", ".join(parts)] if parts else []


def preemptions_window(report: dict[str, Any]) -> str:
    """Which window the preemption count covers: vLLM's counter between the scrapes around the benchmark (or the live
    window), since the server started (one scrape), or the log's stats lines."""
    vllm = report.get("vllm") or {}
    if "vllm:num_preemptions_total" in (vllm.get("metrics_delta") or {}):
        return "vLLM's counter over the " + ("live window" if vllm.get("live") else "benchmark")
    if "vllm:num_preemptions_total" in (vllm.get("metrics") or {}):
        return "vLLM's counter since the server started"
    return "vLLM's log"


def live_lines(report: dict[str, Any]) -> list[str]:
    """A live window (profkit attach): its load, mix and the server's own latency percentiles."""
    live = (report.get("vllm") or {}).get("live")
    if not live:
        return ttft_lines(report) + spec_lines(report)
    head = f"  live window {live['seconds']:,.0f} s: {number(live.get('requests'))} requests finished"
    if live.get("request_rate") is not None:
        head += f" ({live['request_rate']:,.2f} req/s)"
    if live.get("prompt_tokens_per_request") is not None and live.get("output_tokens_per_request") is not None:
        head += (f", {live['prompt_tokens_per_request']:,.0f} prompt / {live['output_tokens_per_request']:,.0f} "
                 "output tokens a request")
    if live.get("prefix_cache_hit_rate") is not None:
        head += f", prefix cache hits {pct(live['prefix_cache_hit_rate'])}"
    out = [head]
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "inter-token"), ("queue", "queue"),
                       ("e2e", "end to end")):
        m = live.get(f"{key}_ms")
        if m:
            low = m.get("first_bucket")
            ps = " / ".join("-" if m.get(p) is None else f"<= {low:,.1f}" if low is not None and m[p] <= low
                            else f"{m[p]:,.1f}" for p in ("p50", "p90", "p99"))
            out.append(f"    {label:12} mean {'-' if m.get('mean') is None else format(m['mean'], ',.1f')} ms, "
                       f"p50 / p90 / p99 {ps} ms (vLLM's histograms)")
    return out + ttft_lines(report) + spec_lines(report)


def ttft_lines(report: dict[str, Any]) -> list[str]:
    """Where the mean TTFT went, from vLLM's histograms (`vllm.ttft_split`): the client, the API server, the
    engine's queue and its prefill."""
    t = (report.get("vllm") or {}).get("ttft_split")
    if not t:
        return []
    parts = ([f"{t['client_ms']:,.1f} client and HTTP"] if t.get("client_ms") is not None else []) + [
        f"{t['api_server_ms']:,.1f} API server", f"{t['queue_ms']:,.1f} queue", f"{t['prefill_ms']:,.1f} prefill"]
    total = t.get("client_ttft_ms", t["server_ttft_ms"])
    return [f"    mean TTFT {total:,.1f} ms = " + " + ".join(parts) + " ms (vLLM's histograms)"]


def spec_lines(report: dict[str, Any]) -> list[str]:
    """Speculative decoding over the run (vLLM's counters): drafts, acceptance, and acceptance per draft position."""
    spec = (report.get("vllm") or {}).get("spec_decode")
    if not spec:
        return []
    line = f"    speculative decoding: {number(spec.get('drafts'))} drafts, {number(spec.get('draft_tokens'))} " \
           f"draft tokens, {number(spec.get('accepted_tokens'))} accepted"
    if spec.get("acceptance_rate") is not None:
        line += f" ({pct(spec['acceptance_rate'])}, {spec['accepted_per_draft']:.2f} a draft)"
    by_position = spec.get("acceptance_by_position")
    if by_position:
        line += "; accepted at position " + ", ".join(f"{i + 1}: {pct(v)}" for i, v in enumerate(by_position))
    return [line]
