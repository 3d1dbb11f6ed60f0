"""The suggested command: the user's own command with exactly the changes applied, and it parses.

Checked against vLLM 0.26.0's option list recorded on the GPU box (profkit/vllm/vllm_options/0.26.0.json,
from vLLM's own parsers; cross-checked below against the `--help` texts recorded beside it), and on the
real capture folder of an `--enforce-eager` run (shared fixtures) paired with an eager trace.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from profkit.diagnose.suggestion import suggest
from profkit.evidence.folder import manifest_user_command, without_capture_args
from profkit.evidence.manifest import parse_manifest
from profkit.evidence.record import Evidence
from profkit.report import build_report
from profkit.vllm.check import check_recorded
from profkit.vllm.command import UserCommand, VllmCommand, from_non_default_args
from profkit.vllm.options import recorded_specs
from tests.conftest import FIXTURES

EAGER_CAPTURE = FIXTURES / "h100_vllm" / "capture_thr_eager"
HELP = Path(__file__).parent / "data" / "vllm_0.26.0_help"
REAL_SERVE = Path(__file__).parent / "data" / "vllm_serve_kv300mb"
USER_EAGER = ("vllm bench throughput --model /tmp/tiny --dataset-name random --random-input-len 512 "
              "--random-output-len 128 --num-prompts 1000 --max-model-len 2048 --enforce-eager")


@pytest.fixture(scope="module")
def eager_capture(sqlite_path, tmp_path_factory) -> Path:
    """The real `profkit capture -- vllm bench throughput ... --enforce-eager` folder, its trace replaced by
    the eager toy trace (the 93 MB original is not shipped)."""
    folder = tmp_path_factory.mktemp("cap") / "capture_thr_eager"
    shutil.copytree(EAGER_CAPTURE, folder)
    shutil.copyfile(sqlite_path("eager_b1"), folder / "trace.sqlite")
    return folder


def test_recorded_options_match_the_help_texts() -> None:
    """The option list came from vLLM's parsers; every option it names for `vllm serve` is in vLLM's own
    `vllm serve --help=all` output, and the reverse; the same for `vllm bench throughput|latency|serve`."""
    specs = recorded_specs()
    text = (HELP / "serve_help_all.txt").read_text()
    in_help = set(re.findall(r"(?<![\w-])(--[a-z0-9][\w-]*)(?=[ ,=\n])", text))
    options = {o for o in specs[("serve",)].options if o.startswith("--")}
    assert len(options) > 300
    assert options - in_help == set()
    defined = set(re.findall(r"^\s{2,}(?:-[\w.]+, )?(--[a-z0-9][\w-]*)[ ,\n]", text, flags=re.M))
    # --json-arg is the placeholder in vLLM's own explanation of JSON arguments, not an option
    assert len(defined) > 200 and defined - options - {"--help", "--json-arg"} == set()
    for sub in (("bench", "throughput"), ("bench", "latency"), ("bench", "serve")):
        groups = (HELP / f"bench_{sub[1]}_help.txt").read_text()  # `--help`: option groups only
        assert f"usage: vllm bench {sub[1]} [options]" in groups
        text = (HELP / f"bench_{sub[1]}_help_all.txt").read_text()  # `--help=all`: every option
        defined = set(re.findall(r"^\s{2,}(?:-[\w.]+, )?(--[a-z0-9][\w-]*)[ ,\n]", text, flags=re.M))
        options = {o for o in specs[sub].options if o.startswith("--")}
        assert len(options) > 100 and defined - options - {"--help", "--json-arg"} == set()
        in_help = set(re.findall(r"(?<![\w-])(--[a-z0-9][\w-]*)(?=[ ,=\n])", text))
        assert options - in_help == set(), sub
    assert specs[("serve",)].options["--enforce-eager"].takes_value is False
    assert specs[("serve",)].options["--no-enforce-eager"].negation_of == "--enforce-eager"
    assert specs[("serve",)].options["--max-num-seqs"].takes_value is True
    assert "fp8" in specs[("serve",)].options["--kv-cache-dtype"].choices


def test_capture_folder_suggestion_is_the_users_command_minus_enforce_eager(eager_capture: Path) -> None:
    doc = build_report(eager_capture).document()
    cmd = doc["command"]
    assert cmd["source"].startswith("capture manifest")
    assert cmd["original"] == [USER_EAGER]  # nsys and --output-json into the folder taken off
    assert cmd["suggested"] == [USER_EAGER.removesuffix(" --enforce-eager")]
    assert doc["suggested_command"] == USER_EAGER.removesuffix(" --enforce-eager")
    change = next(c for f in doc["findings"] for c in f["changes"] if c["flag"] == "--enforce-eager")
    assert (change["from"], change["from_source"], change["to"], change["action"]) == (True, "given", False,
                                                                                       "remove")
    assert cmd["changes"] == [{"flag": "--enforce-eager", "action": "remove", "to": False, "command": 0, "note": ""}]
    assert [c["ok"] for c in cmd["checks"]] == [True]
    # Nothing vLLM filled in by itself (tokenizer, reasoning parser plugin, router gemm) leaks in.
    for internal in ("--tokenizer", "--reasoning-parser-plugin", "--no-enable-bf16x3-router-gemm", "serve"):
        assert internal not in doc["suggested_command"]


def test_every_format_shows_the_same_command(eager_capture: Path) -> None:
    from profkit.render.html import render_html
    from profkit.render.markdown import render_markdown
    from profkit.render.text import render_text

    doc = build_report(eager_capture).document()
    after = doc["suggested_command"]
    assert f"  after:  {after}\n" in render_text(doc)
    md = render_markdown(doc)
    assert f"```diff\n- {USER_EAGER}\n+ {after}\n```" in md and f"```\n{after}\n```" in md
    html = render_html(doc)
    assert f"<pre>{after}</pre>" in html and "<del>--enforce-eager</del>" in html
    assert json.loads(json.dumps(doc))["command"]["suggested"] == [after]


@pytest.mark.parametrize(("args", "flag", "to", "expect", "action"), [
    # edit in place, the user's spelling (= form, underscores) kept where it stood
    ("--model m --max-num-seqs 64 --seed 0", "--max-num-seqs", 128, "--model m --max-num-seqs 128 --seed 0", "edit"),
    ("--model m --max_num_seqs=64 --seed 0", "--max-num-seqs", 32, "--model m --max-num-seqs 32 --seed 0", "edit"),
    # add at the end
    ("--model m", "--kv-cache-dtype", "fp8", "--model m --kv-cache-dtype fp8", "add"),
    # a switch back to vLLM's default is removed; off where the default is on becomes --no-X
    ("--model m --enforce-eager --seed 0", "--enforce-eager", False, "--model m --seed 0", "remove"),
    ("--model m", "--enable-prefix-caching", False, "--model m --no-enable-prefix-caching", "add"),
    ("--model m --no-enable-prefix-caching", "--enable-prefix-caching", True, "--model m", "remove"),
    # None removes the flag and its value; repeated flags collapse to one (argparse keeps the last)
    ("--kv-cache-memory-bytes 300000000 --model m", "--kv-cache-memory-bytes", None, "--model m", "remove"),
    ("--max-num-seqs 4 --model m --max-num-seqs 8", "--max-num-seqs", 16, "--model m --max-num-seqs 16", "edit"),
    # JSON values survive quoting
    ("--model m", "--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}',
     """--model m --compilation-config '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'""", "add"),
])
def test_apply_change(args: str, flag: str, to, expect: str, action: str) -> None:
    cmd = VllmCommand(["vllm"], ["bench", "throughput"], shlex.split(args))
    new, did, _ = cmd.apply(flag, to)
    assert (shlex.join(new.args), did) == (expect, action)
    assert shlex.split(new.shell()) == new.argv()  # round trip through the shell
    assert check_recorded(new.argv()[1:]).ok


def test_quoting_survives_paths_and_json() -> None:
    text = ("vllm serve '/models/my model' --served-model-name 'a b' --compilation-config "
            """'{"level": 3, "cudagraph_capture_sizes": [1, 2, 4]}'""")
    cmd = VllmCommand.parse(text)
    assert cmd.subcommand == ["serve"] and cmd.args[0] == "/models/my model"
    s = suggest(UserCommand([cmd], "--vllm-args"), [{"flag": "--max-num-seqs", "to": 64}])
    assert shlex.split(s.text()) == [*cmd.argv(), "--max-num-seqs", "64"]
    assert s.checks[0].ok, s.checks


def test_vllm_args_forms(sqlite_path) -> None:
    full = build_report(sqlite_path("eager_b1"), Evidence.read(vllm_args=USER_EAGER)).document()
    assert full["command"]["source"] == "--vllm-args"
    assert full["suggested_command"] == USER_EAGER.removesuffix(" --enforce-eager")
    given = Evidence.read(vllm_args="--max-num-seqs 64 --enforce-eager")
    flags = build_report(sqlite_path("eager_b1"), given).document()
    assert flags["suggested_command"] == "--max-num-seqs 64"  # a bare flag list stays a flag list
    assert flags["command"]["checks"][0]["ok"]


def test_serve_suggestion_from_the_log_is_said_as_such(sqlite_path) -> None:
    """No manifest, no --vllm-args: rebuilt from the real serve log's non-default args, said as such."""
    evidence = Evidence.read(log=REAL_SERVE / "server.log",
                             metrics=[REAL_SERVE / "metrics-before.txt", REAL_SERVE / "metrics-after.txt"])
    doc = build_report(sqlite_path("hostgap_b16"), evidence).document()
    cmd = doc["command"]
    assert cmd["source"].startswith("vLLM log's non-default args (the command you ran is not known")
    assert cmd["original"] == [
        "vllm serve /tmp/tiny --port 8011 --max-model-len 2048 --kv-cache-memory-bytes 300000000"]
    assert cmd["suggested"] == ["vllm serve /tmp/tiny --port 8011 --max-model-len 2048"]
    assert all(c["ok"] for c in cmd["checks"])


