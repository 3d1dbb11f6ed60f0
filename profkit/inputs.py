"""Reading the user's input files safely: regular files only, bounded sizes.

A FIFO or a device given as a log would block or never end; a huge "rule file" would exhaust memory.
Every reader of user files goes through `require_file` / `read_text`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from profkit.errors import ProfkitError
from profkit.escape import one_line
from profkit.numbers import json_int_literal

MiB = 1 << 20
LIMITS = {"rule file": 1 * MiB, "benchmark JSON": 16 * MiB, "vLLM log": 512 * MiB, "metrics file": 64 * MiB,
          "capture manifest": 4 * MiB, "report JSON": 512 * MiB, "host samples": 64 * MiB, "model config": 4 * MiB}

def require_file(path: Path, what: str) -> int:
    """The size of `path`, which must be a regular file (a symlink to one is fine); else one clear error."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ProfkitError(f"{path}: no such file ({what})") from None
    except OSError as exc:
        raise ProfkitError(f"{path}: {exc.strerror} ({what})") from None
    if stat.S_ISDIR(st.st_mode):
        raise ProfkitError(f"{path}: a folder, not a {what}")
    if not stat.S_ISREG(st.st_mode):
        raise ProfkitError(f"{path}: not a regular file (a FIFO, socket or device); a {what} must be a file")
    return st.st_size


def read_text(path: Path, what: str) -> str:
    """The file's text (UTF-8, undecodable bytes replaced), refusing non-files and files over the limit."""
    path = Path(path)
    size = require_file(path, what)
    limit = LIMITS.get(what, 64 * MiB)
    if size > limit:
        raise ProfkitError(f"{path}: {size / MiB:.0f} MiB is more than a {what} can be ({limit / MiB:.0f} MiB)")
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ProfkitError(f"{path}: {exc.strerror}") from None
    if len(data) > limit:  # grew while read
        raise ProfkitError(f"{path}: more than a {what} can be ({limit / MiB:.0f} MiB)")
    if b"\x00" in data[:65536]:
        raise ProfkitError(f"{path}: binary data, not a {what}")
    return data.decode("utf-8", errors="replace")


def read_json(path: Path, what: str, bad: str = "not JSON") -> Any:
    """The file's JSON (through `read_text`'s checks, so its size is bounded); a parse error or nesting too deep for
    the parser is one line: `{path}: {bad} (why)`. An integer of more digits than any measurement has reads as an
    infinity (`numbers.json_int_literal`): each reader leaves out what is not a finite number."""
    import json

    try:
        return json.loads(read_text(path, what), parse_int=json_int_literal)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ProfkitError(f"{path}: {bad} ({one_line(exc, 120)})") from None


def refuse_overwrite(output: Path, inputs: list[Path], what: str = "output", protected: tuple[str, ...] = ()) -> None:
    """An output never lands on an input: the same path, the same file through a symlink or a hard link, or,
    where an input is a folder, one of its `protected` files (a capture folder's own)."""
    output = Path(output)
    if output.is_dir():
        raise ProfkitError(f"{output}: is a directory, not a file; refusing to write the {what} there")
    if output.exists() and not output.is_file():
        raise ProfkitError(f"{output}: not a regular file; refusing to write the {what} there")
    for inp in (Path(i) for i in inputs):
        same = os.path.realpath(output) == os.path.realpath(inp)
        if not same and output.exists() and inp.exists():
            try:
                same = os.path.samefile(output, inp)
            except OSError:
                same = False
        if not same and inp.is_dir() and output.name in protected:
            same = Path(os.path.realpath(output)).is_relative_to(os.path.realpath(inp))
        if same:
            shown = "" if str(inp) == str(output) else f" ({inp})"
            raise ProfkitError(f"{output}: is one of the inputs{shown}; refusing to write the {what} over it")
