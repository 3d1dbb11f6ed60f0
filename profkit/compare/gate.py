"""`profkit diff --fail-on COND`: a CI gate over a diff's metrics, parsed without eval.

    request_throughput<-5%    the relative change (after vs before) is below -5 %
    p99_ttft_ms>+10%          the relative change is above +10 %
    gpu.utilization<-0.05     a signed number without %: the absolute change (after - before)
    p99_ttft_ms>2000          an unsigned number: the AFTER value itself

A relative change from a BEFORE of 0 is infinite in the direction AFTER moved: 0 -> 31 preemptions is +inf %, so
`vllm.preemptions>+0%` (or >+10%) holds and the gate fails; 0 -> 0 is no change (0 %), and a condition on a fall
(`<-5%`) does not hold for a rise from 0.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any

from profkit.compare.metrics import canonical
from profkit.errors import ProfkitError

_COND = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]{0,80})\s*(<=|>=|<|>)\s*([+-]?)(\d{1,15}(?:\.\d{1,15})?)\s*(%?)\s*")
_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass(frozen=True)
class Condition:
    text: str
    metric: str
    op: str
    value: float
    kind: str  # "relative" (change %), "absolute" (change), "value" (the after value)

    def holds(self, actual: float | None) -> bool:
        """Does `actual` (a change %, a change or a value, as `kind` says) meet the condition? Unknown: no."""
        return actual is not None and _OPS[self.op](actual, self.value)


FAIL_ON_EXAMPLES = "'request_throughput<-5%', 'p99_ttft_ms>+10%', 'gpu.utilization<-0.05', 'p99_ttft_ms>2000'"


def parse_condition(text: str, option: str = "--fail-on", examples: str = FAIL_ON_EXAMPLES) -> Condition:
    """`METRIC<OP>VALUE`; a text that is not one is a line naming `option` (the flag it came with) and `examples`."""
    m = _COND.fullmatch(text)
    if not m:
        raise ProfkitError(f"{option} {text!r}: expected METRIC<OP>VALUE, e.g. {examples}")
    name, op, sign, number, percent = m.groups()
    value = float(sign + number)
    kind = "relative" if percent else "absolute" if sign else "value"
    return Condition(text.strip(), canonical(name), op, value, kind)


def check(doc: dict[str, Any], conditions: list[Condition]) -> list[str]:
    """The conditions that hold (each a failure), said with the numbers; a metric the diff lacks is an error."""
    rows = {r["name"]: r for r in doc["metrics"]}
    failed = []
    for c in conditions:
        row = rows.get(c.metric)
        if row is None:
            known = ", ".join(sorted(rows)) or "none"
            raise ProfkitError(f"--fail-on {c.text!r}: the diff has no metric {c.metric!r} (it has: {known})")
        if c.kind == "relative":
            if row["change_pct"] is None:  # from 0: infinite, in the direction the value moved
                actual = math.copysign(math.inf, row["change"]) if row["change"] else 0.0
                shown = "from 0" if row["change"] else "0 %"
            else:
                actual, shown = row["change_pct"], f"{row['change_pct']:+.1f} %"
        elif c.kind == "absolute":
            actual, shown = row["change"], f"{row['change']:+g}"
        else:
            actual, shown = row["after"], f"{row['after']:g}"
        if c.holds(actual):
            failed.append(f"{c.text}: {c.metric} {row['before']:g} -> {row['after']:g} ({shown}; {row['verdict']})")
    return failed
