"""`ninfer convert` / `inspect` / `verify` end to end, and a fast, light `--help`."""
from __future__ import annotations

import json
import subprocess
import sys

from ninfer.artifact import Artifact
from ninfer.cli.main import main
from ninfer.testing.checkpoints import PRESETS, write_hf_checkpoint


def _convert(tmp_path, capsys, *extra):
    hf = write_hf_checkpoint(tmp_path / "hf", PRESETS["tiny-moe"], seed=8,
                             architecture="Qwen3_5MoeForConditionalGeneration", with_mtp=True)
    out = tmp_path / "m.ninfer"
    assert main(["convert", str(hf), str(out), "--progress", "never", *extra]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    return out


def test_inspect_text_shows_the_key_facts(tmp_path, capsys):
    out = _convert(tmp_path, capsys, "--dtype", "bf16", "--name", "tiny-moe-demo")
    with Artifact.open(out) as art:
        params = sum(o.numel for o in art.objects.values() if not o.name.startswith("resources/"))
        n_objects = len(art.objects)
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    for fact in ("name          tiny-moe-demo",
                 "architecture  Qwen3_5MoeForCausalLM (source Qwen3_5MoeForConditionalGeneration)",
                 f"parameters    {params:,}", "bfloat16", "uint8", "LFLF",
                 "MoE 8 experts top-2 (expert 32, shared 48)", "MTP layers 1",
                 "tokenizer.json", "chat_template.jinja", "generation_config.json",
                 f"objects       {n_objects}", "layers.1.self_attn.qkv_proj",
                 "layers.0.mlp.experts.gate_up_proj", "8x64x64", "dtype bf16"):
        assert fact in text, fact


def test_inspect_json_and_verify(tmp_path, capsys):
    out = _convert(tmp_path, capsys)
    assert main(["inspect", "--json", str(out)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["architecture"] == "Qwen3_5MoeForCausalLM" and s["name"] == s["architecture"]
    assert set(s["parameters"]["by_use"]) == {"text", "mtp"}
    assert s["config"]["moe"]["experts"] == 8 and s["config"]["layer_pattern"] == "LFLF"
    assert s["bytes_by_dtype"]["float32"] > 0
    assert [r["name"] for r in s["resources"]] == sorted(
        ["chat_template.jinja", "generation_config.json", "tokenizer.json",
         "tokenizer_config.json"])
    assert s["bindings"]["views"] > 0 and len(s["objects"]) > 10
    assert main(["verify", str(out), "--progress", "never"]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys; from ninfer.cli.main import build_parser; build_parser(); "
            "heavy = [m for m in ('numpy', 'numba', 'torch', 'tqdm') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    proc = subprocess.run([sys.executable, "-m", "ninfer.cli.main", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in ("convert", "verify", "inspect"):
        assert command in proc.stdout


def test_internal_errors_are_one_line(monkeypatch, capsys, tmp_path):
    import tools.artifact.inspect as inspect_mod

    def broken(path):
        raise RuntimeError("boom")

    monkeypatch.setattr(inspect_mod, "summarize", broken)
    assert main(["inspect", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: internal error (RuntimeError: boom)") and err.count("\n") == 1


def test_progress_bars_can_be_forced(tmp_path, capsys):
    out = _convert(tmp_path, capsys, "--progress", "never")
    assert main(["verify", str(out), "--progress", "never"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["verify", str(out), "--progress", "always"]) == 0
    err = capsys.readouterr().err
    assert "verify:" in err and "B/s" in err, err
