"""Offline compile of the package's kernels with nvcc (no GPU needed): build check + resources.

`compile_source(src)` writes the loader's expanded source plus a table taking the address of
every declared instance (which instantiates the templates), runs
``nvcc -arch=sm_90 -cubin --resource-usage``, and returns the per-kernel registers, shared
memory, stack frame and spill bytes. `python -m ninfer.kernels_cuda._nvcc` prints the table for
every module.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ninfer.kernels_cuda._loader import BASE_OPTIONS, PACKAGE_DIR, KernelSource, expand_source

_FUNC_RE = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_REG_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")
_STACK_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


@dataclasses.dataclass(frozen=True)
class KernelResources:
    mangled: str
    registers: int
    smem_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


@dataclasses.dataclass(frozen=True)
class CompileResult:
    source: KernelSource
    returncode: int
    log: str
    kernels: tuple[KernelResources, ...]


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


def all_sources() -> list[KernelSource]:
    """Every `KernelSource` declared by a launcher module of this package."""
    import ninfer.kernels_cuda as pkg

    found: dict[str, KernelSource] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"ninfer.kernels_cuda.{info.name}")
        for value in vars(module).values():
            if isinstance(value, KernelSource):
                found[value.file + "|" + "|".join(value.name_expressions)] = value
    return sorted(found.values(), key=lambda s: s.file)


def parse_resources(log: str) -> tuple[KernelResources, ...]:
    out = []
    current = None
    fields: dict = {}
    for line in log.splitlines():
        m = _FUNC_RE.search(line)
        if m:
            if current:
                out.append(KernelResources(current, **fields))
            current = m.group(1)
            fields = dict(registers=0, smem_bytes=0, stack_bytes=0, spill_stores=0, spill_loads=0)
            continue
        if current is None:
            continue
        m = _STACK_RE.search(line)
        if m:
            fields.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                          spill_loads=int(m.group(3)))
        m = _REG_RE.search(line)
        if m:
            fields["registers"] = int(m.group(1))
            s = _SMEM_RE.search(line)
            if s:
                fields["smem_bytes"] = int(s.group(1))
    if current:
        out.append(KernelResources(current, **fields))
    return tuple(out)


def compile_instances(code: str, file: str, names, options, mode: list[str],
                      arch: str = "sm_90") -> tuple[int, str, bytes]:
    """nvcc `mode` (e.g. ["--ptx"], ["-cubin"]) on expanded source `code` (named `file`) with a
    table taking the address of every instance in `names` (which instantiates the templates).
    Returns (return code, nvcc's log, the output file's bytes; b"" on failure)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found on PATH")
    refs = ",\n  ".join(f"(void*)&{name}" for name in names)
    code += f"\n\nstatic void* const ninfer_instance_table[] = {{\n  {refs}\n}};\n"
    with tempfile.TemporaryDirectory() as tmp:
        cu, out = Path(tmp) / file, Path(tmp) / "out.bin"
        cu.write_text(code)
        cmd = [nvcc, f"-arch={arch}", *mode, "-diag-suppress", "177", *BASE_OPTIONS,
               *options, "-I", str(PACKAGE_DIR), "-o", str(out), str(cu)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        data = out.read_bytes() if proc.returncode == 0 and out.exists() else b""
    return proc.returncode, proc.stdout + proc.stderr, data


def compile_source(source: KernelSource, arch: str = "sm_90", *,
                   check_only: bool = False) -> CompileResult:
    """Compile `source` with every declared instance. check_only: front end only (PTX at -O0,
    a few seconds: syntax, types, template instantiation), no resource report."""
    mode = ["--ptx", "-Xcicc", "-O0"] if check_only else ["-cubin", "--resource-usage"]
    rc, log, _ = compile_instances(expand_source(source.path()), source.file,
                                   source.name_expressions, source.options, mode, arch)
    return CompileResult(source, rc, log, parse_resources(log))


def main() -> int:
    if nvcc_path() is None:
        print("nvcc not found")
        return 1
    status = 0
    for source in all_sources():
        res = compile_source(source)
        print(f"== {source.file}: rc={res.returncode}")
        if res.returncode:
            print(res.log)
            status = 1
        for k in res.kernels:
            print(f"  {k.registers:4d} regs {k.smem_bytes:6d} B smem {k.stack_bytes:5d} B stack "
                  f"{k.spill_stores:4d}/{k.spill_loads:<4d} spill  {k.mangled}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
