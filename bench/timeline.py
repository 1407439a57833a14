"""Where a captured decode step's time goes, link by link (diagnostic; H200).

Every kernel of the decode step calls `pdl_wait` (common.cuh) before it reads what the kernel
before it wrote. In the timeline build (NINFER_KERNEL_TIMELINE=1, which `main` sets before
ninfer's loader is imported) thread 0 of every block records the global timer before and after
that wait. A
kernel's wait returns when its predecessor has completed, so the time from one kernel's release
(its first block's wait return) to the next kernel's release is that kernel's link of the chain:
its work after the wait plus the completion hand-off. Records before the wait say how early the
blocks were resident (the PDL overlap).

    python3 -m bench.timeline --shape 35b-a3b --batch 1 [--context 1024] [--top 40]

Runs the decode step eagerly once to log its launches (name, grid, block, shared memory: the
instances' fingerprints), replays the captured graph a few times, then once more with the
records on, and prints every kernel instance in release order (link us, how long before its
release the first block was resident, the spread of its blocks' releases, its position in the
step's launches) and the links summed per kernel name. Instances are matched to the launch log
in order (`sequence_instances`), or grouped by geometry where the order does not explain them.
Kernels whose blocks do not call pdl_wait on thread 0 leave no record; their
time falls into the link before them. The build is slower than the normal one (an atomic per
block): read the links relative to each other and to the step they add up to.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np

from bench.shapes import SHAPES, resolve


def _fingerprint(blocks: int, threads: int, smem: int) -> tuple[int, int, int]:
    return blocks & 0xFFFF, threads & 0xFFFF, smem


def _links(out: list[dict]) -> list[dict]:
    out.sort(key=lambda r: r["release"])
    for a, b in zip(out, out[1:]):
        a["link"] = b["release"] - a["release"]
    if out:
        out[-1]["link"] = out[-1]["last"] - out[-1]["release"]
    return out


def _instance(name: str, part: list[tuple], key) -> dict:
    """One kernel instance from its blocks' records (after, before, ..., module file)."""
    return dict(name=name, blocks=len(part), release=min(r[0] for r in part),
                resident=min(r[1] for r in part), last=max(r[0] for r in part), key=key,
                file=part[0][-1])


def sequence_instances(records: dict[str, np.ndarray], launches) -> tuple[list[dict], int]:
    """Kernel instances of one replay, matched to the launch log in order: a kernel's waits
    return only after every block of the kernel before it has waited and finished, so with the
    records sorted by wait return each launch's blocks come as one run. Launch j takes the next
    records of its fingerprint, at most its block count (none: a kernel whose thread 0 does not
    wait). Returns (instances, records left unmatched; 0 when the log explains them all)."""
    recs = []
    for file, arr in records.items():
        for before, after, meta, smem in arr.tolist():
            recs.append((after, before, _fingerprint((meta >> 32) & 0xFFFF,
                                                     (meta >> 16) & 0xFFFF, int(smem)), file))
    recs.sort()
    out, i = [], 0
    for pos, (name, grid, block, smem) in enumerate(launches):
        blocks = int(np.prod(grid))
        key = _fingerprint(blocks, int(np.prod(block)), smem)
        j = i
        while j < len(recs) and j - i < blocks and recs[j][2] == key:
            j += 1
        if j > i:
            out.append(_instance(name or "?", recs[i:j], key) | {"pos": pos})
            i = j
    return _links(out), len(recs) - i


def instances(records: dict[str, np.ndarray], launches) -> list[dict]:
    """Kernel instances of one replay without relying on the launch order (the fallback of
    `sequence_instances`): the records grouped by fingerprint (blocks, threads per block,
    dynamic shared memory), each group split into as many instances as the launch log has
    launches of that fingerprint, at the largest gaps between the blocks' wait returns."""
    names: dict[tuple, list[str]] = defaultdict(list)
    for name, grid, block, smem in launches:
        names[_fingerprint(int(np.prod(grid)), int(np.prod(block)), smem)].append(name or "?")
    rows = defaultdict(list)
    for file, recs in records.items():
        for before, after, meta, smem in recs.tolist():
            key = _fingerprint((meta >> 32) & 0xFFFF, (meta >> 16) & 0xFFFF, int(smem))
            rows[key].append((after, before, file))
    out = []
    for key, recs in rows.items():
        recs.sort()
        expected = max(1, len(names.get(key, ())))
        after = np.array([r[0] for r in recs], dtype=np.int64)
        gaps = np.diff(after)
        cuts = sorted(np.argsort(gaps)[::-1][: expected - 1] + 1) if len(recs) > 1 else []
        label = "|".join(sorted(set(names.get(key, [f"? {recs[0][2]}"]))))
        for part in np.split(np.arange(len(recs)), cuts):
            if len(part):
                out.append(_instance(label, [recs[i] for i in part], key))
    return _links(out)


