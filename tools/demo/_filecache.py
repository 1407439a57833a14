"""Build-once files in a shared cache directory: exclusive lock, atomic publish, digest check.

`build_once(target, build)` makes sure `target` holds a complete build. A target is complete
when its sidecar `<target>.sha256` (JSON: size + SHA-256) matches the file's bytes, so a
truncated, corrupted or half-published entry is rebuilt. Builders serialize on an `fcntl.flock`
of `<target>.lock` (processes and threads alike: each call opens its own descriptor), build into
a hidden temporary name in the same directory and publish with `os.replace`, so a reader never
sees a partial file. Lock files are never deleted (deleting one would let two builders in).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Callable, Iterator

from ninfer.errors import NinferError

_CHUNK_BYTES = 1 << 22


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _sidecar(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def is_complete(target: Path) -> bool:
    """True when `target` exists and matches the size and SHA-256 its sidecar records."""
    try:
        recorded = json.loads(_sidecar(target).read_text(encoding="utf-8"))
        if target.stat().st_size != recorded["size"]:
            return False
        return file_sha256(target) == recorded["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def exclusive_lock(lock_path: Path, *, waiting_message: str | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path` (created if missing) for the `with` body.

    `waiting_message`, if given, is printed to stderr when another holder makes us wait."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting_message:
                print(waiting_message, file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def temp_sibling(target: Path, tag: str = "tmp") -> Path:
    """A fresh hidden name next to `target` that keeps its suffix (e.g. `.ninfer`)."""
    return target.with_name(f".{tag}-{uuid.uuid4().hex[:12]}-{target.name}")


def build_once(target: Path, build: Callable[[Path], None], *, what: str = "file") -> bool:
    """Make sure `target` is complete, calling `build(tmp_path)` under the lock if it is not.

    `build` must create the file `tmp_path` (a temporary sibling of `target`); it may also
    create other siblings through `temp_sibling(target, ...)`, which are removed afterwards and
    swept on the next build if a crash left them behind. Returns True when this call built the
    target, False when a complete one was already there (possibly built while we waited).
    Cache directory problems raise `NinferError` with the path.
    """
    if is_complete(target):
        return False
    lock_path = target.with_name(target.name + ".lock")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as exc:
        raise NinferError(f"cannot write {what} in the cache directory {target.parent}: "
                          f"{exc.strerror or exc} (set NINFER_CACHE_DIR to a writable "
                          "directory)") from exc
    waiting = f"ninfer: waiting for another process to build {target}"
    with exclusive_lock(lock_path, waiting_message=waiting):
        if is_complete(target):
            return False
        for stale in target.parent.glob(f".*-{target.name}"):
            _remove(stale)  # temporaries of a build that died; we hold the lock
        tmp = temp_sibling(target)
        try:
            build(tmp)
            if not tmp.is_file():
                raise RuntimeError(f"building {what} did not produce {tmp}")
            record = {"size": tmp.stat().st_size, "sha256": file_sha256(tmp)}
            sidecar_tmp = temp_sibling(target, "sha")
            sidecar_tmp.write_text(json.dumps(record), encoding="utf-8")
            os.replace(sidecar_tmp, _sidecar(target))
            os.replace(tmp, target)
        finally:
            for leftover in target.parent.glob(f".*-{target.name}"):
                _remove(leftover)
    return True


def discard(target: Path) -> None:
    """Delete a cache entry (file + sidecar) that nobody is building; skip it if someone is.

    Open memory maps of the file stay valid (POSIX unlink semantics)."""
    lock_path = target.with_name(target.name + ".lock")
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        fd = None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # being built right now
        target.unlink(missing_ok=True)
        _sidecar(target).unlink(missing_ok=True)
        lock_path.unlink(missing_ok=True)
    finally:
        if fd is not None:
            os.close(fd)
