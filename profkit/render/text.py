"""The terminal summary of `profkit report` (default format). Every value from a trace, log, rule file or
path goes through profkit.escape.terminal: one value, one line, no escape sequence."""

from __future__ import annotations

from typing import Any

from profkit.escape import document, terminal
from profkit.render.cmdline import check_name
from profkit.render.efficiency import PRECISION_NOTE, efficiency_view
from profkit.render.prescription import prescription_lines
from profkit.render.ranks import rank_table
from profkit.units import change_from, change_to, clip, clip_middle, gap_class, ns, number, pct, size

# Which events each table counts, said where they are shown: the NVTX table counts a range where it starts (as nsys's
# nvtx_sum does, each style apart: a step's GPU range and its CPU range), the step view a step whose range overlaps
# the window (vLLM names a step on the host just before its first kernel, which may fall inside).
NVTX_WINDOW = "counted where each range starts; GPU: the range as the GPU ran it, CPU: as the host did"
STEPS_WINDOW = "each step that overlaps the window"


def _table(rows: list[dict[str, Any]], columns: dict[str, Any], limit: int) -> str:
    if not rows:
        return "  (none)"
    limit = max(limit, 0)  # a negative count would slice from the end
    table = [{title: terminal(fmt(r)) for title, fmt in columns.items()} for r in rows[:limit]]  # one line a cell
    widths = {c: max([len(c), *(len(row[c]) for row in table)]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(v.ljust(widths[c]) for c, v in row.items()).rstrip() for row in table]
    more = f"\n  ... {len(rows) - limit} more" if len(rows) > limit else ""
    return "\n".join("  " + line for line in lines) + more


def _host_api(gap: dict[str, Any]) -> str:
    """What the host was doing in CUDA during a GPU gap: the top call and its share of the gap."""
    if not gap["host_api"]:
        return "none (host busy outside CUDA)"
    top = gap["host_api"][0]
    return f"{pct(gap['host_api_share'])} {top['name']}"


def command_lines(report: dict[str, Any]) -> list[str]:
    """The suggested command block: the run's command before and after, and how it was checked."""
    cmd = report.get("command") or {}
    if not cmd.get("suggested"):
        return []
    out = [f"Suggested command (the run's command from the {terminal(cmd['source'])}, changes applied)"]
    for before, after in zip(cmd["original"], cmd["suggested"], strict=True):
        out += [f"  before: {terminal(before)}", f"  after:  {terminal(after)}"]
    for check in cmd.get("checks", []):
        verdict = "ok" if check["ok"] else "WOULD NOT START: " + "; ".join(check["problems"])
        out.append(f"  checked {terminal(check_name(check))} with {terminal(check['by'])}: {terminal(verdict)}")
    return out + [""]


def outcome_lines(report: dict[str, Any]) -> list[str]:
    """vLLM's own figures: the benchmark's throughput and latency, preemptions, KV cache."""
    f = report["facts"]
    parts = []
    for key, label, fmt in (("vllm.requests_per_second", "req/s", "{:,.2f}"),
                            ("vllm.output_throughput", "output tok/s", "{:,.0f}"),
                            ("vllm.ttft_mean_ms", "mean TTFT ms", "{:,.1f}"),
                            ("vllm.ttft_p99_ms", "p99 TTFT ms", "{:,.1f}"),
                            ("vllm.tpot_mean_ms", "mean TPOT ms", "{:,.2f}"),
                            ("vllm.preemptions", "preemptions", "{:,.0f}"),
                            ("vllm.kv_cache_usage_max", "peak KV usage", None)):
        value = f.get(key)
        if value is not None:
            where = f" ({preemptions_window(report)})" if key == "vllm.preemptions" else ""
            parts.append(f"{label} {pct(value) if fmt is None else fmt.format(value)}{where}")
    return ["  vLLM: " + ", ".join(parts)] if parts else []


def preemptions_window(report: dict[str, Any]) -> str:
    """Which window the preemption count covers: vLLM's counter between the scrapes around the benchmark, since the
    server started (one scrape), or the log's stats lines."""
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
        return spec_lines(report)
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
    return out + spec_lines(report)


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


def host_lines(report: dict[str, Any]) -> list[str]:
    """Per-process CPU while the benchmark ran (host.json): which side was busy."""
    host = report.get("host")
    if not host or not (host.get("processes") or host_notes(host) or host.get("gpu_util_mean") is not None):
        return []
    out = [f"Host CPU while the benchmark ran (cores used; {host.get('cores') or '?'} cores; a Python process "
           "tops out at 1.0)"]
    rows = sorted(host["processes"], key=lambda p: -p["cpu_mean"])[:8]
    out.append(_table(rows, {"role": lambda r: r["role"], "pid": lambda r: r["pid"],
                             "mean": lambda r: f"{r['cpu_mean']:.2f}", "p90": lambda r: f"{r['cpu_p90']:.2f}",
                             "at a full core": lambda r: pct(r["saturated_share"]),
                             "process": lambda r: clip(terminal(r["name"]), 60)}, 8))
    if host.get("gpu_util_mean") is not None:
        out.append(f"  GPU utilization (NVML): {pct(host['gpu_util_mean'])}")
    out += [f"  {terminal(line)}" for line in host_notes(host)]
    return out + [""]


def host_notes(host: dict[str, Any]) -> list[str]:
    """What the host section left out of host.json and why, and a window it could not place (every format)."""
    out = [f"left out: {n:,} {why}" for why, n in (host.get("left_out") or {}).items()]
    return out + ([host["window_note"]] if host.get("window_note") else [])


def efficiency_lines(report: dict[str, Any]) -> list[str]:
    """How far the run is from the GPU's peaks (MFU, MBU) and what the GPU's own counters say."""
    view = efficiency_view(report)
    if view is None:
        return []
    out = [view["title"], f"  {terminal(view['peaks'])}; {terminal(view['compared_with'])}"
           + (f"; ridge at {view['ridge']} FLOP/byte" if view["ridge"] else "")]
    if view["estimates"]:
        out.append(_table(view["estimates"], {
            "estimate from": lambda r: r["from"], "TFLOP/s": lambda r: r["tflops"], "MFU": lambda r: r["mfu"],
            "TB/s": lambda r: r["tbs"], "MBU": lambda r: r["mbu"], "FLOP/byte": lambda r: r["intensity"],
            "roofline": lambda r: r["side"]}, 4))
    for line in (view["phases"], view["phases_note"] and f"Per phase: not measured: {view['phases_note']}.",
                 *(f"Withheld: {w}." for w in view["withheld"]), view["reading"]):
        if line:
            out.append(f"  {terminal(line)}")
    m = view["metrics"]
    if m:
        out.append(f"  GPU metrics (nsys, mean % of peak; {terminal(str(m['source']))}):")
        columns: dict[str, Any] = {"over": lambda r: terminal(r["scope"])}
        for key, title in zip(m["metric_keys"], m["columns"], strict=True):
            columns[title] = lambda r, key=key: r[key]
        out.append(_table(m["rows"], columns, 12))
    return out + [""]


def sched_lines(report: dict[str, Any]) -> list[str]:
    """Per-process CPU from the trace's context switches (exact, over the report's window)."""
    sc = report.get("sched")
    if not sc or not sc.get("processes"):
        return []
    out = [f"CPU from the trace's context switches (cores used over the {ns(sc['window_ns'])} window; the busiest "
           "thread of a Python process tops out at 1.0)"]
    out.append(_table(sc["processes"], {
        "pid": lambda r: r["pid"], "cores": lambda r: f"{r['cores']:.2f}", "threads": lambda r: r["threads"],
        "busiest thread": lambda r: f"{r['busiest_thread_cores']:.2f} (tid {r['busiest_tid']})",
        "process": lambda r: clip(terminal(r["name"]), 40)}, 10))
    return out + [""]


def step_lines(report: dict[str, Any]) -> list[str]:
    st = report.get("steps")
    if not st:
        return []
    out = [f"Engine steps: {st['count']:,} ({terminal(st['source'])}; {STEPS_WINDOW})",
           f"  GPU busy {pct(st['gpu_share'])} of step time; the GPU waited for the host at step starts "
           f"{pct(st['wait_share'])} of it (median wait {ns(st['wait_p50_ns'])})"]
    for label in ("decode", "prefill"):
        s = st[label]
        if s["count"]:
            out.append(f"  {label:8} {s['count']:>6,} steps  cycle p50 {ns(s['cycle_p50_ns'])}, p90 "
                       f"{ns(s['cycle_p90_ns'])}; GPU busy p50 {ns(s['gpu_busy_p50_ns'])} ({pct(s['gpu_share'])})")
    out += [f"  left out: {n:,} {terminal(why)}" for why, n in (st.get("dropped") or {}).items()]
    return out + [""]


def rank_lines(report: dict[str, Any]) -> list[str]:
    """Per GPU (rank): busy time, communication and its overlap, the wait in collectives; the straggler."""
    table = rank_table(report)
    if table is None:
        return []
    ranks = table["rows"]
    src = report["source"]
    out = [f"GPUs ({len(ranks)} ranks)" + (f"; {len(src['traces'])} traces, the sections below are rank "
                                             f"{terminal(str(ranks[0]['rank']))}'s" if src.get("traces") else "")]
    coll = (report.get("imbalance") or {}).get("collectives") or {}
    columns = {"rank": lambda r: terminal(str(r["rank"])), "busy": lambda r: ns(r["gpu"]["busy_ns"]),
               "util": lambda r: pct(r["gpu"]["utilization"]), "kernels": lambda r: ns(r["kernels"]["total_ns"]),
               "communication": lambda r: ns(r["communication"]["total_ns"]),
               "share": lambda r: pct(r["communication"]["share"]),
               "overlapped": lambda r: pct(r["communication"]["overlap_share"])}
    if table["waits"]:
        columns["waits"] = lambda r: ns(r["wait_ns"])
        columns["last"] = lambda r: pct(r["last_share"])
    out.append(_table(ranks, columns, 64))
    imb = report.get("imbalance")
    if imb:
        out.append(f"  busy time spread {pct(imb['busy_ns']['spread_share'])}")
        if coll:
            straggler = (f"straggler: rank {terminal(str(coll['straggler']['rank']))}, last in "
                         f"{pct(coll['straggler']['last_share'])}" if coll["straggler"] else "no straggler")
            out.append(f"  {coll['collectives']:,} collectives matched (names agree {pct(coll['names_agree'])}); "
                       f"start spread median {ns(coll['spread_ns']['median'])}, p90 {ns(coll['spread_ns']['p90'])}; "
                       f"{straggler}")
    return out + [""]


def render_text(report: dict[str, Any], top: int = 10, name_width: int = 70) -> str:
    src, win, gpu, facts = report["source"], report["window"], report["gpu"], report["facts"]
    if gpu is None:
        return _render_evidence_only(report)
    out = [
        f"profkit report: {terminal(src['path'])}",
        f"  {terminal(src.get('tool', src['kind']))} {terminal(src.get('tool_version') or '')} | GPU "
        f"{terminal(src.get('gpu') or '?')} | driver {terminal(src.get('driver') or '?')}",
        f"  window: {ns(win['duration_ns'])} ({terminal(win['how'])}: {terminal(win['detail'])})",
        *([f"  TRACE INCONSISTENT: {terminal(src['inconsistent'])}"] if src.get("inconsistent") else []),
        f"  GPU utilization {pct(gpu['utilization'])}: busy {ns(gpu['busy_ns'])}, idle {ns(gpu['idle_ns'])}",
        f"  kernels {facts['kernels.count']:,} ({pct(facts['kernels.graph_share'])} from CUDA graphs, "
        f"{pct(facts['kernels.short_share'])} shorter than 10 us); launch call to kernel start median "
        f"{ns(facts['launch.latency_median_ns'])} (queueing behind earlier GPU work included)",
        *outcome_lines(report),
        *live_lines(report),
        "",
    ]
    out += prescription_lines(report)
    out += _findings(report)
    out += efficiency_lines(report)
    out += rank_lines(report)
    out += step_lines(report)
    out += host_lines(report)
    out += sched_lines(report)
    out += [
        "Time by kernel category",
        _table(report["categories"], {"category": lambda r: r["category"], "kernels": lambda r: r["count"],
                                      "time": lambda r: ns(r["total_ns"]), "share": lambda r: pct(r["share"])},
               20),
        "",
        f"Top kernels (of {len(report['kernels'])})",
        _table(report["kernels"], {
            "time": lambda r: ns(r["total_ns"]), "share": lambda r: pct(r["share"]),
            "count": lambda r: r["count"], "avg": lambda r: ns(r["avg_ns"]), "med": lambda r: ns(r["median_ns"]),
            "category": lambda r: r["category"],
            "name": lambda r: clip_middle(r.get("label") or r["short_name"], name_width),
        }, top),
        "",
        "GPU idle by gap size",
        _table([{"class": k, **v} for k, v in report["gap_classes"].items()], {
            "gap size": lambda r: gap_class(r["class"]), "gaps": lambda r: r["count"],
            # idle summed over the GPUs: a share of their time (window x GPUs), as the gaps.*_idle_share facts
            "idle": lambda r: ns(r["idle_ns"]),
            "of window": lambda r: pct(r["idle_ns"] / max(1, gpu["busy_ns"] + gpu["idle_ns"])),
        }, 10),
        "",
        "Longest GPU gaps",
        _table(report["gaps"], {
            "at": lambda r: ns(r["start_ns"] - win["start_ns"]), "gap": lambda r: ns(r["duration_ns"]),
            "host in CUDA API": _host_api,
            "after": lambda r: clip(r["after"], 50),
        }, min(top, 5)),
        "",
        "Memory operations",
        _table(report["memops"], {
            "operation": lambda r: r["operation"], "count": lambda r: r["count"], "time": lambda r: ns(r["total_ns"]),
            "bytes": lambda r: size(r["bytes"]),
            "GB/s": lambda r: "-" if r["bandwidth_gbps"] is None else f"{r['bandwidth_gbps']:.1f}",
        }, top),
        "",
        "CUDA API",
        _table(report["api"], {
            "name": lambda r: r["name"], "calls": lambda r: r["count"], "time": lambda r: ns(r["total_ns"]),
            "avg": lambda r: ns(r["avg_ns"]), "max": lambda r: ns(r["max_ns"]),
        }, top),
        "",
        f"NVTX ranges ({NVTX_WINDOW})",
        _table(report["nvtx"], {
            "range": lambda r: clip(r["range"], name_width), "style": lambda r: r.get("style") or "-",
            "count": lambda r: r["count"], "time": lambda r: ns(r["total_ns"]), "avg": lambda r: ns(r["avg_ns"]),
        }, top),
    ]
    return document("\n".join(out) + "\n")


def _findings(report: dict[str, Any]) -> list[str]:
    out = []
    if report.get("findings"):
        out.append("Findings")
        for f in report["findings"]:
            out.append(f"  [{terminal(f['severity'])}] {terminal(f['title'])} ({terminal(f['rule'])}): "
                       f"{terminal(f['summary'])}")
            for c in f.get("changes", []):
                action = f" [{terminal(c['action'])}]" if c.get("action") else ""
                out.append(f"      {terminal(c['flag'])}: {terminal(change_from(c))} -> {terminal(change_to(c))}"
                           f"{action}  ({terminal(c.get('why', ''))})")
                if c.get("changes_precision"):
                    out.append(f"        ! {PRECISION_NOTE}")
        out.append("")
    return out + command_lines(report)


def _render_evidence_only(report: dict[str, Any]) -> str:
    src = report["source"]
    out = [f"profkit report: {terminal(src['path'] or 'vLLM evidence')} (no trace: vLLM's own evidence only)",
           *outcome_lines(report), *live_lines(report), ""]
    out += prescription_lines(report)
    out += _findings(report)
    out += efficiency_lines(report)
    out += host_lines(report)
    skipped = report.get("rules_skipped") or []
    if skipped:
        out.append(f"Rules not evaluated ({len(skipped)}; they need a trace or evidence not given): "
                   + ", ".join(terminal(s["rule"]) for s in skipped))
    return document("\n".join(out) + "\n")
