"""`pull`: make a drafter from a local folder, the Hugging Face cache or a Hub download usable by decode, bench
and calibrate as it is. Order of work, so that nothing unsafe is ever written or run:

1. Resolve the source. A folder is read in place. A Hub id is looked up in the cache first when offline
   (HF_HUB_OFFLINE=1 or `offline=True`: a cached id works, an uncached one fails at once); online, the file
   list is fetched first (`HfApi.model_info`, short time-out) and only then the files.
2. Check every file name (pdraft/hub/files.py) before any local path is built from it; one unsafe name
   refuses the whole repository. Only top-level .json/.safetensors/.yaml/.md files are fetched
   (`allow_patterns` = those exact names), so no code (.py) and no pickle is ever downloaded; a repository that
   offers only pickle weights is refused with the reason.
3. Recognise the family from config.json (pdraft, DeepSpec `Qwen3DSparkModel` DSpark/DFlash, z-lab
   `DFlashDraftModel`, published `DFlash2DraftModel`) and validate by loading with `pdraft.models.load_drafter`
   (optionally against a target config): every weight name and shape is checked, and pdraft-written files carry a SHA-256.
4. With `out`, copy into a hidden temporary folder next to `out`, validate the copy, then rename it to `out`,
   so an interrupted pull never leaves a folder that looks complete. The copy lists what pdraft wrote
   (pdraft.ledger), so it can be pushed again: pulling a local folder with `--out` is also how a drafter
   written by an older pdraft (no ledger) becomes pushable. From a local folder, a file with several names
   (a hard link, which may be any other file, such as the Hub token) is refused, never copied."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from pdraft import ledger
from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io
from pdraft.paths import OWNED_MARKER, link_outside, staged_dir
from pdraft.hub import companions
from pdraft.hub.files import check_name, check_repo_id, check_revision, classify, require_loadable, safe_join
from pdraft.models.checkpoint import load_drafter
from pdraft.models.families import family_of
from pdraft.models.schema import MAX_CONFIG_BYTES, check_drafter_config
from pdraft.models.tensorfile import index_shards
from pdraft.readback import parse_json, read_bytes
from pdraft.runtime import is_offline

TIMEOUT_S = 10.0  # Hub metadata and ETag requests; a dead network fails in seconds, not minutes


@dataclass
class PulledDrafter:
    path: Path  # folder to give decode/bench/calibrate: `out`, the local folder, or the cache snapshot
    # "pdraft-dflash" | "pdraft-dspark" | "pdraft-dflash2" | "deepspec-dflash" | "deepspec-dspark" | "zlab-dflash"
    # | "zlab-dflash2" (a published DFlash2DraftModel: z-lab / SpecForge / speculators)
    family: str
    config: object  # the drafter's typed config (its family's config class)
    source: str  # what the user asked for
    revision: str | None = None  # resolved commit for Hub sources
    files: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # repository files not fetched (code, docs, other formats)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "family": self.family, "kind": self.config.kind,
                "block_size": getattr(self.config, "block_size", None),
                "block_convention": getattr(self.config, "block_convention", None),
                "max_gamma": self.config.num_gamma, "source": self.source, "revision": self.revision,
                "files": self.files, "ignored": self.ignored}


def hub_cache_dir() -> Path:
    """The Hugging Face cache, read from the environment at call time (huggingface_hub reads it at import)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _read_config(folder: Path, source: str) -> dict:
    blob = read_bytes(folder / "config.json", f"{source}: config.json", MAX_CONFIG_BYTES)  # size before reading
    data = parse_json(blob, f"{source}: config.json")
    if not isinstance(data, dict):
        raise PdraftError(f"{source}: config.json does not hold a JSON object")
    check_drafter_config(data, f"{source}: config.json")  # types and ranges before family_of converts any field
    return data  # an `auto_map` (remote code) is ignored: pdraft implements both architectures itself


