"""The evidence stage: each reader turns one real file into a typed record, numbers as the file holds them, and
names the file in one line when it is broken; the records of a run make one `Evidence`, an explicit option beating
the capture folder. Real files: the H100 14B GPU-bound control run and the 1.1B KV-starved serve run
(tests/data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import pytest

from profkit.errors import ProfkitError
from profkit.evidence import folder as files
from profkit.evidence.bench import BenchResult, read_bench
from profkit.evidence.folder import CaptureFolder
from profkit.evidence.host import read_host
from profkit.evidence.manifest import read_manifest
from profkit.evidence.metrics import counter_delta, read_metrics
from profkit.evidence.record import Evidence
from profkit.evidence.vllm_log import parse_log, read_log

REAL_SERVE = Path(__file__).parent / "data" / "vllm_serve_kv300mb"


def test_bench_serve_json(h100_host: Path) -> None:
    raw = json.loads((h100_host / "ctl" / "bench.json").read_text())
    bench = read_bench(h100_host / "ctl" / "bench.json")
    assert isinstance(bench, BenchResult)
    assert bench.requests_per_second == raw["request_throughput"] == pytest.approx(11.421322623478016)
    assert bench.elapsed_s == raw["duration"] and bench.num_requests == raw["completed"] == 400
    assert bench.ttft_p99_ms == raw["p99_ttft_ms"] and bench.peak_concurrent_requests == 400
    # The report's JSON holds only what the file gave (no nulls for absent fields).
    given = {f for f in BenchResult.__struct_fields__ if getattr(bench, f) is not None}
    assert set(msgspec.to_builtins(bench)) == given


def test_vllm_log_startup_and_stats(h100_host: Path) -> None:
    log = read_log(h100_host / "ctl" / "server.log")
    # "GPU KV cache size: 253,408 tokens", "Maximum concurrency for 2,048 tokens per request: 123.73x",
    # "Model loading took 25.27 GiB", "Available KV cache memory: 46.4 GiB"
    assert log.kv_cache_tokens == 253408 and log.max_concurrency == 123.73
    assert log.model_memory_bytes == int(25.27 * (1 << 30)) and log.kv_cache_memory_bytes == int(46.4 * (1 << 30))
    assert log.non_default_args == {"model_tag": "/tmp/big", "port": 8011, "model": "/tmp/big",
                                    "max_model_len": 2048, "load_format": "dummy"}
    # "Free memory on device (78.66/79.18 GiB) on startup": the GPU's memory as vLLM saw it, not the peak table's
    sample = read_log(Path(__file__).parent.parent / "samples" / "vllm_14b_kv_bound" / "server.log")
    assert sample.gpu_total_memory_bytes == int(79.18 * (1 << 30))
    # the same line with a value that is not a number, or past any GPU: the fact stays unknown, nothing raised
    real = next(line for line in (Path(__file__).parent.parent / "samples" / "vllm_14b_kv_bound" / "server.log")
                .read_text().splitlines() if "Free memory on device" in line)
    for bad in ("1..2", "9" * 400, "", "-79.18"):
        assert parse_log(real.replace("/79.18 GiB", f"/{bad} GiB")).gpu_total_memory_bytes is None, bad
    serve = read_log(REAL_SERVE / "server.log")
    assert serve.stats_lines > 0 and serve.kv_cache_usage_max == 95.6 and serve.waiting_max == 125
    assert serve.preemptions_total is None  # vLLM 0.26 does not log preemptions


def test_metrics_scrapes_and_their_delta() -> None:
    before, after = read_metrics(REAL_SERVE / "metrics-before.txt"), read_metrics(REAL_SERVE / "metrics-after.txt")
    assert after.values["vllm:num_preemptions_total"] == 29.0
    delta = counter_delta(before, after)
    assert delta["vllm:num_preemptions_total"] == 29.0 - before.values.get("vllm:num_preemptions_total", 0.0)


def test_host_samples(h100_host: Path) -> None:
    raw = json.loads((h100_host / "ctl" / "host.json").read_text())
    host = read_host(h100_host / "ctl" / "host.json")
    assert host.cores == raw["cores"] == 16 and host.skipped_samples == 0
    assert [p.pid for p in host.processes] == [p["pid"] for p in raw["processes"]]
    assert sum(len(p.cpu) for p in host.processes) == sum(len(p["cpu"]) for p in raw["processes"])
    assert len(host.gpu_util) == sum(len(g["util"]) for g in raw["gpus"])


def test_manifest(h100_host: Path) -> None:
    m = read_manifest(h100_host / "ctl" / "manifest.json")
    assert m.status == "ok" and m.user_commands[0][:3] == ["vllm", "serve", "/tmp/big"]
    assert m.vllm_args == "--max-model-len 2048 --load-format dummy --port 8011"
    assert m.environment["gpu"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(("reader", "text", "needle"), [
    (read_bench, "[1, 2]", "not a benchmark JSON (expected an object, got a list)"),
    (read_bench, "{", "not a benchmark JSON"),
    (read_metrics, "vllm:x{a=\"1\"} notanumber\n", "not Prometheus text format"),
    (read_host, '{"schema": "other"}', "not a profkit.host/1 document"),
    (read_manifest, "[]", "not a capture manifest"),
    (read_log, "\x00binary", "binary data, not a vLLM log"),
])
def test_a_broken_file_is_one_line_naming_it(tmp_path: Path, reader, text: str, needle: str) -> None:
    path = tmp_path / "input"
    path.write_text(text)
    with pytest.raises(ProfkitError) as exc:
        reader(path)
    assert str(exc.value).startswith(str(path)) and needle in str(exc.value) and "\n" not in str(exc.value)


def test_an_explicit_option_beats_the_folder(tmp_path: Path, h100_host: Path) -> None:
    """Each piece the options give stays; each they lack comes from the folder; a folder file an option replaces
    is never read (here a broken one)."""
    folder = tmp_path / "ctl"
    shutil.copytree(h100_host / "ctl", folder)
    shutil.copy(folder / files.BENCH, tmp_path / "given.json")
    (folder / files.BENCH).write_text("{")
    given = Evidence.read(bench=tmp_path / "given.json", vllm_args="--max-num-seqs 64")
    merged = given.over(CaptureFolder(folder))
    assert merged.bench == given.bench and merged.flags() == {"max_num_seqs": 64}
    assert merged.command.source == "--vllm-args" and merged.manifest.vllm_args != given.vllm_args
    assert merged.log == read_log(folder / files.SERVER_LOG) and len(merged.metrics) == 2
    assert merged.host.cores == 16 and merged.model is None and merged.gpu_metrics is None
    with pytest.raises(ProfkitError, match="not a benchmark JSON"):  # nothing replaces it: the folder's is read
        Evidence().over(CaptureFolder(folder))


def test_one_evidence_test(tmp_path: Path) -> None:
    """Anything of the run but its traces is evidence; a manifest counts by what it records (its environment,
    even an empty one; the flags; the commands), not by being there."""
    assert Evidence().is_empty() and not Evidence.read(vllm_args="--enforce-eager").is_empty()
    manifest = tmp_path / files.MANIFEST
    manifest.write_text(json.dumps({"status": "ok"}))
    assert Evidence().over(CaptureFolder(tmp_path)).is_empty()
    manifest.write_text(json.dumps({"status": "ok", "environment": {}}))
    assert not Evidence().over(CaptureFolder(tmp_path)).is_empty()
    with pytest.raises(ProfkitError, match="--vllm-args: No closing quotation"):
        Evidence.read(vllm_args="--model 'm")
