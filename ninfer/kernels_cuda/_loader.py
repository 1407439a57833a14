"""Compile-once cache of the package's CUDA modules (the only global state of kernels_cuda).

A `KernelSource` names one `.cu` file of this package and every kernel instance (NVRTC name
expression, e.g. ``"rms_norm_kernel<unsigned short, 1>"``) its launchers use. `get_function`
compiles the file the first time any of its kernels is asked for on a device, through
`cupy.RawModule` (which targets ``-arch=sm_XY`` of that device) with ``--std=c++17``, and
caches the module per (source, instances, options, device); CuPy's disk cache is keyed on the
expanded source's hash, the options and the architecture. Launchers call `get_function`
on every launch: after the first compile it is a dictionary lookup.

Local headers (`#include "x.cuh"` naming a file of this package) are inlined before compiling so
that the source hash (and CuPy's own on-disk cache key) covers them. CuPy's disk cache is pointed
at `ninfer.envs.kernel_cache_dir()` unless CUPY_CACHE_DIR is set, so a second process loads
cubins instead of compiling.

Compile time is reported separately from run time: every compile appends a `CompileRecord`
(`compile_records()`) and logs one line on the `ninfer.kernels_cuda` logger.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from ninfer import envs

_LOG = logging.getLogger("ninfer.kernels_cuda")
_DEBUG_SYNC = envs.cuda_debug_sync()  # read once: launch() runs hundreds of times per step
PACKAGE_DIR = Path(__file__).resolve().parent
BASE_OPTIONS = ("--std=c++17",) + (
    ("-DNINFER_PDL_TRIGGER_FIRST=1",) if envs.pdl_trigger_first() else ())
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
# NINFER_KERNEL_TIMELINE (diagnostic): every module is built with pdl_wait's timer records
# (common.cuh) and every launch is logged (`timeline_launches`, `timeline_records`).
_TIMELINE = envs.kernel_timeline()
_LAUNCHES: list[tuple[str, tuple, tuple, int]] = []
# records per module (common.cuh NINFER_TIMELINE_CAP): a 35B-A3B B=1 step writes ~18K into
# linear.cu's buffer alone, a 27B step ~35K; a replay past the cap drops the rest (warned)
_TIMELINE_CAP = 131072
_MARK_CAP = 65536  # phase marks per module (common.cuh NINFER_MARK_CAP)


@dataclasses.dataclass(frozen=True, eq=False)  # identity hash: looked up on every launch
class KernelSource:
    """One `.cu` file of this package and the kernel instances compiled from it."""

    file: str
    name_expressions: tuple[str, ...]
    options: tuple[str, ...] = ()

    def path(self) -> Path:
        return PACKAGE_DIR / self.file


@dataclasses.dataclass(frozen=True, slots=True)
class CompileRecord:
    file: str
    arch: str
    seconds: float
    num_kernels: int


def expand_source(path: Path, _seen: set[Path] | None = None) -> str:
    """The text of `path` with this package's quoted includes inlined (each at most once)."""
    seen = _seen if _seen is not None else set()
    path = path.resolve()
    if path in seen:
        return ""
    seen.add(path)
    text = path.read_text()

    def _inline(match: re.Match) -> str:
        target = PACKAGE_DIR / match.group(1)
        if not target.is_file():
            return match.group(0)  # a system header: leave it to the compiler
        body = expand_source(target, seen)
        return f'#line 1 "{target.name}"\n{body}\n#line 1 "{path.name}"'

    return _INCLUDE_RE.sub(_inline, text)


