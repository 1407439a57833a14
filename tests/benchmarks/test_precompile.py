"""bench.precompile's settings parsing and its bounded process pool (CPU: no compile runs)."""
import subprocess

import pytest

from bench import precompile


def test_parse_setting_splits_on_plus():
    assert precompile.parse_setting("NINFER_ATTN_TMA=1+NINFER_ATTN_MERGE_KERNEL=3") == {
        "NINFER_ATTN_TMA": "1", "NINFER_ATTN_MERGE_KERNEL": "3"}
    assert precompile.parse_setting("A=") == {"A": ""}


@pytest.mark.parametrize("bad", ["NINFER_ATTN_TMA", "=1", "A=1+B"])
def test_parse_setting_rejects_items_without_a_name_and_value(bad):
    with pytest.raises(ValueError, match="NAME=VALUE"):
        precompile.parse_setting(bad)


def test_pool_never_exceeds_jobs_and_runs_every_build_per_setting(monkeypatch, capsys):
    """Fake processes: count how many are alive at once and which env each one got."""
    alive, peak, envs = [0], [0], []

    class FakeProc:
        def __init__(self, cmd, env):
            envs.append(env.get("NINFER_X"))
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
            self.polls, self.returncode = 0, None

        def poll(self):
            self.polls += 1
            if self.polls >= 2 and self.returncode is None:
                self.returncode = 0
                alive[0] -= 1
            return self.returncode

    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    monkeypatch.setattr(precompile.time, "sleep", lambda s: None)
    monkeypatch.setattr(precompile, "MODULES", ("m1", "m2", "m3"))
    monkeypatch.setattr(precompile, "_sources", lambda name: ["SOURCE", "SOURCE_B"])
    assert precompile.main(["--jobs", "4", "--setting", "NINFER_X=1"]) == 0
    assert peak[0] == 4
    assert envs.count(None) == 6 and envs.count("1") == 6
    assert "12 builds (2 settings)" in capsys.readouterr().out


def test_failed_build_is_named_and_exit_code_is_one(monkeypatch, capsys):
    class FailingProc:
        def __init__(self, cmd, env):
            self.returncode = 1

        def poll(self):
            return self.returncode

    monkeypatch.setattr(subprocess, "Popen", FailingProc)
    monkeypatch.setattr(precompile.time, "sleep", lambda s: None)
    monkeypatch.setattr(precompile, "MODULES", ("m1",))
    monkeypatch.setattr(precompile, "_sources", lambda name: ["SOURCE"])
    assert precompile.main(["--setting", "A=1"]) == 1
    assert "FAILED: m1.SOURCE, A=1: m1.SOURCE" in capsys.readouterr().out
