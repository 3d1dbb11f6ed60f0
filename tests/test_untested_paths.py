"""Paths no test took before (issue 29): `rules facts`, `capture --tool both`, `--cpu-switches`, `report --jobs`,
`report --host` with a real host.json, and NVML sampling (a stub `pynvml`, tests/fakes/nvml). Each checks what
comes out against numbers read here from the inputs, the recorded H100 runs or nsys's own CSVs."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shlex
from pathlib import Path

import pytest

from profkit.diagnose.facts import FACTS, UNITS
from profkit.diagnose.rule_files import fact_names, load_rules
from tests.cli import one_error_line, profkit
from tests.conftest import FIXTURES, GROUND_TRUTH
from tests.test_capture import FAKES, capture, free_port, manifest
from tests.test_ranks import RANKS, kernels_of

STUB_NVML = FAKES / "nvml"


@pytest.fixture
def env(sqlite_path, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_NSYS_SQLITE": str(sqlite_path("hostgap_b16")),
            "FAKE_TORCH_TRACE": str(FIXTURES / "h100_toy" / "torch_hostgap_b16.json.gz"),
            "FAKE_METRICS_DIR": str(Path(__file__).parent / "data" / "vllm_serve_kv300mb"),
            "FAKE_BENCH_DONE": str(tmp_path / "bench-done")}


def report_of(*args: object) -> dict:
    r = profkit("report", *args, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def window_mean(host: dict, duration: float, role: str | None) -> float:
    """Independently of profkit: the mean over the benchmark's window (its measured duration + 1 s, ending at
    the client's last sample) of the busiest `role` process's CPU, or (role None) of every GPU's NVML samples."""
    end = max(t for p in host["processes"] if p["role"] == "bench_client" for t, _ in p["cpu"])
    inside = [[v for t, v in series if end - duration - 1.0 <= t <= end]
              for series in ([p["cpu"] for p in host["processes"] if p["role"] == role] if role
                             else [[s for g in host["gpus"] for s in g["util"]]])]
    return max(sum(v) / len(v) for v in inside if v)


def test_rules_facts_lists_every_fact_once_with_its_unit() -> None:
    r = profkit("rules", "facts")
    assert r.returncode == 0 and r.stderr == ""
    rows = [line.split(None, 2) for line in r.stdout.splitlines()]
    listed = {name: (unit, doc) for name, unit, doc in rows}
    assert len(rows) == len(listed) == len(FACTS) and [row[0] for row in rows] == sorted(listed)
    assert listed == {name: (f.unit, f.doc) for name, f in FACTS.items()}
    assert {unit for unit, _ in listed.values()} <= set(UNITS)
    # every fact a shipped rule reads (its condition, its changes' conditions, its gain) is documented there
    read = set()
    for rule in load_rules():
        for expr in (rule.when, rule.gain, *(c.when for c in rule.changes)):
            read |= fact_names(expr) if expr else set()
    assert {"gpu.utilization", "sync.calls", "memops.pageable_share", "vllm.prompt_token_share"} <= read
    assert read <= set(listed)


