"""bench/timeline.py's grouping of pdl_wait records into kernel instances and links (synthetic
records; the timeline build itself runs on the GPU only)."""
from __future__ import annotations

import numpy as np

from bench.timeline import instances, report


def _rec(before, after, blocks, threads, block, smem=0, sm=0, module=3):
    meta = (module << 56) | (sm << 48) | (blocks << 32) | (threads << 16) | block
    return [before, after, meta, smem]


def test_instances_split_a_fingerprint_at_its_largest_gaps_and_measure_links():
    rng = np.random.default_rng()
    # a step: gemv (4 blocks) -> norm (1 block) -> gemv (4 blocks) -> norm; the two gemvs
    # share a fingerprint, as do the norms; blocks release within ~100 ns, out of order
    t = 1_000_000
    gemv = [(0, 4, 544), (5_000, 4, 544)]  # (release offset ns, blocks, threads)
    norm = [(3_000, 1, 256), (9_000, 1, 256)]
    recs_linear, recs_norm = [], []
    for off, blocks, threads in gemv:
        for b in rng.permutation(blocks):
            recs_linear.append(_rec(t + off - 2_000, t + off + int(rng.integers(0, 100)),
                                    blocks, threads, int(b), smem=181_760))
    for off, blocks, threads in norm:
        recs_norm.append(_rec(t + off - 500, t + off + 20, blocks, threads, 0, module=9))
    records = {"linear.cu": np.array(recs_linear, np.uint64),
               "norm.cu": np.array(recs_norm, np.uint64)}
    launches = [("linear_tma", (4, 1), (544,), 181_760), ("rms_norm", (1,), (256,), 0)] * 2
    inst = instances(records, launches)
    assert [r["name"] for r in inst] == ["linear_tma", "rms_norm", "linear_tma", "rms_norm"]
    assert [r["blocks"] for r in inst] == [4, 1, 4, 1]
    links = [r["link"] for r in inst[:-1]]
    # release to the next release: 3000 - (first block of gemv 0), 2000 - 20 + (gemv 1's first)
    assert abs(links[0] - 3_000) < 150 and abs(links[2] - 4_000) < 150, links
    assert abs(links[1] - 2_000) < 150, links
    assert all(r["release"] - r["resident"] >= 480 for r in inst)
    text = report(inst, top=5)
    assert "linear_tma" in text and "rms_norm" in text and "4 instances" in text


def test_records_of_an_unlogged_fingerprint_keep_their_module_name():
    records = {"gdn_decode.cu": np.array([_rec(10, 20, 2, 128, 0), _rec(11, 22, 2, 128, 1)],
                                         np.uint64)}
    inst = instances(records, [])
    assert len(inst) == 1 and inst[0]["blocks"] == 2 and "gdn_decode.cu" in inst[0]["name"]


def test_sequence_instances_follow_the_launch_order():
    """Two GEMVs of one geometry released 300 ns apart (too close for any gap rule) and a
    launch without records between two norms: every record lands on its launch, in order."""
    from bench.timeline import sequence_instances

    rng = np.random.default_rng()
    t = 5_000_000
    plan = [("linear_tma", 4, 544, 181_760, 0), ("rms_norm", 1, 256, 0, 2_000),
            ("copy", 3, 128, 0, None), ("linear_tma", 4, 544, 181_760, 2_300),
            ("linear_tma", 4, 544, 181_760, 2_600), ("rms_norm", 1, 256, 0, 9_000)]
    recs, launches = [], []
    for name, blocks, threads, smem, release in plan:
        launches.append((name, (blocks,), (threads,), smem))
        if release is None:
            continue  # a kernel whose thread 0 does not wait: no records
        for b in rng.permutation(blocks):
            recs.append(_rec(t + release - 1_000, t + release + int(rng.integers(0, 60)), blocks,
                             threads, int(b), smem=smem))
    rng.shuffle(recs)
    inst, unmatched = sequence_instances({"all.cu": np.array(recs, np.uint64)}, launches)
    assert unmatched == 0
    assert [(r["name"], r["pos"], r["blocks"]) for r in inst] == [
        ("linear_tma", 0, 4), ("rms_norm", 1, 1), ("linear_tma", 3, 4), ("linear_tma", 4, 4),
        ("rms_norm", 5, 1)]
    assert abs(inst[2]["link"] - 300) < 80 and abs(inst[3]["link"] - 6_400) < 80
    # records the log cannot explain are reported, not forced onto launches
    _, unmatched = sequence_instances({"all.cu": np.array(recs, np.uint64)}, launches[:2])
    assert unmatched == 9  # the last two GEMVs and norm


