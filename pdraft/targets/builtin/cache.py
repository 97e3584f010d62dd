"""The cache of builtin targets: `cache_dir()/targets/<name>/`, each folder carrying a manifest of sha256
checksums. A folder is only ever made visible by an atomic rename of a complete temporary folder (so two
processes using the target for the first time never see a half-written one), a lock keeps them from doing
the work twice (and, once held, sweeps the temporary folders a killed build left: `_leftovers`), and a
folder whose files no longer match their checksums is reported with a warning and
replaced, never used. The default target is materialised from the weights shipped in the package; a converted
target (`smollm2-135m-instruct`) is converted once from the GGUF its registry package installs; anything else
(the test variant, another seed, a damaged shipped copy) is built."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
import warnings
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.paths import atomic_write_text, cache_dir as _cache_root, make_dir, open_in_place, sha256_file
from pdraft.readback import load
from pdraft.targets.builtin.builder import BUILT_MANIFEST, MANIFEST, VARIANTS, build
from pdraft.targets.builtin.converted import CONVERTED, SOURCE, SOURCE_RECORD, convert, installed_source

log = logging.getLogger("pdraft.targets.builtin")

SHIPPED_DIR = Path(__file__).resolve().parent / "weights"
INSTALL = "install.json"  # how and when this cache entry was made; outside the manifest on purpose
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")
SHIPPED_SEED = 0


def normalise_name(name: str) -> str:
    """Accept `tiny-stdlib` or `builtin:tiny-stdlib`; raise PdraftError for an unknown name."""
    bare = name.removeprefix("builtin:")
    if bare not in VARIANTS and bare not in CONVERTED:
        raise PdraftError(f"unknown builtin target {bare!r}",
                          hint="known builtin targets: " + ", ".join(f"builtin:{n}" for n in (*VARIANTS, *CONVERTED)))
    return bare


def target_dir(name: str, cache_dir=None, seed: int = SHIPPED_SEED) -> Path:
    """Where builtin target `name` built with `seed` lives in the cache."""
    bare = normalise_name(name)
    if bare in CONVERTED and seed != SHIPPED_SEED:
        raise PdraftError(f"builtin:{bare} is converted from pretrained weights: it has no seed to build with",
                          hint="leave the seed at 0")
    leaf = bare if seed == SHIPPED_SEED else f"{bare}-seed{seed}"
    return _cache_root(cache_dir) / "targets" / leaf


def shipped_dir(name: str) -> Path | None:
    """The package's copy of a builtin target's weights, if this variant ships one."""
    folder = SHIPPED_DIR / normalise_name(name)
    return folder if (folder / MANIFEST).is_file() else None


def verify(folder: Path) -> str | None:
    """None if `folder` is a complete target whose files match its manifest, else what is wrong."""
    try:  # its one schema, within its size limit (pdraft.readback)
        files = load(folder / MANIFEST, BUILT_MANIFEST, inside="embedded target folder").files
    except PdraftError:
        return "missing or unreadable manifest.json"
    for required in REQUIRED_FILES:
        if required not in files:
            return f"manifest lacks {required}"
    for fname, digest in sorted(files.items()):
        path = folder / fname
        if not path.is_file():
            return f"{fname} is missing"
        if sha256_file(path) != digest:
            return f"{fname} does not match its sha256 checksum"
    return None


@contextlib.contextmanager
def _lock(path: Path):
    """An exclusive advisory lock (POSIX), yielding True; elsewhere False: the atomic rename alone keeps the folder
    whole."""
    make_dir(path.parent)
    try:
        import fcntl
    except ImportError:  # Windows: no flock; two processes may both build, one rename wins
        yield False  # nothing is held: another process's temporary folder may be live
        return
    fd = open_in_place(path, os.O_CREAT | os.O_RDWR, "build lock")  # never through a link
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _leftovers(folder: Path, since: float) -> list[Path]:
    """The temporary folders (`.tmp-<name>-XXXXXXXX` of mkdtemp, `.trash-<name>-<8 hex>` of _discard) a killed
    build of `folder` left beside it, older than `since` (when the caller took the build lock). Called under that
    lock, so no live process writes them: a build holds the lock from its mkdtemp to its rename. Exact names
    only (another target's `.tmp-<name>-seed1-...` is never one of them); a link or a file is not touched."""
    shape = re.compile(rf"\.(tmp-{re.escape(folder.name)}-[a-z0-9_]{{8}}|trash-{re.escape(folder.name)}-[0-9a-f]{{8}})")
    out = []
    for entry in folder.parent.iterdir():
        if shape.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink() \
                and entry.lstat().st_mtime < since:
            out.append(entry)
    return sorted(out)


def _discard(folder: Path) -> None:
    """Take a folder out of view atomically, then delete it."""
    trash = folder.with_name(f".trash-{folder.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def resolve(name: str, cache_dir=None, progress: bool = True, seed: int = SHIPPED_SEED) -> Path:
    """The Hugging Face folder of builtin target `name`, materialising or building it on first use.

    Later calls only check the manifest's checksums (milliseconds). A corrupted entry is reported with a
    `RuntimeWarning` and made again."""
    bare = normalise_name(name)
    folder = target_dir(bare, cache_dir, seed)
    if folder.is_dir() and verify(folder) is None and _stale(bare, folder, seed) is None:
        return folder
    with _lock(folder.parent / f".{folder.name}.lock") as locked:
        for stale in _leftovers(folder, since=time.time()) if locked else ():  # a killed build's (issue 60)
            log.info("removing %s, left by a build that did not finish", stale)
            shutil.rmtree(stale, ignore_errors=True)
        if folder.is_dir():  # another process may have finished it while we waited for the lock
            problem = verify(folder)
            if problem is None:
                if (stale := _stale(bare, folder, seed)) is None:
                    return folder
                made = "converted from the installed package" if bare in CONVERTED else "this pdraft ships"
                warnings.warn(f"cached builtin target {bare} at {folder} {stale}; replacing it with the weights "
                              f"{made} (drafters trained on the old one must be retrained)",
                              RuntimeWarning, stacklevel=2)
            else:
                warnings.warn(f"cached builtin target {bare} at {folder} is corrupt ({problem}); rebuilding it",
                              RuntimeWarning, stacklevel=2)
            _discard(folder)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
        try:
            source = _fill(bare, tmp, seed, progress, partial=folder.with_name(f".build-{folder.name}"))
            atomic_write_text(tmp / INSTALL, json.dumps(
                {"source": source, "created": time.time(), "pid": os.getpid(), "id": uuid.uuid4().hex}) + "\n")
            try:
                os.rename(tmp, folder)
            except OSError:
                # Only without flock (Windows): another process renamed its copy in first; use that one.
                if verify(folder) is not None:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                source = "another process"
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("builtin target %s ready at %s (%s)", bare, folder, source)
    return folder


def _stale(name: str, folder: Path, seed: int) -> str | None:
    """Why a sound cache entry is not the target this installation ships (it was copied from an older pdraft's
    weights, or converted from another release of the package), or None. Only the shipped seed has a reference;
    other seeds are built and kept as built. A converted folder outlives its package: uninstalled, it is used."""
    if name in CONVERTED:
        try:
            now = installed_source(CONVERTED[name])
            was = load(folder / SOURCE, SOURCE_RECORD, inside="embedded target folder").model_dump()
        except PdraftError:
            return None
        differs = sorted(k for k, v in now.items() if was.get(k) != v)
        return f"was converted from another {now['package']} ({', '.join(differs)} differ)" if differs else None
    src = shipped_dir(name) if seed == SHIPPED_SEED else None
    if src is None:
        return None
    try:
        shipped = load(src / MANIFEST, BUILT_MANIFEST).files
        cached = load(folder / MANIFEST, BUILT_MANIFEST, inside="embedded target folder").files
    except PdraftError:
        return None  # verify() reports unreadable manifests; a damaged shipped copy is _fill's to report
    return None if cached == shipped else "holds other weights than the ones this pdraft ships"


def _fill(name: str, tmp: Path, seed: int, progress: bool, partial: Path) -> str:
    """Put a complete target into `tmp`: copy the shipped weights when they exist and verify, else build.

    A build runs in `partial`, a fixed folder beside the cache entry that keeps the build's checkpoints, so a
    first use killed part way (an hour-long build of tiny-stdlib-candidate) resumes where it stopped. A
    converted target is converted straight into `tmp` (a minute; nothing to resume)."""
    if name in CONVERTED:
        record = convert(name, tmp, progress=progress)
        return f"converted from {record['package']} {record['version']}"
    src = shipped_dir(name) if seed == SHIPPED_SEED else None
    if src is not None:
        problem = verify(src)
        if problem is None:
            for path in sorted(src.iterdir()):
                if path.is_file():
                    shutil.copyfile(path, tmp / path.name)
            if verify(tmp) is None:
                return "shipped"
            raise PdraftError(f"copying the shipped {name} weights into {tmp} failed a checksum",
                              hint="check the disk the cache folder is on")
        warnings.warn(f"the shipped weights of {name} are damaged ({problem}); building them instead",
                      RuntimeWarning, stacklevel=3)
    log.info("building builtin target %s (seed %d) in %s", name, seed, partial)
    build(name, partial, seed=seed, progress=progress)
    for path in sorted(partial.iterdir()):
        if path.is_file():
            os.replace(path, tmp / path.name)
    shutil.rmtree(partial, ignore_errors=True)
    return "built"
