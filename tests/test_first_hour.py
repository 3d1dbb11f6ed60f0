"""A new user's first hour (issue 48), each item through the CLI on the bundled real runs: durations in minutes, the
format an output file's name asks for, the same words in every format (a regression marked, a flag's value, which
window a count covers, which command was checked), metric names spelled once, the offline benchmark modelled, the
GPU named by hand, and the last hostile inputs (an export's bandwidth of 0, host samples without a pid)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import sqlite3
import sys
import tarfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from tests.cli import one_error_line, profkit

REPO = Path(__file__).resolve().parent.parent
KV_BOUND, PRESCRIBED = REPO / "samples" / "vllm_14b_kv_bound", REPO / "samples" / "vllm_14b_prescribed"
THROUGHPUT = REPO / "samples" / "capture_thr_torch"  # `vllm bench throughput` under torch.profiler, 1.1B, H100
# The 1.1B that capture_thr_torch served: the shape shared/gpu's make_model.py writes (hidden 2048, 16 layers).
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def _ok(*args: object) -> str:
    r = profkit(*args)
    assert r.returncode == 0, r.stderr
    return r.stdout


# --- 2. every output goes where it is asked --------------------------------------------------------------------

def test_durations_take_minutes_and_a_bare_number_names_the_spelling_that_works(sqlite_path, tmp_path: Path) -> None:
    r = profkit("attach", "http://127.0.0.1:1", "--duration", "2min", "--out", tmp_path / "a")
    one_error_line(r, "cannot reach the server")  # the duration was taken; the server is not there
    line = one_error_line(profkit("attach", "http://127.0.0.1:1", "--duration", "8", "--out", tmp_path / "b"),
                          "--duration")
    assert "e.g. 8s" in line and "min" in line
    minute = json.loads(_ok("report", sqlite_path("eager_b1"), "--gap-threshold", "0.001min", "--format", "json"))
    ms = json.loads(_ok("report", sqlite_path("eager_b1"), "--gap-threshold", "60ms", "--format", "json"))
    assert minute["gaps"] == ms["gaps"]


@pytest.mark.parametrize(("name", "marker"), [("r.html", "<!doctype html>"), ("r.md", "## profkit"),
                                              ("r.json", '"schema": "profkit.report/1"'),
                                              ("r.txt", "profkit report:"), ("r.out", "profkit report:")])
def test_the_output_files_extension_picks_the_format(tmp_path: Path, name: str, marker: str) -> None:
    _ok("report", KV_BOUND, "-o", tmp_path / name)
    assert (tmp_path / name).read_text().lstrip().startswith(marker) or marker in (tmp_path / name).read_text()[:400]


def test_a_format_that_disagrees_with_the_extension_is_one_line(tmp_path: Path) -> None:
    for cmd in (["report", KV_BOUND], ["diff", KV_BOUND, PRESCRIBED], ["predict", KV_BOUND, "--search"]):
        line = one_error_line(profkit(*cmd, "--format", "md", "-o", tmp_path / "x.html"), "--format md")
        assert ".html" in line and not (tmp_path / "x.html").exists()
    _ok("predict", KV_BOUND, "-o", tmp_path / "p.json", "--", "--kv-cache-dtype", "fp8")
    assert json.loads((tmp_path / "p.json").read_text())["schema"] == "profkit.prediction/1"
    _ok("diff", KV_BOUND, PRESCRIBED, "-o", tmp_path / "d.html")
    assert (tmp_path / "d.html").read_text().startswith("<!doctype html>")


# --- 3. the formats and the words agree --------------------------------------------------------------------------

def test_a_predicted_regression_is_marked_in_every_format() -> None:
    """The prescription's TPOT rises 56 %: WORSE, as diff marks a measured rise of the same metric."""
    text = _ok("report", KV_BOUND)
    row = next(line for line in text.splitlines() if line.strip().startswith("mean TPOT (ms)"))
    assert row.rstrip().endswith("WORSE")
    assert next(line for line in text.splitlines() if line.strip().startswith("requests/s")).rstrip().endswith(
        "better")
    md = _ok("report", KV_BOUND, "--format", "md")
    assert re.search(r"\| mean TPOT \(ms\) \|[^\n]*\+\d+% WORSE \|", md)
    html = _ok("report", KV_BOUND, "--format", "html")
    assert re.search(r"<td>mean TPOT \(ms\)</td>.*?\+\d+% WORSE</td>", html)
    diff = _ok("diff", KV_BOUND, PRESCRIBED)
    assert re.search(r"mean_tpot_ms \+\d+ % \(WORSE\)", diff) and re.search(r"mean_tpot_ms .* WORSE\n", diff)


