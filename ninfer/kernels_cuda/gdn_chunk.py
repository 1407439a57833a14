"""Launcher for gdn_chunk.cu: `gdn_chunk_prefill`, the chunkwise (WY/UT, chunk 64) delta rule.

Same operands and state update as `gdn.gdn_recurrence`. Launches: chunk offsets; per-chunk local
terms (parallel over all chunks); the state pass (sequential over each segment's chunks, parallel
over heads and 32-column tiles of the state), which also computes the output.

The bf16-tile path (``bf16_cols`` 32 or 64, NINFER_GDN_CHUNK_BF16_COLS; BF16 precision only):
the local kernel also writes its operands as bf16 (-W, K e^{G_L - G}, Q e^G, P; U stays fp32),
and the state pass keeps them as bf16 in shared memory (ldmatrix fragments), double-buffered per
chunk, with `bf16_cols` state columns per block. Every product rounds the same fp32 values in
the same order as the fp32-tile BF16 kernels, so its results equal theirs bit for bit. Its local
kernel (``local_pair``, NINFER_GDN_CHUNK_LOCAL_PAIR, default on) is gdn_chunk_localpair_kernel:
one block per chunk and value-head pair of a key head (Q, K and K K^T, Q K^T once per pair),
[U | W] = (I + A)^-1 [beta V | beta e^G K] with the inverse formed once per chunk and head by
16 x 16 blocks and applied with 3xTF32 mma; U and W then differ from the forward substitution's
(gdn_chunk_local16_kernel) by fp32 rounding, so the path is no longer bitwise equal to the
fp32-tile kernels (still deterministic and split-exact).

`Precision` picks how the matrix products run on tensor cores (operands, gates, the state and
the forward substitution stay fp32 in memory either way):
- TF32X3 (default): split hi/lo tf32 operands, 3 mma per product, fp32 accumulation; equal to
  the recurrence within fp32 rounding.
- BF16: operands rounded to bf16 (nearest even) per product, one bf16 mma, fp32 accumulation
  (the state is carried in fp32 and rounded only where it is an operand), as FLA's
  chunk_gated_delta_rule; relative error about 1e-2 or less.
Intermediates live in a `ChunkWorkspace`: pass one sized for the largest prefill (allocated per
call when None). Chunks start at each segment's first token, so splitting a prompt at multiples
of 64 tokens reproduces the unsplit result exactly (in both precisions).
"""
from __future__ import annotations

import dataclasses
import enum
import functools

import numpy as np

from ninfer import envs
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _gdn_operands as O
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

CHUNK = 64
DMAX = 128
STATE_COLS = 32  # SB of gdn_chunk_state_kernel
BF16_COLS_CHOICES = envs.GDN_CHUNK_BF16_COLS  # 0: the fp32-tile kernels
BF16_COLS = envs.gdn_chunk_bf16_cols()
LOCAL_PAIR = envs.gdn_chunk_local_pair()


class Precision(enum.Enum):
    """How gdn_chunk.cu forms its matrix products (the kernels' BF16 template argument) and the
    shared-memory row strides that go with it (Mma<BF16> in gdn_chunk.cu)."""

    TF32X3 = "tf32x3"
    BF16 = "bf16"

    @property
    def bf16(self) -> str:
        return "true" if self is Precision.BF16 else "false"

    @property
    def qk_ld(self) -> int:  # [64][128] tiles read as row-major A or B^T
        return 136 if self is Precision.BF16 else 132

    @property
    def ks_ld(self) -> int:  # the state pass's K tile, read as transposed A
        return 132 if self is Precision.BF16 else 136

    @property
    def a_ld(self) -> int:  # [64][64] tiles (A, P)
        return 72 if self is Precision.BF16 else 68

    def col_ld(self, cols: int) -> int:  # [*][cols] tiles read as B (S, U, V'; cols = 32)
        return cols + (4 if self is Precision.BF16 else 8)


_ENV_PRECISION = envs.gdn_chunk_precision()
PRECISION = Precision(_ENV_PRECISION or Precision.TF32X3.value)


