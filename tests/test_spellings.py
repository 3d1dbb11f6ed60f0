"""One setting, one spelling: vLLM 0.26.0 refuses a flag beside the same key of a config flag although its parser
accepts both ("... are mutually exclusive", engine/arg_utils.py), and silently drops a config flag's JSON beside
its dotted keys. A change edits the setting where and how the user gave it; the check says when a command would
not start."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from profkit.diagnose.rule_files import load_rules
from profkit.diagnose.suggestion import suggest
from profkit.vllm.command import UserCommand, VllmCommand
from profkit.vllm.options import recorded_specs, spellings

# what the user may have written for the settings rules touch, each a different spelling of one setting
SPELLED = {
    "max_cudagraph_capture_size": ["--max-cudagraph-capture-size 16", "-cc.max_cudagraph_capture_size=16",
                                   "--compilation-config.max_cudagraph_capture_size 16",
                                   """--compilation-config '{"max_cudagraph_capture_size": 16, "mode": 3}'""",
                                   """-cc '{"max_cudagraph_capture_size": 16}'"""],
    "cudagraph_mode": ["-cc.cudagraph_mode=PIECEWISE", """--compilation-config '{"cudagraph_mode": "PIECEWISE"}'"""],
    "tensor_parallel_size": ["-tp 2", "--tensor-parallel-size 2", "--tensor_parallel_size=2"],
    "optimization_level": ["-O3", "-O 3", "-O=3", "--optimization-level 3"],
    "enforce_eager": ["--enforce-eager", "--no-enforce-eager"],
    "max_num_seqs": ["--max-num-seqs 8", "--max_num_seqs=8"],
}
CHANGES = {  # (flag a rule may name, values it may set)
    "max_cudagraph_capture_size": ("--max-cudagraph-capture-size", [None, 512]),
    "cudagraph_mode": ("--compilation-config.cudagraph_mode", [None, "FULL_AND_PIECEWISE"]),
    "tensor_parallel_size": ("--tensor-parallel-size", [None, 1, 4]),
    "optimization_level": ("-O", [None, 2]),
    "enforce_eager": ("--enforce-eager", [None, True, False]),
    "max_num_seqs": ("--max-num-seqs", [None, 64]),
}


def test_the_record_agrees_with_the_recorded_option_list() -> None:
    """Every flat flag and config flag the spellings record names is an option of `vllm serve` (vLLM 0.26.0's own
    parser, recorded), with the setting's dest; every refused pair has both a flag and a config key."""
    serve = recorded_specs()[("serve",)]
    words = spellings()
    assert words.version == "0.26.0" and len(words.exclusive) == 7
    for setting, s in words.settings.items():
        if s["flag"]:
            assert serve.options[s["flag"]].dest == setting
        assert words.config_dests[s["config"]] == serve.options[s["config"]].dest
    for alias, dest in words.config_dests.items():
        assert serve.options[alias].dest == dest
    for setting in words.exclusive:
        assert words.settings[setting]["flag"] and words.settings[setting]["config"]
    assert serve.options[words.short["-O"]].dest == "optimization_level"


@pytest.mark.parametrize("spelled", SPELLED["max_cudagraph_capture_size"])
def test_a_capture_size_change_edits_the_users_own_spelling(spelled: str) -> None:
    cmd = VllmCommand.parse(f"vllm serve /m --port 8011 {spelled}")
    assert cmd.value("--max-cudagraph-capture-size") == 16 and cmd.flags()["max_cudagraph_capture_size"] == 16
    raised, action, _ = cmd.apply("--max-cudagraph-capture-size", 512)
    assert action == "edit" and raised.value("--max-cudagraph-capture-size") == 512
    assert raised.spelling_problems() == [] and raised.check().ok, raised.shell()
    assert len(raised.occurrences("--compilation-config.max_cudagraph_capture_size")) == 1
    removed, action, _ = cmd.apply("--max-cudagraph-capture-size", None)
    assert action == "remove" and "max_cudagraph_capture_size" not in removed.shell() and removed.check().ok
    if "mode" in spelled:  # the user's other keys stay
        assert json.loads(shlex.split(removed.shell())[-1]) == {"mode": 3}


