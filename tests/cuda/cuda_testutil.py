"""Helpers for the GPU kernel tests: fresh random inputs on the device, NaN-poisoned outputs,
float64 oracles from `ninfer.ops.reference`, and relative-error / bitwise comparisons.

Every test draws new random data (the seed is printed), never zeros, and poisons outputs with NaN
so an unwritten element fails the comparison.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import numpy as np

from ninfer.core.dtypes import DType, f32_to_bf16_bits
from ninfer.core.tensor import Weight
from ninfer.ops import reference as ref

TOL_F32 = 2e-5   # fp32 kernels vs float64 (reductions of a few thousand terms, tree order)
TOL_BF16_X = 1e-2  # paths that round activations to bf16 (cuBLAS prefill)
DTYPES = (DType.FLOAT32, DType.BFLOAT16)


def cp():
    import cupy

    return cupy


def randn(rng, shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def weight_pair(rng, shape, dtype: DType, scale: float = 1.0) -> tuple[Weight, Weight]:
    """(host Weight for the reference, the same Weight on the device)."""
    values = (rng.standard_normal(shape) * scale).astype(np.float32)
    data = f32_to_bf16_bits(values) if dtype is DType.BFLOAT16 else values
    host = Weight(data, dtype)
    return host, Weight(cp().asarray(data), dtype)


def tiled_experts(rng, experts: int, hidden: int, inter: int, sub: int | None = None):
    """(gate_up, down, gate_up host, down host): `experts` bf16 MoE experts on the device
    (gate_up [E, 2 Im, H], down [E, H, Im], scaled by 1 / sqrt(K)) whose weights repeat those of
    `sub` random ones (expert e has expert e % sub's; None: every expert random), and the random
    experts' host Weights for float64 oracles."""
    k = sub or experts
    gu_h, gu = weight_pair(rng, (k, 2 * inter, hidden), DType.BFLOAT16, hidden ** -0.5)
    dn_h, dn = weight_pair(rng, (k, hidden, inter), DType.BFLOAT16, inter ** -0.5)
    if sub:
        reps = -(-experts // sub)
        gu = Weight(cp().tile(gu.data, (reps, 1, 1))[:experts], DType.BFLOAT16)
        dn = Weight(cp().tile(dn.data, (reps, 1, 1))[:experts], DType.BFLOAT16)
    return gu, dn, gu_h, dn_h


@contextlib.contextmanager
def launch_names(*modules, attrs: tuple[str, ...] = ("launch",)):
    """Inside the block, every call of `module.<attr>` (each of `attrs` the module has) appends
    its `name` keyword to the yielded list, in call order; the originals are restored on exit."""
    names: list = []
    spied = [(m, a, getattr(m, a)) for m in modules for a in attrs if hasattr(m, a)]

    def spy(real):
        def call(*args, **kw):
            names.append(kw.get("name"))
            return real(*args, **kw)
        return call

    try:
        for m, a, real in spied:
            setattr(m, a, spy(real))
        yield names
    finally:
        for m, a, real in spied:
            setattr(m, a, real)


def moe_shared_inputs(rng, n, experts, hidden, inter, shared_inter, sub=None,
                      same_rows: bool = False):
    """Random inputs of an MoE layer with a gated shared expert: experts (tiled from `sub`
    random ones when given), x, logits [router | gate], the shared act [N, Is] and shared down
    [H, Is] bf16: (gu, dn, gu_h, dn_h, x, logits, act, sd, sd_h). same_rows: rows 0 and 1 pick
    the same experts (groups of more than one pair)."""
    gu, dn, gu_h, dn_h = tiled_experts(rng, experts, hidden, inter, sub)
    sd_h, sd = weight_pair(rng, (hidden, shared_inter), DType.BFLOAT16, shared_inter ** -0.5)
    x = dev(randn(rng, (n, hidden)))
    logits = dev(randn(rng, (n, experts + 1), 2.0))
    if same_rows and n > 1:
        logits[1, :experts] = logits[0, :experts]
    act = dev(randn(rng, (n, shared_inter)))
    return gu, dn, gu_h, dn_h, x, logits, act, sd, sd_h


def dev(a: np.ndarray):
    return cp().asarray(a)


def host(a) -> np.ndarray:
    return cp().asnumpy(a)


def rows_view(rng, shape, pad: int = 5, scale: float = 1.0):
    """(host, device) views of the same random data whose rows are strided (last axis padded)."""
    parent = randn(rng, tuple(shape[:-1]) + (shape[-1] + pad,), scale)
    lo = pad // 2
    d_parent = dev(parent)
    index = (Ellipsis, slice(lo, lo + shape[-1]))
    return parent[index], d_parent[index]


def poisoned(shape, dtype=np.float32):
    """A device buffer full of NaN (or -7 for integers)."""
    if np.dtype(dtype).kind == "f":
        return cp().full(shape, np.nan, dtype=dtype)
    return cp().full(shape, -7, dtype=dtype)


def rel_err(out, ref) -> float:
    out = np.asarray(host(out) if not isinstance(out, np.ndarray) else out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def assert_close(out, ref, tol: float = TOL_F32, what: str = "") -> None:
    o = host(out) if not isinstance(out, np.ndarray) else out
    assert o.shape == np.shape(ref), (o.shape, np.shape(ref))
    assert np.linalg.norm(np.asarray(ref, np.float64)) > 0, "reference is all zeros"
    err = rel_err(o, ref)
    assert err < tol, f"{what} rel err {err:.3e} >= {tol:.1e}"


def _bitwise_diff(a, b, what: str):
    """(a, b) on the host, contiguous, and the flat indices of the elements whose bits differ
    (same shape and dtype asserted)."""
    a = np.ascontiguousarray(host(a) if not isinstance(a, np.ndarray) else a)
    b = np.ascontiguousarray(host(b) if not isinstance(b, np.ndarray) else b)
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
    width = (a.size, a.dtype.itemsize)
    return a, b, np.flatnonzero((a.view(np.uint8).reshape(width)
                                 != b.view(np.uint8).reshape(width)).any(axis=1))


def assert_same_bits(a, b, what: str = "") -> None:
    """Bitwise equality (same shape and dtype); a mismatch reports how many elements differ and
    the first few (index, both values)."""
    a, b, diff = _bitwise_diff(a, b, what)
    if diff.size:
        idx = [np.unravel_index(i, a.shape) for i in diff[:5]]
        pairs = ", ".join(f"{tuple(int(v) for v in i)}: {a[i]!r} vs {b[i]!r}" for i in idx)
        raise AssertionError(f"{what}: {diff.size} of {a.size} elements differ bitwise ({pairs})")


def randn_refill(rng, *buffers):
    """A callable writing new random values into device buffers, given as (array, scale) pairs
    (a graph replay's refill of its captured inputs)."""
    def refill():
        for a, scale in buffers:
            a[...] = dev(randn(rng, a.shape, scale))
    return refill


def assert_graph_replay_equals_eager(ctx, name: str, step, refill, poison, captured, eager,
                                     labels, what: str) -> None:
    """`step()` (run once eagerly first: compiling happens outside the capture) captured in a
    CUDA graph on `ctx`'s stream, then twice: `refill()` writes new inputs into the captured
    buffers, the `poison` buffers are filled with NaN (-7 for int32), the graph replays, the
    `captured` arrays are copied, `eager()` returns the arrays to compare them with (same order,
    named by `labels`); bitwise equal, the replayed last array finite."""
    from ninfer.core.cuda import CudaGraph

    step()
    ctx.synchronize()
    graph = CudaGraph(name)
    try:
        with graph.capture(ctx.stream):
            step()
        for _ in range(2):
            refill()
            for a in poison:
                a.fill(-7 if a.dtype == np.int32 else np.nan)
            graph.launch(ctx.stream)
            ctx.synchronize()
            replay = [a.copy() for a in captured]
            want = eager()
            ctx.synchronize()
            assert np.isfinite(host(replay[-1])).all(), f"{what}: non-finite output"
            for got, exp, label in zip(replay, want, labels, strict=True):
                assert_same_bits(got, exp, f"{label}: {what}")
    finally:
        graph.destroy()


def nan_own_key_slots(k_pages: np.ndarray, v_pages: np.ndarray, bt: np.ndarray, row_seq,
                      row_pos) -> tuple[np.ndarray, np.ndarray]:
    """Copies of bf16-bit pages [P, Hkv, page_size, D] (host) with the slot of each row's own
    key (position row_pos[n] of sequence row_seq[n] in block table bt) set to NaN bits, so a
    read of it before kv_write stores the key makes the row NaN."""
    kp, vp = k_pages.copy(), v_pages.copy()
    page_size = kp.shape[2]
    for s, pos in zip(row_seq, row_pos):
        page, slot = bt[s, pos // page_size], pos % page_size
        kp[page, :, slot] = vp[page, :, slot] = 0x7FC0
    return kp, vp


def assert_invalid_attention_rows_nan(rng, k_pages, v_pages, bt: np.ndarray, page_size: int,
                                      heads: int, d: int, workspace,
                                      past_kv_ready: bool = False) -> None:
    """paged_attention's invalid inputs, for sequences 0 and 1 of lengths 3000 and 100 in block
    table `bt` (host; k_pages / v_pages on the device): the table gets a page id out of range in
    the middle of sequence 0 (column 70) and a -1 page at column 3 of sequence 1; rows reaching
    page 70 or sequence 1's page 3, a row_seq out of range, a row_pos < 0 and a row_pos past
    the table are NaN, and only those; the other rows (stopping before the bad pages) equal the
    same rows launched alone. The workspace counters are 0 afterwards. past_kv_ready: passed
    to every launch (nothing writes the pages, so the promise holds)."""
    from ninfer.kernels_cuda import attention as katt

    bad_bt = bt.copy()
    bad_bt[0, 70] = k_pages.shape[0] + 5
    bad_bt[1, 3] = -1
    bt_d = dev(bad_bt)
    cols = bad_bt.shape[1]
    row_seq = np.array([0, 0, 1, 1, 2, 0, 1], np.int32)
    row_pos = np.array([2999, 70 * page_size - 1, 99, 47, 5, -1, cols * page_size], np.int32)
    nan_rows = [0, 2, 4, 5, 6]
    n = len(row_seq)
    q = dev(randn(rng, (n, heads, d)))

    def run(rows):
        out = poisoned((rows.stop - rows.start, heads, d))
        katt.paged_attention(q[rows], k_pages, v_pages, bt_d, dev(row_seq[rows]),
                             dev(row_pos[rows]), d ** -0.5, out, workspace=workspace,
                             past_kv_ready=past_kv_ready)
        return out

    out = run(slice(0, n))
    o = host(out)
    for i in range(n):
        if i in nan_rows:
            assert np.isnan(o[i]).all(), f"row {i} should be NaN"
        else:
            assert np.isfinite(o[i]).all(), f"row {i} should be finite"
            assert_same_bits(run(slice(i, i + 1))[0], out[i], f"row {i}")
    assert not host(workspace.counters).any()


def decode_rows(rng, lengths, heads: int, d: int, invalid: tuple[int, int] | None = None):
    """Decode rows for paged_attention tests: row i is sequence i at its last position (length
    lengths[i]); with invalid = (seq, length) one more row of that (out-of-range) sequence.
    Returns (row_seq, row_pos) as int32 host arrays, then q [N, heads, d] (scale 2) and a gate
    (the strided half of a [N, heads, 2 d] projection), both random on the device."""
    extra = [] if invalid is None else [invalid]
    row_seq = np.array(list(range(len(lengths))) + [s for s, _ in extra], np.int32)
    row_pos = np.array(list(lengths) + [n for _, n in extra], np.int32) - 1
    n = len(row_seq)
    q = dev(randn(rng, (n, heads, d), 2.0))
    gate = dev(randn(rng, (n, heads, 2 * d)))[:, :, d:]
    return row_seq, row_pos, q, gate


# Row lengths for NINFER_ATTN_CHUNK_GRAIN_LONG = 256 at grain 64: chunking changed (128- or
# 192-key chunks by default, 256 with it) and kept (64-key chunks, or >= 256 either way)
LONG_GRAIN_CHANGED = (4097, 5000, 8192, 12288)
LONG_GRAIN_SAME = (1, 1000, 4096, 12289, 16385, 20000)


def use_long_grain_build(monkeypatch, grain_long: int = 256) -> None:
    """Switches paged_attention to the NINFER_ATTN_CHUNK_GRAIN_LONG build (the host's chunk plan
    and both counting builds of attention.cu) until the test ends."""
    from ninfer.kernels_cuda import attention as katt

    source = dataclasses.replace(katt.SOURCE, options=katt.chunk_options(katt.CHUNK_GRAIN,
                                                                          grain_long))
    monkeypatch.setattr(katt, "CHUNK_GRAIN_LONG", grain_long)
    monkeypatch.setattr(katt, "SOURCE", source)
    monkeypatch.setattr(katt, "SOURCE_ACQ_REL", katt.acq_rel_source(source))


def differs(a, b) -> bool:
    """Whether two arrays (same shape and dtype) differ in any bit."""
    return _bitwise_diff(a, b, "")[2].size > 0


def builds_same_bits(monkeypatch, switch: str, values, launch, n: int, rows, counters):
    """paged_attention gives the same bits with each of `values` of the launcher's `switch`
    (e.g. "ACQ_REL": acquire-release vs fenced counting; "MERGE_KERNEL": attn_merge_kernel vs
    the in-kernel merges): `launch(rows_slice, batched)` runs rows_slice of the caller's inputs
    (batched: the whole batch, as the caller configures it, e.g. gated and past_kv_ready) and
    returns the output; it runs for all `n` rows and for each row of `rows` alone, with each
    value, and the workspace `counters` are 0 after each value's launches. Returns the batched
    output of values[0]."""
    from ninfer.kernels_cuda import attention as katt

    outs = {}
    for value in values:
        monkeypatch.setattr(katt, switch, value)
        outs[value] = [launch(slice(0, n), True)]
        outs[value] += [launch(slice(r, r + 1), False) for r in rows]
        assert not host(counters).any(), "workspace counters must be 0 after a launch"
    for value in values[1:]:
        for i, (a, b) in enumerate(zip(outs[value], outs[values[0]])):
            assert_same_bits(a, b, f"call {i}: {switch} {value} vs {values[0]}")
    return outs[values[0]][0]


def assert_attention_graph_replay(ctx, rng, name: str, k_pages, v_pages, block_tables, lengths,
                                  heads: int, d: int, workspace) -> None:
    """A decode paged_attention launch (row i: sequence i at its last position, `heads` query
    heads of dim d, over the device pages and tables) captured in a graph on `ctx` and replayed
    with new q gives the eager bits; the workspace counters are 0 afterwards."""
    from ninfer.kernels_cuda import attention as katt

    rows = len(lengths)
    row_seq = dev(np.arange(rows, dtype=np.int32))
    row_pos = dev(np.array(lengths, np.int32) - 1)
    q = dev(randn(rng, (rows, heads, d)))
    out = poisoned((rows, heads, d))

    def call():
        katt.paged_attention(q, k_pages, v_pages, block_tables, row_seq, row_pos, d ** -0.5,
                             out, workspace=workspace)

    def eager():
        call()
        return (out,)

    assert_graph_replay_equals_eager(ctx, name, call, randn_refill(rng, (q, 1.0)), (out,),
                                     (out,), eager, ("out",), "graph replay vs eager")
    assert not host(workspace.counters).any()


def random_block_tables(rng, lengths, page_size: int, num_pages: int,
                        max_pages: int) -> np.ndarray:
    """Block tables int32 [len(lengths), max_pages] of distinct random pages (of num_pages)
    covering each sequence's length; -1 past them."""
    perm = rng.permutation(num_pages)
    bt = np.full((len(lengths), max_pages), -1, np.int32)
    used = 0
    for s, length in enumerate(lengths):
        need = -(-length // page_size)
        bt[s, :need] = perm[used:used + need]
        used += need
    return bt


def slot_strided(rng, num_slots: int, inner: tuple, pad: int = 7, scale: float = 0.5):
    """(host, device) slot-strided views [S, *inner] of a wider per-slot image (like StateImage)."""
    size = int(np.prod(inner))
    image = randn(rng, (num_slots, size + 2 * pad), scale)
    h = image[:, pad:pad + size].reshape((num_slots,) + tuple(inner))
    d_image = dev(image)
    strides = (d_image.strides[0],) + tuple(np.array(h.strides[1:]))
    d = cp().lib.stride_tricks.as_strided(d_image[:, pad:], shape=h.shape, strides=strides)
    return h, d, d_image


def segments(lengths, slots):
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return starts, np.asarray(slots, np.int32)


def gdn_inputs(rng, n, hk, hv, dk, dv, g_scale=0.3):
    """q, k (L2-normalised, q scaled), v, g <= 0, beta in (0, 1) as host arrays."""
    q = ref.l2norm_heads(randn(rng, (n, hk, dk)), 1e-6, dk ** -0.5).astype(np.float32)
    k = ref.l2norm_heads(randn(rng, (n, hk, dk)), 1e-6, 1.0).astype(np.float32)
    v = randn(rng, (n, hv, dv))
    g = (-np.abs(randn(rng, (n, hv))) * g_scale).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (n, hv)).astype(np.float32)
    return q, k, v, g, beta


def assert_chunk_prefill_splits_bitwise(rng, n, hk, hv, dk, dv, cuts, g_scale, *, slots: int,
                                        contiguous_split_state: bool, **path) -> None:
    """gdn_chunk_prefill of n tokens in the last of `slots` state slots, whole and cut at `cuts`
    (the second run's state a contiguous copy, or a slot-strided one): output and final state
    bitwise equal. `path`: gdn_chunk_prefill's precision / bf16_cols / local_pair (default: the
    module's)."""
    from ninfer.kernels_cuda import gdn as kgdn
    from ninfer.kernels_cuda.gdn_chunk import ChunkWorkspace

    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, g_scale)
    _, st_whole, _ = slot_strided(rng, slots, (hv, dk, dv), scale=0.1)
    if contiguous_split_state:
        st_split = cp().ascontiguousarray(st_whole)
    else:
        _, st_split, _ = slot_strided(rng, slots, (hv, dk, dv), scale=0.1)
        st_split[...] = st_whole
    ws = ChunkWorkspace.allocate(n, 1, hv)
    slot = dev(np.array([slots - 1], np.int32))
    whole = poisoned((n, hv, dv))
    kgdn.gdn_chunk_prefill(*[dev(a) for a in (q, k, v, g, beta)], st_whole,
                           dev(np.array([0, n], np.int32)), slot, whole, workspace=ws, **path)
    split = poisoned((n, hv, dv))
    bounds = (0,) + tuple(cuts) + (n,)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        kgdn.gdn_chunk_prefill(*[dev(a[lo:hi]) for a in (q, k, v, g, beta)], st_split,
                               dev(np.array([0, hi - lo], np.int32)), slot, split[lo:hi],
                               workspace=ws, **path)
    assert_same_bits(split, whole, "output")
    assert_same_bits(st_split, st_whole, "state")


# (name, kernels_cuda.moe flags, moe_block keywords): every path of moe_block's grouped-GEMV call
MOE_BLOCK_PATHS = (
    ("fused, bulk-copy gate_up", {}, {}),
    ("four launches", {}, {"fused": False}),
    ("rows gate_up", {"MOE_TMA": False}, {}),
    ("rows gate_up, four launches", {"MOE_TMA": False}, {"fused": False}),
    ("moe_mma_kernel down (f32 act)", {"GEMV_ROWS": False}, {"fused": False}),
    ("batch invariant", {}, {"batch_invariant": True}),
    ("persistent", {"PERSIST": True}, {}),
    ("bulk-copy down", {"TMA_DOWN": True}, {}),
)
_MOE_PATH_FLAGS = ("MOE_TMA", "GEMV_ROWS", "PERSIST", "TMA_DOWN")


def set_moe_path(monkeypatch, flags: dict) -> None:
    """kernels_cuda.moe's path flags: those in `flags`, the rest as the module was imported
    with (so no path's flag leaks into the next)."""
    from ninfer.kernels_cuda import moe as kmoe

    defaults = _moe_path_defaults()
    for name in _MOE_PATH_FLAGS:
        monkeypatch.setattr(kmoe, name, flags.get(name, defaults[name]))


@functools.lru_cache(maxsize=None)
def _moe_path_defaults() -> dict:
    """The flags' import-time values (first read at the start of a test: monkeypatch has undone
    every earlier test's patches by then)."""
    from ninfer.kernels_cuda import moe as kmoe

    return {name: getattr(kmoe, name) for name in _MOE_PATH_FLAGS}
