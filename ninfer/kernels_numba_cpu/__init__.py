"""Layer 2: Numba CPU kernels, one module per op family (see docs/ops.md for the table).

Each module exposes plain Python functions with the op's signature (called by `ninfer.ops` after
the operand checks) that unpack views and launch `@njit(parallel=True, cache=True)` kernels.
Importing a module compiles nothing; the first call compiles (or loads Numba's on-disk cache).

Numba keys a cached kernel on its own source file only, so a change to a shared helper module
(`_prim.py`, `_dot.py`, `_layout.py`) would otherwise leave stale machine code in the cache.
On first import this package compares a digest of the helpers with the one stored next to the
cache and clears the package's cache entries when they differ.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Numba's OpenMP workers spin while idle by default; next to the engine's own threads (HTTP
# server, consumers) on few cores that spinning steals the CPU the kernels need (measured on 2
# loaded cores: 130-530 us per parallel launch spinning vs 8 us passive). Must be set before the
# threading layer loads (first parallel launch); a user's explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _probe():  # a function of this package, to ask Numba where the package's cache lives
    return None


def _clear_stale_kernel_cache() -> None:
    from numba.core.caching import CompileResultCacheImpl  # internal; present since 0.49

    here = Path(__file__).parent
    digest = hashlib.sha256()
    for helper in sorted(here.glob("_*.py")):
        if helper.name != "__init__.py":
            digest.update(helper.name.encode() + b"\0" + helper.read_bytes())
    try:
        cache_dir = Path(CompileResultCacheImpl(_probe).locator.get_cache_path())
    except RuntimeError:  # no writable cache location: Numba will not cache either
        return
    stamp = cache_dir / "ninfer-helpers.sha256"
    if stamp.is_file() and stamp.read_text() == digest.hexdigest():
        return
    for entry in list(cache_dir.glob("*.nbi")) + list(cache_dir.glob("*.nbc")):
        entry.unlink(missing_ok=True)
    stamp.write_text(digest.hexdigest())


_clear_stale_kernel_cache()