def test_manifest_lines_lose_profiler_and_folder_arguments() -> None:
    serve = VllmCommand.find_in(shlex.split(
        "nsys profile -t cuda --force-overwrite=true -o /c/trace vllm serve /tmp/tiny --max-num-seqs 4 --port 8011 "
        """--profiler-config '{"profiler": "torch", "torch_profiler_dir": "/c/torch"}'"""))
    assert without_capture_args(serve).argv() == ["vllm", "serve", "/tmp/tiny", "--max-num-seqs", "4", "--port", "8011"]
    client = VllmCommand.find_in(shlex.split(
        "vllm bench serve --backend vllm --model /tmp/tiny --port 8011 --num-prompts 200 --save-result "
        "--result-dir /c --result-filename bench.json --profile"))
    assert without_capture_args(client).args == ["--backend", "vllm", "--model", "/tmp/tiny", "--port", "8011",
                                              "--num-prompts", "200"]
    # A user's own --output-json elsewhere is theirs, and stays.
    own = VllmCommand.find_in(["python3", "-m", "vllm.entrypoints.cli.main", "bench", "latency", "--output-json",
                               "/r/x.json"])
    assert own.program == ["python3", "-m", "vllm.entrypoints.cli.main"]
    assert without_capture_args(own).args == ["--output-json", "/r/x.json"]
    manifest = parse_manifest(json.loads((EAGER_CAPTURE / "manifest.json").read_text()), "manifest.json")
    assert [c.shell() for c in manifest_user_command(manifest).commands] == [USER_EAGER]