def report(inst: list[dict], top: int) -> str:
    if not inst:
        return "no records (was the build a timeline build?)"
    t0 = inst[0]["release"]
    lines = [f"{'at us':>8} {'link us':>8} {'lead us':>8} {'spread':>7} {'blocks':>6} "
             f"{'launch':>6}  kernel"]
    for r in inst:
        lines.append(f"{(r['release'] - t0) / 1e3:8.2f} {r['link'] / 1e3:8.2f} "
                     f"{(r['release'] - r['resident']) / 1e3:8.2f} "
                     f"{(r['last'] - r['release']) / 1e3:7.2f} {r['blocks']:6d} "
                     f"{r.get('pos', -1):6d}  {r['name']}")
    total = (inst[-1]["release"] + inst[-1]["link"] - t0) / 1e3
    per = defaultdict(lambda: [0, 0.0])
    for r in inst:
        per[r["name"]][0] += 1
        per[r["name"]][1] += r["link"] / 1e3
    lines.append(f"\nstep (first release to last record): {total:.1f} us, {len(inst)} instances")
    lines.append(f"{'sum us':>9} {'count':>6} {'mean us':>8}  kernel")
    for name, (count, s) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{s:9.1f} {count:6d} {s / count:8.2f}  {name}")
    return "\n".join(lines)


def phases(inst: list[dict], marks: dict[str, np.ndarray]) -> str:
    """The phase marks (common.cuh timeline_mark) per kernel name and tag: each mark belongs to
    the instance of its module with the latest release before it (marks come after their
    block's wait and before their kernel completes, which precedes the module's next release);
    per instance the first and the last block's mark, us after the release; means over the
    instances, with the mean link for comparison."""
    by_file: dict[str, list[dict]] = defaultdict(list)
    for r in inst:
        by_file[r["file"]].append(r)
    table: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for file, arr in marks.items():
        rs = sorted(by_file.get(file, []), key=lambda r: r["release"])
        if not rs or not len(arr):
            continue
        releases = np.array([r["release"] for r in rs], dtype=np.int64)
        per: dict[tuple[int, int], list[int]] = defaultdict(list)
        for t, meta in arr.tolist():
            i = int(np.searchsorted(releases, t, side="right")) - 1
            if i >= 0:
                per[(i, (meta >> 48) & 0xFF)].append(t)
        for (i, tag), ts in per.items():
            table[rs[i]["name"]][tag].append((min(ts) - rs[i]["release"],
                                              max(ts) - rs[i]["release"], len(ts), rs[i]["link"]))
    if not table:
        return "no phase marks"
    lines = [f"{'kernel':<28} {'tag':>3} {'n':>4} {'blocks':>6} {'first us':>9} {'last us':>8} "
             f"{'link us':>8}"]
    for name in sorted(table):
        for tag in sorted(table[name]):
            v = np.array(table[name][tag], dtype=np.float64)
            lines.append(f"{name:<28} {tag:3d} {len(v):4d} {v[:, 2].mean():6.1f} "
                         f"{v[:, 0].mean() / 1e3:9.2f} {v[:, 1].mean() / 1e3:8.2f} "
                         f"{v[:, 3].mean() / 1e3:8.2f}")
    return "\n".join(lines)


def replay_recorded(graph, device, warm: int = 5) -> tuple[dict, dict]:
    """(timeline records, phase marks) of one replay of a captured `graph` on `device`'s stream
    after `warm` replays (timeline build; the launch log is kept)."""
    from ninfer.kernels_cuda import _loader

    for _ in range(warm):
        graph.launch(device.stream)
    device.synchronize()
    _loader.timeline_reset(launches=False)
    graph.launch(device.stream)
    device.synchronize()
    return _loader.timeline_records(), _loader.timeline_marks()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.timeline", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="35b-a3b", help=f"one of {', '.join(SHAPES)}")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--top", type=int, default=40, help="kernel names in the summary")
    parser.add_argument("--rows", action="store_true", help="also print every instance")
    args = parser.parse_args(argv)
    os.environ["NINFER_KERNEL_TIMELINE"] = "1"  # before ninfer's loader is imported

    import cupy as cp

    from bench.model import _build, decode_rows, shape_config
    from ninfer.kernels_cuda import _loader
    from ninfer.models.qwen3_5.random_params import random_parameters

    if not _loader._TIMELINE:
        raise SystemExit("bench.timeline: the kernel loader was imported before the timeline "
                         "switch was set; run it as `python3 -m bench.timeline`")
    shape = resolve(args.shape)
    cfg, _, _ = shape_config(shape, args.context + 1)
    params = random_parameters(cfg, xp=cp, seed=1)
    device, backend = _build(cfg, params, args.batch, args.context, prefill_chunk=64)
    backend.capture_graphs()
    rng = np.random.default_rng(2)
    with decode_rows(backend, cfg, args.batch, args.context, rng):
        with device.activate():
            _loader.timeline_reset()
            backend._decode_body(args.batch)  # the launch log of one step
            device.synchronize()
            launches = _loader.timeline_launches()
            records, marks = replay_recorded(backend.graphs[args.batch], device)
    inst, unmatched = sequence_instances(records, launches)
    if unmatched:  # the log does not explain the records' order: group by geometry instead
        print(f"{unmatched} records not matched to the launch order; grouping by geometry")
        inst = instances(records, launches)
    stamps = np.unique(np.concatenate([r[:, :2].ravel() for r in records.values()] or [[0]]))
    step = int(np.diff(stamps).min()) if len(stamps) > 1 else 0
    print(f"{shape.name} B={args.batch} context {args.context}: {len(launches)} launches per "
          f"step, {sum(len(r) for r in records.values())} block records, timer step {step} ns")
    text = report(inst, args.top)
    if not args.rows:
        text = text[text.index("\nstep"):]
    print(text)
    print("\nphase marks (us after the release; first / last block):")
    print(phases(inst, marks))
    backend.destroy_graphs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
