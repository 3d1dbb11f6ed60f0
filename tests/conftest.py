"""Shared test fixtures: the real H100 traces in tests/data/fixtures, decompressed once per session."""

from __future__ import annotations

import importlib.util
import lzma
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run and machine (no seed from the clock, no database of earlier
# failures replayed): a run's result depends on the code alone. Explore further locally with a seed of your own
# (`pytest --hypothesis-seed=N`) or PROFKIT_FUZZ_EXAMPLES (tests/test_fuzz.py).
settings.register_profile("profkit", derandomize=True, database=None)
settings.load_profile("profkit")

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "data" / "fixtures"
GROUND_TRUTH = Path(__file__).resolve().parent / "ground_truth"
TOY = ["chunked_prefill", "eager_b1", "eager_b64", "graphs_b1", "graphs_b64", "hostgap_b16",
       "prefill_long", "swap_b16", "sync_b16"]


def fixture_xz(name: str) -> Path:
    if name == "serve_frontend":  # 1 s of a frontend-bound `vllm serve` under nsys (tests/data/h100_host.tar.xz)
        return REPO / "tests" / "data" / "h100_serve_frontend_slice.sqlite.xz"
    if name == "thr_graphs":
        return FIXTURES / "h100_vllm" / "thr_graphs.sqlite.xz"
    return FIXTURES / "h100_toy" / name / f"{name}.sqlite.xz"


@pytest.fixture(scope="session")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"fixtures not found at {FIXTURES}: the repository is incomplete")
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="session")
def sqlite_path(trace_dir: Path):
    """Function giving the decompressed path of a fixture trace, decompressing on first use."""

    def get(name: str) -> Path:
        out = trace_dir / f"{name}.sqlite"
        if not out.exists():
            tmp = out.with_suffix(".part")
            with lzma.open(fixture_xz(name)) as src, tmp.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            tmp.rename(out)
            out.chmod(0o444)  # the reader must never need to write
        return out

    return get


@pytest.fixture(scope="session")
def report_all(sqlite_path):
    """Cached `build_report(..., window='all')` per fixture."""
    from profkit.report import ReportOptions, build_report

    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = build_report(sqlite_path(name), options=ReportOptions(window="all")).document()
        return cache[name]

    return get


def script(name: str) -> ModuleType:
    """One of scripts/*.py loaded as a module (the validation scripts' readers, which the tests share)."""
    path = Path(__file__).parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unpack(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """tests/data/NAME.tar.xz unpacked into a fresh temp folder: the folder NAME it holds."""
    import tarfile

    folder = tmp_path_factory.mktemp(name)
    with tarfile.open(Path(__file__).parent / "data" / f"{name}.tar.xz") as tar:
        tar.extractall(folder, filter="data")
    return folder / name


def _contents(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under `root`: its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="session")
def h200_model_led(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The H200 recordings of the leases that tested the model (tests/data/h200_model_led.tar.xz; its README says what
    each is), unpacked once per session (137 MB) and shared: read them, never write into them (a run's folder is the
    user's evidence; copy it first). The session's end checks that nothing in them was changed, added or removed."""
    root = unpack(tmp_path_factory, "h200_model_led")
    before = _contents(root)
    yield root
    assert _contents(root) == before, f"a test wrote into the shared recordings at {root}: copy a run before writing"


@pytest.fixture(scope="session")
def h100_tune(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real `profkit tune` folders and default-config captures from the H100 (tests/data/h100_tune.tar.xz;
    its README says what each is)."""
    return unpack(tmp_path_factory, "h100_tune")


@pytest.fixture(scope="session")
def h100_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real runs of a frontend-bound vLLM server on the H100: tune from the defaults, the by-hand A/B, the
    GPU-bound control, an nsys capture (tests/data/h100_host.tar.xz; its README says what each is)."""
    return unpack(tmp_path_factory, "h100_host")
