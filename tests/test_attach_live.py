"""`profkit attach` on real loaded vLLM 0.26.0 servers (tests/data/h200_live: one H200 each, recorded with
`profkit capture` of the same load beside it; its README says how). In CI the recorded series are replayed by a
stand-in over HTTP on 127.0.0.1, and a stand-in started as `vllm serve` on this machine is found by its port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profkit.evidence.metrics import MetricsScrape, read_series
from tests.cli import one_error_line, profkit
from tests.conftest import unpack
from tests.test_attach import FakeClock, StandIn, watched


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack(tmp_path_factory, "h200_live")


@pytest.fixture(scope="module")
def reports(rec: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("live_reports")
    docs = {}
    for name in ("live_tight2", "cap_tight2", "live_spec2", "cap_spec2", "live_tight_cut"):
        r = profkit("report", rec / name, "--format", "json", "-o", out / f"{name}.json")
        assert r.returncode == 0, r.stderr
        docs[name] = json.loads((out / f"{name}.json").read_text())
    return docs


def fired(doc: dict) -> set[str]:
    return {f["rule"] for f in doc["findings"]}


def test_the_live_report_finds_what_the_capture_of_the_same_load_finds(reports: dict[str, dict], rec: Path) -> None:
    """The same server and load, seen through its endpoints alone and through profkit capture: the same findings,
    the same KV cache (vLLM's cache_config_info gauge against its log), and the window's latencies near the
    client's (the window is the loaded middle of the run, the client's figures the whole)."""
    live, cap = reports["live_tight2"], reports["cap_tight2"]
    bench = json.loads((rec / "cap_tight2" / "bench.json").read_text())
    assert fired(live) == fired(cap) == {"kv-preemption", "kv-cache-pressure", "prefill-dominated"}
    assert live["facts"]["vllm.kv_cache_tokens"] == cap["facts"]["vllm.kv_cache_tokens"] == 69_296
    assert live["vllm"]["cache"] == {"kv_cache_size_tokens": 69_296, "num_gpu_blocks": 4331, "block_size": 16,
                                     "gpu_memory_utilization": 0.28, "cache_dtype": "auto",
                                     "enable_prefix_caching": "True"}
    window = live["vllm"]["live"]
    assert window["tpot_ms"]["mean"] == pytest.approx(bench["mean_tpot_ms"], rel=0.05)
    assert window["itl_ms"]["mean"] == pytest.approx(bench["mean_itl_ms"], rel=0.05)
    assert window["output_tokens_per_request"] == pytest.approx(bench["total_output_tokens"] / bench["completed"],
                                                                rel=0.02)
    # arrived = finished + the change in those running or waiting (the window opened on 30 running, none waiting)
    series = read_series(rec / "live_tight2" / "metrics-series.jsonl")
    held = [m.values["vllm:num_requests_running"] + m.values["vllm:num_requests_waiting"]
            for m in (series[0], series[-1])]
    assert window["arrivals"] == window["requests"] + held[1] - held[0]
    assert live["facts"]["vllm.preemptions"] > 100 and cap["facts"]["vllm.preemptions"] > 100
    # MFU and MBU from vLLM's own counters over the window (--enable-mfu-metrics): the same side of the roofline
    assert live["efficiency"]["window"]["from"] == "vLLM's counters"
    assert live["efficiency"]["window"]["seconds"] == pytest.approx(window["seconds"])
    assert 0.3 < live["efficiency"]["window"]["mbu"] < 1 and 0.3 < cap["efficiency"]["window"]["mbu"] < 1


def test_the_suggested_command_is_the_servers_own(reports: dict[str, dict], rec: Path) -> None:
    """attach found the server's process on the host: its command line is the run's, and the change lands on it."""
    manifest = json.loads((rec / "live_tight2" / "manifest.json").read_text())
    server = manifest["user_commands"][0]
    assert server[:3] == ["vllm", "serve", "/tmp/big"] and "--gpu-memory-utilization" in server
    assert manifest["live"]["pid"] > 0 and manifest["environment"]["gpu"] == "NVIDIA H200"
    text = profkit("report", rec / "live_tight2").stdout
    before = next(line for line in text.splitlines() if line.strip().startswith("before:"))
    assert before.split("before:")[1].split() == server
    assert "after:  vllm serve /tmp/big" in text and "--gpu-memory-utilization 0.28" not in text.split("after:")[1]
    host = json.loads((rec / "live_tight2" / "host.json").read_text())
    roles = {p["role"] for p in host["processes"]}
    assert {"api_server", "engine_core"} <= roles
    assert next(p for p in host["processes"] if p["role"] == "api_server")["pid"] == manifest["live"]["pid"]


def test_speculative_decoding_that_drafts_nothing(reports: dict[str, dict], rec: Path) -> None:
    """n-gram speculation on random text: vLLM's counters read no draft in either window, per position too; the
    finding says so in both reports and the suggested command drops the flag."""
    for name in ("live_spec2", "cap_spec2"):
        doc = reports[name]
        assert "spec-decode-idle" in fired(doc), name
        spec = doc["vllm"]["spec_decode"]
        assert spec["drafts"] == 0 and spec["draft_tokens"] == 0 and spec["acceptance_rate"] is None
        assert doc["facts"]["vllm.generation_tokens"] > 100_000
        assert "--speculative-config" in doc["command"]["original"][0]
        assert "--speculative-config" not in doc["suggested_command"]
    assert "spec-decode-idle" not in fired(reports["live_tight2"])
    from profkit.evidence.metrics import read_metrics

    scrape = read_metrics(rec / "cap_spec2" / "metrics-after.txt")
    per_position = sorted(k for k in scrape.values if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos"))
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert per_position == [name, *(f'{name}{{position="{i}"}}' for i in range(3))]


def test_a_window_the_server_cut_short_is_still_read(reports: dict[str, dict], rec: Path) -> None:
    doc = reports["live_tight_cut"]
    series = read_series(rec / "live_tight_cut" / "metrics-series.jsonl")
    assert doc["vllm"]["live"]["seconds"] == series[-1].t
    done = series[-1].values["vllm:request_success_total"] - series[0].values["vllm:request_success_total"]
    assert doc["vllm"]["live"]["requests"] >= done and "kv-preemption" in fired(doc)


def test_the_model_runs_on_a_live_window_and_says_when_it_does_not_reproduce_it(reports: dict[str, dict]) -> None:
    from profkit.model.observe import observe

    obs = observe(reports["live_tight2"])
    window = reports["live_tight2"]["vllm"]["live"]
    assert obs.requests == window["requests"] and obs.request_rate == pytest.approx(window["arrival_rate"])
    assert obs.memory.kv_tokens == 69_296 and obs.memory.utilization == 0.28
    # the window opens on a backlog the simulation does not have: no prescription with ranges it cannot keep
    note = reports["live_tight2"]["prescription"]["note"]
    assert note.startswith("no prescription: the model does not reproduce this run (its simulated duration")
    # the capture of the same load, whole: reproduced, and more KV cache predicted to end the queueing
    cap = reports["cap_tight2"]["prescription"]
    memory = next(c for c in cap["changes"] if c["flag"] == "--gpu-memory-utilization")
    assert memory["to"] is None or memory["to"] > 0.28  # None: the flag removed, vLLM's default
    ttft = cap["predicted"]["mean_ttft_ms"]
    assert ttft["predicted"] < 0.5 * ttft["before"]


# --- replaying the recorded series ------------------------------------------------------------------------------

def as_text(scrape: MetricsScrape) -> str:
    """A recorded scrape as /metrics text (its values; the histograms' buckets are in the before/after texts)."""
    return "".join(f"{name} {value!r}\n" for name, value in scrape.values.items())


def test_attach_replayed_on_the_recorded_series_gives_the_recorded_window(rec: Path, reports: dict[str, dict],
                                                                         tmp_path: Path) -> None:
    folder = rec / "live_tight2"
    series = read_series(folder / "metrics-series.jsonl")
    texts = [(folder / "metrics-before.txt").read_text(), *map(as_text, series[1:-1]),
             (folder / "metrics-after.txt").read_text()]
    with StandIn(texts) as server:
        watched(server.url, tmp_path / "again", 60.0, 2.0)
    again = read_series(tmp_path / "again" / "metrics-series.jsonl")
    # the recording kept the cache_config_info gauge's value (1) in each scrape; its labels are what counts, and
    # attach now reads them from the before and after texts
    assert [m.values for m in again[1:-1]] == [{k: v for k, v in m.values.items() if k != "vllm:cache_config_info"}
                                               for m in series[1:-1]]
    doc = json.loads(profkit("report", tmp_path / "again", "--format", "json").stdout)
    recorded = reports["live_tight2"]["vllm"]["live"]
    for key in ("requests", "arrivals", "prompt_tokens_per_request", "ttft_ms", "tpot_ms", "queue_ms"):
        assert doc["vllm"]["live"][key] == recorded[key], key
    assert fired(doc) >= {"kv-preemption", "kv-cache-pressure"}


def test_a_server_that_goes_away_mid_window_leaves_the_window_so_far(rec: Path, tmp_path: Path) -> None:
    folder = rec / "live_tight2"
    before = (folder / "metrics-before.txt").read_text()
    server = StandIn([before, before, before])
    with server:
        out = tmp_path / "gone"
        from profkit.capture.attach import AttachError

        class Gone(FakeClock):
            def sleep(self, seconds: float) -> None:
                super().sleep(seconds)
                if self.now >= 4:
                    server.server.server_close()  # the server stops answering mid-window

        from profkit.capture.attach import AttachOptions, attach

        gone = Gone()
        with pytest.raises(AttachError, match="the window ends at 2 s") as info:
            attach(AttachOptions(url=server.url, out=out, duration_s=60, interval_s=2), clock=gone.clock,
                   sleep=gone.sleep)
        assert "profkit report" in str(info.value)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and "cannot reach the server" in manifest["failed_at"]
    assert (out / "metrics-after.txt").read_text() == before
    assert profkit("report", out).returncode == 0


# --- the server's own machine ------------------------------------------------------------------------------------

SERVE = '''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
texts = [open(p).read() for p in sys.argv[sys.argv.index("--texts") + 1:]]
port = int(sys.argv[sys.argv.index("--port") + 1])
seen = []
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path == "/metrics":
            seen.append(1); body = texts[min(len(seen) - 1, len(texts) - 1)].encode()
        elif self.path == "/version": body = json.dumps({"version": "0.26.0"}).encode()
        elif self.path == "/v1/models":
            body = json.dumps({"data": [{"id": sys.argv[2], "root": sys.argv[2], "max_model_len": 2048}]}).encode()
        else:
            self.send_response(404); self.end_headers(); return
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture()
def local_vllm(rec: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """A stand-in started as `vllm serve MODEL ...` on this machine (a script named vllm), serving the recorded
    texts; MODEL a local folder with the recorded config.json."""
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(SERVE)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes((rec / "live_tight2" / "model-config.json").read_bytes())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = rec / "live_tight2"
    proc = subprocess.Popen([sys.executable, str(script), "serve", str(model), "--gpu-memory-utilization", "0.28",
                             "--port", str(port), "--texts", str(folder / "metrics-before.txt"),
                             str(folder / "metrics-after.txt")], env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"})
    try:
        while proc.poll() is None:  # until the stand-in listens (however slowly this machine starts it)
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        assert proc.poll() is None, "the stand-in server exited before it listened"
        yield proc, port, model
    finally:
        proc.kill()
        proc.wait()


def test_attach_on_the_servers_machine_finds_its_command_and_samples_it(local_vllm: tuple, tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    proc, port, model = local_vllm
    out = tmp_path / "here"
    r = profkit("attach", f"http://localhost:{port}", "--duration", "2s", "--interval", "1s", "--out", out)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    argv = manifest["user_commands"][0]
    assert argv[:3] == ["vllm", "serve", str(model)] and argv[3:5] == ["--gpu-memory-utilization", "0.28"]
    assert manifest["vllm_args"][:2] == ["--gpu-memory-utilization", "0.28"]  # the flags, without the model
    assert manifest["live"]["pid"] == proc.pid
    assert (out / "model-config.json").read_bytes() == (model / "config.json").read_bytes()
    host = json.loads((out / "host.json").read_text())
    assert [p["pid"] for p in host["processes"] if p["role"] == "api_server"] == [proc.pid]
    # the suggested command is built on the server's own command line
    doc = json.loads(profkit("report", out, "--format", "json").stdout)
    assert doc["command"]["original_argv"][0][:3] == ["vllm", "serve", str(model)]
    text = profkit("report", out).stdout
    assert f"before: vllm serve {model} --gpu-memory-utilization 0.28" in text


def test_attach_elsewhere_is_endpoints_only(rec: Path, tmp_path: Path) -> None:
    """A URL that is not this machine's: nothing about a process is looked for or written."""
    from profkit.capture.attach import local_server

    assert local_server("http://192.0.2.1:8000") is None  # TEST-NET-1: never this host
    with StandIn([(rec / "live_tight2" / "metrics-before.txt").read_text()]) as server:
        assert local_server(server.url) is None  # this machine, but the listener is no vLLM process
        watched(server.url, tmp_path / "w", 2.0, 1.0)
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_text())
    assert "user_commands" not in manifest and not (tmp_path / "w" / "host.json").exists()


def test_a_servers_own_gpus_only(rec: Path, tmp_path: Path) -> None:
    """On a machine shared with other runs the report's GPU utilization is the run's GPUs': NVML's holders of each
    GPU, else the server's CUDA_VISIBLE_DEVICES. The recorded host.json predates both (all four GPUs averaged);
    given GPU 2's holder (the recorded engine core) it reads GPU 2 alone."""
    from profkit.evidence.host import parse_host

    data = json.loads((rec / "live_tight2" / "host.json").read_text())
    everyone = parse_host(data, "host.json")
    assert everyone.gpus_used is None and len(everyone.gpu_util) == sum(len(g["util"]) for g in data["gpus"])
    core = next(p["pid"] for p in data["processes"] if p["role"] == "engine_core")
    held = {**data, "gpus": [{**g, "pids": [core] if g["index"] == 2 else [4_000_000 + g["index"]]}
                             for g in data["gpus"]]}
    mine = parse_host(held, "host.json")
    gpu2 = next(g for g in data["gpus"] if g["index"] == 2)
    assert mine.gpus_used == [2] and mine.gpu_util == [tuple(pair) for pair in gpu2["util"]]
    visible = {**data, "gpus": [{**g, "visible": g["index"] == 2} for g in data["gpus"]]}
    assert parse_host(visible, "host.json").gpus_used == [2]
    line = one_error_line(profkit("attach", "http://127.0.0.1:1", "--duration", "1s", "--out", tmp_path / "x"),
                          "cannot reach the server")
    assert "Traceback" not in line


def test_the_live_window_reads_the_same_in_every_format(rec: Path, tmp_path: Path) -> None:
    """Text, Markdown and HTML carry the window's lines; a percentile inside the lowest bucket says only "at most"
    (the spec server queued nothing: every queue time fell in vLLM's first bucket, 0.3 s, and the mean is 0.0)."""
    folder = rec / "live_spec2"
    text = profkit("report", folder).stdout
    md = profkit("report", folder, "--format", "md").stdout
    assert profkit("report", folder, "--format", "html", "-o", tmp_path / "r.html").returncode == 0
    html = (tmp_path / "r.html").read_text()
    head = "live window 60 s: 438 requests finished (7.30 req/s)"
    queue = "queue        mean 0.0 ms, p50 / p90 / p99 &lt;= 300.0 / &lt;= 300.0 / &lt;= 300.0 ms"
    assert head in text and head in md and head in html
    assert queue.replace("&lt;", "<") in text and queue.replace("&lt;", "<") in md and queue in html
    assert "speculative decoding: 0 drafts, 0 draft tokens, 0 accepted" in text
    assert "speculative decoding: 0 drafts" in profkit("report", rec / "cap_spec2").stdout


def test_hostile_gpu_holders_and_cache_labels_are_ignored(rec: Path) -> None:
    """host.json and /metrics are the user's evidence, of any shape: holders that are no pids, an index that is no
    GPU, a cache size of inf or text are left out, never a traceback or a non-JSON number."""
    from profkit.analysis.vllm import cache_info
    from profkit.evidence.host import parse_host
    from profkit.evidence.metrics import parse_metrics

    data = json.loads((rec / "live_tight2" / "host.json").read_text())
    odd = {**data, "gpus": [{**g, "pids": [[1], "x", None, True, {"a": 1}], "index": str(g["index"])}
                            for g in data["gpus"]]}
    assert parse_host(odd, "host.json").gpus_used is None
    text = (rec / "live_tight2" / "metrics-after.txt").read_text()
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info"))
    hostile = line.replace('kv_cache_size_tokens="69296"', 'kv_cache_size_tokens="inf"').replace(
        'num_gpu_blocks="4331"', 'num_gpu_blocks="many"').replace('block_size="16"', 'block_size="-16"')
    cache = cache_info(parse_metrics(text.replace(line, hostile)).info)
    assert cache is not None and {"kv_cache_size_tokens", "num_gpu_blocks", "block_size"}.isdisjoint(cache)
    assert cache["gpu_memory_utilization"] == 0.28
