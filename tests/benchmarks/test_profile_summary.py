"""bench/profile_decode.py --summarize on a synthetic ncu CSV (CPU): per-step tables."""
from __future__ import annotations

from bench import profile_decode

HEADER = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'


def _log(tmp_path, launches):
    rows = [f'"{i}","{name}(P)","gpu__time_duration.sum","{unit}","{value}"\n'
            for i, (name, unit, value) in enumerate(launches)]
    path = tmp_path / "prof.csv"
    path.write_text("==PROF== noise\n" + HEADER + "".join(rows))
    return str(path)


def test_kernel_times_units_and_names(tmp_path):
    path = _log(tmp_path, [("gemv", "nsecond", "1,500"), ("norm", "usecond", "2.5"),
                           ("gemv", "msecond", "0.001")])
    assert profile_decode.kernel_times(path) == [("gemv", 1500.0), ("norm", 2500.0),
                                                 ("gemv", 1000.0)]


def test_summarize_one_table_per_step(tmp_path, capsys):
    step = [("gemv", "nsecond", "3000"), ("norm", "nsecond", "1000")]
    bigger = [("gemv", "nsecond", "5000"), ("norm", "nsecond", "1000")]
    path = _log(tmp_path, step + bigger)
    profile_decode.summarize(path, ["B=1", "B=8"])
    out = capsys.readouterr().out
    assert "B=1: kernels 2, total 4.0 us" in out and "B=8: kernels 2, total 6.0 us" in out
    profile_decode.summarize(path, ["B=1", "B=4", "B=8"])  # 4 launches do not split in 3
    out = capsys.readouterr().out
    assert "do not split" in out and "all steps: kernels 4, total 10.0 us" in out
