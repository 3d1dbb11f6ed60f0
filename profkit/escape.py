"""Escaping, one function per output: the one home of control-character handling.

Kernel names, NVTX ranges, process names, paths, labels and flag values come from traces, logs and users;
they reach every output. Each output has one escaper here, and nothing here imports profkit:

- `terminal(text)`: one value on a terminal line (the text report, the diff, the tune summary, the history
  table): control characters (ESC, CR, NUL, DEL, C1) and Unicode format, bidi and line/paragraph separator
  characters out, a newline or a tab becomes a space.
- `document(text)`: a whole rendered document (text, Markdown, HTML), the last line of defence: control
  characters out, newlines and tabs stay.
- `markdown(value)`: one value in a Markdown table cell or paragraph: `terminal`'s clean-up, then every
  character Markdown (or the HTML it may carry) would act on escaped; a backtick becomes `'` (a value may sit
  inside a code span, where no escape works).
- `one_line(text, limit)`: an error message for one terminal line, bounded.

HTML is escaped by Jinja's autoescape (`profkit.render.html.environment`): every value an HTML template
prints is escaped there; the page then goes through `document`.
"""

from __future__ import annotations

import unicodedata

_C0 = [c for c in range(0x20) if c not in (0x09, 0x0A)]  # every C0 control but tab and newline
_C1 = list(range(0x80, 0xA0))
_DEL = 0x7F

_DOCUMENT = dict.fromkeys([*_C0, _DEL, *_C1])
_TERMINAL = {**_DOCUMENT, 0x09: " ", 0x0A: " "}
# one_line's own (as it always was): C1 characters stay; a newline is dropped, not made a space.
_ONE_LINE = dict.fromkeys([*_C0, 0x0A, _DEL])
# Unicode format (bidi overrides, zero-width characters, soft hyphen) and line/paragraph separators.
_INVISIBLE = ("Cf", "Zl", "Zp")

_MARKDOWN = str.maketrans({"\\": "\\\\", "|": "\\|", "`": "'", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]",
                           "~": "\\~", "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _visible(text: str) -> str:
    if text.isascii():
        return text
    return "".join(ch for ch in text if unicodedata.category(ch) not in _INVISIBLE)


def terminal(text: object) -> str:
    """One value for a terminal line: control, format and bidi characters out, a newline or tab a space."""
    return _visible(str(text).translate(_TERMINAL))


def document(text: str) -> str:
    """A rendered document without control characters (terminal escapes, CR, NUL); newlines and tabs stay.
    Trace strings (kernel names, NVTX text) reach every format: this is the last line of defence."""
    return text.translate(_DOCUMENT)


def markdown(value: object) -> str:
    """One value in Markdown: `terminal`'s clean-up, then `\\ | * _ [ ] ~` backslash-escaped, `< > &` as
    entities, a backtick as `'` (no link, emphasis, table cell break or raw HTML from a kernel name)."""
    return terminal(value).translate(_MARKDOWN)


def one_line(text: object, limit: int = 300) -> str:
    """A message fit for one terminal line: control characters and newlines out, bounded length."""
    s = " ".join(str(text).translate(_ONE_LINE).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"
