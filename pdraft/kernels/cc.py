"""Building a small C library once per machine with the system's C compiler, for the CPU loops pdraft runs
through ctypes (`cpu_walks`, `cpu_bf16`; issue 38).

The library is kept under pdraft's cache folder, named by a hash of its source, the compiler and its flags, and
written by rename, so a machine compiles it once and concurrent processes never load a half-written file.
Nothing here raises: without a compiler, with a failed build, or with PDRAFT_CPU_KERNELS=0, `build` gives None
and one line saying why, and the callers keep their torch paths."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pdraft.paths import atomic_write_text, cache_dir

ENV = "PDRAFT_CPU_KERNELS"  # 0 / off: every compiled loop stays in torch
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-shared", "-fPIC", "-std=c99")


def disabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no")


@functools.cache
def _compiler() -> tuple[str | None, str]:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None, ""
    try:
        return compiler, subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None, ""


@functools.cache
def build(name: str, source: str) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "compiled (path)") or (None, why not: '... they run in torch')."""
    compiler, version = _compiler()
    if compiler is None:
        return None, f"no working C compiler on PATH: the {name} run in torch"
    key = hashlib.sha256("\0".join([source, compiler, version, *FLAGS]).encode()).hexdigest()[:16]
    folder = cache_dir() / "kernels"
    lib = folder / f"cpu_{name}-{key}.so"
    if not lib.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder, prefix=".tmp-") as tmp:
                src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
                atomic_write_text(src, source)
                done = subprocess.run([compiler, *FLAGS, "-o", str(out), str(src)], capture_output=True, text=True,
                                      timeout=120)
                if done.returncode != 0:
                    first = (done.stderr.strip().splitlines() or ["no message"])[0]
                    return None, f"compiling the {name} failed ({first}): they run in torch"
                os.replace(out, lib)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"could not build the {name} under {folder} ({e}): they run in torch"
    try:
        return ctypes.CDLL(str(lib)), f"compiled ({lib})"
    except OSError as e:
        return None, f"could not load {lib} ({e}): the {name} run in torch"


def ptr(x) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.data_ptr())


def ptr_or_null(x) -> ctypes.c_void_p | None:
    return None if x is None else ptr(x)


__all__ = ["ENV", "FLAGS", "build", "disabled", "ptr", "ptr_or_null"]
