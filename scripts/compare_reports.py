"""Render every report, diff, tune and rules output of every fixture, sample and test input with one profkit tree,
then compare two such renderings byte for byte: the check that a refactor changed no output.

    python scripts/compare_reports.py render --tree . --out /tmp/snap/new
    python scripts/compare_reports.py render --tree /tmp/old-checkout --out /tmp/snap/old
    python scripts/compare_reports.py compare /tmp/snap/old /tmp/snap/new

`render` drives each tree through its command line only (`profkit.cli:main`, in-process, in two worker
processes), so trees whose library API differs render the same cases. Inputs are unpacked once into
`--inputs` (default /tmp/profkit-snapshot-inputs) and shared by every tree, so paths printed in the
reports agree. Outputs that hold the wall-clock time (the history's `saved_at`) are masked.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("PROFKIT_FIXTURES", REPO / "tests" / "data" / "fixtures"))
DATA = REPO / "tests" / "data"
FORMATS = ("text", "json", "md", "html")
TOY = ["chunked_prefill", "eager_b1", "eager_b64", "graphs_b1", "graphs_b64", "hostgap_b16", "prefill_long",
       "swap_b16", "sync_b16"]


# ------------------------------------------------------------------------------------------------ inputs

def _unxz(src: Path, dst: Path) -> Path:
    if not dst.exists():
        with lzma.open(src) as f, dst.open("wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
    return dst


def _untar(src: Path, dst: Path) -> Path:
    if not dst.exists():
        dst.mkdir(parents=True)
        with tarfile.open(src) as tar:
            tar.extractall(dst, filter="data")
    return dst


def prepare(inputs: Path) -> dict[str, list[str]]:
    """Unpack every input once; return the cases: name -> the command line after `profkit`."""
    inputs.mkdir(parents=True, exist_ok=True)
    traces: dict[str, Path] = {}
    for name in TOY:
        traces[name] = _unxz(FIXTURES / "h100_toy" / name / f"{name}.sqlite.xz", inputs / f"{name}.sqlite")
    for t in sorted((FIXTURES / "h100_toy").glob("torch_*.json.gz")):
        traces[t.name.split(".")[0]] = t
    traces["thr_graphs"] = _unxz(FIXTURES / "h100_vllm" / "thr_graphs.sqlite.xz", inputs / "thr_graphs.sqlite")
    traces["thr_torch"] = next((FIXTURES / "h100_vllm" / "torch_profile").glob("*.pt.trace.json.gz"))
    traces["serve_frontend"] = _unxz(DATA / "h100_serve_frontend_slice.sqlite.xz", inputs / "serve_frontend.sqlite")
    # Samples are copied out of the tree: a path inside it would read differently for each tree.
    samples = inputs / "samples"
    if not samples.exists():
        shutil.copytree(REPO / "samples", samples)
        (inputs / "not-a-trace.txt").write_text("profkit\n")
    traces["sample_hostgap"] = samples / "hostgap_b16.sqlite"
    for f in sorted((DATA / "foreign").iterdir()):
        if f.name.endswith(".sqlite.xz"):
            traces["foreign_" + f.name[:-10]] = _unxz(f, inputs / f.name[:-3])
        elif f.name.endswith(".json.gz"):
            if not (inputs / f.name).exists():
                shutil.copy(f, inputs / f.name)
            traces["foreign_" + f.name[:-8]] = inputs / f.name
    tune = _untar(DATA / "h100_tune.tar.xz", inputs / "h100_tune")
    host = _untar(DATA / "h100_host.tar.xz", inputs / "h100_host")
    pair = _untar(DATA / "vllm_serve_pair.tar.xz", inputs / "serve_pair")
    # A capture folder of a planted misconfiguration joined with an eager trace (tests/test_command.py's case).
    eager_capture = inputs / "capture_thr_eager"
    if not eager_capture.exists():
        shutil.copytree(FIXTURES / "h100_vllm" / "capture_thr_eager", eager_capture)
        shutil.copy(traces["eager_b1"], eager_capture / "trace.sqlite")
    folders = {"capture_thr_eager": eager_capture, "sample_capture_torch": samples / "capture_thr_torch",
               "capture_thr_eager_notrace": FIXTURES / "h100_vllm" / "capture_thr_eager"}
    for sub in sorted(p for p in (tune / "h100_tune").rglob("manifest.json")):
        folders["tune_" + "_".join(sub.parent.relative_to(tune / "h100_tune").parts)] = sub.parent
    for sub in sorted(p for p in (host / "h100_host").rglob("manifest.json")):
        folders["host_" + "_".join(sub.parent.relative_to(host / "h100_host").parts)] = sub.parent
    for sub in sorted(p for p in (pair).rglob("manifest.json")):
        folders["pair_" + "_".join(sub.parent.relative_to(pair).parts)] = sub.parent

    cases: dict[str, list[str]] = {}
    for name, path in {**traces, **folders}.items():
        for window in ("auto", "all"):
            for fmt in FORMATS:
                cases[f"report-{name}-{window}.{fmt}"] = ["report", str(path), "--window", window, "--format", fmt]
    kv = inputs / "vllm_serve_kv300mb"
    if not kv.exists():
        shutil.copytree(DATA / "vllm_serve_kv300mb", kv)
    evidence = ["--bench", str(kv / "bench.json"), "--vllm-log", str(kv / "server.log"), "--metrics",
                str(kv / "metrics-before.txt"), "--metrics", str(kv / "metrics-after.txt"), "--vllm-args",
                (kv / "vllm_args.txt").read_text().strip()]
    for fmt in FORMATS:
        cases[f"report-kv300mb-evidence.{fmt}"] = ["report", *evidence, "--format", fmt]
        cases[f"report-kv300mb-with-trace.{fmt}"] = ["report", str(traces["hostgap_b16"]), *evidence,
                                                     "--format", fmt]
        cases[f"report-eager-vllm-args.{fmt}"] = ["report", str(traces["eager_b1"]), "--vllm-args",
                                                  "vllm serve /m --max-num-seqs 64 --enforce-eager", "--format", fmt]
        cases[f"report-thr-graphs-evidence.{fmt}"] = [
            "report", str(traces["thr_graphs"]), "--bench", str(FIXTURES / "h100_vllm" / "thr_graphs.json"),
            "--vllm-log", str(FIXTURES / "h100_vllm" / "thr_graphs.log"), "--format", fmt]
        cases[f"report-ranks.{fmt}"] = ["report", str(traces["foreign_hta_sampled_rank-0"]),
                                        str(traces["foreign_hta_sampled_rank-1"]), "--window", "all",
                                        "--jobs", "1", "--format", fmt]
        cases[f"report-host-flag.{fmt}"] = ["report", "--host", str(host / "h100_host" / "ctl" / "host.json"),
                                            "--bench", str(host / "h100_host" / "ctl" / "bench.json"),
                                            "--format", fmt]
        cases[f"diff-pair.{fmt}"] = ["diff", str(pair / "before"), str(pair / "after"), "--format", fmt]
        cases[f"diff-toy.{fmt}"] = ["diff", str(traces["eager_b1"]), str(traces["graphs_b1"]), "--format", fmt]
        cases[f"diff-host.{fmt}"] = ["diff", str(host / "h100_host" / "hand_def1"),
                                     str(host / "h100_host" / "hand_api1"), "--format", fmt,
                                     "--fail-on", "request_throughput<-5%", "--fail-on", "vllm.preemptions>+0%"]
        cases[f"diff-evidence.{fmt}"] = ["diff", str(tune / "h100_tune" / "def_serve"),
                                         str(host / "h100_host" / "hand_api2"), "--format", fmt, "--noise", "3%"]
    for tune_json in sorted([*tune.rglob("tune.json"), *host.rglob("tune.json")]):
        rel = "_".join(tune_json.parent.relative_to(inputs).parts)
        for fmt in ("text", "md", "html"):
            cases[f"tune-{rel}.{fmt}"] = ["__tune__", str(tune_json), fmt]
    cases["rules-list.text"] = ["rules", "list"]
    for rule in sorted(p.stem for p in (REPO / "rules").glob("*.yaml")):
        cases[f"rules-explain-{rule}.text"] = ["rules", "explain", rule]
    cases["capture-dry-offline.text"] = ["capture", "--dry-run", "--out", "/tmp/cap", "--", "vllm", "bench",
                                         "throughput", "--model", "/m", "--num-prompts", "10"]
    cases["capture-dry-serve.text"] = ["capture", "--dry-run", "--out", "/tmp/cap", "serve", "--model", "/m",
                                       "--server-args", "--max-num-seqs 8 --enforce-eager",
                                       "--bench-args", "--num-prompts 10"]
    cases["tune-dry-serve.text"] = ["tune", "--dry-run", "--out", "/tmp/tn", "serve", "--model", "/m",
                                    "--server-args", "--max-num-seqs 8", "--bench-args", "--num-prompts 10"]
    cases["error-not-a-trace.text"] = ["report", str(inputs / "not-a-trace.txt")]
    cases["error-no-rule.text"] = ["rules", "explain", "no-such-rule"]
    return cases


# ------------------------------------------------------------------------------------------------ render

def _run_case(args: list[str], out: Path) -> tuple[int, str]:
    """One command line through the tree's own entry point, in this process; (exit code, stderr)."""
    if args[0] == "__tune__":  # a recorded tune.json through the tune renderer
        try:
            from profkit.render import render as render_doc  # after the refactor: one entry per document
        except ImportError:
            render_doc = None
        doc = json.loads(Path(args[1]).read_text())
        if render_doc is not None:
            text = render_doc(doc, args[2])
        else:
            from profkit.tune.render import render_tune

            text = render_tune(doc, args[2])
        out.write_text(text, encoding="utf-8")
        return 0, ""
    from profkit.cli import main

    err, stdout = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = ["profkit", *args]
    code = 0
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved
    out.write_text(stdout.getvalue(), encoding="utf-8")
    return code, err.getvalue()


