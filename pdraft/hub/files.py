"""File-name safety for everything that comes from a Hub repository or a folder someone else wrote. A name is
checked here BEFORE any local path is built from it: no absolute paths, no drive letters, no `..` or `.`
components, no backslashes, no control characters, a bounded length, and (for files pdraft fetches) only the
suffixes a drafter checkpoint uses. Pickle formats (.bin/.pt/.pth/.pkl/.ckpt) are recognised so that a
repository offering only them can be refused with the reason (unpickling can run arbitrary code); no code file
(.py) is ever fetched, so `trust_remote_code` is never needed."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.errors import PdraftError

FETCH_SUFFIXES = (".json", ".safetensors", ".yaml", ".md")  # the only suffixes pull fetches and push uploads
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_NAME_CHARS = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")


def check_name(name: str, *, where: str = "repository") -> str:
    """Return `name` (a POSIX path relative to a repository root) if it is safe, else raise a one-line
    PdraftError that quotes it with repr (so control characters show and cannot rewrite the terminal)."""
    def bad(why: str):
        raise PdraftError(f"{where} file name {name!r} is unsafe: {why}; refusing the whole {where}")

    if not isinstance(name, str) or not name:
        bad("empty")
    if len(name) > MAX_NAME_CHARS:
        bad(f"longer than {MAX_NAME_CHARS} characters")
    if _CONTROL.search(name):
        bad("it contains a control character")
    if "\\" in name:
        bad("it contains a backslash")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        bad("it is an absolute path")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        bad("it has an empty, '.' or '..' path component")
    return name


def is_fetchable(name: str) -> bool:
    """A top-level file with a suffix a drafter checkpoint uses (call check_name first)."""
    return "/" not in name and name.lower().endswith(FETCH_SUFFIXES)


def is_pickle(name: str) -> bool:
    return name.lower().endswith(PICKLE_SUFFIXES)


def safe_join(root: Path, name: str, *, where: str = "repository") -> Path:
    """root / name, only after `name` passed check_name; the result is also confirmed (lexically, without
    following links: the Hub cache links snapshot files into its blob store) to stay inside root."""
    check_name(name, where=where)
    path = Path(os.path.abspath(root / name))
    if not path.is_relative_to(Path(os.path.abspath(root))):
        raise PdraftError(f"{where} file name {name!r} resolves outside {root}; refusing it")
    return root / name


def check_repo_id(repo_id: str) -> str:
    if not _REPO_ID.match(repo_id or "") or ".." in repo_id:
        raise PdraftError(f"{repo_id!r} is neither an existing folder nor a Hub repository id (owner/name)")
    return repo_id


def check_revision(revision: str | None) -> str | None:
    if revision is not None and (not _REVISION.match(revision) or ".." in revision):
        raise PdraftError(f"revision {revision!r} is not a valid branch, tag or commit name")
    return revision


@dataclass
class Listing:
    """The files of a repository, sorted into what pdraft fetches, pickle weights, and the rest (ignored)."""

    fetch: list[str] = field(default_factory=list)
    pickles: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    @property
    def has_safetensors(self) -> bool:
        return any(n.endswith(".safetensors") for n in self.fetch)


def classify(names, *, where: str = "repository") -> Listing:
    """Check every name (one unsafe name refuses the whole listing) and sort them."""
    out = Listing()
    for name in sorted(names):
        check_name(name, where=where)
        if is_fetchable(name):
            out.fetch.append(name)
        elif is_pickle(name):
            out.pickles.append(name)
        else:
            out.ignored.append(name)
    return out


def require_loadable(listing: Listing, source: str) -> None:
    """A drafter needs config.json and safetensors weights; pickle-only repositories are refused with the reason."""
    if "config.json" not in listing.fetch:
        raise PdraftError(f"{source} is not a drafter checkpoint: it has no config.json")
    if not listing.has_safetensors:
        if listing.pickles:
            raise PdraftError(f"{source} offers only pickle weights ({', '.join(listing.pickles[:4])}); pdraft reads "
                              f"safetensors only, because unpickling a file can run arbitrary code",
                              hint="ask the publisher for model.safetensors, or convert the weights yourself")
        raise PdraftError(f"{source} has no model.safetensors")
