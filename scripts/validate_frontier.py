"""The SLO frontier from one run against the sweeps measured on H200s (tests/data/h200_model_led.tar.xz): each sweep
point predicted from the full-load capture's replicates (the mean over them), its throughput and latency
percentiles against what `vllm bench serve` measured at that rate, and the goodput under a few bounds.

    python scripts/validate_frontier.py         # the tables, Markdown, on stdout
"""

from __future__ import annotations

import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SWEEPS = [  # name, the capture it is predicted from, the sweep, the changes from the capture, bounds
    ("8B 1024/256, vLLM's defaults", "sweep/capture", "sweep/defaults", {},
     [("p99_tpot_ms", 15), ("p99_tpot_ms", 30), ("p99_ttft_ms", 200), ("p99_e2el_ms", 5000)]),
    ("8B 1024/256, the FP8 pair", "sweep/capture", "sweep/fp8pair", {"quantization": "fp8", "kv_cache_dtype": "fp8"},
     [("p99_tpot_ms", 15), ("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 5000)]),
    ("14B 512/512, vLLM's defaults", "sweep14/capture", "sweep14/defaults", {},
     [("p99_tpot_ms", 15), ("p99_tpot_ms", 20), ("p99_ttft_ms", 150), ("p99_e2el_ms", 8000)]),
]
KEYS = ["request_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p99_e2el_ms"]


def main() -> None:
    from profkit.compare.sweep import measured_goodput
    from profkit.model.frontier import frontier, point_at
    from profkit.model.observe import observe
    from profkit.model.predict import DEFAULT_NOISE, calibrate, configured
    from profkit.model.search import Bound
    from profkit.report import build_report

    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(REPO / "tests" / "data" / "h200_model_led.tar.xz") as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp) / "h200_model_led"
        for name, capture, sweep, changes, bounds in SWEEPS:
            cals = [calibrate(observe(build_report(r).document())) for r in sorted((root / capture).glob("r[0-9]"))]
            points = sorted((json.loads(f.read_text()) for f in (root / sweep).glob("rate-*.json")),
                            key=lambda m: m["request_rate"])
            print(f"\n### {name}: predicted from {len(cals)} full-load replicate(s)\n")
            print("| rate (req/s) | " + " | ".join(KEYS) + " |")
            print("|---:|" + "---:|" * len(KEYS))
            for m in points:
                preds = []
                for cal in cals:
                    conf = configured(cal, changes)
                    spread = DEFAULT_NOISE + max(cal.fit_error.values())
                    preds.append(point_at(cal, conf, m["request_rate"], m["num_prompts"], spread).predicted)
                cells = []
                for k in KEYS:
                    p = statistics.mean(x[k] for x in preds)
                    cells.append(f"{m[k]:,.1f} / {p:,.1f} ({100 * (p / m[k] - 1):+.0f}%)")
                print(f"| {m['request_rate']:.2f} | " + " | ".join(cells) + " |")
            print("\n| bound | measured goodput (req/s) | predicted (range) | error |\n|---|---:|---:|---:|")
            for metric, value in bounds:
                b = Bound(metric, "<=", value)
                meas = measured_goodput(points, b)
                goods = [frontier(cal, changes, [b]).goodput for cal in cals]
                rate = statistics.mean(g["rate"] for g in goods)
                low, high = min(g["low"] for g in goods), max(g["high"] for g in goods)
                print(f"| {metric}<={value:g} | {meas:.2f} | {rate:.2f} ({low:.2f}-{high:.2f}) | "
                      f"{100 * (rate / meas - 1):+.0f}% |")


if __name__ == "__main__":
    main()
