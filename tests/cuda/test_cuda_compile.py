"""Offline build check (no GPU): every .cu of ninfer/kernels_cuda compiles for sm_90 with nvcc,
with every kernel instance its launcher declares; the params structs mirror the C layouts."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from ninfer.kernels_cuda import _nvcc
from ninfer.kernels_cuda._loader import expand_source

pytestmark = pytest.mark.skipif(_nvcc.nvcc_path() is None, reason="nvcc not installed")


def test_every_module_compiles_for_sm90():
    sources = _nvcc.all_sources()
    assert {s.file for s in sources} >= {
        "attention.cu", "attention_prefill.cu", "attn_prep.cu", "elementwise.cu", "embedding.cu",
        "gdn.cu", "gdn_chunk.cu",
        "gdn_decode.cu", "linear.cu", "moe.cu", "norm.cu", "rope.cu", "sampling.cu"}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda s: _nvcc.compile_source(s, check_only=True), sources))
    failed = {r.source.file: r.log[-3000:] for r in results if r.returncode != 0}
    assert not failed, failed


def test_local_headers_are_inlined_once():
    text = expand_source(_nvcc.PACKAGE_DIR / "moe.cu")
    assert '#include "' not in text
    assert text.count("struct WVec<bf16raw>") == 1  # gemv.cuh
    assert text.count("__device__ __forceinline__ float warp_sum") == 1  # common.cuh via gemv.cuh


def test_resource_report_parser():
    log = ("ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'\n"
           "ptxas info    : Function properties for _Z3fooPf\n"
           "    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem, "
           "360 bytes cmem[0]\n")
    (k,) = _nvcc.parse_resources(log)
    assert (k.mangled, k.registers, k.smem_bytes, k.stack_bytes, k.spill_stores, k.spill_loads) \
        == ("_Z3fooPf", 40, 2048, 16, 4, 8)
