"""Each bad input gives one clear error line, a non-zero exit, no traceback, no output file."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ninfer.cli.main import main
from ninfer.testing.checkpoints import PRESETS, write_hf_checkpoint
from tools.convert.safetensors import SafetensorsFile, write_safetensors


def _ckpt(tmp_path, **kw):
    kw.setdefault("architecture", "Qwen3_5ForCausalLM")
    preset = "tiny-moe" if "Moe" in kw["architecture"] else "tiny-dense"
    return write_hf_checkpoint(tmp_path / "hf", PRESETS[preset], seed=2, **kw)


def _edit_config(hf, fn):
    cfg = json.loads((hf / "config.json").read_text())
    fn(cfg)
    (hf / "config.json").write_text(json.dumps(cfg))


def _rewrite_tensors(path, transform):
    """Rewrite a safetensors file through `transform(entries) -> entries`, entries being
    [(name, dtype, shape, array)]."""
    st = SafetensorsFile(path)
    entries = [(n, i.dtype, i.shape, np.array(st.array(n))) for n, i in st.tensors.items()]
    st.close()
    entries = transform(entries)
    data = {n: a for n, _, _, a in entries}
    write_safetensors(path, [(n, d, s) for n, d, s, _ in entries], lambda n: [data[n]])


def _drop_key(key):
    return lambda entries: [e for e in entries if e[0] != key]


def _as_int8(key):
    def t(entries):
        return [(n, "I8", s, np.zeros(s, np.int8)) if n == key else (n, d, s, a)
                for n, d, s, a in entries]
    return t


def _break(tmp_path, case: str):
    """Build the bad checkpoint for `case`; returns (hf_dir, expected message fragment)."""
    if case == "missing-dir":
        return tmp_path / "nowhere", "does not exist"
    hf = _ckpt(tmp_path, shard_bytes=50_000 if case == "missing-shard" else None)
    st = hf / "model.safetensors"
    if case == "unsupported-arch":
        _edit_config(hf, lambda c: c.update(architectures=["LlamaForCausalLM"]))
        return hf, "unsupported architecture 'LlamaForCausalLM'"
    if case == "missing-config":
        (hf / "config.json").unlink()
        return hf, "missing config.json"
    if case == "bad-config-json":
        (hf / "config.json").write_text("{not json")
        return hf, "not valid JSON"
    if case == "bad-config-value":
        _edit_config(hf, lambda c: c.update(linear_num_value_heads=3))
        return hf, "linear_num_value_heads 3 must be a multiple"
    if case == "missing-safetensors":
        st.unlink()
        return hf, "no *.safetensors files"
    if case == "missing-shard":
        next(hf.glob("model-00002-*.safetensors")).unlink()
        return hf, "missing safetensors shard model-00002"
    if case == "shape-mismatch":
        _edit_config(hf, lambda c: c.update(intermediate_size=96))
        return hf, "shape mismatch against config.json: model.layers.0.mlp.gate_proj.weight"
    if case == "missing-tensor":
        _rewrite_tensors(st, _drop_key("model.layers.2.linear_attn.A_log"))
        return hf, "lacks 1 tensor(s) the model needs: model.layers.2.linear_attn.A_log"
    if case == "partial-mtp":
        _rewrite_tensors(st, lambda e: e + [("mtp.fc.weight", "F32", (64, 128),
                                             np.ones((64, 128), np.float32))])
        return hf, "mtp.pre_fc_norm_embedding.weight"
    if case == "truncated-safetensors":
        raw = st.read_bytes()
        st.write_bytes(raw[:-100])
        return hf, "truncated safetensors file"
    if case == "truncated-header":
        st.write_bytes(st.read_bytes()[:50])
        return hf, "truncated safetensors file"
    if case == "bad-dtype":
        _rewrite_tensors(st, _as_int8("model.norm.weight"))
        return hf, "cannot handle the dtype of model.norm.weight (I8)"
    raise AssertionError(case)


CASES = ["missing-dir", "unsupported-arch", "missing-config", "bad-config-json",
         "bad-config-value", "missing-safetensors", "missing-shard", "shape-mismatch",
         "missing-tensor", "partial-mtp", "truncated-safetensors", "truncated-header", "bad-dtype"]


@pytest.mark.parametrize("case", CASES)
def test_bad_checkpoint_gives_one_line_and_no_output(tmp_path, capsys, case):
    hf, fragment = _break(tmp_path, case)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code = main(["convert", str(hf), str(out_dir / "m.ninfer")])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert fragment in captured.err, captured.err
    assert "Traceback" not in captured.err
    assert os.listdir(out_dir) == []          # no output, no temp file


def test_bad_dtype_policy_and_output_dir(tmp_path, capsys):
    hf = _ckpt(tmp_path)
    from tools.convert import convert_checkpoint
    from ninfer.errors import ConversionError

    with pytest.raises(ConversionError, match="unknown --dtype"):
        convert_checkpoint(hf, tmp_path / "m.ninfer", dtype="fp8")
    assert main(["convert", str(hf), str(tmp_path / "no" / "m.ninfer")]) == 2
    assert "output directory" in capsys.readouterr().err
    assert not (tmp_path / "m.ninfer").exists()


def test_cli_process_exit_code_and_single_line(tmp_path):
    hf, _ = _break(tmp_path, "shape-mismatch")
    out = tmp_path / "m.ninfer"
    proc = subprocess.run([sys.executable, "-m", "ninfer.cli.main", "convert", str(hf), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: shape mismatch") and proc.stderr.count("\n") == 1
    assert not out.exists()