def test_capture_tool_both_records_each_profiler_in_turn(env, tmp_path: Path) -> None:
    """--tool both: the benchmark under nsys (then its export), then again with torch.profiler; each run keeps
    its own result and log, and the folder reports from the nsys trace (every kernel nsys stats counts)."""
    out = tmp_path / "c"
    r = capture(env, "--tool", "both", "--out", str(out), "--", "vllm", "bench", "throughput", "--model", "/m",
                "--num-prompts", "32")
    assert r.returncode == 0, r.stderr
    m = manifest(out)
    assert m["status"] == "ok"
    assert [(s["name"], s["log"], s["exit_code"]) for s in m["steps"]] == [
        ("vllm bench under nsys", "bench.log", 0), ("nsys export", "export.log", 0),
        ("vllm bench with torch.profiler", "bench-torch.log", 0)]
    nsys_run, _, torch_run = (shlex.split(s["command"]) for s in m["steps"])
    assert nsys_run[:2] == ["nsys", "profile"] and "--profiler-config" not in nsys_run
    assert nsys_run[-2:] == ["--output-json", str(out / "bench.json")]
    config = json.loads(torch_run[torch_run.index("--profiler-config") + 1])
    assert config == {"profiler": "torch", "torch_profiler_dir": str((out / "torch").resolve()),
                      "detailed_trace_annotation": True}
    assert torch_run[0] == "vllm" and torch_run[-2:] == ["--output-json", str(out / "bench-torch.json")]
    for name in ("bench.json", "bench-torch.json"):
        assert json.loads((out / name).read_text())["requests_per_second"] == 21.3
    doc = report_of(out, "--window", "all")
    with (GROUND_TRUTH / "hostgap_b16_cuda_gpu_kern_sum.csv").open(newline="") as f:
        kernels = sum(int(row["Instances"]) for row in csv.DictReader(f))
    assert doc["source"]["kind"] == "nsys-sqlite" and doc["facts"]["kernels.count"] == kernels
    torch_trace = out / "torch" / "rank0.1.pt.trace.json.gz"
    with gzip.open(torch_trace) as f:
        torch_kernels = sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X")
    torch_doc = report_of(torch_trace, "--window", "all")
    assert torch_doc["source"]["kind"] == "torch-trace" and torch_doc["facts"]["kernels.count"] == torch_kernels
    # a served vLLM takes one profiler's configuration: both at once is refused before anything runs
    refused = capture(env, "serve", "--tool", "both", "--out", str(tmp_path / "s"), "--model", "/m",
                      "--port", str(free_port()))
    one_error_line(refused, "one profiler at a time", progress=True)
    assert not (tmp_path / "s").exists()


def test_cpu_switches_become_nsys_process_tree_context_switches(env, h100_host: Path) -> None:
    """`--cpu-switches` turns nsys's --cpuctxsw=none into --cpuctxsw=process-tree: the very nsys command of the
    H100 capture recorded with it (nsys_def2's manifest), and none of it without the option."""
    recorded = manifest(h100_host / "nsys_def2")["commands"][0]
    workload = ("--dataset-name random --random-input-len 1024 --random-output-len 256 --num-prompts 500 "
                "--request-rate inf --seed 0")
    args = ["serve", "--dry-run", "--out", "nsys_def2", "--model", "/tmp/tiny", "--port", "8011",
            "--server-args", "--max-model-len 2048", "--bench-args", workload]

    def nsys_part(line: str) -> list[str]:
        return shlex.split(line.split(" vllm serve ", 1)[0])

    switched = capture(env, *args, "--cpu-switches")
    plain = capture(env, *args)
    assert switched.returncode == plain.returncode == 0, switched.stderr + plain.stderr
    assert nsys_part(switched.stdout.splitlines()[0]) == nsys_part(recorded)
    assert "--cpuctxsw=process-tree" in nsys_part(recorded)
    expected = ["--cpuctxsw=none" if w == "--cpuctxsw=process-tree" else w for w in nsys_part(recorded)]
    assert nsys_part(plain.stdout.splitlines()[0]) == expected
    offline = capture(env, "--dry-run", "--cpu-switches", "--out", "c", "--", "vllm", "bench", "throughput",
                      "--model", "/m")
    words = shlex.split(offline.stdout.splitlines()[0])
    assert [w for w in words if w.startswith("--cpuctxsw")] == ["--cpuctxsw=process-tree"]


def test_report_jobs_gives_the_serial_report(monkeypatch) -> None:
    """--jobs 2 analyses the two rank traces in a pool of two processes, --jobs 1 in this one (the pools made are
    recorded, the real pool runs); the reports are equal, and each rank's kernel count is its file's."""
    import profkit.report.ranks as ranks

    pools: list[int | None] = []
    real_pool = ranks.ProcessPoolExecutor

    def recording_pool(*args, **kwargs):
        pools.append(kwargs.get("max_workers"))
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(ranks, "ProcessPoolExecutor", recording_pool)
    serial = report_of(*RANKS, "--window", "all", "--jobs", "1")
    assert pools == []
    pooled = report_of(*RANKS, "--window", "all", "--jobs", "2")
    assert pools == [2]
    assert pooled == serial
    assert [(r["source"], r["kernels"]["count"]) for r in pooled["ranks"]] == [
        (str(p), len(kernels_of(p))) for p in RANKS]
    one_error_line(profkit("report", *RANKS, "--jobs", "0"), "--jobs")


