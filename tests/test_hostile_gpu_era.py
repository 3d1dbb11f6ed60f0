"""Hostile input of the GPU era (issue 40): model configs, step annotations, GPU rows, host samples, odd numbers.

Every case is a real recording with one thing made wrong: the profiled 14B-shape H100 run (tests/data/h100_phases),
its model config, host samples, bench result and server log. Each case asserts the exit (one error line, never
the internal error's 70) or, where the report goes on, that no impossible figure is printed and one line says
which input is inconsistent."""

from __future__ import annotations

import json
import math
import re
import shutil
import sqlite3
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profkit.analysis.efficiency import efficiency_section
from profkit.evidence.model_config import parse_model_config
from profkit.numbers import parse_float, parse_int
from tests.cli import one_error_line, profkit

DATA = Path(__file__).parent / "data"
EXAMPLES = int(__import__("os").environ.get("PROFKIT_FUZZ_EXAMPLES", "60"))


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("phases")
    with tarfile.open(DATA / "h100_phases" / "bf16.tar.xz") as tar:
        tar.extractall(out, filter="data")
    return out / "bf16"


def _edited(src: Path, dst: Path, edit) -> Path:
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data))
    return dst


# ---------------------------------------------------------------------------------------------- numbers as text

@pytest.mark.parametrize(("text", "value"), [("253,392", 253392), ("12", 12), (" 7 ", 7), ("1,2,,3", None),
                                             ("1,2345", None), ("9" * 41, None), ("٣", None), ("", None),
                                             ("12a", None), ("-3", -3)])
def test_parse_int(text: str, value: int | None) -> None:
    assert parse_int(text) == value


@pytest.mark.parametrize(("text", "value"), [("12.5", 12.5), ("1,024.0", 1024.0), ("3e9", 3e9), ("...", None),
                                             ("..", None), ("1..2", None), ("nan", None), ("inf", None),
                                             ("1e999", None), ("1.2.3", None), (".5", 0.5)])
def test_parse_float(text: str, value: float | None) -> None:
    assert parse_float(text) == value


