"""Building a small C library once per machine with the system's C compiler, for the CPU loops pdraft runs
through ctypes (`cpu_walks`, `cpu_bf16`; issues 38 and 56).

A compiled loop is a capability, probed and then used or stepped aside from, never assumed. `build` gives a
`Built`: the loaded library, or None and one line saying why, and the callers keep their torch paths. It steps
aside, and never raises, when:
- PDRAFT_CPU_KERNELS=0 is set, or there is no working C compiler;
- the compiler refuses the flags (an ARM compiler given x86 flags, an old one that does not know the level);
- the library would need an instruction this CPU lacks: the instruction sets the compiler targets are read off
  its own predefined macros (`cc -dM -E`) and compared with the CPU's flags, so a library built for
  x86-64-v4 on a CPU without AVX-512, or one built elsewhere into a shared cache folder, is never loaded;
- the loaded library lacks a symbol its caller declares (`symbols`);
- the cached file is not what pdraft built: a link, not a regular file, or content whose sha256 differs from
  the digest recorded beside it when it was built (truncated, replaced): it is built again.

The level the loops are built for is PDRAFT_CPU_MARCH: `native` (the default: this CPU), or an explicit
x86-64-v2 (SSE4.2), x86-64-v3 (AVX2 + FMA: the AVX2-only machine class) or x86-64-v4 (AVX-512). Setting
x86-64-v3 on an AVX-512 machine shows a developer what the AVX2 class runs (with torch's own
ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 and MKL_ENABLE_INSTRUCTIONS=AVX2: pdraft.runtime.cpu_class).

The library is kept under pdraft's cache folder, named by a hash of its source, the compiler, its flags and the
instruction sets they target, and written by rename, so a machine compiles it once and concurrent processes
never load a half-written file. A cache folder pdraft cannot write (read-only, or a link) gets the library built
in a private temporary folder for this process, said in the status line."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pdraft.children import run_bounded
from pdraft.paths import atomic_write_text, cache_dir, sha256_file

ENV = "PDRAFT_CPU_KERNELS"  # 0 / off: every compiled loop stays in torch
MARCH_ENV = "PDRAFT_CPU_MARCH"  # native (default) / x86-64-v2 / x86-64-v3 / x86-64-v4
MARCHES = ("native", "x86-64-v2", "x86-64-v3", "x86-64-v4")
BASE_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c99")

# The compiler's predefined macro for an instruction set -> the flag /proc/cpuinfo shows for it on Linux.
ISA_MACROS = {
    "__SSE4_2__": "sse4_2", "__POPCNT__": "popcnt", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma",
    "__F16C__": "f16c", "__BMI2__": "bmi2", "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl", "__AVX512DQ__": "avx512dq", "__AVX512VNNI__": "avx512_vnni",
    "__AVX512BF16__": "avx512_bf16", "__AMX_TILE__": "amx_tile", "__AMX_BF16__": "amx_bf16",
}


@dataclass(frozen=True)
class Built:
    """What `build` gives: the library (None where the loops stay in torch) and one line saying which."""
    lib: ctypes.CDLL | None
    why: str
    march: str
    targets: tuple[str, ...] = ()  # the CPU flags the library's code needs (from the compiler's macros)


def disabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() in ("0", "off", "false", "no")


def march() -> str:
    """The level the loops are built for (PDRAFT_CPU_MARCH, default native); an unknown value is native."""
    value = os.environ.get(MARCH_ENV, "native").strip().lower() or "native"
    return value if value in MARCHES else "native"


def x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


def flags(level: str) -> tuple[str, ...]:
    """The compiler flags for a level. Off x86, only native is meaningful (`-mcpu=native`-less: the compiler's
    default target, which the machine runs); the x86 levels are refused there by the compiler itself."""
    if level == "native" and not x86():
        return BASE_FLAGS
    wide = ("-mprefer-vector-width=512",) if level in ("native", "x86-64-v4") else ()
    return BASE_FLAGS + (f"-march={level}",) + wide


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (empty where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def _compiler() -> tuple[str | None, str]:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None, ""
    try:
        done = run_bounded([compiler, "--version"], timeout_s=30, max_bytes=4096)
    except OSError:
        return None, ""
    return (compiler, done.stdout) if done.returncode == 0 else (None, "")


@functools.cache
def targeted(level: str) -> tuple[tuple[str, ...] | None, str]:
    """(the CPU flags code compiled at `level` may use, sorted; or None and the compiler's one-line refusal)."""
    compiler, _ = _compiler()
    if compiler is None:
        return None, "no working C compiler on PATH"
    cmd = [compiler, *[f for f in flags(level) if f not in ("-shared", "-fPIC")], "-dM", "-E", "-x", "c", os.devnull]
    try:
        done = run_bounded(cmd, timeout_s=60, max_bytes=1 << 20)
    except OSError as e:
        return None, f"the C compiler could not be asked for {level} ({e})"
    if done.timed_out or done.cut:
        return None, f"the C compiler did not answer for {level} within 60 s and 1 MB"
    if done.returncode != 0:
        return None, f"the C compiler refuses {level} ({done.first_error_line()})"
    macros = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define ")}
    return tuple(sorted(ISA_MACROS[m] for m in macros if m in ISA_MACROS)), ""


def _verified(lib: Path) -> bool:
    """The cached library is a regular file (not a link) whose sha256 is the one recorded when it was built."""
    digest = lib.with_name(lib.name + ".sha256")
    try:
        if not stat.S_ISREG(os.lstat(lib).st_mode) or not stat.S_ISREG(os.lstat(digest).st_mode):
            return False
        return digest.read_text(encoding="utf-8").strip() == sha256_file(lib)
    except (OSError, UnicodeDecodeError):
        return False


def _compile(compiler: str, level: str, name: str, source: str, folder: Path, lib: Path) -> str | None:
    """Compile into `lib` (by rename, with its digest beside it); None when done, else why not."""
    with tempfile.TemporaryDirectory(dir=folder, prefix=".tmp-") as tmp:
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        atomic_write_text(src, source)
        done = run_bounded([compiler, *flags(level), "-o", str(out), str(src)], timeout_s=180)
        if done.timed_out:
            return f"compiling them for {level} took more than 180 s"
        if done.returncode != 0:
            return f"compiling them for {level} failed ({done.first_error_line()})"
        digest = sha256_file(out)
        for old in (lib, lib.with_name(lib.name + ".sha256")):
            if os.path.islink(old):  # never written through: the link itself is replaced
                old.unlink()
        os.replace(out, lib)
        atomic_write_text(lib.with_name(lib.name + ".sha256"), digest + "\n")
    return None


def _writable_folder() -> tuple[Path, str]:
    """The kernels folder under the cache folder, or a private temporary one where that cannot be written."""
    folder = cache_dir() / "kernels"
    try:
        if any(os.path.islink(p) for p in (folder, folder.parent)):
            raise OSError(f"{folder} or its parent is a symbolic link")
        folder.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".tmp-probe-")
        probe.close()
        return folder, ""
    except OSError as e:
        private = Path(tempfile.mkdtemp(prefix="pdraft-kernels-"))
        return private, f"; built in {private} for this process: the cache folder cannot be written ({e})"


