"""`profkit attach URL` (issue 37), in CI: a stand-in server on 127.0.0.1 replays /metrics texts recorded from a
real vLLM 0.26.0 server on 2 H200s (tests/data/h200_tp2/capture: before and after 200 requests of
`vllm bench serve`), with its /version and /v1/models; and servers that are not vLLM, refuse, hang or send
too much. The live folder is read by `profkit report` like any other capture folder."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli import one_error_line, profkit
from tests.conftest import unpack


class StandIn:
    """A vLLM-shaped HTTP server: /metrics answers each scrape with the next recorded text (the last repeats)."""

    def __init__(self, scrapes: list[str], token: str | None = None, status: int = 200,
                 version: str = "0.26.0", profiles: bool = False) -> None:
        self.scrapes, self.token, self.status, self.version = scrapes, token, status, version
        self.profiles = profiles  # answers /start_profile and /stop_profile, as a server with --profiler-config
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, authorization
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _answer(self) -> None:
                stand_in.seen.append((self.command, self.path, self.headers.get("Authorization")))
                if stand_in.token and self.headers.get("Authorization") != f"Bearer {stand_in.token}":
                    return self._send(401, b'{"error": "Unauthorized"}', "application/json")
                if stand_in.status != 200:
                    return self._send(stand_in.status, b"", "text/plain")
                if self.path == "/metrics":
                    n = sum(1 for _, p, _ in stand_in.seen if p == "/metrics") - 1
                    text = stand_in.scrapes[min(n, len(stand_in.scrapes) - 1)]
                    return self._send(200, text.encode(), "text/plain; version=0.0.4")
                if stand_in.profiles and self.command == "POST" and self.path in ("/start_profile", "/stop_profile"):
                    return self._send(200, b"", "text/plain")
                if self.path == "/version":
                    return self._send(200, json.dumps({"version": stand_in.version}).encode(), "application/json")
                if self.path == "/v1/models":
                    body = {"object": "list", "data": [{"id": "/tmp/big", "max_model_len": 2048}]}
                    return self._send(200, json.dumps(body).encode(), "application/json")
                return self._send(404, b"", "text/plain")

            do_GET = do_POST = _answer

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandIn:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeClock:
    """attach's clock and sleep for library calls: a window of minutes watched in no time."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def watched(url: str, out: Path, duration_s: float, interval_s: float) -> Path:
    from profkit.capture.attach import AttachOptions, attach

    fake = FakeClock()
    return attach(AttachOptions(url=url, out=out, duration_s=duration_s, interval_s=interval_s), clock=fake.clock,
                  sleep=fake.sleep)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    capture = unpack(tmp_path_factory, "h200_tp2") / "capture"
    return {name: (capture / f"metrics-{name}.txt").read_text() for name in ("before", "after")}


@pytest.fixture()
def live(recorded: dict[str, str], tmp_path: Path) -> Iterator[tuple[StandIn, Path]]:
    with StandIn([recorded["before"], recorded["before"], recorded["after"], recorded["after"]],
                 token="s3cr3t-token") as server:
        yield server, tmp_path / "live"


