"""Programmatic dependent launch (PDL) of the decode step's small kernels.

GPU: a decode-like chain (embedding -> rms_norm -> GEMV -> attn_prep -> gated paged_attention
(the output gate fused, the model's decode path; also the unfused paged_attention ->
sigmoid_mul pair, bitwise equal) -> GEMV -> add_rms_norm -> fused SwiGLU GEMV -> GEMV -> ... ->
final norm -> lm_head GEMV -> sample; a second layer takes the unfused attention path and the
GDN-style norms) gives the same bits with PDL on as with every launch plain, eagerly and
replayed from a CUDA graph; every launch of the small kernels goes through the PDL path. CPU:
`_loader._arg_bytes` marshalling and `_loader.launch`'s routing.
"""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import TOL_BF16_X, TOL_F32, assert_close, cp, dev, host, randn, weight_pair

from ninfer.core.dtypes import DType, f32_to_bf16_bits
from ninfer.kernels_cuda import (
    _loader,
    attention,
    attn_prep,
    elementwise,
    embedding,
    linear,
    norm,
    rope,
    sampling,
)
from ninfer.ops import reference as ref

# hidden, query heads, KV heads, head dim, rotary dim, FFN width, vocabulary (odd sizes; every
# K a multiple of 16 so that the GEMVs take linear_tma_kernel on sm_90)
H, A, HKV, D, ROT, INNER, VOCAB = 272, 4, 2, 64, 32, 176, 3001
PAGE, PAGES, COLS = 16, 48, 8
EPS = 1e-6
N_TOP = 5
SMALL_KERNEL_MODULES = ("norm", "elementwise", "attn_prep", "attention", "sampling",
                        "embedding", "rope")
# the launch names of the small kernels the chain runs (`name=` of their launches)
CHAIN_LAUNCHES = {"embedding", "norm[1]", "norm[2]", "norm[3]", "norm[4]", "attn_prep",
                  "paged_attention", "SigmoidMul", "SiluMul", "SigmoidScaleAdd", "Add", "rope",
                  "kv_write", "sample_stats", "sample"} | (
                      {"attn_merge"} if attention.MERGE_KERNEL else set())  # rows of 2 chunks


def _set_pdl(monkeypatch, on: bool) -> None:
    """PDL for the small kernels (_loader._PDL) and the GEMVs (linear.GEMV_PDL) together."""
    monkeypatch.setattr(_loader, "_PDL", on)
    monkeypatch.setattr(linear, "GEMV_PDL", on)


