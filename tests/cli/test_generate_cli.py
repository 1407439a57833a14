"""`ninfer generate`: JSON output through the public Engine, and one-line errors for bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.models.qwen35_cases import build_case, generate, open_program


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return build_case(tmp_path_factory.mktemp("cli"), "tiny-dense")


def ninfer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ninfer.cli.main", *args], capture_output=True,
                          text=True, timeout=300)


def test_generate_json_matches_program_greedy(case):
    proc = ninfer("generate", str(case.artifact), "--prompt-ids", "5,17,42,99", "--max-tokens",
                  "9", "--temperature", "0", "--ignore-eos", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    (ref,) = generate(open_program(case), [[5, 17, 42, 99]], 9)
    assert out["token_ids"] == ref.tokens
    assert out["logprobs"] == pytest.approx(ref.logprobs, abs=1e-6)
    assert out["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 4, "completion_tokens": 9}
    assert isinstance(out["text"], str) and out["timings"]["total_s"] > 0


def test_generate_text_prompt_streams_text(case):
    proc = ninfer("generate", str(case.artifact), "--prompt", "hello", "--max-tokens", "4",
                  "--seed", "1")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", ""], "empty"),
    (["--prompt-ids", "1,x"], "comma-separated"),
    (["--prompt-ids", "1,100000"], "vocabulary"),
    (["--prompt-ids", ",".join(["7"] * 5000)], "context"),
    (["--prompt-ids", "1", "--device", "tpu"], "unknown device"),
    (["--prompt-ids", "1", "--max-tokens", "0"], "max-tokens"),
    (["--prompt", ""], "empty"),
])
def test_generate_bad_input_is_one_clear_line(case, args, message):
    proc = ninfer("generate", str(case.artifact), *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_generate_missing_artifact(tmp_path):
    proc = ninfer("generate", str(tmp_path / "nope.ninfer"), "--prompt-ids", "1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