def model_precision(weights_bf16: bool) -> Precision:
    """The precision a model's prefill uses: NINFER_GDN_CHUNK_PRECISION when set, else BF16 for
    a model with bf16 weights (its activations are rounded to bf16 by its GEMMs anyway) and
    TF32X3 for an fp32 one."""
    if _ENV_PRECISION:
        return Precision(_ENV_PRECISION)
    return Precision.BF16 if weights_bf16 else Precision.TF32X3


SOURCE = KernelSource("gdn_chunk.cu", (
    "gdn_chunk_offsets_kernel",
    *[name for prec in Precision for name in (
        f"gdn_chunk_local_kernel<{prec.bf16}>", f"gdn_chunk_state_kernel<{prec.bf16}>")],
    "gdn_chunk_local16_kernel",
    *[f"gdn_chunk_localpair_kernel<{vpb}>" for vpb in (1, 2)],
    *[f"gdn_chunk_state16_kernel<{sb}>" for sb in BF16_COLS_CHOICES if sb]))
_PARAMS = C.struct(*[(f, "ptr") for f in (
    "q", "k", "v", "g", "beta", "state", "seg_starts", "seg_slots", "out", "chunk_offsets",
    "w_ws", "u_ws", "gam_ws", "p_ws", "reserved")],
    *[(f, "i64") for f in ("q_rs", "q_hs", "k_rs", "k_hs", "v_rs", "v_hs", "g_rs", "beta_rs",
                           "out_rs", "out_hs", "state_ss")],
    ("key_heads", "i32"), ("value_heads", "i32"), ("dk", "i32"), ("dv", "i32"),
    ("num_segs", "i32"), ("max_chunks", "i32"), ("vec_qk", "i32"), ("vec_v", "i32"))
assert _PARAMS.itemsize == 240


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """A kernel instance: name expression, columns per block (state or output tile; the local
    kernel: one chunk), dynamic shared memory bytes."""

    kernel: str
    cols: int
    smem: int


@functools.cache
def local_launch(prec: Precision) -> KernelLaunch:
    # K, Q [64][qk_ld]; A [64][a_ld]; G, beta [64]
    floats = 2 * CHUNK * prec.qk_ld + CHUNK * prec.a_ld + 2 * CHUNK
    return KernelLaunch(f"gdn_chunk_local_kernel<{prec.bf16}>", CHUNK, floats * 4)


@functools.cache
def state_launch(prec: Precision = Precision.TF32X3) -> KernelLaunch:
    """The fp32-tile state kernel (STATE_COLS columns per block, output inside it)."""
    ld = prec.col_ld(STATE_COLS)
    # W, Q [64][qk_ld]; U [64][ld]; G [64]; P [64][a_ld]; K [64][ks_ld]; S [128][ld];
    # V' [64][ld]; e^{G_L - G} [64]
    floats = (2 * CHUNK * prec.qk_ld + CHUNK * ld + CHUNK + CHUNK * prec.a_ld
              + CHUNK * prec.ks_ld + DMAX * ld + CHUNK * ld + CHUNK)
    return KernelLaunch(f"gdn_chunk_state_kernel<{prec.bf16}>", STATE_COLS, floats * 4)


@functools.cache
def state16_launch(cols: int) -> KernelLaunch:
    """The bf16-tile state kernel with `cols` state columns per block (32 or 64)."""
    C.require(cols in BF16_COLS_CHOICES and cols > 0, "bf16_cols",
              f"must be one of {BF16_COLS_CHOICES}")
    # two stages of -W, K', Q e^G [64][136] bf16, P [64][72] bf16, U [64][cols + 4] fp32;
    # S [128][cols + 8], V' [64][cols + 8] bf16; G_L [2] (padded to 16 bytes)
    stage = 3 * CHUNK * 136 * 2 + CHUNK * 72 * 2 + CHUNK * (cols + 4) * 4
    smem = 2 * stage + (DMAX + CHUNK) * (cols + 8) * 2 + 16
    return KernelLaunch(f"gdn_chunk_state16_kernel<{cols}>", cols, smem)


LOCAL16 = KernelLaunch("gdn_chunk_local16_kernel", CHUNK, local_launch(Precision.BF16).smem)


