"""Traces nobody here wrote (tests/data/foreign, README there): old and re-serialized Kineto, AMD ROCm,
Blackwell, nsys exports from ~2021 to 2024. Every expected figure is computed here from the file's own
events (JSON or SQL), independently of profkit's readers."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

from profkit.report import ReportOptions, build_report
from tests.cli import profkit

DATA = Path(__file__).parent / "data" / "foreign"
KINETO = sorted(p.name.removesuffix(".json.gz") for p in DATA.glob("*.json.gz"))
NSYS = ["extrap_con_kernel", "extrap_exgpu_s10_2021", "mordred", "nvfuser_2024_6"]
HIP_LAUNCH = {"hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel"}
CUDA_LAUNCH = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"}
GRAPH_LAUNCH = {"cudaGraphLaunch", "hipGraphLaunch"}


def events(name: str) -> tuple[dict | list, list[dict]]:
    with gzip.open(DATA / f"{name}.json.gz") as f:
        doc = json.load(f)
    return doc, doc if isinstance(doc, list) else doc["traceEvents"]


def own_kernels(evs: list[dict]) -> list[dict]:
    """Kernel events in any spelling Kineto ever used (`kernel`, legacy `Kernel`)."""
    return [e for e in evs if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]


def own_runtime(evs: list[dict]) -> list[dict]:
    return [e for e in evs if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime")]


@pytest.fixture(scope="module")
def reports() -> dict:
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            cache[name] = build_report(DATA / f"{name}.json.gz", options=ReportOptions(window="all")).document()
        return cache[name]

    return get


@pytest.mark.parametrize("name", KINETO)
def test_kineto_counts_equal_the_traces_own_events(reports, name: str) -> None:
    doc, evs = events(name)
    kernels = own_kernels(evs)
    f = reports(name)["facts"]
    assert f["kernels.count"] == len(kernels) > 0
    assert f["kernels.total_ns"] == sum(round(e["dur"] * 1000) for e in kernels)
    launches = [e for e in own_runtime(evs) if e["name"] in HIP_LAUNCH | CUDA_LAUNCH]
    assert f["launch.calls"] == len(launches)
    # graph replays: the kernels whose correlation id is a graph launch's
    graph_corr = {e["args"]["correlation"] for e in own_runtime(evs) if e["name"] in GRAPH_LAUNCH}
    replayed = sum(1 for e in kernels if e.get("args", {}).get("correlation") in graph_corr)
    assert f["kernels.graph_share"] == pytest.approx(replayed / len(kernels))
    # the GPU's name wherever the file keeps it: before or after the events, or in computeProperties
    props = [] if isinstance(doc, list) else doc.get("deviceProperties") or doc.get("computeProperties") or []
    assert reports(name)["source"]["gpu"] == (props[0]["name"] if props else None)


def test_legacy_spelling_and_metadata_after_the_events(reports) -> None:
    """torch 1.8-era Kineto: capitalized categories; a rank written after the events."""
    _, evs = events("hta_legacy_inference_rank1")
    assert {e.get("cat") for e in evs} >= {"Kernel", "Runtime"}
    rep = reports("hta_legacy_inference_rank1")
    assert rep["source"]["rank"] == 1 and rep["facts"]["kernels.count"] == 4
    doc, evs = events("kineto_legacy_toplevel_list")
    assert isinstance(doc, list) and any(str(e.get("tid", "")).startswith("stream ") for e in evs)
    assert reports("kineto_legacy_toplevel_list")["facts"]["sync.calls"] == sum(
        1 for e in own_runtime(evs) if e["name"] in ("cudaDeviceSynchronize", "cudaStreamSynchronize"))


def test_amd_rocm_is_read_whole(reports) -> None:
    """MI300X: HIP launches counted, Tensile GEMMs are GEMMs, hipGraphLaunch replays are graph kernels."""
    _, evs = events("tracelens_mi300_bert_small")
    rep = reports("tracelens_mi300_bert_small")
    assert rep["source"]["gpu"] == "AMD Instinct MI300X VF"
    cijk = sum(1 for e in own_kernels(evs) if e["name"].startswith("Cijk_"))
    cats = {c["category"]: c["count"] for c in rep["categories"]}
    assert cijk > 0 and cats["gemm"] >= cijk
    assert rep["facts"]["launch.calls"] > 0
    hip = reports("tracelens_mi300_sglang_hipgraph")["facts"]
    assert hip["kernels.graph_share"] > 0.9 and hip["launch.graph_launches"] > 0


def test_vllm_advice_only_on_vllm_runs(reports) -> None:
    """No vLLM flag on a run not shown to be vLLM's: training, a BERT, SGLang (whose ROCm attention kernel
    names `vllm::` in a template argument). A vLLM run known by its own kernel names is one."""
    for name in ("hta_amd_mi250_minitoy", "hta_a100_cudagraph_nccl", "tracelens_mi300_sglang_hipgraph",
                 "tracelens_h100_bert_small"):
        rep = reports(name)
        assert rep["run"]["vllm"] == [] and "no evidence this is a vLLM run" in rep["run"]["note"]
        assert all(f["changes"] == [] for f in rep["findings"]) and rep["suggested_command"] is None
        assert not any(k.startswith("config.") and v is not None for k, v in rep["facts"].items())
    _, evs = events("tracelens_b200_vllm_eager")
    assert any(e["name"].startswith("void vllm::") for e in own_kernels(evs))
    rep = reports("tracelens_b200_vllm_eager")
    assert rep["run"]["vllm"] == ["vLLM kernel or annotation names in the trace"]
    assert rep["source"]["gpu"] == "NVIDIA B200" and rep["facts"]["config.max_num_seqs"] is not None


def test_communication_kernels_are_named(reports) -> None:
    _, evs = events("hta_a100_cudagraph_nccl")
    nccl = sum(1 for e in own_kernels(evs) if "nccl" in e["name"].lower())
    cats = {c["category"]: c["count"] for c in reports("hta_a100_cudagraph_nccl")["categories"]}
    assert nccl > 0 and cats["communication"] == nccl


@pytest.fixture(scope="module")
def nsys_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("foreign_nsys")

    def get(name: str) -> Path:
        out = folder / f"{name}.sqlite"
        if not out.exists():
            with lzma.open(DATA / f"{name}.sqlite.xz") as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            out.chmod(0o444)
        return out

    return get


@pytest.mark.parametrize("name", NSYS)
def test_nsys_exports_2021_to_2024(nsys_file, name: str) -> None:
    path = nsys_file(name)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.text_factory = bytes
    count, total = conn.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    tables = {r[0].decode() for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in tables), None)
    version = (conn.execute(f"SELECT value FROM {meta_table} WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()[0]
               .decode() if meta_table else None)
    gpu_col = "id" if b"id" in {r[1] for r in conn.execute("PRAGMA table_info(TARGET_INFO_GPU)")} else "deviceId"
    gpu = conn.execute(f"SELECT name FROM TARGET_INFO_GPU ORDER BY {gpu_col} LIMIT 1").fetchone()[0].decode()
    conn.close()
    rep = build_report(path, options=ReportOptions(window="all")).document()
    assert rep["facts"]["kernels.count"] == count > 0 and rep["facts"]["kernels.total_ns"] == total
    assert rep["source"]["tool_version"] == version and rep["source"]["gpu"] == gpu
    assert rep["run"]["vllm"] == [] and all(f["changes"] == [] for f in rep["findings"])


def test_nsys_2022_metadata_and_the_oldest_gpu_table(nsys_file) -> None:
    """2022.1 kept its metadata in EXPORT_META_DATA (with a Latin-1 user name); ~2021 had no metadata
    table and a five-column TARGET_INFO_GPU keyed by deviceId."""
    everything = ReportOptions(window="all")
    assert build_report(nsys_file("extrap_con_kernel"), options=everything).source["tool_version"] == "2022.1.1.61"
    assert build_report(nsys_file("extrap_exgpu_s10_2021"), options=everything).source["gpu"] == "A100-PCIE-40GB"


def test_export_without_cuda_kernels_is_one_line(nsys_file) -> None:
    path = nsys_file("lighttransport_gemm")
    r = profkit("report", path)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert str(path) in r.stderr and "no CUDA kernel table" in r.stderr


def test_report_help_names_every_input_kind() -> None:
    r = profkit("report", "--help")
    for kind in ("nsys SQLite", "torch", ".json.gz", "capture folder", "ROCm"):
        assert kind in r.stdout, kind