@settings(max_examples=EXAMPLES * 10, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789,.eE+- x٣"), max_size=120))
def test_text_never_raises_as_a_number(text: str) -> None:
    i, f = parse_int(text), parse_float(text)
    assert i is None or isinstance(i, int)
    assert f is None or math.isfinite(f)


# ------------------------------------------------------------------------------------- JSON past Python's limits

HUGE = "9" * 5000


def test_a_5000_digit_integer_is_no_number_wherever_it_stands(bf16: Path, tmp_path: Path) -> None:
    """Python's int() raises past 4,300 digits; the one JSON reader reads such a literal as an infinity, which
    each reader's own check leaves out (a model size: one line naming the key; a benchmark figure or a host
    sample: left out, the rest used)."""
    config = (bf16 / "model-config.json").read_text().replace('"hidden_size": 5120', f'"hidden_size": {HUGE}')
    (tmp_path / "config.json").write_text(config)
    one_error_line(profkit("report", bf16, "--model-config", tmp_path / "config.json"), "hidden_size is inf")
    bench = json.loads((bf16 / "bench.json").read_text())
    text = json.dumps(bench).replace('"duration": ', f'"extra": {HUGE}, "duration": ')
    (tmp_path / "bench.json").write_text(text.replace('"completed": 300', f'"completed": {HUGE}'))
    r = profkit("report", "--bench", tmp_path / "bench.json", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["vllm"]["bench"]["requests_per_second"] == bench["request_throughput"]
    host = (bf16 / "host.json").read_text().replace('"cores": 16', f'"cores": {HUGE}')
    (tmp_path / "host.json").write_text(host)
    r = profkit("report", "--host", tmp_path / "host.json", "--bench", bf16 / "bench.json", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["facts"]["host.cores"] is None


# ------------------------------------------------------------------------------------------- vLLM log numbers

@pytest.mark.parametrize("odd", ["9" * 5000, "1,2,,3", "..", "...", "1..2", "٢٥٣"])
def test_odd_numbers_in_the_log_leave_the_fact_unknown(bf16: Path, tmp_path: Path, odd: str) -> None:
    log = (bf16 / "server.log").read_text()
    assert "GPU KV cache size: 253,392 tokens" in log and "Maximum concurrency for 2,048 tokens per request:" in log
    log = log.replace("GPU KV cache size: 253,392 tokens", f"GPU KV cache size: {odd} tokens")
    log = re.sub(r"(Maximum concurrency for 2,048 tokens per request: )[0-9.]+x", rf"\g<1>{odd}x", log)
    log = re.sub(r"Avg prompt throughput: [0-9.]+", f"Avg prompt throughput: {odd}", log)
    (tmp_path / "server.log").write_text(log)
    r = profkit("report", "--vllm-log", tmp_path / "server.log", "--bench", bf16 / "bench.json", "--format", "json")
    assert r.returncode == 0, r.stderr
    vllm = json.loads(r.stdout)["facts"]
    assert vllm["vllm.kv_cache_tokens"] is None
    good = json.loads(profkit("report", "--vllm-log", bf16 / "server.log", "--format", "json").stdout)["facts"]
    assert good["vllm.kv_cache_tokens"] == 253392


# ---------------------------------------------------------------------------------------------- model configs

@pytest.mark.parametrize(("edit", "needle"), [
    (lambda c: c.update(num_attention_heads="40"), "num_attention_heads is '40', not an integer"),
    (lambda c: c.update(num_attention_heads=True), "num_attention_heads is True, not an integer"),
    (lambda c: c.update(num_key_value_heads=80), "80 KV heads do not divide 40 attention heads"),
    (lambda c: c.update(num_key_value_heads=7), "7 KV heads do not divide 40 attention heads"),
    (lambda c: c.update(hidden_size=5120 * 10**6), "hidden_size = 5120000000 is not a plausible model size"),
    (lambda c: c.update(num_hidden_layers=-48), "num_hidden_layers = -48 is not a plausible model size"),
    (lambda c: c.update(vocab_size=32000.0), "vocab_size is 32000.0, not an integer"),
    (lambda c: c.update(intermediate_size=[13824]), "intermediate_size is [13824], not an integer"),
])
def test_an_implausible_model_shape_is_one_line_naming_the_field(bf16: Path, tmp_path: Path, edit, needle) -> None:
    bad = _edited(bf16 / "model-config.json", tmp_path / "config.json", edit)
    one_error_line(profkit("report", bf16, "--model-config", bad), needle)


def test_a_head_count_as_text_is_not_replaced_by_another_key(bf16: Path) -> None:
    """The old reader skipped a string `num_attention_heads` and took `n_head` (here 8) silently."""
    cfg = json.loads((bf16 / "model-config.json").read_text())
    cfg.update(num_attention_heads="40", n_head=8)
    with pytest.raises(Exception, match="num_attention_heads is '40'"):
        parse_model_config(cfg, "config.json")


# ------------------------------------------------------------------------------------------------ host samples

@pytest.mark.parametrize("pid", [float("nan"), list(range(20_000)), -1, 0, "894", True, 2**40])
def test_a_host_process_without_a_real_pid_is_left_out(bf16: Path, tmp_path: Path, pid) -> None:
    host = json.loads((bf16 / "host.json").read_text())
    victim = host["processes"][1]
    host["processes"][1] = {**victim, "pid": pid}
    (tmp_path / "host.json").write_text(json.dumps(host, allow_nan=True))
    r = profkit("report", "--host", tmp_path / "host.json", "--bench", bf16 / "bench.json", "--format", "json")
    assert r.returncode == 0, r.stderr
    processes = json.loads(r.stdout)["host"]["processes"]
    assert all(isinstance(p["pid"], int) and p["pid"] > 0 for p in processes)
    assert len(processes) == len([p for p in host["processes"] if p.get("role")]) - 1
    text = profkit("report", "--host", tmp_path / "host.json", "--bench", bf16 / "bench.json").stdout
    assert "nan" not in text.split() and len(text) < 50_000


# ------------------------------------------------------------------------------------ trace text in the charts

def test_kernel_names_that_look_like_tex_stay_text_in_the_charts(sqlite_path, tmp_path: Path) -> None:
    trace = tmp_path / "math.sqlite"
    shutil.copy(sqlite_path("eager_b1"), trace)
    with sqlite3.connect(trace) as conn:
        conn.execute("UPDATE StringIds SET value = '$x^' || value || '$' "
                     "WHERE id IN (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    r = profkit("report", trace, "--format", "html")
    assert r.returncode == 0, r.stderr
    assert "$x^" in r.stdout


# ---------------------------------------------------------------------------------------- physics as the bound

SHARES = ("mfu", "mbu")
AMOUNTS = ("flops", "bytes", "tflops", "tbs", "seconds", "attention_pairs")


def _estimates(eff: dict) -> list[dict]:
    rows = [eff.get("vllm_counters"), eff.get("model_shape"), *((eff.get("phases") or {}).get("rows") or [])]
    return [r for r in rows if r]


def assert_physical(eff: dict | None) -> None:
    """Every share of a peak within 0..1 and no amount negative, in the section every format renders."""
    for est in _estimates(eff or {}):
        for key in SHARES:
            assert est.get(key) is None or 0 <= est[key] <= 1, (key, est.get(key))
        for key in AMOUNTS:
            assert est.get(key) is None or est[key] >= 0, (key, est.get(key))
        for value in (est.get("parts") or {}).values():
            assert value is None or value >= 0


def test_a_model_too_big_for_the_run_withholds_mfu_and_says_why(bf16: Path, tmp_path: Path) -> None:
    """A 100x wider model than the one served: every shape-based figure would exceed the H100's peaks."""
    big = _edited(bf16 / "model-config.json", tmp_path / "config.json",
                  lambda c: c.update(hidden_size=c["hidden_size"] * 100,
                                     intermediate_size=c["intermediate_size"] * 100))
    doc = json.loads(profkit("report", bf16, "--model-config", big, "--format", "json").stdout)
    eff = doc["efficiency"]
    assert_physical(eff)
    assert eff["model_shape"]["mfu"] is None and eff["model_shape"]["tflops"] is None
    assert any(w.startswith("the model's shape: MFU and MBU") for w in eff["withheld"])
    assert doc["facts"]["efficiency.prefill_mfu"] is None
    for fmt in ("text", "md", "html"):
        out = profkit("report", bf16, "--model-config", big, "--format", fmt).stdout
        assert "Withheld: the model" in out.replace("&#39;", "'")
        assert not re.search(r"\b\d{4,}(?:,\d{3})*\.\d%", out)  # no MFU of thousands of percent
    # the real config: nothing withheld
    good = json.loads(profkit("report", bf16, "--format", "json").stdout)["efficiency"]
    assert "withheld" not in good and good["phases"]["rows"][0]["mfu"] > 0.3


@pytest.mark.parametrize("bandwidth", [1.1e10, 1.2e10, 5e14])
def test_an_export_bandwidth_no_gpu_has_is_not_used(bf16: Path, bandwidth: float) -> None:
    shape = parse_model_config(json.loads((bf16 / "model-config.json").read_text()), "config.json")
    eff = efficiency_section("NVIDIA Unknown GPU", shape, {}, {}, 10.0, 100, export_bandwidth=bandwidth)
    assert eff["gpu"].get("bandwidth_tbs") is None
    assert any("outside any GPU's" in w for w in eff["withheld"])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head_dim=st.integers(1, 1024), layers=st.integers(1, 10_000), heads=st.sampled_from([1, 2, 8, 40, 64]),
       group=st.sampled_from([1, 2, 4, 8]), counters=st.lists(st.floats(-1e20, 1e22), min_size=6, max_size=6),
       seconds=st.floats(1e-9, 1e4), bandwidth=st.one_of(st.none(), st.floats(-1e15, 1e15)))
def test_every_efficiency_figure_is_physical_or_withheld(head_dim, layers, heads, group, counters, seconds,
                                                         bandwidth) -> None:
    hidden, kv_heads = heads * head_dim, heads // group if heads % group == 0 else heads
    shape = parse_model_config({"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                                "num_key_value_heads": kv_heads, "intermediate_size": 4 * hidden,
                                "vocab_size": 32000, "torch_dtype": "bfloat16"}, "config.json")
    names = ["flops", "read_bytes", "write_bytes"]
    delta = {f"vllm:estimated_{n}_per_gpu_total": v for n, v in zip(names, counters[:3], strict=True)}
    delta.update({"vllm:iteration_tokens_total_count": abs(counters[3]), "vllm:prompt_tokens_total": counters[4],
                  "vllm:generation_tokens_total": abs(counters[5]), "vllm:request_success_total": 10.0})
    eff = efficiency_section("NVIDIA H100 80GB HBM3", shape, {}, delta, seconds, 10, export_bandwidth=bandwidth)
    assert_physical(eff)
    # and as every format prints it: no share of a peak above 100 %
    from profkit.render.sections import efficiency

    view = efficiency.view({"efficiency": eff}, 10)
    printed = "\n".join(efficiency.text(view)) if view else ""
    view = view or {"estimates": []}
    shares = [float(x.rstrip("%").replace(",", "")) for e in view["estimates"] for x in (e["mfu"], e["mbu"])
              if x not in ("-", None)]
    assert all(0 <= v <= 100 for v in shares), (shares, printed)


@pytest.mark.parametrize("how", ["absent", "null"])
def test_a_torch_trace_without_durations_renders_in_every_format(tmp_path: Path, how: str) -> None:
    """No kernel time at all: shares of it are unknown (None), and the charts say "-" instead of multiplying."""
    import gzip

    from tests.conftest import FIXTURES

    doc = json.loads(gzip.decompress((FIXTURES / "h100_toy" / "torch_eager_b1.json.gz").read_bytes()))
    for e in doc["traceEvents"]:
        if "dur" in e:
            del e["dur"]
            if how == "null":
                e["dur"] = None
    trace = tmp_path / "nodur.json.gz"
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for fmt in ("text", "md", "json", "html"):
        r = profkit("report", trace, "--format", fmt)
        assert r.returncode == 0, r.stderr
    assert json.loads(profkit("report", trace, "--format", "json").stdout)["gpu"]["busy_ns"] == 0


# ---------------------------------------------------------------------------------- rule files of another shape

RULE = Path(__file__).parent.parent / "rules" / "batch-cap.yaml"


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda r: r.update({1: "x", "zz": 2}), "unknown key(s) [1, 'zz']"),
    (lambda r: r.update(evidence=[{"fact": {"a": 1}}]), "evidence: fact is a fact's name"),
    (lambda r: r.update(evidence=[{"fact": "vllm.waiting_max", "threshold": [1, 2]}]), "threshold and source are"),
    (lambda r: r.update(evidence={"fact": "vllm.waiting_max"}), "evidence must be a list"),
    (lambda r: r.update(evidence=[["vllm.waiting_max"]]), "evidence items are {fact, threshold, source}"),
    (lambda r: r.update(changes=[{"flag": "--max-num-seqs", "to": {"a": 1}, "why": "x"}]), "changes.to is a value"),
    (lambda r: r.update(changes=[{"flag": "--max-num-seqs", "to": [1], "why": "x"}]), "changes.to is a value"),
    (lambda r: r.update(id=[1, 2]), "id must be a text"),
])
def test_a_rule_file_of_another_shape_is_one_line(sqlite_path, tmp_path: Path, edit, needle: str) -> None:
    import yaml

    rule = yaml.safe_load(RULE.read_text())
    edit(rule)
    (tmp_path / "rule.yaml").write_text(yaml.safe_dump(rule))
    one_error_line(profkit("report", sqlite_path("eager_b1"), "--rules", tmp_path), needle)