def test_the_check_refuses_what_vllm_refuses() -> None:
    """The command a cuda-graph-coverage finding printed before this issue: the user's flag and the same key in
    --compilation-config. argparse accepts it; vLLM 0.26 does not start."""
    old = VllmCommand.parse("""vllm serve /m --max-cudagraph-capture-size 16 --compilation-config """
                            """'{"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 512}'""")
    result = old.check()
    assert not result.ok and "one spelling per setting (7 pairs vLLM 0.26.0 refuses)" in result.by
    assert any("max_cudagraph_capture_size and compilation_config.max_cudagraph_capture_size are mutually "
               "exclusive" in p for p in result.problems)
    dropped = VllmCommand.parse("""vllm serve /m --compilation-config '{"mode": 3}' -cc.cudagraph_mode=NONE""")
    assert any("keeps only the last" in p for p in dropped.check().problems)


def test_the_rule_undoes_the_narrowed_capture_size_in_one_spelling(sqlite_path) -> None:
    """cuda-graph-coverage on a real trace whose kernels mostly launched outside graphs (thr_graphs, whole
    process), for a user who narrowed the capture sizes: the flag goes; no second spelling is added."""
    from profkit.evidence.record import Evidence
    from profkit.report import ReportOptions, build_report

    for spelled in SPELLED["max_cudagraph_capture_size"]:
        given = Evidence.read(vllm_args=f"vllm serve /m --max-num-seqs 256 {spelled}")
        report = build_report(sqlite_path("thr_graphs"), given, ReportOptions(window="all"))
        finding = next(f for f in report.findings if f.rule == "cuda-graph-coverage")
        change = finding.changes[0]
        assert (change.flag, change.from_, change.from_source, change.to, change.action) == \
            ("--max-cudagraph-capture-size", 16, "given", None, "remove")
        assert report.suggested_command == "vllm serve /m --max-num-seqs 256" + (
            """ --compilation-config '{"mode": 3}'""" if "mode" in spelled else "")
        assert all(c.ok for c in report.command.checks), report.command.checks


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(SPELLED)), min_size=0, max_size=4, unique=True).flatmap(
    lambda keys: st.tuples(st.just(keys), st.tuples(*[st.sampled_from(SPELLED[k]) for k in keys]))),
       st.lists(st.sampled_from(sorted(CHANGES)), min_size=1, max_size=3, unique=True).flatmap(
    lambda keys: st.tuples(*[st.tuples(st.just(k), st.sampled_from(CHANGES[k][1])) for k in keys])))
def test_no_change_adds_a_second_spelling(given_spellings: tuple, changes: tuple) -> None:
    """Any user command spelling each setting one way, any changes to those settings: the suggested command
    gives every changed setting at most once, parses, and keeps what the user set otherwise."""
    _, words = given_spellings
    cmd = VllmCommand.parse("vllm serve /m --port 8011 " + " ".join(words))
    assume(cmd.spelling_problems() == [])  # -cc.x beside --compilation-config.y: the user's own problem
    sug = suggest(UserCommand([cmd], "test"), [{"flag": CHANGES[k][0], "to": to} for k, to in changes])
    new = sug.commands[0] if sug.commands else cmd
    for key, to in changes:
        found = new.occurrences(CHANGES[key][0])
        assert len(found) <= 1, (new.shell(), key)
        if to is not None and found:
            assert found[0].value == to or (isinstance(to, bool) and key == "enforce_eager")
    assert new.spelling_problems() == [] and (not sug.checks or all(c.ok for c in sug.checks)), new.shell()
    assert new.value("--port") == 8011 and new.model == "/m"


def test_every_rule_change_names_a_setting_vllm_serve_takes() -> None:
    from profkit.vllm.options import spec_for, takes

    serve, client = spec_for(["serve"]), spec_for(["bench", "serve"])
    for rule in load_rules():
        for change in rule.changes:
            assert takes(serve, change.flag) or takes(client, change.flag), (rule.id, change.flag)