def test_attach_writes_a_live_folder_that_report_reads(live: tuple[StandIn, Path]) -> None:
    server, out = live
    r = profkit("attach", server.url, "--duration", "3s", "--interval", "1s", "--every", "1s", "--out", out,
                "--header", "Authorization: Bearer s3cr3t-token")
    assert r.returncode == 0, r.stderr
    assert "attached to" in r.stderr and "vLLM 0.26.0, /tmp/big" in r.stderr
    assert "req/s" in r.stderr and "running" in r.stderr  # the --every lines
    # only reads, at most one a second: 4 scrapes in 3 s, identity once, nothing that changes the server
    assert {m for m, _, _ in server.seen} == {"GET"}
    assert sum(p == "/metrics" for _, p, _ in server.seen) == 4
    assert all(a == "Bearer s3cr3t-token" for _, _, a in server.seen)
    # the credential is sent, never written
    for f in out.iterdir():
        assert "s3cr3t" not in f.read_text(errors="replace"), f.name
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "live" and manifest["status"] == "ok"
    assert manifest["live"] == {"url": server.url, "vllm": "0.26.0", "model": "/tmp/big", "max_model_len": 2048,
                                "authenticated": True}
    lines = (out / "metrics-series.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["t"] >= 3.0
    doc = json.loads(profkit("report", out, "--format", "json").stdout)
    facts = doc["facts"]
    # the recorded counters over the window: the 200 requests of the benchmark between the two scrapes
    assert facts["live.requests"] == 200
    assert facts["live.seconds"] >= 3.0
    assert facts["vllm.preemptions"] == 0
    assert doc["vllm"]["series"]["scrapes"] == 4


def test_endpoints_that_cannot_be_watched_give_one_line(recorded: dict[str, str], tmp_path: Path) -> None:
    with StandIn([recorded["after"]], token="right") as server:
        line = one_error_line(profkit("attach", server.url, "--duration", "1s", "--out", tmp_path / "a"),
                              "401 unauthorized")
        assert "right" not in line
        assert not (tmp_path / "a").exists()
    with StandIn(["# HELP python_info x\n# TYPE python_info gauge\npython_info 1\n"]) as server:
        one_error_line(profkit("attach", server.url, "--duration", "1s", "--out", tmp_path / "b"),
                       "not a vLLM server's metrics")
    with StandIn(["\x00\xff{not prometheus\n" * 10]) as server:
        one_error_line(profkit("attach", server.url, "--duration", "1s", "--out", tmp_path / "c"),
                       "/metrics: not Prometheus text format")
    with StandIn(["vllm:x 1\n" + "#" * (17 << 20)]) as server:
        one_error_line(profkit("attach", server.url, "--duration", "1s", "--out", tmp_path / "d"),
                       "larger than 16 MB")
    with StandIn([recorded["after"]], status=503) as server:
        one_error_line(profkit("attach", server.url, "--duration", "1s", "--out", tmp_path / "e"), "HTTP 503")
    dead = StandIn([""])
    url = dead.url
    dead.server.server_close()
    one_error_line(profkit("attach", url, "--duration", "1s", "--out", tmp_path / "f"), "cannot reach the server")
    one_error_line(profkit("attach", "file:///etc/passwd", "--out", tmp_path / "g"), "not an http(s) URL")
    one_error_line(profkit("attach", "http://user:pw@127.0.0.1:1", "--out", tmp_path / "h"),
                   "credentials in the URL")
    one_error_line(profkit("attach", "http://127.0.0.1:1", "--duration", "5", "--out", tmp_path / "i"),
                   "give a unit")


def test_a_profile_window_needs_a_server_that_profiles(recorded: dict[str, str], tmp_path: Path) -> None:
    with StandIn([recorded["after"]]) as server:  # answers 404 to /start_profile, as vLLM without a profiler config
        line = one_error_line(profkit("attach", server.url, "--duration", "1s", "--profile", "1s", "--out",
                                      tmp_path / "p"), "404 not found")
        assert "--profiler-config" in line
        assert [p for m, p, _ in server.seen if m == "POST"] == ["/start_profile"]
        assert not (tmp_path / "p").exists()


def test_the_live_report_agrees_with_the_benchmark_of_the_same_load(recorded: dict[str, str], tmp_path: Path,
                                                                    tp2_bench: dict) -> None:
    """The recorded scrapes bracket 200 requests that `vllm bench serve` measured from the client's side over
    9.58 s; watched for 10 s, the server's own counters and histograms give the same load and latencies: the mix
    exactly, the rate within the window's slack, TPOT and inter-token latency within 1 %, TTFT within 10 % (the
    client's TTFT adds HTTP and tokenising)."""
    with StandIn([recorded["before"], recorded["after"], recorded["after"]]) as server:
        watched(server.url, tmp_path / "w", 10.0, 5.0)
    doc = json.loads(profkit("report", tmp_path / "w", "--format", "json").stdout)
    live, facts = doc["vllm"]["live"], doc["facts"]
    assert live["requests"] == tp2_bench["completed"] == 200
    assert live["prompt_tokens_per_request"] == tp2_bench["total_input_tokens"] / 200
    assert live["output_tokens_per_request"] == tp2_bench["total_output_tokens"] / 200
    assert facts["vllm.requests_per_second"] == pytest.approx(tp2_bench["request_throughput"], rel=0.1)
    assert live["tpot_ms"]["mean"] == pytest.approx(tp2_bench["mean_tpot_ms"], rel=0.01)
    assert live["itl_ms"]["mean"] == pytest.approx(tp2_bench["mean_itl_ms"], rel=0.01)
    assert live["ttft_ms"]["mean"] == pytest.approx(tp2_bench["mean_ttft_ms"], rel=0.1)
    # a percentile from buckets lies within the bucket holding the client's own
    assert live["ttft_ms"]["p50"] == pytest.approx(tp2_bench["median_ttft_ms"], rel=0.15)
    text = profkit("report", tmp_path / "w").stdout
    assert "live window 10 s: 200 requests finished" in text and "vLLM's histograms" in text


@pytest.fixture(scope="module")
def tp2_bench(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return json.loads((unpack(tmp_path_factory, "h200_tp2") / "capture" / "bench.json").read_text())


def test_histogram_quantiles_follow_prometheus() -> None:
    """histogram_quantile by hand: linear inside the bucket holding the rank; the +Inf bucket gives the highest
    finite bound."""
    from profkit.analysis.vllm import quantile

    buckets = [(0.1, 10.0), (0.5, 30.0), (float("inf"), 40.0)]
    assert quantile(buckets, 0.5) == pytest.approx(0.1 + 0.4 * (20 - 10) / 20)
    assert quantile(buckets, 0.25) == pytest.approx(0.1 * 10 / 10)
    assert quantile(buckets, 0.99) == 0.5
    assert quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_diff_of_two_live_folders_compares_the_servers_figures(recorded: dict[str, str], tmp_path: Path) -> None:
    """Before and after a deploy: two attach windows compared on the rate and latencies the server reported."""
    for name, scrapes in (("busy", [recorded["before"], recorded["after"], recorded["after"]]),
                          ("idle", [recorded["after"]])):
        with StandIn(scrapes) as server:
            watched(server.url, tmp_path / name, 2.0, 1.0)
    doc = json.loads(profkit("diff", tmp_path / "busy", tmp_path / "idle", "--format", "json").stdout)
    rows = {m["name"]: m for m in doc["metrics"]}
    assert rows["request_throughput"]["before"] == pytest.approx(100.0, rel=0.05)  # 200 requests in 2 s
    assert rows["request_throughput"]["after"] == 0.0 and rows["request_throughput"]["verdict"] == "worse"
    idle = json.loads(profkit("report", tmp_path / "idle", "--format", "json").stdout)
    assert "live-window-quiet" in {f["rule"] for f in idle["findings"]}


def test_a_profile_window_is_taken_only_when_asked(recorded: dict[str, str], tmp_path: Path) -> None:
    with StandIn([recorded["after"]], profiles=True) as server:
        r = profkit("attach", server.url, "--duration", "1s", "--profile", "1s", "--out", tmp_path / "p")
        assert r.returncode == 0, r.stderr
        assert [p for m, p, _ in server.seen if m == "POST"] == ["/start_profile", "/stop_profile"]
        notes = json.loads((tmp_path / "p" / "manifest.json").read_text())["notes"]
        assert any("profile window" in n for n in notes)
        r = profkit("attach", server.url, "--duration", "1s", "--out", tmp_path / "q")
        assert [p for m, p, _ in server.seen if m == "POST"] == ["/start_profile", "/stop_profile"]  # none more


def test_a_broken_metrics_series_names_the_file(recorded: dict[str, str], tmp_path: Path) -> None:
    """A live folder's series is the user's evidence too: not JSON, not a scrape, time going back, or a line longer
    than any scrape each give one line naming the file and the line."""
    with StandIn([recorded["before"], recorded["after"]]) as server:
        watched(server.url, tmp_path / "w", 2.0, 1.0)
    series = tmp_path / "w" / "metrics-series.jsonl"
    good = series.read_text().splitlines()
    for lines, needle in (([good[0], "{not json"], "line 2: not JSON"),
                          ([good[0], '{"values": 3}'], "line 2: not a scrape"),
                          ([good[1], good[0]], "line 2: its time is missing or goes back"),
                          ([good[0], '{"t": 1, "values": {"vllm:x": 1}, "pad": "' + "x" * (1 << 20) + '"}'],
                           "line 2: more than a metrics series holds")):
        series.write_text("\n".join(lines) + "\n")
        before = series.read_bytes()
        one_error_line(profkit("report", tmp_path / "w"), f"metrics-series.jsonl: {needle}")
        assert series.read_bytes() == before  # read, never written


def test_an_interval_below_the_least_is_said(recorded: dict[str, str], tmp_path: Path) -> None:
    """--interval 0.5s was raised to 1 s without a word."""
    from profkit.capture.attach import AttachOptions, attach

    said: list[str] = []
    fake = FakeClock()
    with StandIn([recorded["before"], recorded["after"], recorded["after"]]) as server:
        attach(AttachOptions(url=server.url, out=tmp_path / "w", duration_s=2.0, interval_s=0.5), say=said.append,
               clock=fake.clock, sleep=fake.sleep)
    assert said[0] == ("--interval 0.5 s: scraping every 1 s, the least (a scrape renders every series on the "
                       "server's event loop)")
