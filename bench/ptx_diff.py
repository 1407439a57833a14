"""Compare the compiled code of a kernel module's instances between the working tree and a git
revision, offline (nvcc; no GPU): per instance, normalised PTX (or SASS) identical or not.

The evidence behind "the default build's code is unchanged" and "these instances are the code
that was measured": a kernel change behind a new template flag or define must leave the other
instances' code as it was.

    python3 -m bench.ptx_diff linear SOURCE --rev 79f49fe              # every instance
    python3 -m bench.ptx_diff linear SOURCE --rev bc50d64 --match ', 1, 3[35]>$' \\
        --old-sub ', 1, 33>$' ', 1, 1>' --old-sub ', 1, 35>$' ', 1, 3>' \\
        --old-option=-DGEMV_X_VEC=1 --sass

`--match`: only the instances whose name matches; `--old-sub PATTERN REPL` (repeatable, applied
in order): the name the same code has at the revision (re.sub on the instance name);
`--option=` / `--old-option=`: extra nvcc options for the working tree's / the revision's build
(with `=`: they start with a dash). PTX is normalised: comments, .loc / .file lines, the
function's own name, its branch labels' function numbers, and the names of static shared
variables (which carry the template arguments). Exit status 1 if any instance differs or is
missing at the revision; 2 if a build fails.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ninfer.kernels_cuda._loader import PACKAGE_DIR, expand_source
from ninfer.kernels_cuda._nvcc import compile_instances

_PKG = "ninfer/kernels_cuda"


def source_at(rev: str | None, file: str) -> str:
    """`file` of the kernel package with its includes inlined, at `rev` (None: the working
    tree), the includes taken from the same revision."""
    if rev is None:
        return expand_source(PACKAGE_DIR / file)
    with tempfile.TemporaryDirectory() as tmp:
        names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:{_PKG}"],
                               capture_output=True, text=True, check=True).stdout.split()
        for name in names:
            if name.endswith((".cu", ".cuh")):
                text = subprocess.run(["git", "show", f"{rev}:{_PKG}/{name}"],
                                      capture_output=True, text=True, check=True).stdout
                Path(tmp, name).write_text(text)
        return expand_source(Path(tmp) / file)


def compile_functions(code: str, file: str, names: list[str], options: tuple[str, ...],
                      *, sass: bool) -> dict[str, list[str]]:
    """{mangled name: normalised lines} of `names` compiled from `code` for sm_90."""
    rc, log, data = compile_instances(code, file, names, options,
                                      ["-cubin"] if sass else ["--ptx"])
    if rc:
        print(log[-3000:], file=sys.stderr)
        raise SystemExit(2)
    if not sass:
        return _ptx_functions(data.decode())
    tool = shutil.which("cuobjdump")
    if tool is None:
        raise SystemExit("ptx_diff: --sass needs cuobjdump on PATH")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        return _sass_functions(subprocess.run([tool, "-sass", f.name], capture_output=True,
                                              text=True, check=True).stdout)


def _ptx_functions(ptx: str) -> dict[str, list[str]]:
    ptx = re.sub(r"^\s*(//.*|\.loc.*|\.file.*)$", "", ptx, flags=re.M)
    out = {}
    for part in re.split(r"^\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+", ptx, flags=re.M)[1:]:
        name = re.match(r"(\S+?)\(", part).group(1)
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", part.replace(name, "NAME"))
        body = re.sub(r"_ZZ\w+?E\d+\w+", "STATIC", body)
        out[name] = [line.strip() for line in body.splitlines() if line.strip()]
    return out


def _sass_functions(text: str) -> dict[str, list[str]]:
    out = {}
    for part in re.split(r"^\s*Function : ", text, flags=re.M)[1:]:
        name = part.split("\n", 1)[0].strip()
        out[name] = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", part)
    return out


def by_instance(funcs: dict[str, list[str]]) -> dict[str, list[str]]:
    """`funcs` keyed by instance name as written in name_expressions (spaces removed), by
    demangling (c++filt): "void k<0, 1>(P)" -> "k<0,1>", "k(P)" -> "k"."""
    tool = shutil.which("c++filt")
    if tool is None:
        raise SystemExit("ptx_diff: needs c++filt on PATH")
    keys = list(funcs)
    plain = subprocess.run([tool], input="\n".join(keys), capture_output=True, text=True,
                           check=True).stdout.splitlines()
    out = {}
    for key, text in zip(keys, plain):
        m = re.match(r"(?:void\s+)?([\w:]+(?:<.*>)?)\(", text)
        if m:
            out[_key(m.group(1))] = funcs[key]
    return out


def _key(name: str) -> str:
    return re.sub(r"\s+", "", name)


def _lookup(funcs: dict[str, list[str]], name: str) -> list[str] | None:
    """funcs[name]; a name that leaves trailing template arguments to their defaults
    ("k<float,1>") matches the demangled instance that spells them out as 0 ("k<float,1,0>";
    the flag parameters of these kernels default to 0)."""
    key = _key(name)
    if key in funcs:
        return funcs[key]
    if not key.endswith(">"):
        return None
    head = key[:-1] + ","
    found = [v for k, v in funcs.items() if k.startswith(head)
             and set(k[len(head):-1].split(",")) == {"0"}]
    return found[0] if len(found) == 1 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.ptx_diff", description=__doc__.split("\n")[0])
    ap.add_argument("module", help="ninfer.kernels_cuda module, e.g. linear")
    ap.add_argument("source", help="its KernelSource variable, e.g. SOURCE")
    ap.add_argument("--rev", required=True)
    ap.add_argument("--match", default="", help="regex: only matching instance names")
    ap.add_argument("--old-sub", nargs=2, action="append", default=[],
                    metavar=("PATTERN", "REPL"))
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--old-option", action="append", default=[])
    ap.add_argument("--sass", action="store_true", help="compare SASS (cuobjdump) instead")
    args = ap.parse_args(argv)
    src = getattr(importlib.import_module(f"ninfer.kernels_cuda.{args.module}"), args.source)
    names = [n for n in src.name_expressions if re.search(args.match, n)]
    if not names:
        raise SystemExit(f"ptx_diff: no instance of {args.module}.{args.source} matches")
    old_names = []
    for name in names:
        for pattern, repl in args.old_sub:
            name = re.sub(pattern, repl, name)
        old_names.append(name)
    new_code, old_code = source_at(None, src.file), source_at(args.rev, src.file)
    new_opts = tuple(src.options) + tuple(args.option)
    old_opts = tuple(src.options) + tuple(args.old_option)
    new = by_instance(compile_functions(new_code, src.file, names, new_opts, sass=args.sass))
    old = by_instance(compile_functions(old_code, src.file, old_names, old_opts, sass=args.sass))
    bad = 0
    for name, old_name in zip(names, old_names):
        a, b = _lookup(new, name), _lookup(old, old_name)
        if b is None or a is None:
            print(f"missing   {name}" + (f" (as {old_name})" if old_name != name else ""))
            bad += 1
        elif a != b:
            diff = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
            print(f"differs   {name}: {diff} of {len(a)} lines")
            bad += 1
    kind = "SASS" if args.sass else "PTX"
    print(f"{len(names) - bad} of {len(names)} instances: {kind} identical to {args.rev}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
