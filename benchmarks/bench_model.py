"""The model's search and the report's prescription, timed (a measurement, not a test: nothing asserts a time).

For each sample run, in its own process (best of `--repeat`):
- the floor: `profkit predict RUN -- --max-num-seqs 256`, one calibration and one prediction, process start included;
- `profkit predict RUN --search` and `--search --allow-precision-changes`;
- `profkit predict RUN --frontier --slo "p99_tpot_ms<=60"`: the curve at 10 rates and the goodput's bisection;
- the report's prescription: `prescribe(...)` timed inside `profkit report RUN` (the search the report runs), beside
  the whole report's time.

`--baseline TREE` times another source tree (a worktree of an earlier commit) the same way in the same run.

    python benchmarks/bench_model.py
    python benchmarks/bench_model.py --baseline /tmp/wt_f668
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = [str(ROOT / "samples" / s) for s in ("vllm_14b_kv_bound", "vllm_14b_prescribed")]

# Runs inside the child: every module's `prescribe` wrapped with a timer, then the report built as the CLI builds it.
PRESCRIPTION = """
import json, sys, time
import profkit.diagnose.prescription as p
spent = []
real = p.prescribe
def timed(*a, **k):
    t = time.perf_counter(); out = real(*a, **k); spent.append(time.perf_counter() - t); return out
import profkit.report.build
for name in ("profkit.report.judgement", "profkit.report.build"):
    try:
        mod = __import__(name, fromlist=["_"])
    except ImportError:  # an older tree without that module
        continue
    if getattr(mod, "prescribe", None) is real:
        mod.prescribe = timed
p.prescribe = timed
from profkit.report import build_report
t = time.perf_counter()
build_report(sys.argv[1]).document()
print(json.dumps({"report": time.perf_counter() - t, "prescription": sum(spent)}))
"""


def best_of(argv: list[str], tree: Path, repeat: int) -> float:
    # run from the tree itself: `python -m` and `-c` put the working directory first on the path
    times = []
    env = {**os.environ, "PYTHONPATH": str(tree)}
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t)
    return min(times)


def prescription(sample: str, tree: Path, repeat: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", PRESCRIPTION, sample], cwd=tree, env=env, check=True,
                                      capture_output=True, text=True).stdout) for _ in range(repeat)]
    return min(runs, key=lambda r: r["report"])


def measure(tree: Path, repeat: int) -> dict[str, dict[str, float]]:
    cli = [sys.executable, "-m", "profkit.cli", "predict"]
    out = {}
    for sample in SAMPLES:
        floor = best_of([*cli, sample, "--", "--max-num-seqs", "256"], tree, repeat)
        search = best_of([*cli, sample, "--search"], tree, repeat)
        precision = best_of([*cli, sample, "--search", "--allow-precision-changes"], tree, repeat)
        front = best_of([*cli, sample, "--frontier", "--slo", "p99_tpot_ms<=60"], tree, repeat)
        out[sample] = {"floor": floor, "search": search, "search_precision": precision, "frontier": front,
                       **prescription(sample, tree, repeat)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another source tree, timed the same way")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    trees = {"this tree": ROOT, **({"baseline": args.baseline} if args.baseline else {})}
    print(f"{'tree':<10} {'sample':<30} {'floor':>7} {'search':>8} {'+prec.':>8} {'ratio':>6} "
          f"{'front.':>7} {'prescr.':>8} {'report':>7}")
    for label, tree in trees.items():
        for sample, t in measure(tree, args.repeat).items():
            print(f"{label:<10} {Path(sample).name:<30} {t['floor']:7.2f} {t['search']:8.2f} "
                  f"{t['search_precision']:8.2f} {t['search'] / t['floor']:6.1f} {t['frontier']:7.2f} "
                  f"{t['prescription']:8.2f} "
                  f"{t['report']:7.2f}")


if __name__ == "__main__":
    main()