class _ModuleCache:
    """Compiled modules per (source, device); the compile log."""

    def __init__(self):
        self._lock = threading.Lock()
        self._modules: dict[tuple, object] = {}
        self._functions: dict[tuple, object] = {}
        self._records: list[CompileRecord] = []
        self._persistent_configured = False

    def function(self, source: KernelSource, name_expr: str):
        import cupy

        device_id = cupy.cuda.runtime.getDevice()
        key = (source, name_expr, device_id)
        fn = self._functions.get(key)
        if fn is not None:
            return fn
        if name_expr not in source.name_expressions:
            raise KeyError(f"{name_expr!r} is not an instance declared by {source.file}; "
                           f"declared: {', '.join(source.name_expressions)}")
        module = self._module(source, device_id)
        fn = module.get_function(name_expr)
        self._functions[key] = fn
        return fn

    def _module(self, source: KernelSource, device_id: int):
        key = (source, device_id)
        module = self._modules.get(key)
        if module is not None:
            return module
        with self._lock:
            module = self._modules.get(key)
            if module is None:
                module = self._compile(source, device_id)
                self._modules[key] = module
        return module

    def _compile(self, source: KernelSource, device_id: int):
        import cupy

        self._configure_persistent_cache()
        cc = cupy.cuda.Device(device_id).compute_capability  # e.g. "90"
        arch = f"sm_{cc}"
        code = expand_source(source.path())
        digest = hashlib.sha256(code.encode()).hexdigest()[:16]
        # CuPy adds -arch=sm_XY of the current device itself (a second -arch would conflict).
        options = BASE_OPTIONS + source.options + _timeline_options(source)
        # The digest line makes CuPy's cache key change whenever an inlined header changes.
        code = f"// ninfer {source.file} {digest}\n{code}"
        start = time.perf_counter()
        module = cupy.RawModule(code=code, options=options,
                                name_expressions=list(source.name_expressions))
        module.compile()
        seconds = time.perf_counter() - start
        record = CompileRecord(source.file, arch, seconds, len(source.name_expressions))
        self._records.append(record)
        _LOG.info("compiled %s for %s (%d kernels) in %.2f s", source.file, arch,
                  record.num_kernels, seconds)
        return module

    def _configure_persistent_cache(self) -> None:
        """Point CuPy's on-disk kernel cache at ninfer's cache dir (unless the user chose one)."""
        if self._persistent_configured:
            return
        self._persistent_configured = True
        import os

        if os.environ.get("CUPY_CACHE_DIR"):
            return
        try:
            from cupy.cuda import _compiler_cache, compiler

            cache_dir = envs.kernel_cache_dir()
            cache_dir.mkdir(parents=True, exist_ok=True)
            compiler._set_kernel_cache_backend(
                _compiler_cache.DiskKernelCacheBackend(str(cache_dir)))
        except Exception as exc:  # private CuPy API: fall back to CuPy's default cache dir
            _LOG.debug("kernel cache dir not set (%s); using CuPy's default", exc)

    def records(self) -> list[CompileRecord]:
        return list(self._records)

    def modules(self) -> list[tuple[KernelSource, object]]:
        return [(source, module) for (source, _), module in self._modules.items()]


_CACHE = _ModuleCache()


def get_function(source: KernelSource, name_expr: str):
    """The compiled kernel `name_expr` of `source` on the current device (compiled once)."""
    return _CACHE.function(source, name_expr)


def precompile(*sources: KernelSource) -> None:
    """Compile `sources` on the current device now (start-up), so launches never compile."""
    import cupy

    device_id = cupy.cuda.runtime.getDevice()
    for source in sources:
        _CACHE._module(source, device_id)


def timeline_module_id(file: str) -> int:
    """The id a timeline build compiles into `file`'s records: its index among the package's
    .cu files (sorted), the same in every process."""
    return sorted(p.name for p in PACKAGE_DIR.glob("*.cu")).index(file)


def _timeline_options(source: KernelSource) -> tuple[str, ...]:
    if not _TIMELINE:
        return ()
    return ("-DNINFER_TIMELINE=1", f"-DNINFER_MODULE_ID={timeline_module_id(source.file)}")


def timeline_reset(*, launches: bool = True) -> None:
    """Zero every compiled module's timeline record count and (`launches`) the launch log
    (timeline build only)."""
    if not _TIMELINE:
        raise RuntimeError("timeline_reset needs NINFER_KERNEL_TIMELINE=1 (set before import)")
    if launches:
        _LAUNCHES.clear()
    for _, module in _CACHE.modules():
        _count(module, "ninfer_timeline_count").fill(0)
        _count(module, "ninfer_marks_count").fill(0)