class _Chain:
    """Fixed device buffers of a two-layer decode-like step of n rows; `step` launches it
    (capturable: no allocation). Every stage writes its own buffer (compared by name), except
    the residual `h`, which add_rms_norm / add_inplace update in place as in the model."""

    def __init__(self, rng, n: int):
        c = cp()
        self.n = n
        bf16 = DType.BFLOAT16
        self.emb_host, self.emb = weight_pair(rng, (VOCAB, H), bf16)
        names = ("in0", "post0", "in1", "post1", "final")
        pairs = {k: weight_pair(rng, (H,), bf16, 0.3) for k in names}
        self.norm_w = {k: d for k, (_, d) in pairs.items()}
        self.in0_host = pairs["in0"][0]
        self.head_w = {k: weight_pair(rng, (D,), bf16, 0.3)[1] for k in ("q0", "k0", "q1", "k1")}
        self.gn_w = weight_pair(rng, (D,), bf16, 0.3)[1]
        qkv = 2 * A * D + 2 * HKV * D
        self.lin = {}
        for i in (0, 1):
            self.lin[f"qkv{i}"] = weight_pair(rng, (qkv, H), bf16, H ** -0.5)[1]
            self.lin[f"o{i}"] = weight_pair(rng, (H, A * D), bf16, (A * D) ** -0.5)[1]
            self.lin[f"gu{i}"] = weight_pair(rng, (2 * INNER, H), bf16, H ** -0.5)[1]
            self.lin[f"down{i}"] = weight_pair(rng, (H, INNER), bf16, INNER ** -0.5)[1]
        self.lm_head_host, self.lm_head = weight_pair(rng, (VOCAB, H), bf16, H ** -0.5)
        half = ROT // 2
        self.inv_freq = dev((1.0 / 1e4 ** (np.arange(half) / half)).astype(np.float32))
        self.freq_axis = dev((np.arange(half) % 3).astype(np.int32))
        # distinct sequences (no two rows write one KV slot), random positions in the table
        self.bt = dev(rng.permutation(PAGES)[: (n + 1) * COLS].reshape(n + 1, COLS)
                      .astype(np.int32))
        self.row_seq_h = rng.permutation(n + 1)[:n].astype(np.int32)
        self.row_pos_h = rng.integers(0, COLS * PAGE, n).astype(np.int32)
        self.row_seq, self.row_pos = dev(self.row_seq_h), dev(self.row_pos_h)
        pos = np.stack([self.row_pos_h, self.row_pos_h + rng.integers(0, 3, n),
                        self.row_pos_h + rng.integers(0, 3, n)]).astype(np.int32)
        self.positions = dev(pos)
        self.pages0 = [dev(f32_to_bf16_bits(randn(rng, (PAGES, HKV, PAGE, D))))
                       for _ in range(4)]
        self.pages = [p.copy() for p in self.pages0]  # k0, v0, k1, v1
        self.ws = attention.AttentionWorkspace.allocate(n, A, D, COLS * PAGE)
        self.scratch = c.empty((n, VOCAB), np.float32)
        self.top_count = dev(np.array([3], np.int32))
        self.ids = c.empty(n, np.int32)
        f32 = np.float32
        shapes = dict(
            x0=(n, H), proj0=(n, qkv), q0=(n, A, D), g0=(n, A, D), att0=(n, A, D),
            attg0=(n, A, D), gated0=(n, A * D), o0=(n, H), x1=(n, H), act0=(n, INNER), down0=(n, H),
            x2=(n, H), proj1=(n, qkv), q1=(n, A, D), k1=(n, HKV, D), att1=(n, A, D),
            l2=(n, A, D), gn=(n, A, D), o1=(n, H), x3=(n, H), gu1=(n, 2 * INNER),
            act1=(n, INNER), down1=(n, H), xf=(n, H), logits=(n, VOCAB), h=(n, H),
            logprobs=(n,), top_lp=(n, N_TOP))
        self.out = {k: c.empty(s, f32) for k, s in shapes.items()}
        self.out.update(tokens=c.empty(n, np.int32), top_ids=c.empty((n, N_TOP), np.int32))
        self.samp = dict(
            temperature=dev(np.where(np.arange(n) % 2, 0.8, 0.0).astype(f32)),
            top_k=dev(np.full(n, 20, np.int32)), top_p=dev(np.full(n, 0.9, f32)),
            min_p=dev(np.zeros(n, f32)), rep=dev(np.full(n, 1.1, f32)),
            presence=dev(np.zeros(n, f32)), frequency=dev(np.zeros(n, f32)),
            seeds=dev(rng.integers(0, 2**63, n).astype(np.uint64)),
            counters=dev(rng.integers(0, 100, n).astype(np.int64)),
            pen_offsets=dev(np.arange(n + 1, dtype=np.int32)),
            pen_tokens=dev(rng.integers(0, VOCAB, n).astype(np.int32)),
            pen_counts=dev(np.ones(n, np.int32)))
        self.ids_host = np.zeros(n, np.int32)

    def new_ids(self, rng) -> None:
        self.ids_host = rng.integers(0, VOCAB, self.n).astype(np.int32)

    def reset(self) -> None:
        """Poison every output (NaN / -7), restore the KV pages, upload this step's ids (an H2D
        copy right before the first PDL launch)."""
        for a in self.out.values():
            a.fill(np.nan if a.dtype.kind == "f" else -7)
        for p, p0 in zip(self.pages, self.pages0):
            p[...] = p0
        self.ids.set(self.ids_host)

    def step(self) -> None:
        n, o, w, hw, lin = self.n, self.out, self.norm_w, self.head_w, self.lin
        kp0, vp0, kp1, vp1 = self.pages
        h = o["h"]
        embedding.embedding(self.ids, self.emb, h)
        norm.rms_norm(h, w["in0"], EPS, o["x0"], zero_centered=True)
        # layer 0: fused attention prep and the gated attention (the decode path: the gate read
        # from the projection), the unfused attention + sigmoid gate beside it, fused SwiGLU FFN
        linear.linear(o["x0"], lin["qkv0"], o["proj0"])
        qg, k, v = _split_qkv(o["proj0"], n)
        attn_prep.attn_prep(qg, k, v, hw["q0"], hw["k0"], EPS, self.positions, self.inv_freq,
                            self.freq_axis, o["q0"], o["g0"], kp0, vp0, self.bt, self.row_seq,
                            self.row_pos)
        attention.paged_attention(o["q0"], kp0, vp0, self.bt, self.row_seq, self.row_pos,
                                  D ** -0.5, o["attg0"], workspace=self.ws, gate=qg[:, :, D:])
        attention.paged_attention(o["q0"], kp0, vp0, self.bt, self.row_seq, self.row_pos,
                                  D ** -0.5, o["att0"], workspace=self.ws)
        elementwise.sigmoid_mul(o["att0"].reshape(n, A * D), o["g0"].reshape(n, A * D),
                                o["gated0"])
        linear.linear(o["attg0"].reshape(n, A * D), lin["o0"], o["o0"])
        norm.add_rms_norm(h, o["o0"], w["post0"], EPS, o["x1"])
        linear.linear_swiglu(o["x1"], lin["gu0"], o["act0"])
        linear.linear(o["act0"], lin["down0"], o["down0"])
        norm.add_rms_norm(h, o["down0"], w["in1"], EPS, o["x2"])
        # layer 1: unfused attention prep, GDN-style norms, unfused SwiGLU
        linear.linear(o["x2"], lin["qkv1"], o["proj1"])
        qg, k, v = _split_qkv(o["proj1"], n)
        norm.rms_norm(qg[:, :, :D], hw["q1"], EPS, o["q1"], zero_centered=True)
        norm.rms_norm(k, hw["k1"], EPS, o["k1"], zero_centered=True)
        rope.rope(o["q1"], self.positions, self.inv_freq, self.freq_axis)
        rope.rope(o["k1"], self.positions, self.inv_freq, self.freq_axis)
        attention.kv_write(o["k1"], v, kp1, vp1, self.bt, self.row_seq, self.row_pos)
        attention.paged_attention(o["q1"], kp1, vp1, self.bt, self.row_seq, self.row_pos,
                                  D ** -0.5, o["att1"], workspace=self.ws)
        norm.l2norm_heads(o["att1"], EPS, D ** -0.5, o["l2"])
        norm.gated_rms_norm(o["l2"], qg[:, :, D:], self.gn_w, EPS, o["gn"])
        linear.linear(o["gn"].reshape(n, A * D), lin["o1"], o["o1"])
        norm.add_rms_norm(h, o["o1"], w["post1"], EPS, o["x3"])
        linear.linear(o["x3"], lin["gu1"], o["gu1"])
        elementwise.swiglu(o["gu1"], o["act1"])
        linear.linear(o["act1"], lin["down1"], o["down1"])
        elementwise.sigmoid_scale_add(o["down1"], o["x3"], o["gu1"][:, :1])
        elementwise.add_inplace(h, o["down1"])
        norm.rms_norm(h, w["final"], EPS, o["xf"], zero_centered=True)
        linear.linear(o["xf"], self.lm_head, o["logits"])
        sampling.sample(o["logits"], *self.samp.values(), o["tokens"], o["logprobs"],
                        o["top_ids"], o["top_lp"], scratch=self.scratch,
                        top_count=self.top_count)

    def results(self) -> dict:
        """Host copies of every output and the KV pages, in stage order."""
        got = {k: host(a) for k, a in self.out.items()}
        got.update({f"pages[{i}]": host(p) for i, p in enumerate(self.pages)})
        return got


