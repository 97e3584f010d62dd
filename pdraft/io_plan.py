"""Every command's inputs and outputs, checked against each other before it starts. A command states what it
reads (the recipe, drafter folders or their files, `drafter.init_from`, a cache, prompt sets, calibration
files) and what it writes or deletes (files, folders, the entries it creates inside a folder), and
`check_io` refuses, in one line naming both, an output that is, contains or lies inside an input, or two outputs
that name one path (a metrics stream aimed at the report's own bench.json or at the report folder), comparing
paths with symbolic links resolved. The granularity is the command's: `bench` reads a drafter folder whole,
so a report written anywhere in it is refused; `calibrate-threshold` reads a drafter's weights, config and
recipe, so its sidecars may go beside them (their purpose) but never over them.

The same check refuses an output whose name exists as a symbolic link (for a file appended to or locked, also
a hard link), before anything is written: pdraft.paths refuses them again at the moment of writing, which
also covers one planted while the command runs. And an output folder that already holds another kind of
artifact (a model's config.json where a hidden-state cache would go, a cache where a bench report would go)
is refused, because the names those artifacts use collide (`recipe.resolved.yaml`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.paths import refuse_link

# The file that shows which artifact a folder already holds, by artifact.
ARTIFACTS = {"model": "config.json", "hidden-state cache": "manifest.json", "run folder": "latest",
             "bench report": "bench.json"}


@dataclass(frozen=True)
class Input:
    what: str  # how the user named it: "drafter", "drafter.init_from", "data.source", "the recipe"
    path: Path


@dataclass(frozen=True)
class Output:
    what: str  # "--out", "data.cache_dir", "--metrics", "the run folder's latest"
    path: Path
    kind: str = "file"  # "file" (replaced whole), "append" (written in place: a log, a lock), "folder"
    artifact: str | None = None  # for a folder: the artifact it holds (a key of ARTIFACTS)
    shares: tuple[str, ...] = ()  # other artifacts that may share that folder
    whole: bool = True  # False: a folder the command writes entries into (listed as outputs of their own)


def input_if_local(what: str, value: str | os.PathLike | None) -> list[Input]:
    """[Input] for a recipe value that may name a local file or folder (a prompt set, a target, init_from), or
    [] when it names something else (builtin:NAME, a Hub or datasets id) or nothing."""
    if value is None or str(value).startswith("builtin:"):
        return []
    path = Path(str(value)).expanduser()
    return [Input(what, path)] if os.path.lexists(path) else []


def _real(path: Path) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def _relation(out: Path, inp: Path) -> str | None:
    if out == inp:
        return "is the same path as"
    if out.is_relative_to(inp):
        return "lies inside"
    if inp.is_relative_to(out):
        return "contains"
    return None


def _artifacts_in(folder: Path) -> list[str]:
    return [name for name, sign in ARTIFACTS.items() if os.path.lexists(folder / sign)]


def check_io(command: str, inputs: Iterable[Input], outputs: Iterable[Output]) -> None:
    """Refuse, in one line, an output over an input, an output that exists as a link, or an output folder
    holding another artifact; see the module docstring."""
    inputs, outputs = list(inputs), list(outputs)
    for out in outputs:
        shown = f"{command}: {out.what} {out.path}"
        refuse_link(out.path, f"{command}: {out.what}")
        if out.kind == "append" and os.path.lexists(out.path):
            st = os.lstat(out.path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                raise PdraftError(f"{shown} is a hard link ({st.st_nlink} names); pdraft writes in place only into "
                                  f"a file of its own", hint="remove it, or choose another path")
        real_out = _real(out.path)
        for inp in inputs if out.whole else ():
            rel = _relation(real_out, _real(inp.path))
            if rel is not None:
                raise PdraftError(f"{shown} {rel} {inp.what} {inp.path}, which it reads; pdraft never writes "
                                  f"over its own inputs", hint="give the output a place of its own")
    for i, a in enumerate(outputs):  # two outputs on one path (a file on a folder too): one would overwrite the other
        for b in outputs[i + 1:]:
            if _real(a.path) == _real(b.path):
                same = "file" if "folder" not in (a.kind, b.kind) else "path"
                raise PdraftError(f"{command}: {a.what} {a.path} and {b.what} {b.path} are the same {same}; one would "
                                  f"overwrite the other", hint=f"give {a.what} a place of its own")
    for out in outputs:  # after every overlap: a message naming the input says more than one naming the artifact
        shown = f"{command}: {out.what} {out.path}"
        if out.kind == "folder" and out.artifact is not None and out.path.is_dir():
            others = [a for a in _artifacts_in(out.path) if a != out.artifact and a not in out.shares]
            if others:
                sign = ARTIFACTS[others[0]]
                raise PdraftError(f"{shown} already holds {sign}, the file of a {others[0]}, not of a "
                                  f"{out.artifact}: writing there would mix the two and replace its files",
                                  hint=f"give the {out.artifact} a folder of its own")

