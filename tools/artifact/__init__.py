"""Artifact tools beside the package: `inspect` (summary) and `verify` (full digest check)."""
from tools.artifact.inspect import format_summary, summarize
from tools.artifact.verify import verify_artifact

__all__ = ["format_summary", "summarize", "verify_artifact"]