def _split_qkv(proj, n):
    """(q_and_gate [N, A, 2D], k [N, Hkv, D], v [N, Hkv, D]) views of a qkv projection."""
    qg = proj[:, : 2 * A * D].reshape(n, A, 2 * D)
    k = proj[:, 2 * A * D: 2 * A * D + HKV * D].reshape(n, HKV, D)
    v = proj[:, 2 * A * D + HKV * D:].reshape(n, HKV, D)
    return qg, k, v


def _assert_same(got: dict, want: dict, what: str) -> None:
    """Bitwise equality of every output; the message names each differing stage (in chain
    order) with its count of differing elements and the first one."""
    bad = []
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        gb = np.ascontiguousarray(g).view(np.uint8).reshape(g.shape + (-1,))
        wb = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape + (-1,))
        diff = np.any(gb != wb, axis=-1)
        if diff.any():
            first = tuple(int(i) for i in np.argwhere(diff)[0])
            bad.append(f"{name}: {int(diff.sum())}/{diff.size} differ, first at {first}: "
                       f"{g[first]!r} vs {w[first]!r}")
    assert not bad, f"{what}: PDL on != plain launches:\n  " + "\n  ".join(bad)


def _run(chain, ctx) -> dict:
    chain.reset()
    chain.step()
    ctx.synchronize()
    return chain.results()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 5])