def _check_index(folder: Path, names: list[str], source: str) -> None:
    """Shard names inside model.safetensors.index.json come from the repository too: check them before the
    loader builds paths from them, and require that each was fetched."""
    index = folder / "model.safetensors.index.json"
    if "model.safetensors" in names or not index.is_file():
        return
    try:
        shards = index_shards(index)  # the weight index's one schema
    except PdraftError as err:
        raise PdraftError(f"{source}: {err.message}") from None
    for shard in shards:
        check_name(str(shard), where="weight index")
        if shard not in names:
            raise PdraftError(f"{source}: weight shard {shard!r} named by the index is not in the repository")


def _listing_of_folder(folder: Path, recursive: bool) -> list[str]:
    if not recursive:  # pdraft's own bookkeeping (the ledger, the ownership marker) is never part of a drafter
        return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in (ledger.LEDGER_NAME, OWNED_MARKER))
    out = []
    for root, dirs, files in os.walk(folder):  # followlinks=False: cache snapshots link files, not folders
        dirs[:] = [d for d in dirs if d != ".cache"]  # huggingface_hub's local-dir metadata
        for f in files:
            out.append(Path(root, f).relative_to(folder).as_posix())
    return sorted(out)


def _from_cache(repo_id: str, revision: str | None, cache: Path) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError and friends: not cached (or not this revision)
        at = f"@{revision}" if revision else ""
        raise PdraftError(f"{repo_id}{at} is not in the Hugging Face cache ({cache}) and the Hub cannot be "
                          f"reached (offline mode)",
                          hint="pull it once with the network on, or give a local folder") from None