def test_a_flags_value_reads_the_same_in_findings_prescription_and_diff() -> None:
    text = _ok("report", KV_BOUND)
    lead = text[text.index("Prescription"):text.index("Findings")]
    assert "--kv-cache-dtype auto (vLLM 0.26 default) -> fp8" in lead
    assert "--quantization not set (vLLM 0.26 default) -> fp8" in lead
    assert "--kv-cache-dtype: auto (vLLM 0.26 default) -> fp8" in text[text.index("Findings"):]
    diff = _ok("diff", KV_BOUND, PRESCRIBED)
    assert "--kv-cache-dtype: auto (vLLM 0.26 default) -> fp8" in diff
    assert "--quantization not set (vLLM 0.26 default) -> fp8" in diff  # the verdict line
    md = _ok("diff", KV_BOUND, PRESCRIBED, "--format", "md")
    assert "| `--kv-cache-dtype` | auto (vLLM 0.26 default) | fp8 |" in md


def test_a_finding_does_not_contradict_the_prescription() -> None:
    """The run held memory back (--gpu-memory-utilization 0.6), and the prescription raises it: kv-capacity-bound
    says that memory moves the limit too, not that more memory moves it little."""
    doc = json.loads(_ok("report", KV_BOUND, "--format", "json"))
    memory = next(c for c in doc["prescription"]["changes"] if c["flag"] == "--gpu-memory-utilization")
    assert memory["from"] == 0.6 and memory["to"] is None  # the flag removed: vLLM's default share
    summary = next(f["summary"] for f in doc["findings"] if f["rule"] == "kv-capacity-bound")
    assert "moves it little" not in summary and "--gpu-memory-utilization 0.6" in summary
    # a run at vLLM's default memory share keeps the sentence (the GPU-bound fp8 run of h100_phases is not capped,
    # so the rule's own text is checked through `rules explain`)
    assert "Past vLLM 0.26's default" in _ok("rules", "explain", "kv-capacity-bound")


def test_each_count_says_its_window_and_each_check_its_command() -> None:
    text = _ok("report", KV_BOUND)
    assert "preemptions 84 (vLLM's counter over the benchmark)" in text
    assert "preemptions in the simulated run 81 → 0 (vLLM counted 84 in the run)" in text
    assert "preemptions 84 (vLLM's counter over the benchmark)" in _ok("report", KV_BOUND, "--format", "md")
    checks = [line for line in text.splitlines() if line.strip().startswith("checked ")]
    assert [c.split(" with ")[0].strip() for c in checks] == ["checked vllm serve", "checked vllm bench serve"]
    md = _ok("report", KV_BOUND, "--format", "md")
    assert "Checked vllm serve with" in md and "Checked vllm bench serve with" in md
    # the benchmark's client is as it was: said once, not as a before and an identical after
    bench = next(line for line in text.splitlines() if "vllm bench serve --backend" in line)
    assert bench.startswith("  as is:  vllm bench serve") and text.count("vllm bench serve --backend") == 1
    assert "\n  vllm bench serve --backend vllm" in md and "+ vllm bench serve" not in md


def test_the_nvtx_table_keeps_its_styles_in_text_and_markdown() -> None:
    """The torch capture's engine steps are NVTX-like ranges on the GPU and the host: two rows per kind of step,
    told apart by their style, in text and Markdown alike; the step view says it counts steps that overlap."""
    text = _ok("report", THROUGHPUT)
    table = text[text.index("NVTX ranges"):]
    rows = [line.split() for line in table.splitlines()[2:] if "engine steps, decode only" in line]
    assert sorted(r[r.index("(execute_*_context_0_generation_*)") + 1] for r in rows) == ["CPU", "GPU"]
    assert "counted where each range starts" in table and "each step that overlaps the window" in text
    md = _ok("report", THROUGHPUT, "--format", "md")
    assert "### NVTX ranges" in md and re.search(r"decode only \(execute[^|]*\) \| GPU \| 31 \|", md)


def test_metric_names_are_vllms_everywhere_and_the_others_are_aliases() -> None:
    help_text = _ok("predict", "--help")
    assert "mean_ttft_ms" in help_text and "ttft_mean_ms" not in help_text
    doc = json.loads(_ok("predict", KV_BOUND, "--format", "json", "--", "--kv-cache-dtype", "fp8"))
    assert set(doc["metrics"]) == {"request_throughput", "output_throughput", "mean_ttft_ms", "mean_tpot_ms"}
    pred = json.loads(_ok("report", KV_BOUND, "--format", "json"))["prescription"]["predicted"]
    assert {"mean_ttft_ms", "mean_tpot_ms"} <= set(pred) and "ttft_mean_ms" not in pred
    canonical = _ok("predict", KV_BOUND, "--search", "--slo", "mean_ttft_ms<=9000", "--format", "json")
    alias = _ok("predict", KV_BOUND, "--search", "--slo", "ttft_mean_ms<=9000", "--format", "json")
    assert canonical == alias
    gate = profkit("diff", KV_BOUND, PRESCRIBED, "--fail-on", "ttft_mean_ms<-50%")  # TTFT fell 63 %: it fails
    assert gate.returncode == 3 and "gate failed" in gate.stderr and "-62.5 %" in gate.stderr


# --- 4. evidence the model reads --------------------------------------------------------------------------------

