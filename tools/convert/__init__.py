"""HF checkpoint -> `.ninfer` converter (no torch): `convert_checkpoint(hf_dir, out_path, ...)`."""
from tools.convert.checkpoint import ConversionWarning
from tools.convert.convert import convert_checkpoint

__all__ = ["ConversionWarning", "convert_checkpoint"]