def test_unknown_or_invalid_flags_fail_the_check() -> None:
    assert not check_recorded(["serve", "m", "--max-num-seqz", "4"]).ok
    assert "needs a value" in check_recorded(["serve", "m", "--max-num-seqs"]).problems[0]
    assert "not one of" in check_recorded(["serve", "m", "--kv-cache-dtype", "fp9"]).problems[0]
    assert "takes no value" in check_recorded(["serve", "m", "--enforce-eager=1"]).problems[0]
    assert not check_recorded(["bench", "throughput", "--request-rate", "4"]).ok  # a serve-bench flag
    assert check_recorded(["bench", "serve", "--request-rate", "4"]).ok


def test_from_log_keeps_only_what_the_user_set() -> None:
    log = {"tokenizer": "/tmp/tiny", "max_model_len": 2048, "enforce_eager": True, "enable_lora": None,
           "reasoning_parser_plugin": "", "enable_bf16x3_router_gemm": False, "model": "/tmp/tiny"}
    user = from_non_default_args(log, offline=True)
    assert user.commands[0].shell() == "vllm bench throughput --model /tmp/tiny --max-model-len 2048 --enforce-eager"


def test_a_random_prefix_is_part_of_every_prompt() -> None:
    """vLLM's RandomDataset builds a prompt as --random-prefix-len fixed tokens, then an input drawn within the range
    ratio around --random-input-len (its `total_input_len = prefix_len + input_len`): the prompt the command asks
    for and its longest request count the prefix (they left it out)."""
    from profkit.analysis.workload import workload_section

    cmd = VllmCommand.parse("vllm bench serve --dataset-name random --random-input-len 512 --random-output-len 128 "
                            "--random-range-ratio 0.5 --random-prefix-len 256")
    assert cmd.prompt_lengths() == (512, 128, 0.5, 256)
    w = workload_section(cmd, None)
    assert (w["asked_prompt_tokens"], w["tokens_per_request"]) == (768, 896)
    assert w["max_tokens_per_request"] == 256 + (512 + 128) * 1.5 and w["shared_prefixes"] is True