@functools.cache
def build(name: str, source: str, symbols: tuple[str, ...] = (), level: str | None = None) -> Built:
    """Build (once per machine), check and load `source` as the library `name` at `level` (default: the
    PDRAFT_CPU_MARCH level); never raises. `symbols` are the functions the caller will bind."""
    level = level or march()
    if level not in MARCHES:
        return Built(None, f"unknown level {level!r} (one of {', '.join(MARCHES)}): the {name} loops run in torch",
                     level)
    if level != "native" and not x86():
        return Built(None, f"{level} is an x86 level and this is {platform.machine()}: the {name} loops run in "
                           f"torch", level)
    compiler, version = _compiler()
    if compiler is None:
        return Built(None, f"no working C compiler on PATH: the {name} loops run in torch", level)
    targets, refusal = targeted(level)
    if targets is None:
        return Built(None, f"{refusal}: the {name} loops run in torch", level)
    have = cpu_flags()
    missing = [f for f in targets if f not in have] if have else []
    if missing:
        return Built(None, f"built for {level}, the {name} loops would need {', '.join(missing)}, which this CPU "
                           f"lacks: they run in torch", level, targets)
    key = hashlib.sha256("\0".join([source, compiler, version, *flags(level), *targets]).encode()).hexdigest()[:16]
    folder, where = _writable_folder()
    lib = folder / f"cpu_{name}-{level}-{key}.so"
    rebuilt = ""
    if not _verified(lib):
        rebuilt = "; the cached copy did not match its recorded digest, so it was built again" \
            if os.path.lexists(lib) else ""
        try:
            failed = _compile(compiler, level, name, source, folder, lib)
        except OSError as e:
            failed = f"could not build them under {folder} ({e})"
        if failed:
            return Built(None, f"{failed}: the {name} loops run in torch", level, targets)
    try:
        loaded = ctypes.CDLL(str(lib))
    except OSError as e:
        return Built(None, f"could not load {lib} ({e}): the {name} loops run in torch", level, targets)
    lacking = [s for s in symbols if not hasattr(loaded, s)]
    if lacking:
        return Built(None, f"{lib.name} lacks {', '.join(lacking)}: the {name} loops run in torch", level, targets)
    return Built(loaded, f"compiled for {level} ({lib}){rebuilt}{where}", level, targets)


def clear() -> None:
    """Forget every build and probe of this process (tests that change the compiler, the CPU or the level)."""
    for f in (_compiler, targeted, build, cpu_flags):
        getattr(f, "cache_clear", lambda: None)()  # a test may have put a plain function in its place


def ptr(x) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.data_ptr())


def ptr_or_null(x) -> ctypes.c_void_p | None:
    return None if x is None else ptr(x)


__all__ = ["ENV", "MARCHES", "MARCH_ENV", "Built", "build", "clear", "cpu_flags", "disabled", "flags", "march",
           "ptr", "ptr_or_null", "targeted"]
