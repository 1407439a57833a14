"""`summarize(path)`: the facts `ninfer inspect` prints, as a JSON-ready dict; `format_summary`
renders it as text."""
from __future__ import annotations

import collections
import os

from ninfer.artifact import Artifact
from ninfer.errors import InvalidInput
from ninfer.models.qwen3_5.config import Qwen35Config


def summarize(path: str | os.PathLike) -> dict:
    with Artifact.open(path, verify=False) as art:
        resource_objects = {r.object for r in art.resources.values()}
        use_of = {}
        for b in art.bindings.values():
            use_of.setdefault(b.object, b.use.value)
        params: collections.Counter = collections.Counter()
        by_dtype: collections.Counter = collections.Counter()
        for o in art.objects.values():
            by_dtype[o.dtype.value] += o.nbytes
            if o.name not in resource_objects:
                params[use_of.get(o.name, "unbound")] += o.numel
        whole: dict[str, list[str]] = collections.defaultdict(list)
        for b in art.bindings.values():
            if b.rows is None:
                whole[b.object].append(b.name)
        groups = art.parent_groups()
        return {
            "path": str(art.path), "file_bytes": os.path.getsize(art.path),
            "name": art.name, "architecture": art.architecture, "metadata": art.metadata,
            "parameters": {"total": sum(params.values()), "by_use": dict(sorted(params.items()))},
            "bytes_by_dtype": dict(sorted(by_dtype.items())),
            "config": _config_summary(art.config),
            "bindings": {
                "count": len(art.bindings),
                "by_use": dict(sorted(collections.Counter(
                    b.use.value for b in art.bindings.values()).items())),
                "views": sum(len(v) for v in groups.values()),
                "fused_parents": len(groups),
                "shared_objects": {k: sorted(v) for k, v in sorted(whole.items()) if len(v) > 1},
            },
            "resources": [{"name": r.name, "media_type": r.media_type,
                           "nbytes": art.objects[r.object].nbytes,
                           "sha256": art.objects[r.object].sha256}
                          for r in sorted(art.resources.values(), key=lambda r: r.name)],
            "objects": [{"name": o.name, "dtype": o.dtype.value, "shape": list(o.shape),
                         "offset": o.offset, "nbytes": o.nbytes, "sha256": o.sha256}
                        for o in art.objects.values()],
        }


def _config_summary(raw: dict) -> dict:
    try:
        cfg = Qwen35Config.from_hf(raw)
    except InvalidInput as exc:
        return {"error": str(exc)}
    out = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "layer_pattern": "".join("F" if i in cfg.full_attention_layers else "L"
                                 for i in range(cfg.num_hidden_layers)),
        "attention": {"heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                      "head_dim": cfg.head_dim},
        "linear_attention": {"key_heads": cfg.linear_num_key_heads,
                             "value_heads": cfg.linear_num_value_heads,
                             "key_head_dim": cfg.linear_key_head_dim,
                             "value_head_dim": cfg.linear_value_head_dim,
                             "conv_kernel": cfg.linear_conv_kernel_dim},
        "rope": {"theta": cfg.rope.theta, "partial_rotary_factor": cfg.rope.partial_rotary_factor,
                 "mrope_section": list(cfg.rope.mrope_section)},
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "mtp_num_hidden_layers": cfg.mtp_num_hidden_layers,
        "vision": cfg.vision is not None,
    }
    if cfg.is_moe:
        out["moe"] = {"experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok,
                      "expert_intermediate": cfg.moe_intermediate_size,
                      "shared_intermediate": cfg.shared_expert_intermediate_size}
    else:
        out["intermediate_size"] = cfg.intermediate_size
    return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def format_summary(s: dict) -> str:
    meta, cfg, b = s["metadata"], s["config"], s["bindings"]
    src, conv = meta.get("source", {}), meta.get("converter", {})
    lines = [
        f"artifact      {s['path']} ({_size(s['file_bytes'])})",
        f"name          {s['name']}",
        f"architecture  {s['architecture']}"
        + (f" (source {src['architecture']})" if src.get("architecture") else ""),
    ]
    if conv:
        lines.append(f"converter     {conv.get('name')} {conv.get('version')}, "
                     f"dtype {conv.get('dtype')}")
    by_use = ", ".join(f"{k} {v:,}" for k, v in s["parameters"]["by_use"].items())
    lines.append(f"parameters    {s['parameters']['total']:,} ({by_use})")
    lines.append("bytes         " + ", ".join(f"{k} {_size(v)}"
                                             for k, v in s["bytes_by_dtype"].items()))
    if "error" in cfg:
        lines.append(f"config        unreadable: {cfg['error']}")
    else:
        att, lin = cfg["attention"], cfg["linear_attention"]
        mlp = (f"MoE {cfg['moe']['experts']} experts top-{cfg['moe']['top_k']} "
               f"(expert {cfg['moe']['expert_intermediate']}, shared "
               f"{cfg['moe']['shared_intermediate']})" if "moe" in cfg
               else f"dense MLP {cfg['intermediate_size']}")
        lines += [
            f"config        hidden {cfg['hidden_size']}, vocab {cfg['vocab_size']}, "
            f"{cfg['num_hidden_layers']} layers {cfg['layer_pattern']} (L = GDN, F = attention)",
            f"              attention {att['heads']} heads / {att['kv_heads']} kv x "
            f"{att['head_dim']}; GDN Hk {lin['key_heads']} Hv {lin['value_heads']} dk "
            f"{lin['key_head_dim']} dv {lin['value_head_dim']} conv {lin['conv_kernel']}",
            f"              {mlp}; tied embeddings {'yes' if cfg['tie_word_embeddings'] else 'no'}"
            f"; MTP layers {cfg['mtp_num_hidden_layers']}; vision "
            f"{'yes' if cfg['vision'] else 'no'}; rope theta {cfg['rope']['theta']:g}",
        ]
    uses = ", ".join(f"{k} {v}" for k, v in b["by_use"].items())
    lines.append(f"bindings      {b['count']} ({uses}); {b['views']} row views of "
                 f"{b['fused_parents']} fused parents")
    for obj, names in b["shared_objects"].items():
        lines.append(f"              shared object {obj}: {', '.join(names)}")
    lines.append("resources     " + (", ".join(
        f"{r['name']} ({_size(r['nbytes'])})" for r in s["resources"]) or "none"))
    lines.append(f"objects       {len(s['objects'])}")
    width = max((len(o["name"]) for o in s["objects"]), default=4)
    lines.append(f"  {'name':<{width}}  {'dtype':<8}  {'shape':<18}  {'bytes':>12}  sha256")
    for o in s["objects"]:
        shape = "x".join(map(str, o["shape"])) or "scalar"
        lines.append(f"  {o['name']:<{width}}  {o['dtype']:<8}  {shape:<18}  {o['nbytes']:>12,}  "
                     f"{o['sha256'][:16]}")
    return "\n".join(lines)
