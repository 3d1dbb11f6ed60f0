"""The "How far from the hardware's limit" section, laid out once for every format (text, Markdown, HTML):
the GPU's peaks, each estimate's achieved FLOP/s and bytes/s as shares of them (MFU, MBU), which side of the
roofline's ridge the run sits on, and the GPU's own counters (nsys GPU metrics) over the window, per engine-step
phase and per kernel category. Values are formatted here; the templates only place them."""

from __future__ import annotations

from typing import Any

from profkit.escape import terminal
from profkit.render.sections.table import text_table
from profkit.units import pct

ESTIMATES = (("vllm_counters", "vLLM's own counters (--enable-mfu-metrics)"),
             ("model_shape", "the model's shape x tokens processed"))
METRIC_COLUMNS = (("sm_active", "SMs active"), ("tensor_active", "tensor active"), ("dram", "DRAM read+write"))
TOP_CATEGORIES = 6


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _metric_pct(row: dict[str, Any], key: str) -> str:
    """A GPU-metrics mean (percent of peak, 0-100) as text; DRAM is read + write."""
    if key == "dram":
        r, w = row.get("dram_read"), row.get("dram_write")
        return "-" if r is None or w is None else f"{r + w:.1f}%"
    value = row.get(key)
    return "-" if value is None else f"{value:.1f}%"


def ridge(eff: dict[str, Any]) -> float | None:
    """FLOP per byte where the compute roof meets the bandwidth roof: below it a run is memory-bound."""
    gpu, peak = eff.get("gpu") or {}, (eff.get("precision") or {}).get("compute_peak_tflops")
    bw = gpu.get("bandwidth_tbs")
    return peak / bw if peak and bw else None


def efficiency_view(report: dict[str, Any]) -> dict[str, Any] | None:
    """The section's rows, or None when the report measured nothing against the peaks (no estimate, no GPU
    metrics: the peaks alone say nothing about the run)."""
    eff = report.get("efficiency")
    if not eff or not (eff.get("vllm_counters") or eff.get("model_shape") or eff.get("gpu_metrics")):
        return None
    gpu, prec = eff.get("gpu") or {}, eff.get("precision") or {}
    point = ridge(eff)
    if gpu.get("bf16_tflops"):
        peaks = (f"{gpu['name']}: {_num(gpu['bf16_tflops'])} TFLOP/s bf16, {_num(gpu['fp8_tflops'])} fp8 (dense), "
                 f"{_num(gpu['bandwidth_tbs'], 2)} TB/s")
    elif gpu.get("bandwidth_tbs"):
        peaks = (f"{gpu.get('name') or 'the GPU'}: not in profkit's peak table (no MFU); "
                 f"{_num(gpu['bandwidth_tbs'], 2)} TB/s from the trace")
    else:
        peaks = f"{gpu.get('name') or 'the GPU'}: not in profkit's peak table (no MFU/MBU)"
    bits, kv = prec.get("weight_bits"), prec.get("kv_cache_bytes")
    kv_text = f"KV cache {kv} byte{'' if kv == 1 else 's'} per element" if kv else ""
    precision = ", ".join(p for p in (f"weights {bits}-bit" if bits else "", kv_text) if p)
    labelled = [(label, eff.get(key), False) for key, label in ESTIMATES]
    phases = eff.get("phases") or {}
    labelled += [(f"{row['phase']} steps ({row['steps']:,}, {_num(row['seconds'])} s)", row, True)
                 for row in phases.get("rows") or []]
    estimates = [_estimate(label, est, point, phase) for label, est, phase in labelled if est]
    window = eff.get("window") or {}
    reading = None
    if window.get("mfu") is not None and window.get("mbu") is not None:
        closer = "compute" if window["mfu"] >= window["mbu"] else "memory bandwidth"
        reading = (f"Over the benchmark ({_num(window.get('seconds'))} s, from {window['from']}): MFU "
                   f"{pct(window['mfu'])}, MBU {pct(window['mbu'])}; closest to the {closer} limit.")
    by_phase = [f"{row['phase']} steps {_closer(row)}" for row in phases.get("rows") or []
                if row.get("mfu") is not None and row.get("mbu") is not None]
    if by_phase:
        reading = (reading + " " if reading else "") + "By phase: " + "; ".join(by_phase) + "."
    return {"title": "How far from the hardware's limit", "peaks": peaks, "source": gpu.get("source"),
            "compared_with": f"compute compared with the {prec.get('peak_is') or 'bf16'} peak"
                             + (f" ({precision})" if precision else ""),
            "ridge": _num(point, 0) if point else None, "estimates": estimates, "reading": reading,
            "phases": phases.get("from") and f"Phases: from {phases['from']} and the model's shape; each phase's "
                                             "time is its steps' own (start to the next step's start).",
            "phases_note": phases.get("note"), "withheld": list(eff.get("withheld") or []),
            "metrics": _metrics(eff.get("gpu_metrics")), "chart": _chart_data(eff, estimates)}