@functools.cache
def localpair_launch(heads_per_block: int) -> KernelLaunch:
    """gdn_chunk_localpair_kernel<heads_per_block> (1 or 2 value heads of one key head per
    block, 256 threads each); `cols` is the chunk. Shared memory (floats): K, Q and each head's
    V [64][136]; each head's A / T [64][68] and block-row scratch [16][52]; six [64] vectors per
    head (gdn_chunk.cu localpair_smem_bytes)."""
    C.require(heads_per_block in (1, 2), "heads_per_block", "must be 1 or 2")
    v = heads_per_block
    floats = (2 + v) * CHUNK * 136 + v * CHUNK * 68 + v * 16 * 52 + 6 * v * CHUNK
    return KernelLaunch(f"gdn_chunk_localpair_kernel<{v}>", CHUNK, floats * 4)


def localpair_heads(key_heads: int, value_heads: int) -> int:
    """Value heads per block of the pair local kernel: 2 when each key head's group of value
    heads splits into pairs, else 1."""
    return 2 if (value_heads // key_heads) % 2 == 0 else 1


def max_chunks(n_tokens: int, n_segments: int) -> int:
    """Upper bound of the chunks of n_tokens split into n_segments segments."""
    return (n_tokens + CHUNK - 1) // CHUNK + n_segments


@dataclasses.dataclass(frozen=True)
class ChunkWorkspace:
    """Intermediates of gdn_chunk_prefill for up to `max_tokens` tokens and `max_segments`."""

    w: object        # f32 [max_tokens, Hv, 128]
    u: object        # f32 [max_tokens, Hv, 128]
    gam: object      # f32 [max_tokens, Hv]
    p: object        # f32 [max_chunks, Hv, 64, 64]
    offsets: object  # i32 [max_segments + 1]
    qg: object = None  # bf16 bits (u16) [max_tokens, Hv, 128]: Q e^G of the bf16-tile path

    @classmethod
    def allocate(cls, max_tokens: int, max_segments: int, value_heads: int, *,
                 bf16_tiles: bool | None = None):
        """bf16_tiles (None: NINFER_GDN_CHUNK_BF16_COLS != 0) adds `qg` (the bf16-tile path needs
        it; 256 bytes per token and head)."""
        if bf16_tiles is None:
            bf16_tiles = BF16_COLS != 0
        cp = C.cupy()
        nb = max_chunks(max_tokens, max_segments)
        return cls(cp.empty((max_tokens, value_heads, DMAX), dtype=np.float32),
                   cp.empty((max_tokens, value_heads, DMAX), dtype=np.float32),
                   cp.empty((max_tokens, value_heads), dtype=np.float32),
                   cp.empty((nb, value_heads, CHUNK, CHUNK), dtype=np.float32),
                   cp.empty(max_segments + 1, dtype=np.int32),
                   cp.empty((max_tokens, value_heads, DMAX), dtype=np.uint16)
                   if bf16_tiles else None)

    def fits(self, n_tokens: int, n_segments: int, value_heads: int,
             bf16_tiles: bool = False) -> bool:
        nb = max_chunks(n_tokens, n_segments)
        return (self.w.shape[0] >= n_tokens and self.w.shape[1] == value_heads
                and self.offsets.shape[0] >= n_segments + 1 and self.p.shape[0] >= nb
                and (not bf16_tiles or (self.qg is not None and self.qg.shape[0] >= n_tokens)))


def _prepare_smem(fn, nbytes: int) -> None:
    if nbytes > 48 * 1024 and fn.max_dynamic_shared_size_bytes < nbytes:
        fn.max_dynamic_shared_size_bytes = nbytes


def gdn_chunk_prefill(q, k, v, g, beta, state, seg_starts, seg_slots, out, *,
                      workspace: ChunkWorkspace | None = None,
                      precision: Precision | str | None = None,
                      bf16_cols: int | None = None,
                      local_pair: bool | None = None) -> None:
    """Chunkwise gated delta rule over segments (operands as `gdn_recurrence`; dk, dv <= 128).

    precision: a `Precision` or its value ("tf32x3", "bf16"); bf16_cols: 0 (the fp32-tile
    kernels), or 32 / 64 for the bf16-tile path with that many state columns per block, taken
    only in BF16 precision (else the fp32-tile kernels run). None: PRECISION and BF16_COLS
    (NINFER_GDN_CHUNK_PRECISION, NINFER_GDN_CHUNK_BF16_COLS, read at import). local_pair (the
    bf16-tile path only): its local kernel is gdn_chunk_localpair_kernel (True: Q, K and their
    products shared by two value heads, (I + A)^-1 by 16 x 16 blocks applied with 3xTF32 mma)
    or gdn_chunk_local16_kernel (False: forward substitution per column, the fp32-tile bf16
    path's bits); None: LOCAL_PAIR (NINFER_GDN_CHUNK_LOCAL_PAIR, read at import).
    """
    f = O.recurrence_operands(q, k, v, g, beta, state, seg_starts, seg_slots, out)
    n = f.pop("n")
    C.require(f["dk"] <= DMAX and f["dv"] <= DMAX, "q", f"dk, dv must be <= {DMAX}")
    prec = PRECISION if precision is None else Precision(precision)
    bf16_cols = BF16_COLS if bf16_cols is None else bf16_cols
    C.require(bf16_cols in BF16_COLS_CHOICES, "bf16_cols", f"must be one of {BF16_COLS_CHOICES}")
    tiles16 = bf16_cols != 0 and prec is Precision.BF16
    config = state16_launch(bf16_cols) if tiles16 else state_launch(prec)
    segs, heads, dv = f["num_segs"], f["value_heads"], f["dv"]
    if n == 0 or segs == 0:
        return
    if workspace is None:
        workspace = ChunkWorkspace.allocate(n, segs, heads, bf16_tiles=tiles16)
    C.require(workspace.fits(n, segs, heads, tiles16), "workspace",
              f"too small for {n} tokens, {segs} segments, {heads} heads")
    nb = max_chunks(n, segs)
    # 16-byte cp.async of q / k rows needs 16-byte aligned bases and strides (else 4-byte copies)
    vec_qk = all(f[a] % 16 == 0 for a in ("q", "k")) and all(
        f[st] % 4 == 0 for st in ("q_rs", "q_hs", "k_rs", "k_hs"))
    vec_v = f["v"] % 16 == 0 and f["v_rs"] % 4 == 0 and f["v_hs"] % 4 == 0
    params = C.pack(_PARAMS, **f, chunk_offsets=C.ptr(workspace.offsets),
                    w_ws=C.ptr(workspace.w), u_ws=C.ptr(workspace.u),
                    gam_ws=C.ptr(workspace.gam), p_ws=C.ptr(workspace.p), max_chunks=nb,
                    vec_qk=int(vec_qk), vec_v=int(vec_v))
    launch(get_function(SOURCE, "gdn_chunk_offsets_kernel"), (1,), (32,), (params,),
           name="gdn_chunk_offsets")
    if tiles16:
        if LOCAL_PAIR if local_pair is None else local_pair:
            vpb = localpair_heads(f["key_heads"], heads)
            _launch(localpair_launch(vpb), (nb, heads // vpb), (params, workspace.qg),
                    "gdn_chunk_localpair", threads=256 * vpb)
        else:
            _launch(LOCAL16, (nb, heads), (params, workspace.qg), "gdn_chunk_local16")
        _launch(config, (segs, heads, -(-dv // config.cols)), (params, workspace.qg),
                "gdn_chunk_state16")
        return
    _launch(local_launch(prec), (nb, heads), params, "gdn_chunk_local")
    _launch(config, (segs, heads, -(-dv // config.cols)), params, "gdn_chunk_state")


def _launch(config: KernelLaunch, grid: tuple, args, name: str, threads: int = 256) -> None:
    """args: the params struct, or a tuple of kernel arguments."""
    fn = get_function(SOURCE, config.kernel)
    _prepare_smem(fn, config.smem)
    launch(fn, grid, (threads,), args if isinstance(args, tuple) else (args,),
           shared_mem=config.smem, name=name)
