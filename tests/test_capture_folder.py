"""The capture folder: one class knows its files (CaptureFolder), on real folders written by `profkit capture` on
the H100; and no other module spells a capture folder's file names."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from profkit.evidence import folder as files
from profkit.evidence.folder import CaptureFolder
from tests.conftest import FIXTURES, REPO

SAMPLE = REPO / "samples" / "capture_thr_torch"


def test_reads_a_real_serve_capture(h100_host: Path) -> None:
    folder = CaptureFolder(h100_host / "ctl")
    assert CaptureFolder.recognise(folder.path) and folder.traces() == []
    assert folder.log_path.name == files.SERVER_LOG and len(folder.metrics()) == 2
    assert folder.bench().requests_per_second > 11 and folder.host().cores == 16
    user = folder.user_command()
    assert user.source == "capture manifest" and [c.role for c in user.commands] == ["server", "client"]
    assert user.commands[0].model == "/tmp/big" and user.commands[1].value("--num-prompts") == 400


def test_reads_the_bundled_torch_sample() -> None:
    folder = CaptureFolder(SAMPLE)
    assert [p.relative_to(SAMPLE).parts[0] for p in folder.traces()] == [files.TORCH_DIR]
    assert folder.log_path.name == files.BENCH_LOG and folder.host() is None
    # recorded through a wrapper script (`/tmp/vllmw`) in vllm's place: the command is still the manifest's, with
    # what capture added for the profiler and the folder taken off
    user = folder.user_command()
    assert user is not None and user.source.startswith("capture manifest")
    assert user.commands[0].argv() == ["vllm", "bench", "throughput", "--model", "/tmp/tiny", "--dataset-name",
                                       "random", "--random-input-len", "512", "--random-output-len", "32",
                                       "--num-prompts", "32", "--max-model-len", "2048"]
    assert folder.manifest().vllm_args.startswith("--model /tmp/tiny --dataset-name random")


def test_old_manifests_lose_what_capture_added(tmp_path: Path) -> None:
    """A manifest from before `user_commands`: the recorded lines, nsys and the folder's outputs taken off."""
    folder = tmp_path / "c"
    shutil.copytree(FIXTURES / "h100_vllm" / "capture_thr_eager", folder)
    user = CaptureFolder(folder).user_command()
    assert user.source.startswith("capture manifest")
    assert "--output-json" not in user.commands[0].args and user.commands[0].program == ["vllm"]


def test_writes_through_the_folder(tmp_path: Path) -> None:
    folder = CaptureFolder(tmp_path)
    folder.write_host({"schema": "profkit.host/1", "cores": 2, "processes": []})
    folder.write_metrics("before", "# empty\n")
    assert folder.host().cores == 2 and folder.metrics_paths == [tmp_path / files.METRICS_BEFORE]
    assert not CaptureFolder.recognise(tmp_path)  # samples alone are no capture
    (tmp_path / files.BENCH).write_text("{}")
    assert CaptureFolder.recognise(tmp_path)


def test_file_names_are_spelled_in_one_module() -> None:
    """Every capture file name lives in profkit/evidence/folder.py; any other module naming one (in code, not in
    prose) is a second home."""
    names = [getattr(files, n) for n in dir(files) if n.isupper() and isinstance(getattr(files, n), str)
             and "." in getattr(files, n)]
    assert {"manifest.json", "bench.json", "server.log", "trace.sqlite", "host.json"} <= set(names)
    quoted = re.compile("|".join(re.escape(f'"{n}"') for n in names))
    found = []
    for path in (REPO / "profkit").rglob("*.py"):
        if path == Path(files.__file__):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if quoted.search(code) and not code.strip().startswith(('"', "'")):
                found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert found == []