def test_report_host_file_over_the_benchmark_window(sqlite_path, h100_host: Path) -> None:
    """--host with the frontend-bound run's host.json (and its bench.json, and 1 s of its trace): the host facts
    are the samples' means over the benchmark's window, and NVML's GPU busy (over the benchmark) is preferred
    to the trace's utilization (over the 1 s slice)."""
    run = h100_host / "nsys_def2"
    host = json.loads((run / "host.json").read_text())
    duration = json.loads((run / "bench.json").read_text())["duration"]
    doc = report_of(sqlite_path("serve_frontend"), "--host", run / "host.json", "--bench", run / "bench.json")
    f = doc["facts"]
    assert doc["host"]["window_s"][1] - doc["host"]["window_s"][0] == pytest.approx(duration + 1.0)
    assert f["host.api_server_cpu"] == pytest.approx(window_mean(host, duration, "api_server"))
    assert f["host.engine_core_cpu"] == pytest.approx(window_mean(host, duration, "engine_core"))
    assert f["host.gpu_util_mean"] == pytest.approx(window_mean(host, duration, None))
    assert f["gpu.busy"] == f["host.gpu_util_mean"] != f["gpu.utilization"]
    assert f["host.cores"] == host["cores"] == 16 and f["host.api_server_count"] == 1
    assert "frontend-bound" in {x["rule"] for x in doc["findings"]}


def test_nvml_sampling_with_a_stub_library(env, tmp_path: Path) -> None:
    """The host sampler reads NVML through pynvml: with a stub (two GPUs, utilization 20, 40, 60, 80 % in turn)
    every reading lands in host.json in order, NVML is shut down once, and the report's GPU busy is their mean
    over the benchmark. Without a driver (the stub's init fails) the capture still writes the CPU samples."""
    calls = tmp_path / "nvml-calls"
    gpus = ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    stub = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(STUB_NVML), env.get("PYTHONPATH")])),
            "FAKE_NVML_GPUS": ";".join(gpus), "FAKE_NVML_UTIL": "20,40,60,80", "FAKE_NVML_CALLS": str(calls),
            "FAKE_VLLM_BENCH_S": "1.5"}
    out = tmp_path / "c"
    r = capture(stub, "serve", "--tool", "none", "--out", str(out), "--model", "/tmp/tiny", "--port",
                str(free_port()), "--bench-args", "--num-prompts 200")
    assert r.returncode == 0, r.stderr
    assert calls.read_text().split() == ["init", "shutdown"]
    host = json.loads((out / "host.json").read_text())
    assert [(g["index"], g["name"]) for g in host["gpus"]] == list(enumerate(gpus))
    cycle = [0.2, 0.4, 0.6, 0.8]
    for g in host["gpus"]:
        assert len(g["util"]) >= 4 and [v for _, v in g["util"]] == [cycle[i % 4] for i in range(len(g["util"]))]
    doc = report_of(out)
    duration = json.loads((out / "bench.json").read_text())["duration"]
    f = doc["facts"]
    assert f["host.gpu_util_mean"] == pytest.approx(window_mean(host, duration, None))
    assert f["gpu.busy"] == f["host.gpu_util_mean"] and f["gpu.count"] == 2
    assert doc["host"]["gpus"] == gpus
    # no NVML driver: no GPU samples, the CPU ones still taken
    bare = tmp_path / "bare"
    r = capture({**stub, "FAKE_NVML_GPUS": ""}, "serve", "--tool", "none", "--out", str(bare), "--model",
                "/tmp/tiny", "--port", str(free_port()), "--bench-args", "--num-prompts 200")
    assert r.returncode == 0, r.stderr
    host = json.loads((bare / "host.json").read_text())
    assert host["gpus"] == [] and any(p["role"] == "bench_client" and p["cpu"] for p in host["processes"])
    assert report_of(bare)["facts"]["host.gpu_util_mean"] is None
