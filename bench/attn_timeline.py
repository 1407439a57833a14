"""Where a decode paged_attention launch spends its time (diagnostic; H200, timeline build).

    python3 -m bench.attn_timeline --shape 9b --batch 1 --context 32768 [--launches 8]
        [--past-kv-ready]

Captures `--launches` back-to-back decode launches (each over its own copy of the K / V pages,
as `ninfer-bench kernels --op paged_attention` times them) in a CUDA graph, replays it, then
replays it once more with the timeline records on (bench/timeline.py explains the build). Prints
each launch's link (release to the next launch's release) against the bytes it must move at
the copy rate measured in the same run, and per phase mark (common.cuh timeline_mark; the
kernel's comments name its tags) the spread over the blocks: us after the launch's release at
the 0 / 10 / 50 / 90 / 100th percentile, means over the launches after the first.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

from bench.timeline import replay_recorded, sequence_instances


def mark_spread(inst: list[dict], marks: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """Per tag: [launches, 5] percentiles (0, 10, 50, 90, 100) of the blocks' marks, ns after
    their launch's release (NaN for a launch without that tag); a mark belongs to the launch
    with the latest release before it."""
    releases = np.array([r["release"] for r in inst], dtype=np.int64)
    per: dict[tuple[int, int], list[int]] = defaultdict(list)
    for arr in marks.values():
        for t, meta in arr.tolist():
            i = int(np.searchsorted(releases, t, side="right")) - 1
            if i >= 0:
                per[((meta >> 48) & 0xFF, i)].append(t - int(releases[i]))
    out: dict[int, np.ndarray] = {}
    for (tag, i), ts in per.items():
        rows = out.setdefault(tag, np.full((len(inst), 5), np.nan))
        rows[i] = np.percentile(np.array(ts, dtype=np.float64), [0, 10, 50, 90, 100])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.attn_timeline", description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="9b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--launches", type=int, default=8)
    ap.add_argument("--past-kv-ready", action="store_true")
    args = ap.parse_args(argv)
    os.environ["NINFER_KERNEL_TIMELINE"] = "1"  # before ninfer's loader is imported

    import cupy as cp

    from bench.harness import BenchContext, measure_copy_gbps
    from bench.kernel_cases import PAGE, DecodeAttention
    from bench.shapes import resolve
    from ninfer.core.cuda.device import DeviceContext
    from ninfer.core.cuda.graph import CudaGraph
    from ninfer.kernels_cuda import _loader
    from ninfer.kernels_cuda import attention as katt

    if not _loader._TIMELINE:
        raise SystemExit("bench.attn_timeline: run it as `python3 -m bench.attn_timeline`")
    s, b, ctx, reps = resolve(args.shape), args.batch, args.context, args.launches
    case = DecodeAttention.build(cp, s, b, ctx, reps)
    need = case.bytes
    path = katt.decode_path(katt.C.WKind.BF16, s.heads // s.kv_heads, s.head_dim, PAGE)

    device = DeviceContext()
    with device.activate():
        copy_bps = measure_copy_gbps(BenchContext(s, np.random.default_rng(0), 0)) * 1e9

        def calls():
            for i in range(reps):
                case.call(i, args.past_kv_ready)

        _loader.timeline_reset()
        calls()  # compiles, and logs the launches
        device.synchronize()
        launches = _loader.timeline_launches()
        graph = CudaGraph("attn_timeline")
        with graph.capture(device.stream):
            calls()
        records, marks = replay_recorded(graph, device)
        graph.destroy()
    inst, unmatched = sequence_instances(records, launches)
    floor_us = need / copy_bps * 1e6
    print(f"{args.shape} B={b} ctx={ctx} {path} past_kv_ready={args.past_kv_ready}: "
          f"{need / 1e6:.1f} MB per launch, copy {copy_bps / 1e9:.0f} GB/s -> floor "
          f"{floor_us:.2f} us; {len(inst)} launches, {unmatched} records unmatched")
    links = np.array([r["link"] for r in inst[:-1]], dtype=np.float64) / 1e3
    for i, r in enumerate(inst):
        lead = (r["release"] - r["resident"]) / 1e3
        print(f"  launch {i}: link {r['link'] / 1e3:7.2f} us, lead {lead:6.2f}, "
              f"release spread {(r['last'] - r['release']) / 1e3:6.2f}, {r['blocks']} blocks")
    if len(links) > 1:
        mean = links[1:].mean()
        print(f"mean link (launches 1..{len(links) - 1}): {mean:.2f} us = "
              f"{floor_us / mean:.2f} of the copy rate")
    print("phase marks, us after the release (percentiles over blocks 0/10/50/90/100, mean over "
          "launches 1..):")
    for tag, v in sorted(mark_spread(inst, marks).items()):
        rows = v[1:] if len(v) > 1 else v
        rows = rows[~np.isnan(rows[:, 0])]
        if not len(rows):
            continue
        m = rows.mean(axis=0) / 1e3
        print(f"  tag {tag}: " + " ".join(f"{x:7.2f}" for x in m) + f"  ({len(rows)} launches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