def work(tree: Path, out: Path, inputs: Path, part: int, parts: int) -> None:
    """One worker process: its share of the cases through the tree's profkit (first on sys.path)."""
    sys.path.insert(0, str(tree))
    items = sorted(prepare(inputs).items())[part::parts]
    results = {}
    for name, args in items:
        code, err = _run_case(args, out / name)
        results[name] = {"exit": code, "stderr": err.replace(str(tree), "<tree>")}
        text = (out / name).read_text(encoding="utf-8")
        if str(tree) in text:  # rule files are named by their path in the tree
            (out / name).write_text(text.replace(str(tree), "<tree>"), encoding="utf-8")
    (out / f"_status.{part}.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


def render(tree: Path, out: Path, inputs: Path, workers: int = 2) -> None:
    cases = prepare(inputs)  # unpacked once, before the workers share the folder
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    procs = [subprocess.Popen([sys.executable, __file__, "_work", "--tree", str(tree.resolve()), "--out", str(out),
                               "--inputs", str(inputs), "--part", str(i), "--parts", str(workers)], env=env)
             for i in range(workers)]
    if any(p.wait() for p in procs):
        raise SystemExit("a worker failed")
    status: dict[str, dict] = {}
    for i in range(workers):
        part = out / f"_status.{i}.json"
        status.update(json.loads(part.read_text()))
        part.unlink()
    (out / "_status.json").write_text(json.dumps(dict(sorted(status.items())), indent=1) + "\n")
    print(f"{len(cases)} outputs of {tree} in {out}")


MASKS = [re.compile(r'"saved_at": "[^"]*"'), re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")]


def _masked(data: bytes) -> bytes:
    text = data.decode("utf-8", "replace")
    for m in MASKS:
        text = m.sub("<time>", text)
    return text.encode()


def compare(a: Path, b: Path) -> int:
    names = sorted({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()})
    differ = 0
    for name in names:
        pa, pb = a / name, b / name
        if not pa.exists() or not pb.exists():
            print(f"only in {'the first' if pa.exists() else 'the second'}: {name}")
            differ += 1
            continue
        da, db = _masked(pa.read_bytes()), _masked(pb.read_bytes())
        if da != db:
            differ += 1
            la, lb = da.decode().splitlines(), db.decode().splitlines()
            at = next((i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y), min(len(la), len(lb)))
            print(f"DIFFERS {name} at line {at + 1}:\n  - {la[at] if at < len(la) else '<end>'}"
                  f"\n  + {lb[at] if at < len(lb) else '<end>'}")
    same = len(names) - differ
    digest = hashlib.sha256(b"".join(_masked((b / n).read_bytes()) for n in names if (b / n).exists())).hexdigest()
    print(f"{same} of {len(names)} outputs byte-identical; {differ} differ (sha256 of the second: {digest[:16]})")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("--tree", type=Path, default=REPO)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--inputs", type=Path, default=Path("/tmp/profkit-snapshot-inputs"))
    r.add_argument("--workers", type=int, default=2)
    w = sub.add_parser("_work")
    w.add_argument("--tree", type=Path, required=True)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--inputs", type=Path, required=True)
    w.add_argument("--part", type=int, required=True)
    w.add_argument("--parts", type=int, required=True)
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = parser.parse_args()
    if args.cmd == "_work":
        work(args.tree, args.out, args.inputs, args.part, args.parts)
        return 0
    if args.cmd == "render":
        render(args.tree, args.out, args.inputs, args.workers)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