def test_decode_chain_pdl_equals_plain_launches(rng, monkeypatch, n):
    """PDL on (small kernels and GEMVs) gives the bits of plain launches: eagerly (twice, new
    ids) and from a graph captured once and replayed three times (new ids each time)."""
    from ninfer.core.cuda import CudaGraph, DeviceContext

    ctx = DeviceContext(0)
    if ctx.props.compute_capability < (9, 0):
        pytest.skip("PDL needs sm_90 (the launches are plain below)")
    with ctx.activate():
        chain = _Chain(rng, n)
        for it in range(2):
            chain.new_ids(rng)
            _set_pdl(monkeypatch, False)
            want = _run(chain, ctx)
            _check_oracles(chain, want)
            _set_pdl(monkeypatch, True)
            _assert_same(_run(chain, ctx), want, f"eager, n={n}, iteration {it}")
        _set_pdl(monkeypatch, True)
        _run(chain, ctx)  # warm-up outside the capture (as capture_graphs does)
        chain.reset()
        ctx.synchronize()
        graph = CudaGraph("pdl-decode-chain")
        with graph.capture(ctx.stream):
            chain.step()
        try:
            for it in range(3):
                chain.new_ids(rng)
                _set_pdl(monkeypatch, False)
                want = _run(chain, ctx)
                chain.reset()
                graph.launch(ctx.stream)
                ctx.synchronize()
                _assert_same(chain.results(), want, f"graph replay, n={n}, iteration {it}")
        finally:
            ctx.synchronize()
            graph.destroy()


def _check_oracles(chain, got: dict) -> None:
    """The plain-launch chain is sane: float64 checks of a few stages from the GPU's own
    inputs to them (the per-op tests check every op in depth)."""
    emb = ref.embedding(chain.ids_host, chain.emb_host)
    assert_close(got["x0"], ref.rms_norm(emb, chain.in0_host, EPS, zero_centered=True), TOL_F32,
                 "embedding -> rms_norm")
    want_att = ref.paged_attention(got["q0"], got["pages[0]"], got["pages[1]"], host(chain.bt),
                                   chain.row_seq_h, chain.row_pos_h, D ** -0.5)
    assert_close(got["att0"], want_att, 1e-5, "attn_prep -> paged_attention")
    assert np.array_equal(got["attg0"].reshape(chain.n, A * D).view(np.uint32),
                          got["gated0"].view(np.uint32)), \
        "gated paged_attention != paged_attention then sigmoid_mul (bitwise)"
    assert_close(got["logits"], ref.linear(got["xf"], chain.lm_head_host), TOL_BF16_X,
                 "lm_head GEMV")
    toks = got["tokens"]
    assert ((toks >= 0) & (toks < VOCAB)).all(), f"tokens {toks}"
    assert np.isfinite(got["logprobs"]).all(), f"logprobs {got['logprobs']}"


