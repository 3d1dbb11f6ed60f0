"""Kernel names a reader can tell apart.

A demangled kernel name runs to hundreds of characters (`void cutlass::device_kernel<flash::...<(int)64, ...>>(...)`)
and its short name (nsys's, or the function's own name) is shared by every instantiation of a template: FlashAttention's
forward kernel for 64- and 128-token tiles and its combine kernel are all `device_kernel`. Clipped, the full names
look identical too. `distinct_labels` gives each name of a set the short name plus just enough of its template
arguments to tell it from the others of the set (the report's kernels; both sides of a diff):

    device_kernel<FlashAttnFwdSm90 … 64>   device_kernel<FlashAttnFwdSm90 … 128>   device_kernel<FlashAttnFwdCombine>
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping

# identifiers, template integer arguments written as (int)64 / (bool)1, and bare integers
_TOKEN = re.compile(r"\((?:unsigned )?(?:int|bool|long|char|short)\)-?\d+|[A-Za-z_]\w*|-?\d+")
_IDENTIFIER = re.compile(r"~?[A-Za-z_]\w*")
_MAX_EXTRA = 4  # tokens added to a label before falling back to a number


def base_name(name: str) -> str:
    """The function's own name: no return type, namespace, template arguments or parameters
    (`void at::native::elementwise_kernel<128, 4, ...>(int, T3)` -> `elementwise_kernel`)."""
    head, depth = [], 0
    for ch in name:  # the text outside every <...> and (...)
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif not depth:
            head.append(ch)
    words = "".join(head).split()
    last = words[-1].rsplit("::", 1)[-1] if words else ""
    # only a C++ signature has a base name; any other text (a Triton kernel, a clipped name) is its own
    signature = any(c in name for c in "<(:") and not name.lstrip().startswith(("<", "(", "["))
    return last if signature and _IDENTIFIER.fullmatch(last) else name


def _tokens(name: str) -> list[str]:
    return [t.rsplit(")", 1)[-1] if t.startswith("(") else t for t in _TOKEN.findall(name)]


def _label(base: str, extra: list[str]) -> str:
    shown = [e for e in extra if e]
    return f"{base}<{' … '.join(shown)}>" if shown else base


def distinct_labels(short_names: Mapping[str, str | None]) -> dict[str, str]:
    """Each full name's label: its short name (else `base_name`), with template arguments added where two names
    of the set would otherwise read the same."""
    bases = {n: (s if s and s != n else base_name(n)) for n, s in short_names.items()}
    groups: dict[str, list[str]] = defaultdict(list)
    for n, b in bases.items():
        groups[b].append(n)
    labels = dict(bases)
    for base, names in groups.items():
        if len(names) < 2:
            continue
        toks = {n: _tokens(n) for n in names}
        # first the class a template wraps (FlashAttnFwdSm90, FlashAttnFwdCombine), where the set's differ
        heads = {n: next((t for t in toks[n] if t[0].isupper() and len(t) > 2 and t != base), "") for n in names}
        extra = {n: [heads[n]] if len(set(heads.values())) > 1 else [] for n in names}
        for _ in range(_MAX_EXTRA):
            by_label: dict[str, list[str]] = defaultdict(list)
            for n in names:
                by_label[_label(base, extra[n])].append(n)
            clashes = [c for c in by_label.values() if len(c) > 1]
            if not clashes:
                break
            for clash in clashes:  # the first argument where the clashing names part
                seqs = [toks[n] for n in clash]
                i = next((i for i in range(max(map(len, seqs)))
                          if len({s[i] if i < len(s) else None for s in seqs}) > 1), None)
                for n in clash:
                    extra[n].append(toks[n][i] if i is not None and i < len(toks[n]) else "")
        seen: dict[str, int] = defaultdict(int)
        for n in sorted(names):  # names equal up to what a label shows (differing only in punctuation): numbered
            label = _label(base, extra[n])
            seen[label] += 1
            labels[n] = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return labels
