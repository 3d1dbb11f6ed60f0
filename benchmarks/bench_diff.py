"""Time `profkit diff`: of two saved report JSONs (target < 0.3 s), and of two 1M-kernel nsys traces
against the cost of the two reports it needs (target: about that cost; the two sides are reported in
parallel processes, so on 2+ cores about one report's time).

The traces are built as in bench_report.py (the real vLLM fixture, every CUDA table replicated);
each command runs in its own process, best of `--repeat`.

    python benchmarks/bench_diff.py [--copies 17] [--workdir DIR] [--repeat 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_report import DEFAULT_FIXTURE, build_replicated, floor_cmd, prepare, run_measured  # noqa: E402


def best(cmd: list[str], repeat: int) -> float:
    return min(run_measured(cmd)[0] for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixture", type=Path, default=DEFAULT_FIXTURE)
    ap.add_argument("--copies", type=int, default=17, help="copies of the fixture (17 -> 1.0M kernels)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    work, base = prepare(args.fixture, args.workdir)
    a, b = work / "a.sqlite", work / "b.sqlite"
    kernels = build_replicated(base, args.copies, a)
    shutil.copyfile(a, b)
    cli = [sys.executable, "-m", "profkit.cli"]
    floor = best(floor_cmd(a), args.repeat)
    report_a = best([*cli, "report", str(a), "--format", "json", "-o", str(work / "a.json"), "--no-progress"],
                    args.repeat)
    report_b = best([*cli, "report", str(b), "--format", "json", "-o", str(work / "b.json"), "--no-progress"],
                    args.repeat)
    diff_traces = best([*cli, "diff", str(a), str(b), "--format", "json", "-o", str(work / "d.json")], args.repeat)
    diff_json = best([*cli, "diff", str(work / "a.json"), str(work / "b.json"), "--format", "json", "-o",
                      str(work / "dj.json")], max(3, args.repeat))
    print(f"{kernels:,} kernels per trace, {a.stat().st_size / 1e6:.0f} MB each", file=sys.stderr)
    print("| what | wall s | vs |")
    print("|---|---:|---|")
    print(f"| floor: one raw kernel GROUP BY | {floor:.2f} | |")
    print(f"| report A | {report_a:.2f} | {report_a / floor:.1f}x the floor |")
    print(f"| report B | {report_b:.2f} | |")
    print(f"| diff A B (two traces) | {diff_traces:.2f} | {diff_traces / (report_a + report_b):.2f}x the two reports, "
          f"{diff_traces / max(report_a, report_b):.2f}x the slower one |")
    print(f"| diff of the two report JSONs | {diff_json:.2f} | target < 0.3 s |")
    for p in (a, b):
        p.unlink()


if __name__ == "__main__":
    main()