def _count(module, name: str):
    """A module's uint32 device counter `name` (common.cuh ninfer_timeline_count /
    ninfer_marks_count) as a CuPy array of one element."""
    import cupy

    return cupy.ndarray((1,), np.uint32, memptr=module.get_global(name))


def _read_buffers(buffer: str, count: str, cap: int, width: int, what: str) -> dict:
    """Per compiled module file: the first min(count, cap) rows of each of its builds' uint64
    [cap, width] device buffers `buffer` (common.cuh), concatenated, after a synchronize; warns
    where a replay wrote past the cap (those rows were dropped)."""
    import cupy

    cupy.cuda.get_current_stream().synchronize()
    out = {}
    for source, module in _CACHE.modules():
        written = int(_count(module, count).get()[0])
        if written > cap:
            warnings.warn(f"timeline: {source.file} wrote {written} {what}, {written - cap} "
                          f"past the buffer's {cap} were dropped", stacklevel=3)
        buf = cupy.ndarray((cap, width), np.uint64, memptr=module.get_global(buffer))
        rows = buf[:min(written, cap)].get()
        # a file's second build (e.g. linear.SOURCE_FOLD) is a module of its own: its rows join
        # the first build's instead of replacing them
        out[source.file] = np.concatenate([out[source.file], rows]) if source.file in out else rows
    return out


def timeline_records() -> dict[str, np.ndarray]:
    """Per compiled module file: its timeline records, uint64 [n, 4] (common.cuh: timer before
    and after pdl_wait, packed ids, dynamic shared memory), after a synchronize."""
    return _read_buffers("ninfer_timeline", "ninfer_timeline_count", _TIMELINE_CAP, 4, "records")


def timeline_marks() -> dict[str, np.ndarray]:
    """Per compiled module file: its phase marks (common.cuh timeline_mark), uint64 [n, 2]
    (timer, packed module / tag / SM / block index), after a synchronize."""
    return _read_buffers("ninfer_marks", "ninfer_marks_count", _MARK_CAP, 2, "phase marks")


def timeline_launches() -> list[tuple[str, tuple, tuple, int]]:
    """(name, grid, block, shared memory bytes) of every launch since `timeline_reset`."""
    return list(_LAUNCHES)


def compile_records() -> list[CompileRecord]:
    """Every compile done by this process (file, arch, seconds), in order."""
    return _CACHE.records()


def launch(fn, grid, block, args, shared_mem: int = 0, *, name: str = "",
           pdl: bool = False) -> None:
    """Launch `fn` on CuPy's current stream; in debug mode synchronize and check right after.

    `grid`/`block` are tuples of up to three ints. Never allocates (capturable in a graph).
    `pdl`: the kernel calls `pdl_wait` (common.cuh) before touching memory earlier kernels use,
    so it may be launched with programmatic dependent launch (`launch_dependent`); done on sm_90
    and newer unless NINFER_PDL=0.
    """
    if pdl and _PDL and _pdl_device():
        launch_dependent(fn, grid, block, args, shared_mem, name=name)
        return
    if _TIMELINE:
        _LAUNCHES.append((name, tuple(grid), tuple(block), shared_mem))
    fn(tuple(grid), tuple(block), args, shared_mem=shared_mem)
    if _DEBUG_SYNC:
        _debug_sync(name or getattr(fn, "name", "kernel"))


_PDL = envs.pdl()
_PDL_CONFIGS: dict[tuple, object] = {}  # (grid, block, shared_mem, stream) -> CUlaunchConfig


@functools.lru_cache(maxsize=None)
def _device_properties(device_id: int):
    from ninfer.core.cuda.device import read_properties

    return read_properties(device_id)


def current_device():
    """The current device's `DeviceProperties` (core.cuda.read_properties), read once per
    device: launchers size grids and pick kernels by its SM count and compute capability."""
    import cupy

    return _device_properties(cupy.cuda.runtime.getDevice())