# ------------------------------------------------------------------------- settings of the wrong type, given

@pytest.mark.parametrize("args", ["--max-num-seqs abc --gpu-memory-utilization high --enforce-eager=maybe",
                                  "--max-num-seqs= --max-model-len=", "--max-num-seqs nan --gpu-memory-utilization inf",
                                  "--max-num-seqs " + "9" * 5000])
def test_settings_that_are_not_numbers_are_no_values(bf16: Path, args: str) -> None:
    r = profkit("report", "--vllm-log", bf16 / "server.log", "--bench", bf16 / "bench.json", "--vllm-args",
                f"vllm serve /m {args}", "--format", "json")
    assert r.returncode == 0, r.stderr
    config = json.loads(r.stdout)["vllm"]["config"]
    assert config["max_num_seqs"]["value"] is None
    assert "is not a number (vLLM would refuse it)" in config["max_num_seqs"]["source"]
    for fmt in ("text", "md", "html"):
        assert profkit("report", "--vllm-log", bf16 / "server.log", "--vllm-args", f"vllm serve /m {args}",
                       "--format", fmt).returncode == 0


# ------------------------------------------------------------------------------- the export's own description

@pytest.mark.parametrize("sql", [
    "DROP TABLE TARGET_INFO_SESSION_START_TIME; CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER);"
    " INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1);",
    "ALTER TABLE TARGET_INFO_SYSTEM_ENV DROP COLUMN value;",
    "ALTER TABLE META_DATA_CAPTURE RENAME COLUMN name TO nm;",
    "ALTER TABLE META_DATA_EXPORT RENAME COLUMN value TO v;",
    "ALTER TABLE TARGET_INFO_GPU DROP COLUMN name;",
    "UPDATE TARGET_INFO_SYSTEM_ENV SET value = '" + "9" * 5000 + "' WHERE name = 'CudaDriverVersion';",
    "UPDATE TARGET_INFO_SYSTEM_ENV SET value = '١٢٠٠٠' WHERE name = 'CudaDriverVersion';",
    "UPDATE TARGET_INFO_SYSTEM_ENV SET value = x'00ff' WHERE name = 'CudaDriverVersion';",
])
def test_metadata_of_another_shape_leaves_it_unknown(sqlite_path, tmp_path: Path, sql: str) -> None:
    """Metadata is optional: a meta table missing a column, or a driver version that is no number, leaves that
    piece unknown; the report is the same otherwise."""
    trace = tmp_path / "meta.sqlite"
    shutil.copy(sqlite_path("eager_b1"), trace)
    with sqlite3.connect(trace) as conn:
        conn.executescript(sql)
    r = profkit("report", trace, "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["gpu"]["busy_ns"] == json.loads(profkit("report", sqlite_path("eager_b1"), "--format",
                                                       "json").stdout)["gpu"]["busy_ns"]
    assert doc["source"].get("cuda_driver") in (None, "13.0")


