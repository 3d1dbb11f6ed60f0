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
- `shell(argv)` / `shell_word(word)`: a command line a person can paste, exactly the argv it stands for, on one
  line: `shlex.quote` per word, and a word holding a control, format or line-separator character (a newline in
  `--out`, an ESC in a model name, a byte that is not UTF-8) in ANSI-C quoting (`$'a\nb'`: bash, zsh, ksh,
  busybox sh and POSIX sh since 2024), its characters as escapes: no raw control character reaches the terminal.

HTML is escaped by Jinja's autoescape (`profkit.render.html.environment`): every value an HTML template
prints is escaped there; the page then goes through `document`.
"""

from __future__ import annotations

import re
import shlex
import unicodedata
from collections.abc import Iterable

_C0 = [c for c in range(0x20) if c not in (0x09, 0x0A)]  # every C0 control but tab and newline
_C1 = list(range(0x80, 0xA0))
_DEL = 0x7F

# bidi embeddings, overrides, isolates and marks: text from a trace that reorders what the reader sees ("Trojan
# Source"); the terminal drops every format character, a document these
_BIDI = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_DOCUMENT = dict.fromkeys([*_C0, _DEL, *_C1, *_BIDI])
_TERMINAL = {**_DOCUMENT, 0x09: " ", 0x0A: " "}
# one_line's own: a newline is dropped, not made a space (as it always was); C1 controls go too (0x9B is a CSI).
_ONE_LINE = dict.fromkeys([*_C0, 0x0A, _DEL, *_C1])
# Unicode format (bidi overrides, zero-width characters, soft hyphen) and line/paragraph separators.
_INVISIBLE = ("Cf", "Zl", "Zp")

_MARKDOWN = str.maketrans({"\\": "\\\\", "|": "\\|", "`": "'", "*": "\\*", "_": "\\_", "[": "\\[", "]": "\\]",
                           "~": "\\~", "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def _visible(text: str) -> str:
    if text.isascii():
        return text
    return "".join(ch if ch.isprintable() else _shown(ch) for ch in text)


def _shown(ch: str) -> str:
    """A character that is not printable: a space for a space (NBSP...), U+FFFD for what no font shows (half a
    surrogate pair - a byte that was not UTF-8 -, private use, unassigned), nothing for format and separators."""
    category = unicodedata.category(ch)
    if category == "Zs":
        return " "
    return "\ufffd" if category in ("Cs", "Co", "Cn") else ""


def terminal(text: object) -> str:
    """One value for a terminal line: control, format and bidi characters out, a newline or tab a space."""
    return _visible(str(text).translate(_TERMINAL))


def document(text: str) -> str:
    """A rendered document without control characters (terminal escapes, CR, NUL) or bidi controls; newlines and
    tabs stay.
    Trace strings (kernel names, NVTX text) reach every format: this is the last line of defence."""
    return text.translate(_DOCUMENT)


def markdown(value: object) -> str:
    """One value in Markdown: `terminal`'s clean-up, then `\\ | * _ [ ] ~` backslash-escaped, `< > &` as
    entities, a backtick as `'` (no link, emphasis, table cell break or raw HTML from a kernel name)."""
    return terminal(value).translate(_MARKDOWN)


def one_line(text: object, limit: int = 300) -> str:
    """A message fit for one terminal line: control, format and bidi characters and newlines out, bounded
    length."""
    s = " ".join(_visible(str(text).translate(_ONE_LINE)).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


_ANSI_C = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _ansi_c(ch: str) -> str:
    """One character inside `$'...'`: itself where printable, else an escape."""
    if ch in _ANSI_C:
        return _ANSI_C[ch]
    if ch.isprintable():
        return ch
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (Python's surrogateescape): that byte
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x80:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def shell_word(word: str) -> str:
    """One argument for a printed command line: `shlex.quote`'s own, or `$'...'` where the word holds a character
    that is not printable (control, format, bidi, line separator, a byte that is not UTF-8), each such
    character then an escape (`\\n`, `\\x1b`, `\\u202e`)."""
    if word.isprintable():
        return shlex.quote(word)
    out = []
    for i, ch in enumerate(word):
        out.append(_ansi_c(ch))
        if out[-1][:2] in ("\\x", "\\u", "\\U") and word[i + 1:i + 2] in _HEX:
            out.append("'$'")  # `\x1b` then `c`: no shell may read `\x1bc` as one escape
    return "$'" + "".join(out) + "'"


_HEX = set("0123456789abcdefABCDEF")


_RESERVED = {"case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function", "if", "in", "select",
             "then", "time", "until", "while"}


def shell(argv: Iterable[str]) -> str:
    """A command line, each word through `shell_word`: pasted into a shell it runs exactly `argv` (a program
    named like a reserved word or an assignment is quoted: unquoted, a shell reads it as one)."""
    argv = list(argv)
    words = [shell_word(w) for w in argv]
    if words and words[0] == argv[0] and (argv[0] in _RESERVED or re.match(r"[A-Za-z_][A-Za-z0-9_]*\+?=", argv[0])):
        words[0] = "'" + argv[0] + "'"
    return " ".join(words)