def _download(repo_id: str, revision: str | None, cache: Path, token) -> tuple[Path, str | None]:
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        info = HfApi().model_info(repo_id, revision=revision, timeout=TIMEOUT_S, token=token)
        names = [s.rfilename for s in (info.siblings or [])]
        listing = classify(names)  # every name checked before anything is downloaded
        require_loadable(listing, repo_id)
        path = snapshot_download(repo_id, revision=info.sha or revision, cache_dir=cache, token=token,
                                 allow_patterns=listing.fetch, etag_timeout=TIMEOUT_S)
        return Path(path), info.sha
    except PdraftError:
        raise
    except GatedRepoError:
        raise PdraftError(f"{repo_id} is gated: accept its terms on the Hub and log in (hf auth login)") from None
    except RevisionNotFoundError:
        raise PdraftError(f"{repo_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise PdraftError(f"{repo_id} was not found on the Hub (or is private and no token allows it)") from None
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as err:
        raise PdraftError(f"cannot download {repo_id} from the Hub: {type(err).__name__}",
                          hint="check the network, or set HF_HUB_OFFLINE=1 to use the cache") from None
    except Exception as err:  # httpx2 transport errors (no network, DNS, time-out): fall back to the cache
        raise _Unreachable(type(err).__name__) from None


def _refuse_outside_links(src: Path, names: list[str], where: str, *, cache_snapshot: bool) -> None:
    """Nothing outside the source is read as part of it: a file that is a link leaving the folder (or, for a
    Hugging Face cache snapshot, leaving that repository's cache folder, whose blobs/ the snapshot links into)
    refuses the pull before anything is read or copied."""
    root = src.parent.parent if cache_snapshot else src
    for name in names:
        if link_outside(safe_join(src, name), root):
            raise PdraftError(f"{where}: {name} is a symbolic link to a file outside {root}; pdraft never reads or "
                              f"copies what lies outside the folder", hint="replace the link with a copy of the file")


def _refuse_hard_links(src: Path, names: list[str], where: str) -> None:
    """A local folder's file with several names may be any other file (a hard link to the Hub token): refused,
    so it is never copied, and never listed as a file pdraft wrote."""
    for name in names:
        st = os.lstat(src / name)
        if st.st_nlink > 1 and not os.path.islink(src / name):
            raise PdraftError(f"{where}: {name} is a hard link ({st.st_nlink} names): it may be any other file, so "
                              f"pdraft does not take it as part of the drafter", hint="replace it with a copy")


class _Unreachable(Exception):
    """The Hub could not be reached at all (as opposed to answering with an error)."""


def _install(src: Path, names: list[str], out: Path, validate) -> tuple[Path, object]:
    """Copy `names` from src into a hidden temporary folder beside `out`, validate, then rename into place."""
    with staged_dir(out) as (out, tmp):
        for name in names:
            dest = safe_join(tmp, name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(safe_join(src, name), dest)  # follows the cache's symlinks into its blobs
            with open(dest, "rb") as f:
                os.fsync(f.fileno())
        config = validate(tmp)
        for name in names:  # what was copied and validated, as it lies in the copy
            if "/" not in name:
                ledger.record(tmp / name)
    return out, config


def pull(source: str, revision: str | None = None, out: str | os.PathLike | None = None,
         offline: bool | None = None, *, target_config=None, token: str | bool | None = None) -> PulledDrafter:
    """Resolve, check, recognise, validate and (with `out`) install a drafter; see the module docstring."""
    src = Path(str(source)).expanduser()
    commit = None
    if src.is_dir():
        names = _listing_of_folder(src, recursive=False)
        where = str(src)
        if out is not None:
            check_io("pull", [Input("the source folder", src)], [Output("--out", Path(out), "folder")])
            _refuse_hard_links(src, names, where)
    else:
        check_repo_id(str(source))
        check_revision(revision)
        cache = hub_cache_dir()
        if is_offline(offline):
            src = _from_cache(str(source), revision, cache)
            commit = src.name
        else:
            try:
                src, commit = _download(str(source), revision, cache, token)
            except _Unreachable as err:  # no network: a cached copy still works, as with HF_HUB_OFFLINE=1
                try:
                    src = _from_cache(str(source), revision, cache)
                except PdraftError:
                    raise PdraftError(f"cannot reach the Hub for {source} ({err}) and it is not in the Hugging "
                                      f"Face cache ({cache})", hint="check the network") from None
                commit = src.name
        names = _listing_of_folder(src, recursive=True)
        where = f"{source}" + (f"@{revision}" if revision else "")
    listing = classify(names, where="repository" if commit else "folder")
    require_loadable(listing, where)
    _refuse_outside_links(src, listing.fetch, where, cache_snapshot=commit is not None)
    # A cache snapshot links into blobs/; an interrupted download can leave a link whose blob is missing.
    missing = [n for n in listing.fetch if not safe_join(src, n).is_file()]
    if missing:
        raise PdraftError(f"{where}: {', '.join(missing)} is missing from {src} (an interrupted download?)",
                          hint="pull it again with the network on")
    _check_index(src, listing.fetch, where)
    data = _read_config(src, where)
    family = family_of(data, f"{where}: config.json")

    def validate(folder: Path):
        try:
            config = load_drafter(folder, target_config).config
        except PdraftError as err:
            raise PdraftError(f"{where}: {err.message}", hint=err.hint) from None
        # The recipe, calibration, cost table and bench report it brings, by the schemas decode and push use.
        companions.check_folder(folder, [n for n in listing.fetch if "/" not in n], where)
        return config

    if out is not None:
        path, config = _install(src, listing.fetch, Path(out), validate)
    else:
        path, config = src, validate(src)
    return PulledDrafter(path=path, family=family, config=config, source=str(source), revision=commit,
                         files=list(listing.fetch), ignored=list(listing.ignored + listing.pickles))


def drafter_folder(source: str) -> Path:
    """The folder of the drafter `source` names: a local folder as it is, a Hub id pulled (checked as `pull`
    checks it). What the commands resolve `drafter.init_from` to before training starts, so that training
    never reaches the Hub."""
    path = Path(source).expanduser()
    return path if path.is_dir() else pull(source).path
