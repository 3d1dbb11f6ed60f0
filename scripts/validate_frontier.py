"""The SLO frontier from one run against the sweeps measured on H200s (tests/data/h200_model_led.tar.xz): each sweep
point predicted from each of the full-load capture's replicates, its throughput and latency percentiles against what
`vllm bench serve` measured at that rate, and the goodput under a few bounds.

    python scripts/validate_frontier.py           # the tables, Markdown, on stdout
    python scripts/validate_frontier.py --write   # and the rows profkit ships (profkit/model/frontier_validation.json)

A row is one (sweep point, capture replicate, metric) where both the server and the model kept up with the rate (past
the capacity a finite run's percentiles say how long it ran). The frontier widens a point's range to the 10th-90th
percentiles of these rows' log(measured / predicted) for the metric (their extremes below 10 rows; under a change,
the rows of sweeps sharing its class of change, `levers.families`, where any do); the coverage
printed is leave-one-recording-out: each row's range built without the rows predicted from its own capture. The
goodput ranges in the tables are the product's (widened by the errors of every sweep of the same kind, this one's
included): in-sample.
"""

from __future__ import annotations

import argparse
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
    ("14B 512/512, vLLM's defaults, the rates `profkit sweep` chose (lease 4)", "sweep14/capture", "sweep14p", {},
     [("p99_tpot_ms", 15), ("p99_tpot_ms", 20), ("p99_ttft_ms", 200), ("p99_e2el_ms", 8000)]),
    ("14B 512/512, the FP8 pair (lease 5; read after f9c7120 predicted it)", "sweep14/capture", "sweep14fp8",
     {"quantization": "fp8", "kv_cache_dtype": "fp8"},
     [("p99_tpot_ms", 15), ("p99_tpot_ms", 20), ("p99_ttft_ms", 200), ("p99_e2el_ms", 8000)]),
    ("8B 128/256, vLLM's defaults, 1 API server (lease 6; the rates and predictions `profkit sweep --from` made on the "
     "GPU box, 243a8c4's model)", "api/s2_api1", "sweep8s", {},
     [("p99_tpot_ms", 15), ("p99_ttft_ms", 150), ("p99_tpot_ms", 10), ("p99_e2el_ms", 3000)]),
    ("8B 128/256, 2 API servers, predicted from the 1-API-server capture (lease 7; 3 replicates a rate; the points "
     "predicted on the GPU box by 5d1f19b's model before the sweep ran)", "api/s2_api1", "sweep8s2",
     {"api_server_count": 2}, [("p99_tpot_ms", 10), ("p99_ttft_ms", 150), ("p99_e2el_ms", 3000)]),
    ("8B 128/256, 4 API servers, predicted from the 1-API-server capture (lease 8; 6 rates x 3 replicates, 16 runs "
     "finished; the rates chosen and the points predicted on the GPU box by 93afb36's model before the sweep ran)",
     "api/s2_api1", "sweep8s4", {"api_server_count": 4},
     [("p99_tpot_ms", 10), ("p99_ttft_ms", 150), ("p99_e2el_ms", 3000)]),
    ("8B 128/256, 2 API servers on a third box (lease 10; 40 and 48 req/s x 3 replicates; the points predicted by "
     "6a072aa's model before they ran)", "api/s2_api1", "sweep8s2b", {"api_server_count": 2},
     [("p99_tpot_ms", 10), ("p99_ttft_ms", 150), ("p99_e2el_ms", 3000)]),
    ("8B 128/256, 4 API servers on a third box (lease 10, beside the 2; the same rates and model)", "api/s2_api1",
     "sweep8s4b", {"api_server_count": 4}, [("p99_tpot_ms", 10), ("p99_ttft_ms", 150), ("p99_e2el_ms", 3000)]),
    ("8B 128/256, 3 API servers, from its own full-load run on the same box (lease 12; the 6 rates `profkit sweep "
     "--from` chose, one run each; the points predicted on the GPU box by 9b10439's model, which fitted that run: "
     "-32 % and -24 %; it is not fitted since)", "api/s2_api3b", "sweep8s3", {},
     [("p99_tpot_ms", 10), ("p99_ttft_ms", 150), ("p99_e2el_ms", 3000)]),
    ("8B 128/256, 3 API servers, predicted from the 1-API-server capture (lease 12; the frontier 9b10439 predicted on "
     "the workstation before the lease)", "api/s2_api1", "sweep8s3", {"api_server_count": 3},
     [("p99_tpot_ms", 10), ("p99_ttft_ms", 150), ("p99_e2el_ms", 3000)]),
    ("8B 512/128, lengths +-50 %, 1 API server, from lease 12's full-load run, swept on a fifth box (lease 14; the 6 "
     "rates `profkit sweep --from` chose x 2 replicates; every point predicted by bda68c2 before the lease)",
     "api/s4_api1", "sweep4s", {}, [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("8B 512/128, lengths +-50 %, --max-num-batched-tokens 2048, predicted from the default's run (lease 14, beside "
     "it; 6 rates x 1; predicted by bda68c2 before the lease)", "api/s4_api1", "sweep4s_mnbt2048",
     {"max_num_batched_tokens": 2048}, [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("14B 512/128, lengths +-50 %, from its own full-load run (lease 18; the rates `profkit sweep --from` chose on a "
     "second box, one run each, 4 of 5 finished; predicted by 2e2d974 before they ran; the E2E bound added after)",
     "api/s14_512_128", "sweep14_512_128", {},
     [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("8B 1024/128, lengths +-50 %, from its own full-load run (lease 18, beside it; the same)", "api/s8_1024_128",
     "sweep8_1024_128", {}, [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("14B 512/128, lengths +-50 %, from lease 18's full-load run, swept on a third box (lease 19; 6 rates of the "
     "frontier 2e2d974 predicted x 3 replicates, chosen and predicted before the lease)", "api/s14_512_128",
     "sweep14_512_128b", {}, [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("8B 1024/128, lengths +-50 %, from lease 18's full-load run (lease 19, beside it; the same)", "api/s8_1024_128",
     "sweep8_1024_128b", {}, [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("14B 512/128, lengths +-50 %, --max-num-seqs 64, predicted from the default's run (lease 20; 6 rates of the "
     "frontier 2fed7ae predicted x 3 replicates on a fourth box, chosen, bounded and predicted before the lease)",
     "api/s14_512_128", "sweep14_512_128_mns64", {"max_num_seqs": 64},
     [("p99_tpot_ms", 20), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
    ("8B 1024/128, lengths +-50 %, --max-num-batched-tokens 2048, predicted from the default's run (lease 20, beside "
     "it; the same)", "api/s8_1024_128", "sweep8_1024_128_mnbt2048", {"max_num_batched_tokens": 2048},
     [("p99_tpot_ms", 30), ("p99_ttft_ms", 300), ("p99_e2el_ms", 3000)]),
]
KEYS = ["request_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p99_e2el_ms"]
OUT = REPO / "profkit" / "model" / "frontier_validation.json"


def sweep_points(folder: Path) -> list[dict]:
    """A sweep's measured points, ascending by rate: `rate-R.json` (a `vllm bench serve` result each), or a `profkit
    sweep` folder's `rate-R/r*/bench.json` (the mean over a rate's replicates)."""
    points = [json.loads(f.read_text()) for f in folder.glob("rate-*.json")]
    for rate_dir in folder.glob("rate-*/"):
        runs = [json.loads(f.read_text()) for f in sorted(rate_dir.glob("r*/bench.json"))]
        if runs:
            points.append({k: statistics.mean(r[k] for r in runs) if isinstance(runs[0][k], (int, float)) else
                           runs[0][k] for k in runs[0] if all(k in r for r in runs)})
    return sorted(points, key=lambda m: m["request_rate"])


def kept_up(m: dict) -> bool:
    """The server kept up: a finite run at the rate lasts its sending time and about one request more."""
    return m["request_throughput"] >= 0.9 * m["num_prompts"] / (m["num_prompts"] / m["request_rate"]
                                                                + m["mean_e2el_ms"] / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the rows to {OUT.relative_to(REPO)}")
    args = parser.parse_args()

    from profkit.compare.sweep import measured_goodput
    from profkit.model.frontier import frontier, frontier_metrics, keeps_up, point_at
    from profkit.model.levers import families
    from profkit.model.observe import observe
    from profkit.model.predict import calibrate, configured, spread
    from profkit.model.search import Bound
    from profkit.model.validation import inside_frontier_held_out, residual, rows_text
    from profkit.report import build_report

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(REPO / "tests" / "data" / "h200_model_led.tar.xz") as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp) / "h200_model_led"
        for name, capture, sweep, changes, bounds in SWEEPS:
            replicates = sorted((root / capture).glob("r[0-9]"))
            cals = [calibrate(observe(build_report(r).document())) for r in replicates]
            points = sweep_points(root / sweep)
            print(f"\n### {name}: predicted from {len(cals)} full-load replicate(s)\n")
            print("| rate (req/s) | " + " | ".join(KEYS) + " |")
            print("|---:|" + "---:|" * len(KEYS))
            for m in points:
                preds = []
                for cal, replicate in zip(cals, replicates, strict=True):
                    p = point_at(cal, configured(cal, changes), m["request_rate"], m["num_prompts"], spread(cal),
                                 held_out=False)
                    preds.append(p.predicted)
                    if not (kept_up(m) and keeps_up(p)):
                        continue
                    rows += [{"recording": capture, "sweep": sweep, "changed": bool(changes),
                              **({"families": list(families(changes))} if changes else {}),
                              "replicate": replicate.name,
                              "rate": m["request_rate"], "metric": k, "predicted": p.predicted[k], "low": p.low[k],
                              "high": p.high[k], "measured": m[k]}
                             for k in frontier_metrics() if k in p.predicted and m.get(k)]
                cells = []
                for k in KEYS:
                    v = statistics.mean(x[k] for x in preds)
                    cells.append(f"{m[k]:,.1f} / {v:,.1f} ({100 * (v / m[k] - 1):+.0f}%)")
                print(f"| {m['request_rate']:.2f} | " + " | ".join(cells) + " |")
            print("\n| bound | measured goodput (req/s) | predicted (range) | error |\n|---|---:|---:|---:|")
            for metric, value in bounds:
                b = Bound(metric, "<=", value)
                meas = measured_goodput(points, b)
                goods = [frontier(cal, changes, [b]).goodput for cal in cals]
                rate = statistics.mean(g["rate"] for g in goods)
                low, high = min(g["low"] for g in goods), max(g["high"] for g in goods)
                floor = bool(points) and all(b.holds(m[metric]) for m in points)  # the goodput is at least that
                if not meas:
                    error = "- (no rate measured met it)"
                elif floor:
                    error = ("- (every rate measured met it)" if rate >= meas
                             else f"{100 * (rate / meas - 1):+.0f}% or more")
                else:
                    error = f"{100 * (rate / meas - 1):+.0f}%"
                shown = f"{'>= ' if floor else ''}{meas:.2f}"
                print(f"| {metric}<={value:g} | {shown} | {rate:.2f} ({low:.2f}-{high:.2f}) | {error} |")
    for r in rows:
        r["inside_held_out"] = inside_frontier_held_out(r, rows)
    print("\n### Coverage (leave-one-recording-out), points both kept up with\n")
    print("| metric | rows | median error | 10th-90th percentile | inside the model's own range | inside the held-out "
          "range |\n|---|---:|---:|---:|---:|---:|")
    for k, changed in dict.fromkeys((r["metric"], r["changed"]) for r in rows):
        mine = [r for r in rows if r["metric"] == k and r["changed"] == changed]
        errors = sorted(residual(r) for r in mine)
        cuts = statistics.quantiles(errors, n=10, method="inclusive") if len(errors) >= 10 else [errors[0], errors[-1]]
        own = sum(r["low"] <= r["measured"] <= r["high"] for r in mine)
        held = sum(r["inside_held_out"] for r in mine)
        name = f"{k} (from another configuration's run)" if changed else k
        print(f"| {name} | {len(mine)} | {100 * statistics.median(errors):+.0f}% | {100 * cuts[0]:+.0f}% to "
              f"{100 * cuts[-1]:+.0f}% | {own}/{len(mine)} | {held}/{len(mine)} |")
    if args.write:
        OUT.write_text(rows_text("profkit.frontier-validation/1", rows))
        print(f"\nwrote {OUT.relative_to(REPO)} ({len(rows)} rows)", file=sys.stderr)


if __name__ == "__main__":
    main()
