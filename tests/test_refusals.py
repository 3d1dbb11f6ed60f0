"""What the model does not know it refuses, in one line, through the CLI: `predict`, `--search`, `--frontier` and
the report's prescription alike (profkit/model/refusals.py). Each case was answered with a confident prediction
before (issue 51): a mixture-of-experts or 70B config.json for a 14B run, AWQ, bitsandbytes and an int8 KV cache
"no change", a --max-model-len below the workload "unchanged", 1 GPU -> 8, TP=2 -> TP=4 (+76 % against its capture),
and a live window the fit does not reproduce."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import one_error_line, profkit
from tests.conftest import unpack

SAMPLE = "samples/vllm_14b_kv_bound"


@pytest.mark.parametrize("change, says", [
    ("--quantization awq", "--quantization awq: the model knows FP8 weights only"),
    ("--quantization bitsandbytes", "--quantization bitsandbytes: the model knows FP8 weights only"),
    ("--kv-cache-dtype int8", "--kv-cache-dtype int8: the model knows the 16-bit and FP8 KV caches only"),
    ("--max-model-len 1024", "--max-model-len 1024 is shorter than the workload's requests (1,024 + 256 tokens)"),
    ("-tp 8", "8 GPUs where the run used 1: the model predicts only splits of the run's own GPUs"),
])
def test_a_change_the_model_has_no_grounds_for_is_refused(change: str, says: str) -> None:
    line = one_error_line(profkit("predict", SAMPLE, "--", *change.split()), says)
    assert line == f"profkit: error: changes: not predicted: {says}" + line.split(says, 1)[1]
    # the same change on the frontier
    one_error_line(profkit("predict", SAMPLE, "--frontier", "--", *change.split()), says)


@pytest.mark.parametrize("change, flag", [
    (["--stream-interval", "4"], "--stream-interval"),
    (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}'], "--speculative-config"),
])
def test_a_flag_it_does_not_know_is_refused_beside_ones_it_does(change: list[str], flag: str) -> None:
    """A prediction of the flags it knows was once said as the whole change's, the others listed "not modelled";
    `--stream-interval` moves a frontend-bound run and speculative decoding a decode-bound one. A config flag's JSON
    keys (the speculative method) are said as the flag that was written."""
    says = f"changes: not predicted: the model does not know what {flag} would do (it models --api-server-count"
    for args in (["--", *change], ["--", "--max-num-seqs", "64", *change], ["--frontier", "--", *change]):
        line = one_error_line(profkit("predict", SAMPLE, *args), says)
        assert line.endswith("; ask without it for the others") == ("--max-num-seqs" in args)


def test_a_lever_the_runs_evidence_cannot_read_is_refused(tmp_path: Path) -> None:
    """What the search leaves out for want of evidence, `predict` refuses: the API servers' count without their host
    samples (the sample without host.json) and FP8 weights on a GPU without FP8 tensor cores (the sample said to be
    an A100's)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run, ignore=shutil.ignore_patterns("host.json"))
    one_error_line(profkit("predict", run, "--", "--api-server-count", "2"),
                   "--api-server-count: the run has no host samples of its API servers, so what they carried is "
                   "unknown (profkit capture records them)")
    assert profkit("predict", SAMPLE, "--", "--api-server-count", "2").returncode == 0
    a100 = ("predict", SAMPLE, "--gpu", "A100 SXM4 80GB")
    one_error_line(profkit(*a100, "--", "--quantization", "fp8"),
                   "--quantization: the NVIDIA A100 SXM4 80GB has no FP8 tensor cores")
    assert profkit(*a100, "--", "--max-num-seqs", "512").returncode == 0


def test_a_change_it_knows_still_predicts() -> None:
    r = profkit("predict", SAMPLE, "--", "--kv-cache-dtype", "bfloat16", "--max-model-len", "1280")
    assert r.returncode == 0, r.stderr


def test_tp2_to_tp4_is_refused_and_the_split_of_the_same_gpus_is_not(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The TP=2 capture: its TP=4 prediction (54.5 req/s) missed the TP=4 capture's 31.05 by 76 %; the split of its
    own 2 GPUs (DP=2) was measured against the model and stays predicted."""
    run = unpack(tmp_path_factory, "h200_tp2") / "ab" / "tp2" / "T_s11"
    one_error_line(profkit("predict", run, "--", "-tp", "4"),
                   "4 GPUs where the run used 2: the model predicts only splits of the run's own GPUs")
    r = profkit("predict", run, "--", "-tp", "1", "--data-parallel-size", "2")
    assert r.returncode == 0, r.stderr


def _config(tmp_path: Path, **edits: object) -> Path:
    cfg = json.loads(Path(SAMPLE, "model-config.json").read_text())
    cfg.update(edits)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_a_mixture_of_experts_config_is_refused_everywhere(tmp_path: Path) -> None:
    """Mixtral-8x7B's experts on the sample's shape: predict, search and frontier refuse it in one line, and the
    report's prescription says the same."""
    moe = _config(tmp_path, num_local_experts=8, num_experts_per_tok=2)
    says = "a mixture-of-experts model (its config.json names experts): the model simulates dense layers only"
    for args in (["--", "--kv-cache-dtype", "fp8"], ["--search"], ["--frontier"]):
        one_error_line(profkit("predict", SAMPLE, "--model-config", moe, *args), says)
    doc = json.loads(profkit("report", SAMPLE, "--model-config", moe, "--format", "json").stdout)
    assert doc["prescription"]["note"] == f"no prescription: the model cannot be calibrated on this run ({says})"


def test_a_config_json_that_is_not_the_model_that_ran_is_refused(tmp_path: Path) -> None:
    """A 70B's shape (hidden 8192, 80 layers, MLP 28672) for the sample's 14B: 131 GiB of weights against the log's
    25.6 GiB."""
    big = _config(tmp_path, hidden_size=8192, num_hidden_layers=80, intermediate_size=28672, num_attention_heads=64)
    line = one_error_line(profkit("predict", SAMPLE, "--model-config", big, "--", "--kv-cache-dtype", "fp8"),
                          "not the model that ran (give its config.json with --model-config)")
    assert "GiB of weights a GPU where vLLM's log says" in line


def test_a_live_window_the_fit_does_not_reproduce_gets_no_prediction(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The report withholds its prescription on this window (a backlog the simulation does not have); predict,
    search and frontier withhold theirs with the same reason."""
    live = unpack(tmp_path_factory, "h200_live") / "live_tight2"
    for args in (["--", "--max-num-seqs", "512"], ["--search"], ["--frontier"]):
        one_error_line(profkit("predict", live, *args),
                       "not predicted: the model does not reproduce this run (its simulated duration")


def test_a_run_of_another_vllm_version_says_whose_defaults_it_assumes(tmp_path: Path) -> None:
    """The version is read off the run's own log (the engine's start-up line); where it is not 0.26.0, whose options,
    defaults and validation profkit recorded, the prediction says so beside its figures."""
    import shutil

    doc = json.loads(profkit("report", SAMPLE, "--format", "json").stdout)
    assert doc["vllm"]["log"]["vllm_version"] == "0.26.0"
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    log = run / "server.log"
    log.write_text(log.read_text().replace("LLM engine (v0.26.0)", "LLM engine (v0.27.1)"))
    pred = json.loads(profkit("predict", run, "--format", "json", "--", "--max-num-seqs", "512").stdout)
    assert pred["reasoning"][0] == ("the run is vLLM 0.27.1's: the defaults assumed and the model's validation are "
                                    "vLLM 0.26.0's")
    same = json.loads(profkit("predict", SAMPLE, "--format", "json", "--", "--max-num-seqs", "512").stdout)
    assert not any("vLLM 0.26.0's" in r for r in same["reasoning"])


def test_a_flag_taken_back_to_vllms_default_is_said_default_and_a_bad_value_is_one_line() -> None:
    """`--gpu-memory-utilization default` is the flag removed (what the prescription writes `not set`): the same
    prediction as `None`, vLLM's 0.92 in force; a value the flag does not take is one line, never an internal error."""
    said, same = (json.loads(profkit("predict", SAMPLE, "--format", "json", "--", "--gpu-memory-utilization",
                                     value).stdout) for value in ("default", "0.92"))
    assert said["changes"] == {"gpu_memory_utilization": 0.92}  # vLLM's default, said
    assert said["changes_text"] == "--gpu-memory-utilization default"
    assert said["metrics"]["request_throughput"] == same["metrics"]["request_throughput"]
    one_error_line(profkit("predict", SAMPLE, "--", "--max-num-seqs", "many"),
                   "changes: --max-num-seqs many: a value vLLM would not take")


def test_failed_requests_are_said_and_a_run_where_many_failed_is_refused(h200_model_led: Path) -> None:
    """Lease 27's first start (a tokenizer without the ids its dummy model emitted): 374 of 1,000 requests failed and
    `vllm bench serve` reported the other 626's figures; profkit read `num_prompts` as the requests and said nothing.
    Now the report says it, the completed are the run's requests, and the model refuses such a run. Its third start
    failed 16 of 1,000 (400s before any work): said, and predicted (Q51)."""
    from profkit.model.refusals import run_refusal

    broken = h200_model_led / "lease27-first-start" / "q_base_r1-bench.json"
    doc = json.loads(profkit("report", "--bench", broken, "--format", "json").stdout)
    facts = doc["facts"]
    assert (facts["vllm.num_requests"], facts["vllm.failed_requests"]) == (626, 374)
    assert facts["vllm.failed_share"] == pytest.approx(0.374)
    said = next(f for f in doc["findings"] if f["rule"] == "failed-requests")
    assert said["summary"].startswith("374 of 1,000 requests failed (37.4%): the benchmark's figures are the "
                                      "completed requests'")
    assert run_refusal(doc) == ("374 of 1,000 requests failed (37.4%): the completed ones are not the workload the "
                                "benchmark asked for (the server's log says why)")
    run = h200_model_led / "api" / "q_base" / "r1"
    text = profkit("report", run).stdout
    assert "16 of 1,000 requests failed (1.6%)" in text
    pred = json.loads(profkit("predict", run, "--format", "json", "--", "--gpu-memory-utilization", "0.5").stdout)
    assert pred["metrics"]["request_throughput"]["before"] == pytest.approx(25.61, abs=0.01)


def test_a_benchmark_whose_prompts_are_not_its_commands_is_said(h200_model_led: Path) -> None:
    """The same first start asked for 1,024-token prompts (+-50 %) and its server got 1.6 tokens a prompt on average:
    the random dataset's text re-encoded by a tokenizer that lacked the ids drawn. Said from the result and the
    command (the session's own, given as --vllm-args); the third start's prompts (r1: 1,033 on average) are not."""
    import shlex

    first = h200_model_led / "lease27-first-start"
    command = json.loads((first / "q_base-session.json").read_text())["user_commands"][1]
    doc = json.loads(profkit("report", "--bench", first / "q_base_r1-bench.json", "--vllm-args",
                             shlex.join(command), "--format", "json").stdout)
    said = next(f for f in doc["findings"] if f["rule"] == "workload-not-as-asked")
    assert said["summary"].startswith("The prompts averaged 1.62 tokens where the command asks for 1,024 "
                                      "(--random-input-len)")
    third = json.loads(profkit("report", h200_model_led / "api" / "q_base" / "r1", "--format", "json").stdout)
    assert third["facts"]["workload.prompt_tokens"] == pytest.approx(1016366 / 984)  # its result's tokens, completed
    assert third["facts"]["workload.asked_prompt_tokens"] == 1024
    assert "workload-not-as-asked" not in {f["rule"] for f in third["findings"]}


@pytest.mark.parametrize("change", [
    "--max-num-seqs 0", "--max-num-seqs -5", "--max-num-seqs 256.7", "--max-num-seqs 1e3",
    "--max-num-batched-tokens 0", "--gpu-memory-utilization 1.5", "--gpu-memory-utilization 0",
    "--gpu-memory-utilization inf", "--kv-cache-memory-bytes inf", "--kv-cache-memory-bytes 1.5K", "-tp 0",
    "--data-parallel-size 0", "--api-server-count 0", "--api-server-count -1", "--max-model-len 0",
    "--max-model-len 2.5", "--kv-cache-memory-bytes 1e9", "--max-num-batched-tokens 1.5K"])
def test_a_value_vllm_would_not_take_is_one_line(change: str) -> None:
    """An adversarial review found these predicted with confidence (a batch cap of 0 or 256.7, 150 % of the GPU's
    memory: +40 %, 0 API servers: "same") or answered with an internal error (0 and -5 as a batch cap, inf bytes).
    vLLM 0.26's own types say what each takes (whole numbers of at least 1, a share in (0, 1], sizes like 1k)."""
    flag = change.split()[0]
    for args in ([], ["--frontier"]):
        line = one_error_line(profkit("predict", SAMPLE, *args, "--", *change.split()), "a value vLLM would not take")
        assert ": a value vLLM would not take (it takes " in line and (flag in line or "--tensor-parallel-size" in line)


def test_vllms_human_readable_sizes_and_auto_length_are_its_values() -> None:
    """`--kv-cache-memory-bytes 1G` and `--max-model-len 1k` are vLLM 0.26's spellings (1G = 1,073,741,824 bytes,
    1k = 1,000 tokens: its --help); -1 is its automatic length, the default. They were refused as values vLLM would
    not take, and -1 as shorter than the workload."""
    def metrics(*change: str) -> dict:
        r = profkit("predict", SAMPLE, "--format", "json", "--", *change)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["metrics"]

    assert metrics("--kv-cache-memory-bytes", "1G") == metrics("--kv-cache-memory-bytes", str(1 << 30))
    assert metrics("--max-num-batched-tokens", "16k") == metrics("--max-num-batched-tokens", "16000")
    # a whole command is the flags' too (its model tag a positional, not a stray word)
    assert metrics("vllm", "serve", "M", "--max-num-seqs", "64") == metrics("--max-num-seqs", "64")
    assert metrics("--max-model-len", "-1") == metrics("--max-model-len", "default")
    one_error_line(profkit("predict", SAMPLE, "--", "--max-model-len", "1k"),
                   "--max-model-len 1000 is shorter than the workload's requests (1,024 + 256 tokens)")


def test_a_switch_takes_no_value_and_default_turns_it_off(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`--enforce-eager false` (vLLM: 'unrecognized arguments') and `--enforce-eager=false` were read as eager on, the
    word dropped; a stray word after any flag was dropped too. `--enforce-eager default` is vLLM's default: CUDA
    graphs on, as `--no-enforce-eager` (an eager TP=2 run of h200_tp4)."""
    for change, says in ((["--enforce-eager", "false"], "'false' is not a flag (--enforce-eager is a switch and "
                                                        "takes no value"),
                         (["--enforce-eager=false"], "--enforce-eager=false: --enforce-eager is a switch"),
                         (["--max-num-seqs", "64", "extra"], "'extra' is not a flag")):
        one_error_line(profkit("predict", SAMPLE, "--", *change), says)
    eager = unpack(tmp_path_factory, "h200_tp4") / "tp2_eager"
    off, default = (json.loads(profkit("predict", eager, "--format", "json", "--", *c).stdout)
                    for c in (["--no-enforce-eager"], ["--enforce-eager", "default"]))
    assert default["changes"] == off["changes"] == {"enforce_eager": False}
    assert default["metrics"] == off["metrics"]
    assert off["metrics"]["request_throughput"]["predicted"] > off["metrics"]["request_throughput"]["before"]


def test_a_parallel_size_taken_back_to_the_default_is_one_gpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`-tp default` was read as the run's own size, which let a TP=2 run's move to one GPU through the refusal that
    `-tp 1` meets; vLLM's default is 1."""
    tp2 = unpack(tmp_path_factory, "h200_tp2") / "ab"
    for run, change in (("tp2/L_s21", "--tensor-parallel-size"), ("dp2/T_s11", "--data-parallel-size")):
        for value in ("1", "default"):
            one_error_line(profkit("predict", tp2 / run, "--", change, value),
                           "1 GPU where the run used 2: the model predicts only splits of the run's own GPUs")


@pytest.mark.parametrize("dtype", ["fp8_inc", "fp8_ds_mla", "fp8_per_token_head"])
def test_fp8_kv_caches_it_never_measured_are_refused(dtype: str) -> None:
    """Any dtype starting fp8 was taken as the FP8 KV cache (+17 %): Gaudi's fp8_inc, MLA's fp8_ds_mla and the per-token
    scaled kinds were never measured. fp8_e4m3 and fp8_e5m2 are the per-tensor FP8 the model knows."""
    one_error_line(profkit("predict", SAMPLE, "--", "--kv-cache-dtype", dtype),
                   f"--kv-cache-dtype {dtype}: the model knows the 16-bit and FP8 KV caches only")
    assert profkit("predict", SAMPLE, "--", "--kv-cache-dtype", "fp8_e5m2").returncode == 0


def test_runs_the_model_was_not_built_for_are_refused(tmp_path: Path,
                                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """A run that decodes speculatively (its n-gram proposer: h200_live's cap_spec2), one at TP=4 (h200_tp4's
    capture: the all-reduces validated up to TP=2), 4-bit weights (a GPTQ checkpoint's config.json on the sample's
    shape) and a mixture of experts named otherwise (ERNIE's moe_num_experts, an architecture called Moe): each
    was predicted; now one line, and the report says it in place of a prescription."""
    live, tp4 = unpack(tmp_path_factory, "h200_live"), unpack(tmp_path_factory, "h200_tp4")
    one_error_line(profkit("predict", live / "cap_spec2", "--", "--max-num-seqs", "64"),
                   "the run decodes speculatively (--speculative-config): the model simulates one token a step")
    one_error_line(profkit("predict", tp4 / "capture", "--", "--max-num-seqs", "64"),
                   "the run spans 4 GPUs by tensor parallelism: the model's all-reduces were validated up to 2")
    assert "no prescription: the model cannot be calibrated on this run (the run spans 4 GPUs" in \
        profkit("report", tp4 / "capture").stdout
    gptq = _config(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4})
    one_error_line(profkit("predict", SAMPLE, "--model-config", gptq, "--", "--quantization", "fp8"),
                   "4-bit weights (the checkpoint's quantization): the model knows 16-bit and FP8 weights only")
    for name, edits in (("ernie", {"moe_num_experts": 64}), ("ernie_vl", {"moe_num_experts": [64, 64]}),
                        ("named", {"architectures": ["Qwen2MoeForCausalLM"]})):
        (tmp_path / name).mkdir()
        moe = _config(tmp_path / name, **edits)
        one_error_line(profkit("predict", SAMPLE, "--model-config", moe, "--", "--max-num-seqs", "64"),
                       "a mixture-of-experts model")
        # the report still runs (ERNIE-VL's list of experts per modality was an error line for the whole report)
        assert "no prescription: the model cannot be calibrated on this run (a mixture-of-experts model" in \
            profkit("report", SAMPLE, "--model-config", moe).stdout


def test_a_runs_own_human_readable_sizes_are_read(tmp_path: Path) -> None:
    """A run given --kv-cache-memory-bytes 10G, --max-model-len 32k or --max-num-batched-tokens 16k had those
    settings read as "not a number (vLLM would refuse it)" and the hand-set cache ignored; they are vLLM's
    spellings."""
    args = "--kv-cache-memory-bytes 10G --max-model-len 32k --max-num-batched-tokens 16K"
    doc = json.loads(profkit("report", "--bench", Path(SAMPLE) / "bench.json", "--vllm-args", args,
                             "--format", "json").stdout)
    config = doc["vllm"]["config"]
    assert (config["kv_cache_memory_bytes"]["value"], config["max_model_len"]["value"],
            config["max_num_batched_tokens"]["value"]) == (10 * (1 << 30), 32_000, 16 * 1024)