def test_an_offline_throughput_run_is_modelled(tmp_path: Path) -> None:
    """`vllm bench throughput` writes only total tokens: the command's random lengths split them (32 x (512 + 32) =
    17,408, the JSON's total_num_tokens). Without the model's config the one missing thing is named."""
    line = one_error_line(profkit("predict", THROUGHPUT, "--", "--max-num-seqs", "16"), "cannot model this run")
    assert "the model's shape or precision is unknown" in line
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY))
    doc = json.loads(_ok("predict", THROUGHPUT, "--model-config", config, "--format", "json", "--",
                         "--max-num-seqs", "16"))
    bench = json.loads((THROUGHPUT / "bench.json").read_text())
    rt = doc["metrics"]["request_throughput"]
    assert rt["before"] == pytest.approx(bench["requests_per_second"])
    assert rt["predicted"] < rt["before"]  # 16 of the 32 requests at a time
    assert doc["limit"]["before"].startswith("the benchmark's requests (all of them run at once")
    assert doc["limit"]["after"].startswith("--max-num-seqs")


def test_the_gpu_can_be_named_where_the_evidence_names_none() -> None:
    files = ("--bench", KV_BOUND / "bench.json", "--vllm-log", KV_BOUND / "server.log", "--model-config",
             KV_BOUND / "model-config.json")
    line = one_error_line(profkit("predict", *files, "--", "--kv-cache-dtype", "fp8"), "cannot model this run")
    assert "names no GPU (give --gpu NAME)" in line and "no GPU name is not" not in line
    assert "H100 SXM5 80GB" in one_error_line(profkit("predict", *files, "--gpu", "h100", "--", "--max-num-seqs",
                                                      "64"), "names several GPUs")
    assert "L40S" in one_error_line(profkit("report", *files, "--gpu", "V100"), "not in profkit's peak table")
    named = json.loads(_ok("predict", *files, "--gpu", "H100 SXM", "--format", "json", "--", "--kv-cache-dtype",
                           "fp8"))
    folder = json.loads(_ok("predict", KV_BOUND, "--format", "json", "--", "--kv-cache-dtype", "fp8"))
    assert named["source"]["gpu"] == "NVIDIA H100 SXM5 80GB"
    assert named["metrics"] == folder["metrics"]  # the folder's manifest names the same H100


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """numpy came in through matplotlib and pyarrow: each distribution profkit imports is in pyproject.toml."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-")
                for d in [*project["dependencies"], *[d for ds in project["optional-dependencies"].values()
                                                      for d in ds]]}
    dists = {**packages_distributions(), "pynvml": ["nvidia-ml-py"]}  # the capture extra's, not installed here
    missing = set()
    for path in (REPO / "profkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "profkit":
                    continue
                owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not owners & declared:
                    missing.add(f"{top} ({path.relative_to(REPO)})")
    assert not missing, sorted(missing)


# --- 5. the last hostile inputs ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("phases")
    with tarfile.open(REPO / "tests" / "data" / "h100_phases" / "bf16.tar.xz") as tar:
        tar.extractall(out, filter="data")
    return out / "bf16"


@pytest.mark.parametrize("bandwidth", [0, -3_350_000_000_000])
def test_an_export_bandwidth_of_zero_or_below_is_never_used(bf16: Path, tmp_path: Path, bandwidth: int) -> None:
    """A GPU the peak table lacks, whose export row says 0 (or -3.35 TB/s): no division, no negative peak; MBU is
    withheld with the reason, in every format."""
    folder = tmp_path / "run"
    shutil.copytree(bf16, folder)
    with sqlite3.connect(folder / "trace.sqlite") as conn:
        conn.execute("UPDATE TARGET_INFO_GPU SET name = 'NVIDIA Future GPU', memoryBandwidth = ?", (bandwidth,))
    doc = json.loads(_ok("report", folder, "--format", "json"))
    eff = doc["efficiency"]
    assert eff["gpu"]["name"] == "NVIDIA Future GPU" and eff["gpu"].get("bandwidth_tbs") is None
    assert any("memory bandwidth of" in w and "not used" in w for w in eff["withheld"])
    assert all(e is None or e.get("mbu") is None for e in (eff["vllm_counters"], eff["model_shape"]))
    for fmt in ("text", "md", "html"):
        assert "not used" in _ok("report", folder, "--format", fmt)


def test_host_samples_without_a_pid_say_what_was_left_out(tmp_path: Path) -> None:
    """Every process's pid NaN: the host section says so (and that the benchmark's window cannot be placed) in every
    format, and the GPU-busy rules are listed as not evaluated instead of vanishing."""
    folder = tmp_path / "run"
    shutil.copytree(KV_BOUND, folder)
    host = json.loads((folder / "host.json").read_text())
    n = len(host["processes"])
    for p in host["processes"]:
        p["pid"] = float("nan")
    (folder / "host.json").write_text(json.dumps(host))
    doc = json.loads(_ok("report", folder, "--format", "json"))
    assert doc["host"]["processes"] == [] and doc["host"]["left_out"] == {"processes whose pid is no process id": n}
    assert "kv-capacity-bound" in [s["rule"] for s in doc["rules_skipped"]]
    for fmt in ("text", "md", "html"):
        out = _ok("report", folder, "--format", fmt)
        assert f"left out: {n} processes whose pid is no process id" in out
        assert "no benchmark client was sampled to place the benchmark" in out