def _estimate(label: str, est: dict[str, Any], point: float | None, phase: bool) -> dict[str, Any]:
    """A row of the estimates table: achieved rates, their shares of the peaks, and the roofline's side (`phase`:
    one phase of the engine steps, not the whole run)."""
    side = None
    if point and est.get("intensity"):
        side = "compute-bound side" if est["intensity"] >= point else "memory-bound side"
    return {"from": label, "tflops": _num(est.get("tflops")), "mfu": pct(est.get("mfu")),
            "tbs": _num(est.get("tbs"), 2), "mbu": pct(est.get("mbu")),
            "intensity": _num(est.get("intensity"), 0), "side": side or "-", "phase": phase,
            "raw": {k: est.get(k) for k in ("tflops", "tbs", "intensity", "mfu", "mbu")}}


def _closer(row: dict[str, Any]) -> str:
    """`MFU 60.5 %` or `MBU 74.5 %`, the larger share: the limit the phase is nearer."""
    return f"MFU {pct(row['mfu'])} (compute)" if row["mfu"] >= row["mbu"] else \
        f"MBU {pct(row['mbu'])} (memory bandwidth)"


def _metrics(gm: dict[str, Any] | None) -> dict[str, Any] | None:
    if not gm:
        return None
    rows = [{"scope": "window", **{k: _metric_pct(gm.get("window") or {}, k) for k, _ in METRIC_COLUMNS}}]
    for phase in gm.get("phases") or []:
        rows.append({"scope": f"{phase['phase']} steps", **{k: _metric_pct(phase, k) for k, _ in METRIC_COLUMNS}})
    cats = gm.get("categories") or {}
    ranked = sorted(cats.items(), key=lambda kv: -max((m.get("samples") or 0) for m in kv[1].values()))
    for name, by_metric in ranked[:TOP_CATEGORIES]:
        flat = {m: v.get("mean") for m, v in by_metric.items()}
        samples = max((v.get("samples") or 0) for v in by_metric.values())
        rows.append({"scope": f"under {name} ({samples:,} sample{'' if samples == 1 else 's'})",
                     **{k: _metric_pct(flat, k) for k, _ in METRIC_COLUMNS}})
    return {"source": gm.get("source"), "columns": [title for _, title in METRIC_COLUMNS], "rows": rows,
            "metric_keys": [k for k, _ in METRIC_COLUMNS]}


def _chart_data(eff: dict[str, Any], estimates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the roofline chart draws: the roofs (bf16, fp8 where the GPU has it) and each estimate's point."""
    gpu = eff.get("gpu") or {}
    if not gpu.get("bandwidth_tbs"):
        return None
    points = [{"label": e["from"], "intensity": e["raw"]["intensity"], "tflops": e["raw"]["tflops"],
               "phase": e["phase"]}
              for e in estimates if e["raw"]["intensity"] and e["raw"]["tflops"]]
    if not gpu.get("bf16_tflops"):
        return None
    roofs = [{"label": "bf16", "tflops": gpu["bf16_tflops"]}]
    if gpu.get("fp8_tflops"):
        roofs.append({"label": "fp8", "tflops": gpu["fp8_tflops"]})
    return {"bandwidth_tbs": gpu["bandwidth_tbs"], "roofs": roofs, "points": points}


def view(report: dict[str, Any], top: int) -> dict[str, Any] | None:
    return efficiency_view(report)


def text(v: dict[str, Any]) -> list[str]:
    out = [v["title"], f"  {terminal(v['peaks'])}; {terminal(v['compared_with'])}"
           + (f"; ridge at {v['ridge']} FLOP/byte" if v["ridge"] else "")]
    if v["estimates"]:
        out.append(text_table(v["estimates"], {
            "estimate from": lambda r: r["from"], "TFLOP/s": lambda r: r["tflops"], "MFU": lambda r: r["mfu"],
            "TB/s": lambda r: r["tbs"], "MBU": lambda r: r["mbu"], "FLOP/byte": lambda r: r["intensity"],
            "roofline": lambda r: r["side"]}, 4))
    for line in (v["phases"], v["phases_note"] and f"Per phase: not measured: {v['phases_note']}.",
                 *(f"Withheld: {w}." for w in v["withheld"]), v["reading"]):
        if line:
            out.append(f"  {terminal(line)}")
    m = v["metrics"]
    if m:
        out.append(f"  GPU metrics (nsys, mean % of peak; {terminal(str(m['source']))}):")
        columns: dict[str, Any] = {"over": lambda r: terminal(r["scope"])}
        for key, title in zip(m["metric_keys"], m["columns"], strict=True):
            columns[title] = lambda r, key=key: r[key]
        out.append(text_table(m["rows"], columns, 12))
    return out