def _pdl_device() -> bool:
    """Whether the current device runs griddepcontrol (sm_90+)."""
    return current_device().compute_capability >= (9, 0)


def _pdl_config(grid, block, shared_mem: int, stream_ptr: int):
    """The cuLaunchKernelEx config (PDL attribute set) for one launch geometry and stream,
    built once: building it costs tens of microseconds of cuda-python calls per launch."""
    key = (tuple(grid), tuple(block), shared_mem, stream_ptr)
    config = _PDL_CONFIGS.get(key)
    if config is not None:
        return config
    from cuda.bindings import driver

    config = driver.CUlaunchConfig()
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]
    bx, by, bz = (tuple(block) + (1, 1))[:3]
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
    config.sharedMemBytes = shared_mem
    config.hStream = driver.CUstream(stream_ptr)
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config.attrs = [attr]
    config.numAttrs = 1
    if len(_PDL_CONFIGS) > 4096:  # geometries vary with the batch; keep the cache bounded
        _PDL_CONFIGS.clear()
    _PDL_CONFIGS[key] = config
    return config


def _arg_bytes(arg) -> np.ndarray:
    """The bytes one kernel argument is passed as: a packed params struct (`_checks.pack`) or a
    NumPy scalar as is, a CuPy array (or None) as its device pointer."""
    if isinstance(arg, np.ndarray):
        return arg
    if isinstance(arg, np.generic):
        return np.array(arg)
    if arg is None:
        return np.zeros(1, dtype=np.uint64)
    ptr = getattr(getattr(arg, "data", None), "ptr", None)
    if ptr is None:
        raise TypeError(f"kernel argument of type {type(arg).__name__}: expected a CuPy array, "
                        f"None, a NumPy scalar or a packed params struct")
    return np.array(ptr, dtype=np.uint64)


def launch_dependent(fn, grid, block, args, shared_mem: int = 0, *, name: str = "") -> None:
    """`launch` with programmatic dependent launch (PDL) allowed: the kernel may start while the
    previous kernel in the stream is still running (once all of that kernel's blocks have
    executed `griddepcontrol.launch_dependents` or exited). The kernel must execute
    `griddepcontrol.wait` before it reads anything earlier kernels wrote or writes anything they
    read. `args`: as for `launch` (packed params structs, NumPy scalars, CuPy arrays, None).
    Through cuda-python's cuLaunchKernelEx (CuPy's launch takes no attributes); capturable (a
    programmatic edge in the graph)."""
    import cupy
    from cuda.bindings import driver

    if _TIMELINE:
        _LAUNCHES.append((name, tuple(grid), tuple(block), shared_mem))
    config = _pdl_config(grid, block, shared_mem, cupy.cuda.get_current_stream().ptr)
    held = [_arg_bytes(a) for a in args]  # alive until the launch has copied them
    ptrs = np.array([b.ctypes.data for b in held], dtype=np.uint64)  # void*[] -> each argument
    handle = getattr(fn, "kernel", fn).ptr  # a RawKernel holds its cupy Function in .kernel
    (err,) = driver.cuLaunchKernelEx(config, driver.CUfunction(handle), ptrs.ctypes.data, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        from ninfer.core.cuda import CudaError

        raise CudaError(f"launch of {name or 'kernel'} (PDL)", int(err), err.name, "")
    if _DEBUG_SYNC:
        _debug_sync(name or getattr(fn, "name", "kernel"))


def _debug_sync(name: str) -> None:
    import cupy

    from ninfer.core.cuda import CudaError

    stream = cupy.cuda.get_current_stream()
    if stream.is_capturing():
        return
    try:
        stream.synchronize()
    except cupy.cuda.driver.CUDADriverError as exc:
        raise CudaError(f"launch of {name}", -1, type(exc).__name__, str(exc)) from exc
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise CudaError(f"launch of {name}", getattr(exc, "status", -1), type(exc).__name__,
                        str(exc)) from exc