def test_phases_assign_marks_to_their_modules_instances():
    """Marks land on the instance of their module released last before them; per tag the
    first and last block's offsets after that release are averaged over the instances."""
    from bench.timeline import phases

    t = 2_000_000
    inst = [dict(name="gdn_decode", release=t, link=7_000, file="gdn_decode.cu"),
            dict(name="linear_tma", release=t + 7_000, link=4_000, file="linear.cu"),
            dict(name="gdn_decode", release=t + 11_000, link=9_000, file="gdn_decode.cu")]

    def mark(time, tag, block):
        return [time, (5 << 56) | (tag << 48) | block]

    marks = {"gdn_decode.cu": np.array(
        [mark(t + 1_000, 1, 0), mark(t + 1_400, 1, 1),  # instance 0, tag 1: 1.0 / 1.4 us
         mark(t + 6_000, 5, 0),                          # instance 0, tag 5: 6.0
         mark(t + 11_000 + 2_000, 1, 0), mark(t + 11_000 + 2_600, 1, 1),  # instance 1: 2.0 / 2.6
         mark(t + 11_000 + 8_000, 5, 1)], np.uint64),    # instance 1, tag 5: 8.0
        "linear.cu": np.zeros((0, 2), np.uint64)}
    rows = {tuple(line.split()[:2]): line.split() for line in phases(inst, marks).splitlines()[1:]}
    n, blocks, first, last, link = map(float, rows[("gdn_decode", "1")][2:])
    assert (n, blocks) == (2, 2) and abs(first - 1.5) < 1e-9 and abs(last - 2.0) < 1e-9
    assert abs(link - 8.0) < 1e-9
    n, blocks, first, last, _ = map(float, rows[("gdn_decode", "5")][2:])
    assert (n, blocks) == (2, 1) and abs(first - 7.0) < 1e-9 and abs(last - 7.0) < 1e-9
    assert phases(inst, {"linear.cu": np.zeros((0, 2), np.uint64)}) == "no phase marks"


def test_record_caps_match_the_device_buffers():
    """The loader reads back as many records / marks per module as common.cuh's buffers hold
    (a 35B-A3B step writes ~18K block records into linear.cu's buffer alone)."""
    import re

    from ninfer.kernels_cuda import _loader

    text = (_loader.PACKAGE_DIR / "common.cuh").read_text()
    caps = dict(re.findall(r"#define (NINFER_TIMELINE_CAP|NINFER_MARK_CAP) (\d+)", text))
    assert int(caps["NINFER_TIMELINE_CAP"]) == _loader._TIMELINE_CAP >= 65536
    assert int(caps["NINFER_MARK_CAP"]) == _loader._MARK_CAP


def test_attn_timeline_mark_spread_per_tag_and_launch():
    """bench/attn_timeline.py: each mark goes to the launch released last before it; per tag
    and launch the 0 / 10 / 50 / 90 / 100th percentiles of the blocks' offsets (ns)."""
    from bench.attn_timeline import mark_spread

    t = 5_000_000
    inst = [dict(release=t), dict(release=t + 50_000)]

    def mark(time, tag, block):
        return [time, (7 << 56) | (tag << 48) | block]

    marks = {"attention.cu": np.array(
        [mark(t + 1_000 * (b + 1), 2, b) for b in range(11)]           # launch 0: 1..11 us
        + [mark(t + 50_000 + 3_000, 2, 0), mark(t + 50_000 + 5_000, 2, 1)]  # launch 1: 3, 5
        + [mark(t + 40_000, 6, 0)], np.uint64)}                         # launch 0, tag 6
    spread = mark_spread(inst, marks)
    assert sorted(spread) == [2, 6]
    assert spread[2].shape == spread[6].shape == (2, 5)
    np.testing.assert_allclose(spread[2][0], [1_000, 2_000, 6_000, 10_000, 11_000])
    np.testing.assert_allclose(spread[2][1], [3_000, 3_200, 4_000, 4_800, 5_000])
    np.testing.assert_allclose(spread[6][0], [40_000] * 5)
    assert np.isnan(spread[6][1]).all()  # launch 1 has no tag 6
