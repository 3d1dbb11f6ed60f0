"""`profkit capture` with fake `nsys` and `vllm` executables (tests/fakes): orchestration, files,
signals and every failure path, without a GPU. The real run on an H100 is in the issue note."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli import Result, one_error_line, profkit
from tests.conftest import FIXTURES
from tests.test_rules import REAL_SERVE

FAKES = Path(__file__).parent / "fakes"


@pytest.fixture
def env(sqlite_path, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "PATH": f"{FAKES}:{os.environ['PATH']}", "FAKE_NSYS_SQLITE": str(sqlite_path("hostgap_b16")),
            "FAKE_TORCH_TRACE": str(FIXTURES / "h100_toy" / "torch_hostgap_b16.json.gz"),
            "FAKE_METRICS_DIR": str(REAL_SERVE), "FAKE_BENCH_DONE": str(tmp_path / "bench-done")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(path: Path, proc: subprocess.Popen, limit_s: float = 600) -> None:
    """Until the stand-in writes `path` (the state a test waits for): polls the file, never a fixed sleep; a
    process that ends first fails the test with its output."""
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"exited with {proc.returncode} before {path.name} appeared: {err[-2000:]}")
        assert time.monotonic() < deadline, f"{path.name} did not appear in {limit_s:g} s"
        time.sleep(0.05)


def capture(env: dict[str, str], *args: str, timeout: float = 120) -> Result:
    """`profkit capture` in a child process: the fake vllm and nsys are on its PATH."""
    return profkit("capture", *args, env=env, timeout=timeout)


def manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def report_json(folder: Path) -> dict:
    out = profkit("report", folder, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def log_facts(log: Path) -> dict:
    """The facts a report takes from a vLLM log alone (no manifest, no flags)."""
    out = profkit("report", "--vllm-log", log, "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["facts"]


def test_dry_run_prints_the_exact_commands(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture(env, "--dry-run", "--out", str(out), "--capture-range", "--delay", "5", "--duration", "30", "--",
                "vllm", "bench", "throughput", "--model", "/m", "--num-prompts", "32")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"nsys profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none --trace-fork-before-exec=true "
        f"--cuda-graph-trace=node --force-overwrite=true -o {out}/trace --capture-range=cudaProfilerApi "
        f"--capture-range-end=stop --delay 5 --duration 30 vllm bench throughput --model /m --num-prompts 32 "
        f"--profile --profiler-config '{{\"profiler\": \"cuda\", \"detailed_trace_annotation\": true}}' "
        f"--output-json {out}/bench.json",
        f"nsys export --type sqlite --force-overwrite=true --output {out}/trace.sqlite {out}/trace.nsys-rep",
    ]
    assert not out.exists()  # a dry run creates nothing
    torch = capture(env, "--dry-run", "--tool", "torch", "--out", str(out), "--", "vllm", "bench", "latency",
                    "--model", "/m")
    assert torch.stdout.strip() == (f"vllm bench latency --model /m --profile --profiler-config "
                                    f"'{{\"profiler\": \"torch\", \"torch_profiler_dir\": \"{out.resolve()}/torch\", "
                                    f"\"detailed_trace_annotation\": true}}' "
                                    f"--output-json {out}/bench.json")
    serve = capture(env, "serve", "--dry-run", "--out", str(out), "--model", "/m", "--port", "8011",
                    "--server-args", "--kv-cache-memory-bytes 300000000", "--bench-args", "--num-prompts 200")
    lines = serve.stdout.splitlines()
    # a served vLLM is stopped, not left to exit: nsys saves its CUDA buffers periodically
    assert lines[0].startswith("nsys profile --cuda-flush-interval=500 -t cuda,nvtx,osrt")
    assert "vllm serve /m --kv-cache-memory-bytes 300000000 " in lines[0]
    assert "--port 8011" in lines[0] and lines[0].endswith("stopped with SIGINT after the bench")
    # vLLM's cuda profiler names each engine step (NVTX), started and stopped by the benchmark client
    assert ("""--profiler-config '{"profiler": "cuda", "detailed_trace_annotation": true}'""" in lines[0])
    assert lines[1] == (f"vllm bench serve --backend vllm --model /m --port 8011 --num-prompts 200 --save-result "
                        f"--result-dir {out} --result-filename bench.json --profile")
    assert lines[2].startswith("nsys export --type sqlite")


def test_a_profiler_config_of_the_users_own_is_kept(env, tmp_path: Path) -> None:
    """A served capture under nsys adds vLLM's cuda profiler config; where the user's server command has one,
    it stays the only one (vLLM would take the last) and the benchmark still starts and stops it."""
    own = """--profiler-config '{"profiler": "cuda", "max_iterations": 500}'"""
    serve = capture(env, "serve", "--dry-run", "--out", str(tmp_path / "c"), "--model", "/m", "--server-args", own)
    assert serve.returncode == 0, serve.stderr
    server, client = serve.stdout.splitlines()[:2]
    assert server.count("--profiler-config") == 1 and """'{"profiler": "cuda", "max_iterations": 500}'""" in server
    assert client.endswith(" --profile")


def test_offline_nsys_capture_then_report(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture(env, "--out", str(out), "--", "vllm", "bench", "throughput", "--model", "/m", "--max-num-seqs", "4")
    assert r.returncode == 0, r.stderr
    m = manifest(out)
    assert m["status"] == "ok" and [s["exit_code"] for s in m["steps"]] == [0, 0]
    assert m["environment"]["vllm"] == "0.26.0" and "2025.3.1" in m["environment"]["nsys"]
    assert m["vllm_args"] == ["--model", "/m", "--max-num-seqs", "4"]
    assert {"trace.nsys-rep", "trace.sqlite", "bench.json", "bench.log", "export.log"} <= set(m["files"])
    doc = report_json(out)
    assert doc["facts"]["vllm.requests_per_second"] == 21.3
    assert doc["facts"]["config.max_num_seqs"] == 4 and doc["facts"]["config_source.max_num_seqs"] == "given"
    # the benchmark's log says the same ("non-default args"): the log alone gives the value
    logged = log_facts(out / "bench.log")
    assert (logged["config.max_num_seqs"], logged["config_source.max_num_seqs"]) == (4, "vLLM log")


def test_offline_torch_capture_then_report(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture(env, "--tool", "torch", "--out", str(out), "--", "vllm", "bench", "throughput", "--model", "/m")
    assert r.returncode == 0, r.stderr
    assert (out / "torch" / "rank0.1.pt.trace.json.gz").exists()
    doc = report_json(out)
    assert doc["source"]["kind"] == "torch-trace"


def test_serve_capture_with_metrics_then_report(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    port = free_port()
    r = capture(env, "serve", "--out", str(out), "--model", "/tmp/tiny", "--port", str(port),
                "--server-args", "--kv-cache-memory-bytes 300000000", "--bench-args", "--num-prompts 200")
    assert r.returncode == 0, r.stderr
    m = manifest(out)
    assert m["status"] == "ok" and m["server"]["exit_code"] == 0
    files = set(m["files"])
    assert {"server.log", "bench.log", "bench.json", "metrics-before.txt", "metrics-after.txt", "trace.nsys-rep",
            "trace.sqlite"} <= files
    assert "Shutting down" in (out / "server.log").read_text()  # stopped with SIGINT, cleanly
    doc = report_json(out)
    assert doc["facts"]["vllm.preemptions"] == 29  # the real /metrics scrapes the fake server returns
    kv = next(f for f in doc["findings"] if f["rule"] == "kv-preemption")
    assert any(c["flag"] == "--kv-cache-memory-bytes" and c["from"] == 300000000 for c in kv["changes"])
    # The user's own commands, without nsys and the folder's output arguments, and their suggested form.
    server = ["vllm", "serve", "/tmp/tiny", "--kv-cache-memory-bytes", "300000000", "--port", str(port)]
    client = ["vllm", "bench", "serve", "--backend", "vllm", "--model", "/tmp/tiny", "--port", str(port),
              "--num-prompts", "200"]
    assert m["user_commands"] == [server, client]
    cmd = doc["command"]
    assert cmd["source"] == "capture manifest" and cmd["original_argv"] == [server, client]
    assert cmd["suggested_argv"][0] == ["vllm", "serve", "/tmp/tiny", "--kv-cache-memory-bytes", "600000000",
                                        "--port", str(port)]
    assert cmd["suggested_argv"][1] == client  # no client-side change proposed
    assert all(c["ok"] for c in cmd["checks"]), cmd["checks"]
    assert doc["suggested_command"] == "\n".join(shlex.join(a) for a in cmd["suggested_argv"])


def test_unprofiled_captures_report_the_evidence(env, tmp_path: Path) -> None:
    """--tool none: the benchmark alone, no profiler; `profkit report` on the folder needs no trace."""
    out = tmp_path / "offline"
    r = capture(env, "--tool", "none", "--out", str(out), "--", "vllm", "bench", "throughput", "--model", "/m",
                "--enforce-eager", "--num-prompts", "32")
    assert r.returncode == 0, r.stderr
    m = manifest(out)
    assert m["commands"] == [f"vllm bench throughput --model /m --enforce-eager --num-prompts 32 "
                             f"--output-json {out}/bench.json"]
    assert m["user_commands"] == [["vllm", "bench", "throughput", "--model", "/m", "--enforce-eager",
                                   "--num-prompts", "32"]]
    assert not any(f.endswith((".sqlite", ".nsys-rep")) for f in m["files"])
    doc = report_json(out)
    assert doc["source"]["kind"] == "evidence" and doc["gpu"] is None
    assert doc["facts"]["vllm.requests_per_second"] == 21.3  # the fake bench's JSON
    assert doc["facts"]["config.enforce_eager"] is True
    # its log names what the command set, and nothing it did not
    logged = log_facts(out / "bench.log")
    assert (logged["config.enforce_eager"], logged["config_source.enforce_eager"]) == (True, "vLLM log")
    assert logged["config_source.max_num_seqs"] != "vLLM log"
    assert {"rule": "launch-overhead", "missing": ["gaps.host_idle_share", "gaps.sub_ms_idle_share", "gpu.busy",
                                                   "kernels.count", "kernels.graph_share",
                                                   "launch.latency_median_ns"]} in doc["rules_skipped"]
    port = free_port()
    serve = tmp_path / "serve"
    r = capture(env, "serve", "--tool", "none", "--out", str(serve), "--model", "/tmp/tiny", "--port", str(port),
                "--server-args", "--kv-cache-memory-bytes 300000000", "--bench-args", "--num-prompts 200")
    assert r.returncode == 0, r.stderr
    m = manifest(serve)
    assert "nsys" not in " ".join(m["commands"]) and m["status"] == "ok"
    doc = report_json(serve)
    assert doc["facts"]["vllm.preemptions"] == 29 and doc["source"]["kind"] == "evidence"
    assert doc["command"]["suggested_argv"][0][:5] == ["vllm", "serve", "/tmp/tiny", "--kv-cache-memory-bytes",
                                                       "600000000"]


def test_missing_nsys_or_vllm_fails_before_anything_starts(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture(env, "--nsys", "/nonexistent/nsys", "--out", str(out), "--", "vllm", "bench", "throughput")
    one_error_line(r, "'/nonexistent/nsys' not found on PATH", progress=True)
    r = capture(env, "--vllm", "no-such-vllm", "--tool", "torch", "--out", str(out), "--", "vllm", "bench",
                "throughput")
    one_error_line(r, "'no-such-vllm' not found on PATH", progress=True)
    assert not out.exists()


def test_port_already_taken(env, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = capture(env, "serve", "--out", str(tmp_path / "c"), "--model", "/m", "--port", str(s.getsockname()[1]))
    one_error_line(r, "already in use", progress=True)
    assert not (tmp_path / "c").exists()


def test_benchmark_failure_is_recorded(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture({**env, "FAKE_VLLM_FAIL": "bench"}, "--out", str(out), "--", "vllm", "bench", "throughput")
    one_error_line(r, "vllm bench under nsys exited with code 1", progress=True)
    m = manifest(out)
    assert m["status"] == "failed" and "exited with code 1" in m["failed_at"]
    assert "CUDA out of memory" in (out / "bench.log").read_text()
    assert "trace.nsys-rep" in m["files"]  # nsys still wrote what it had


def test_server_crash_keeps_the_log(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture({**env, "FAKE_VLLM_FAIL": "serve-crash"}, "serve", "--tool", "torch", "--out", str(out),
                "--model", "/m", "--port", str(free_port()))
    one_error_line(r, "vllm serve exited with code 1 before it was healthy", progress=True)
    assert manifest(out)["status"] == "failed"
    assert "engine core died" in (out / "server.log").read_text()


def test_health_timeout(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture({**env, "FAKE_VLLM_SLOW_HEALTH": "60"}, "serve", "--out", str(out), "--model", "/m",
                "--port", str(free_port()), "--health-timeout", "2")
    one_error_line(r, "not healthy within 2 s", progress=True)
    m = manifest(out)
    assert m["status"] == "failed" and m["server"]["exit_code"] == 0  # stopped, not left running


def test_step_timeout(env, tmp_path: Path) -> None:
    out = tmp_path / "c"
    r = capture({**env, "FAKE_VLLM_BENCH_S": "30"}, "--tool", "torch", "--timeout", "1", "--out", str(out), "--",
                "vllm", "bench", "throughput")
    one_error_line(r, "timed out after 1 s", progress=True)
    assert manifest(out)["steps"][0]["note"] == "timed out after 1 s"


def test_ctrl_c_stops_the_server_and_keeps_a_finalized_trace(env, tmp_path: Path) -> None:
    """The signal reaches profkit while the benchmark surely runs (the stand-in says so, then blocks), and profkit
    was started with SIGINT ignored, as a shell script's background job is: before f668df1's successor, Python
    left it ignored, the capture ran on and exited 0 as if complete."""
    out, blocking = tmp_path / "c", tmp_path / "blocking"
    proc = subprocess.Popen([sys.executable, "-m", "profkit.cli", "capture", "serve", "--out", str(out), "--model",
                             "/m", "--port", str(free_port())],
                            env={**env, "FAKE_VLLM_BLOCK_IN": ".", "FAKE_VLLM_BLOCKING": str(blocking)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_for(blocking, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode != 0 and "interrupted" in err and "Traceback" not in err
    m = manifest(out)
    assert m["status"] == "interrupted" and m["server"]["exit_code"] == 0
    assert {"trace.nsys-rep", "trace.sqlite", "server.log", "metrics-before.txt"} <= set(m["files"])


def test_a_child_is_reaped_though_an_interrupt_left_popens_lock_held() -> None:
    """CPython's Popen.wait and poll take an internal lock with a non-blocking acquire just before a `try`: a
    KeyboardInterrupt landing between the two (Ctrl-C, as profkit's handler raises it) leaves the lock held, and every
    later Popen.wait blocks for ever (a loaded test run hung `profkit tune` so, its benchmark a zombie). `exited`
    reaps without that lock: here the lock is held as the interrupt left it, and the children are still reaped."""
    from profkit.capture.run import exited

    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        for proc in (done, running):
            lock = getattr(proc, "_waitpid_lock", None)
            if lock is None:
                pytest.skip("this Python's Popen has no internal wait lock")
            assert lock.acquire(False)  # as the interrupt left it
        said: list[bool] = []  # in a thread: a wait that took the held lock would block, not fail
        waiter = threading.Thread(target=lambda: said.append(exited(done, None)), daemon=True)
        waiter.start()
        waiter.join(60)
        assert said == [True] and done.returncode == 3
        assert not exited(running, 0.0) and running.returncode is None
        running.kill()
        assert exited(running, None) and running.returncode == -signal.SIGKILL
        assert exited(running)  # reaped already: said so, the code kept
    finally:
        for proc in (done, running):
            if proc.returncode is None:
                proc.kill()


def test_real_h100_capture_folder_in_samples() -> None:
    """`samples/capture_thr_torch` was written by `profkit capture --tool torch` on the H100 (vLLM 0.26.0)."""
    folder = Path(__file__).resolve().parent.parent / "samples" / "capture_thr_torch"
    m = manifest(folder)
    assert m["status"] == "ok" and m["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert m["environment"]["vllm"] == "0.26.0" and m["steps"][0]["exit_code"] == 0
    doc = report_json(folder)
    assert doc["source"]["kind"] == "torch-trace" and doc["facts"]["kernels.count"] == 6975
    assert doc["facts"]["vllm.requests_per_second"] == json.loads((folder / "bench.json").read_text())[
        "requests_per_second"]