def test_the_gpu_is_the_one_that_ran_the_kernels(sqlite_path, tmp_path: Path, bf16: Path) -> None:
    """A TARGET_INFO_GPU row for a device that ran no kernel, listed first, with a bandwidth no GPU has: the report
    names the H100 that ran the kernels and takes its bandwidth."""
    folder = tmp_path / "run"
    shutil.copytree(bf16, folder)
    with sqlite3.connect(folder / "trace.sqlite") as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(TARGET_INFO_GPU)")]
        row = dict(zip(cols, conn.execute("SELECT * FROM TARGET_INFO_GPU").fetchone(), strict=True))
        row.update(id=-1, name="Idle GPU", memoryBandwidth=11_000_000_000)
        conn.execute(f"INSERT INTO TARGET_INFO_GPU ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     list(row.values()))
    doc = json.loads(profkit("report", folder, "--format", "json").stdout)
    assert doc["source"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert doc["efficiency"]["gpu"]["bandwidth_tbs"] == 3.35 and "withheld" not in doc["efficiency"]


# ------------------------------------------------------------------------------------------ outputs and options

@pytest.mark.parametrize("top", ["0", "-99999999999"])
def test_a_top_of_no_rows_is_one_line(sqlite_path, top: str) -> None:
    one_error_line(profkit("report", sqlite_path("eager_b1"), "--top", top), "--top")


@pytest.mark.parametrize("where", ["/proc/profkit-report.txt", "/sys/profkit-report.txt"])
def test_an_output_that_cannot_be_written_is_one_line(sqlite_path, where: str) -> None:
    one_error_line(profkit("report", sqlite_path("eager_b1"), "-o", where), f"{where}: cannot write there")


# ------------------------------------------------------------------------------------------ step annotations

def _annotated(bf16: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(bf16, folder)
    with sqlite3.connect(folder / "trace.sqlite") as conn:
        edit(conn)
    return folder


def _duplicate(conn: sqlite3.Connection) -> None:
    cols = ", ".join(r[1] for r in conn.execute("PRAGMA table_info(NVTX_EVENTS)"))
    conn.execute(f"INSERT INTO NVTX_EVENTS ({cols}) SELECT {cols} FROM NVTX_EVENTS")


def _short_context(conn: sqlite3.Connection) -> None:
    def short(v: str | None) -> str | None:
        return re.sub(r"context_(\d+)\(sq(\d+)sk(\d+)", lambda m: f"context_{m[1]}(sq{m[2]}sk1", v) if v else v
    for table, key, col in (("StringIds", "id", "value"), ("NVTX_EVENTS", "rowid", "text")):
        for k, v in conn.execute(f"SELECT {key}, {col} FROM {table} WHERE {col} LIKE '%context_%'").fetchall():
            conn.execute(f"UPDATE {table} SET {col} = ? WHERE {key} = ?", (short(v), k))


def _one_instant(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE NVTX_EVENTS SET start = 22416592912, end = 22416592913 WHERE text LIKE 'execute_%' "
                 "OR textId IN (SELECT id FROM StringIds WHERE value LIKE 'execute_%')")


@pytest.mark.parametrize(("edit", "said"), [(_duplicate, "annotations written twice in one process"),
                                            (_short_context, "annotations with a context shorter than its query"),
                                            (_one_instant, None)])
def test_step_annotations_that_cannot_be_vllms_are_left_out_or_withheld(bf16: Path, tmp_path: Path, edit,
                                                                         said: str | None) -> None:
    folder = _annotated(bf16, tmp_path, edit)
    doc = json.loads(profkit("report", folder, "--format", "json").stdout)
    assert_physical(doc["efficiency"])
    if said is not None:
        assert doc["steps"]["dropped"][said] > 0
    else:
        assert doc["efficiency"]["withheld"]  # steps of ~1 ns: the rates past the peak are withheld, not printed
    for fmt in ("text", "md", "html"):
        out = profkit("report", folder, "--format", fmt)
        assert out.returncode == 0, out.stderr
        assert ("Left out" if fmt != "text" else "left out") in out.stdout if said else "Withheld" in out.stdout
        assert not re.search(r"\b\d{4,}(?:,\d{3})*\.\d%", out.stdout)
    real = json.loads(profkit("report", bf16, "--format", "json").stdout)
    assert "dropped" not in real["steps"]
