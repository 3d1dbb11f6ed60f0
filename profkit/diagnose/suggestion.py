"""The command line a user copies: the command they ran, with the findings' flag changes applied.

One function builds it (`suggest`), and report, diff and tune all call it. The user's command comes, best
first, from the capture manifest (`CaptureFolder.user_command`), from `--vllm-args`, and only when nothing
better is known from the vLLM log's "non-default args" line, said as such (`Evidence.run_command`). Changes are
applied in place by `VllmCommand.apply`: the same program and subcommand, the user's arguments in their order,
only the changed settings edited, added or removed, in the user's own spelling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from profkit.diagnose.engine import Finding, ProposedChange
from profkit.vllm.command import UserCommand, VllmCommand, dest_of
from profkit.vllm.options import normalize_flag, spec_for, takes

NOT_PRESCRIBED = ("not prescribed: the model of the run predicts it within the noise, or a prescribed value "
                  "of the same flag does more")


class AppliedChange(msgspec.Struct, frozen=True):
    flag: str
    action: str  # edit | add | remove | none
    to: Any
    command: int | None  # index into the run's commands
    note: str = ""


class CommandCheck(msgspec.Struct, frozen=True):
    command: str
    ok: bool
    by: str
    problems: list[str]
    name: str = ""  # which command was checked: `vllm serve`, `vllm bench serve`


class CommandSection(msgspec.Struct, frozen=True):
    """The report's `command`: the run's commands, the suggested ones, what was applied and how it was checked."""

    source: str | None
    original: list[str]
    original_argv: list[list[str]]
    suggested: list[str]
    suggested_argv: list[list[str]]
    changes: list[AppliedChange]
    checks: list[CommandCheck]


@dataclass
class Suggestion:
    original: UserCommand | None
    commands: list[VllmCommand] = field(default_factory=list)
    applied: list[AppliedChange] = field(default_factory=list)
    checks: list[CommandCheck] = field(default_factory=list)

    def text(self) -> str | None:
        return "\n".join(c.shell() for c in self.commands) if self.commands else None

    def section(self) -> CommandSection:
        orig = self.original.commands if self.original else []
        return CommandSection(source=self.original.source if self.original else None,
                              original=[c.shell() for c in orig], original_argv=[c.argv() for c in orig],
                              suggested=[c.shell() for c in self.commands],
                              suggested_argv=[c.argv() for c in self.commands],
                              changes=list(self.applied), checks=list(self.checks))

    def annotated(self, findings: list[Finding], prescribed: bool = False) -> list[Finding]:
        """The findings again, each change saying what the suggested command does with it (action), and why
        when that is not the change itself (a more severe finding set the same flag; `prescribed`: the command
        holds the prescription only, and the change is not in it)."""
        by_setting = {dest_of(a.flag): a for a in self.applied}
        out = []
        for f in findings:
            changes = []
            for c in f.changes:
                a = by_setting.get(dest_of(c.flag))
                if a is None and prescribed:
                    changes.append(msgspec.structs.replace(c, action="none", note=NOT_PRESCRIBED))
                elif a is None:
                    changes.append(c)
                elif a.to == c.to:
                    changes.append(msgspec.structs.replace(c, action=a.action))
                elif prescribed:  # one value per flag in the whole report: the model's, the rule's kept as a note
                    changes.append(msgspec.structs.replace(c, to=a.to, action=a.action,
                                                           note=f"the prescription's value (the model chose it; "
                                                                f"the rule proposed {c.to})"))
                else:
                    changes.append(msgspec.structs.replace(c, action="none", note=NOT_PRESCRIBED if prescribed
                                                           else "a more severe finding sets this flag"))
            out.append(msgspec.structs.replace(f, changes=changes))
        return out


def _target(cmds: list[VllmCommand], flag: str) -> int | None:
    """Which command a flag belongs to: the server/offline/flags command for engine flags, the benchmark
    client for client-side flags (--request-rate, --max-concurrency)."""
    engine = next((i for i, c in enumerate(cmds) if c.role in ("server", "offline", "flags")), None)
    client = next((i for i, c in enumerate(cmds) if c.role == "client"), None)
    engine_spec = cmds[engine].spec() if engine is not None else None
    if engine is not None and (engine_spec is None or takes(engine_spec, flag)):
        return engine
    if client is not None and takes(spec_for(["bench", "serve"]), flag):
        return client
    return None


def suggest(original: UserCommand | None, changes: list[ProposedChange | dict[str, Any]],
            check: bool = True) -> Suggestion:
    """Apply `changes` (most important first: the first change to a flag wins) to the run's commands."""
    out = Suggestion(original=original)
    cmds = list(original.commands) if original else []
    seen: set[str] = set()
    for change in changes:
        if isinstance(change, ProposedChange):
            flag, to, from_source = change.flag, change.to, change.from_source
        else:
            flag, to, from_source = change["flag"], change.get("to"), change.get("from_source")
        flag = normalize_flag(flag)
        if dest_of(flag) in seen:  # one setting, whatever spelling each finding used for it
            continue
        seen.add(dest_of(flag))
        if not cmds:
            action = "remove" if to is None else "edit" if from_source == "given" else "add"
            out.applied.append(AppliedChange(flag, action, to, None, "the command you ran is not known"))
            continue
        idx = _target(cmds, flag)
        if idx is None:
            out.applied.append(AppliedChange(flag, "none", to, None, "not an option of the commands this run used"))
            continue
        cmds[idx], action, note = cmds[idx].apply(flag, to)
        out.applied.append(AppliedChange(flag, action, to, idx, note))
    if original and any(a.action != "none" for a in out.applied):
        out.commands = cmds
        if check:
            out.checks = [_check(c) for c in cmds]
    return out


def _check(cmd: VllmCommand) -> CommandCheck:
    result = cmd.check()
    return CommandCheck(cmd.shell(), result.ok, result.by, result.problems, " ".join(["vllm", *cmd.subcommand]))