@pytest.mark.gpu
def test_small_kernels_take_the_pdl_path(rng, monkeypatch):
    """Every launch of the chain's small kernels asks for PDL and goes through
    `launch_dependent` (sm_90, NINFER_PDL on)."""
    import importlib

    from ninfer.core.cuda import DeviceContext

    ctx = DeviceContext(0)
    if ctx.props.compute_capability < (9, 0):
        pytest.skip("PDL needs sm_90")
    asked, dependent = [], []
    for mod_name in SMALL_KERNEL_MODULES:
        module = importlib.import_module(f"ninfer.kernels_cuda.{mod_name}")
        real = module.launch

        def spy(fn, grid, block, args, shared_mem=0, *, name="", pdl=False, _real=real):
            asked.append((name, pdl))
            _real(fn, grid, block, args, shared_mem, name=name, pdl=pdl)

        monkeypatch.setattr(module, "launch", spy)
    real_dep = _loader.launch_dependent

    def dep_spy(fn, grid, block, args, shared_mem=0, *, name=""):
        dependent.append(name)
        real_dep(fn, grid, block, args, shared_mem, name=name)

    monkeypatch.setattr(_loader, "launch_dependent", dep_spy)
    _set_pdl(monkeypatch, True)
    with ctx.activate():
        chain = _Chain(rng, 3)
        chain.new_ids(rng)
        _run(chain, ctx)
    plain = sorted({name for name, pdl in asked if not pdl})
    assert not plain, f"launched without pdl=True: {plain}"
    names = {name for name, _ in asked}
    assert names == CHAIN_LAUNCHES, (sorted(names - CHAIN_LAUNCHES),
                                     sorted(CHAIN_LAUNCHES - names))
    assert sorted(dependent) == sorted(name for name, _ in asked), "not all went through PDL"


# -- CPU: argument marshalling and routing -------------------------------------------------------

class _FakeArray:
    """What `_arg_bytes` reads of a CuPy array: `.data.ptr`."""

    class _Mem:
        def __init__(self, ptr):
            self.ptr = ptr

    def __init__(self, ptr: int):
        self.data = self._Mem(ptr)


def test_arg_bytes_marshalling():
    from ninfer.kernels_cuda import _checks as C

    assert _loader._arg_bytes(np.int32(-7)).tobytes() == np.int32(-7).tobytes()
    assert _loader._arg_bytes(np.int64(1 << 40)).tobytes() == (1 << 40).to_bytes(8, "little")
    assert _loader._arg_bytes(np.float32(1.5)).tobytes() == np.float32(1.5).tobytes()
    assert _loader._arg_bytes(np.uint64(2**64 - 1)).nbytes == 8
    ptr = 0x7F12_3456_7890
    assert _loader._arg_bytes(_FakeArray(ptr)).tobytes() == ptr.to_bytes(8, "little")
    assert _loader._arg_bytes(None).tobytes() == bytes(8)  # a null pointer
    params = C.struct(("p", "ptr"), ("n", "i64"), ("k", "i32"), ("x", "f32"))
    packed = C.pack(params, p=ptr, n=-3, k=9, x=0.25)
    got = _loader._arg_bytes(packed)
    assert got is packed and got.nbytes == params.itemsize == 24  # by value, as packed
    assert got.tobytes() == (ptr.to_bytes(8, "little") + (-3).to_bytes(8, "little", signed=True)
                             + (9).to_bytes(4, "little") + np.float32(0.25).tobytes())
    for bad in (7, 1.5, True, "x", object()):
        with pytest.raises(TypeError, match="kernel argument of type"):
            _loader._arg_bytes(bad)


def test_launch_routes_pdl_requests(monkeypatch):
    """launch(pdl=True) goes to launch_dependent only when NINFER_PDL is on and the device
    runs griddepcontrol; everything else is the plain launch."""
    calls = []

    def fn(grid, block, args, shared_mem=0):
        calls.append(("plain", grid, block, shared_mem))

    def dep(fn_, grid, block, args, shared_mem=0, *, name=""):
        calls.append(("pdl", tuple(grid), tuple(block), shared_mem, name))

    monkeypatch.setattr(_loader, "launch_dependent", dep)
    monkeypatch.setattr(_loader, "_DEBUG_SYNC", False)
    for flag, device, pdl, route in [(True, True, True, "pdl"), (True, True, False, "plain"),
                                     (False, True, True, "plain"), (True, False, True, "plain")]:
        calls.clear()
        monkeypatch.setattr(_loader, "_PDL", flag)
        monkeypatch.setattr(_loader, "_pdl_device", lambda d=device: d)
        _loader.launch(fn, [3, 2], [64], (np.int32(1),), 128, name="k", pdl=pdl)
        assert len(calls) == 1 and calls[0][0] == route, (flag, device, pdl, calls)
        assert calls[0][1:4] == ((3, 2), (64,), 128)
