"""Prompt sets for export-hidden, train, calibrate and bench: read from a DeepSpec-layout JSONL file, a
Parquet file, a `datasets` id, or the embedded target's own prompt sets (`builtin:code`, `builtin:prose`,
`builtin:code+prose`), into one record type, `Conversation`.

Accepted record forms (one JSON object per line, or one Parquet/datasets row):
``{"turns": ["user turn", ...]}`` (DeepSpec's layout, optionally with ``"response"``),
``{"messages"|"conversations": [{"role"|"from": ..., "content"|"value": ...}, ...]}`` (chat and ShareGPT),
``{"prompt": ..., "response"|"completion"|"output": ...}`` and ``{"text": ...}`` (plain text, no response).
System messages are dropped because decode feeds only the first user turn; a response is the first assistant
message after the first user message.

Hostile files are bounded before they are read: a prompt file must be a regular file (a device such as
/dev/zero, or a pipe, never ends), a JSONL file is read line by line with each line bounded (MAX_LINE_BYTES)
and nesting bounded by the JSON parser's own limit (a line of millions of brackets is one malformed line, not a
RecursionError), and a record's `seed` must fit the 63 bits
every sampling stream takes (vLLM's SamplingParams.seed is an int too).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pdraft.errors import PdraftError
from pdraft.paths import check_input_file
from pdraft.readback import TooDeep, loads
from pdraft.recipe import MAX_SEED

BUILTIN_PREFIX = "builtin:"
# Held-out sets (bench, calibration) and the training-split sets (drafter training) of the embedded target.
BUILTIN_SETS = ("code", "prose", "code-train", "prose-train")
_USER_ROLES = {"user", "human"}
_ASSISTANT_ROLES = {"assistant", "gpt", "model", "bot"}
_RESPONSE_KEYS = ("response", "completion", "output")
_DATASET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")

OnError = Literal["stop", "skip"]
MAX_LINE_BYTES = 64 << 20  # one JSONL record; a prompt longer than this cannot fit any target's context


@dataclass
class Conversation:
    """One prompt record: the user turns in order and, when the data has one, the answer to the first turn.

    `response_ids` is set only by regeneration, where the target's exact token ids are known; it lets the
    training sequence hold the ids the target produced instead of a re-tokenisation of their text.
    """

    turns: list[str]
    response: str | None = None
    response_ids: list[int] | None = None
    origin: str = ""  # "file:line" or "dataset[row]", for error messages
    seed: int | None = None  # the record's own sampling seed ("seed" field), as vLLM's SamplingParams.seed

    @property
    def prompt(self) -> str:
        return self.turns[0]


class PromptSet(list):
    """A list of `Conversation` that also remembers where it came from and which lines were skipped."""

    def __init__(self, items: list[Conversation] = (), source: str = "", skipped: list[int] | None = None):
        super().__init__(items)
        self.source = source
        self.skipped: list[int] = list(skipped or [])


# --------------------------------------------------------------------------------------------- parsing


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, found {type(value).__name__}")
    return value


def parse_record(obj: Any) -> Conversation:
    """One JSON object -> Conversation; raises ValueError with a short reason for anything else."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, found {type(obj).__name__}")
    record = _parse_fields(obj)
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        shown = repr(seed) if not isinstance(seed, int) or seed.bit_length() < 200 else f"an integer of {len(str(seed))} digits"
        raise ValueError(f'"seed" must be an integer in 0..{MAX_SEED} (2**63 - 1), found {shown}')
    record.seed = seed
    return record


def _parse_fields(obj: dict) -> Conversation:
    response = next((obj[k] for k in _RESPONSE_KEYS if obj.get(k) is not None), None)
    if response is not None:
        response = _text(response, "response")
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError('"turns" must be a non-empty list of strings')
        return Conversation([_text(t, "each turn") for t in turns], response)
    for key in ("messages", "conversations"):
        if key in obj:
            return _from_messages(obj[key], key)
    if "prompt" in obj:
        return Conversation([_text(obj["prompt"], '"prompt"')], response)
    if "text" in obj:
        return Conversation([_text(obj["text"], '"text"')], None)
    keys = ", ".join(sorted(obj)[:6]) or "none"
    raise ValueError(f'no "turns", "messages", "conversations", "prompt" or "text" key (keys: {keys})')


def _from_messages(messages: Any, key: str) -> Conversation:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'"{key}" must be a non-empty list of messages')
    turns: list[str] = []
    response: str | None = None
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError(f'each item of "{key}" must be an object with a role and content')
        role = str(m.get("role", m.get("from", ""))).lower()
        content = m.get("content", m.get("value"))
        if role in _USER_ROLES:
            turns.append(_text(content, "message content"))
        elif role in _ASSISTANT_ROLES and len(turns) == 1 and response is None:
            response = _text(content, "message content")
    if not turns:
        raise ValueError(f'"{key}" has no user message')
    return Conversation(turns, response)


def read_jsonl(path: str | Path, on_error: OnError = "stop") -> PromptSet:
    """Read a JSONL prompt file. A malformed line stops with an error naming the file and line number, or,
    with on_error="skip", is left out and its number recorded in `.skipped`. Blank lines are ignored."""
    path = Path(path)
    records: list[Conversation] = []
    skipped: list[int] = []
    check_input_file(path, "prompt file")
    try:
        handle = path.open("r", encoding="utf-8")
    except OSError as e:
        raise PdraftError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    with handle:
        for number, line in enumerate(_lines(handle, path), start=1):
            if not line.strip():
                continue
            try:
                if len(line) > MAX_LINE_BYTES:
                    raise ValueError(f"a line longer than {MAX_LINE_BYTES >> 20} MiB")
                rec = parse_record(loads(line))  # nesting bounded (pdraft.readback)
            except ValueError as e:  # JSONDecodeError and TooDeep are ValueErrors
                if isinstance(e, TooDeep):
                    reason = "invalid JSON (nested too deeply)"
                else:
                    reason = f"invalid JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
                if on_error == "skip":
                    skipped.append(number)
                    continue
                raise PdraftError(f"{path}:{number}: {reason}",
                                  hint="fix the line, or skip malformed lines") from None
            rec.origin = f"{path}:{number}"
            records.append(rec)
    if not records:
        what = f"all {len(skipped)} lines are malformed" if skipped else "it has no records"
        raise PdraftError(f"{path}: empty prompt set ({what})")
    return PromptSet(records, str(path), skipped)


def _lines(handle, path: Path):
    """The file's lines, each read with a bound: a longer one is cut at MAX_LINE_BYTES + 1 characters (so it
    is refused as too long) and the rest of it skipped, never held whole."""
    try:
        while line := handle.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES and not line.endswith("\n"):
                while (rest := handle.readline(MAX_LINE_BYTES)) and not rest.endswith("\n"):
                    pass  # the rest of the over-long line
            yield line
    except UnicodeDecodeError:
        raise PdraftError(f"{path}: not UTF-8 text; expected JSONL") from None


def read_parquet(path: str | Path, on_error: OnError = "stop") -> PromptSet:
    import pyarrow.parquet as pq

    path = Path(path)
    check_input_file(path, "prompt file")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a bad file
        raise PdraftError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
    return _from_rows(rows, str(path), on_error, lambda i: f"{path}[row {i}]")


def _from_rows(rows, source: str, on_error: OnError, where) -> PromptSet:
    records: list[Conversation] = []
    skipped: list[int] = []
    for i, row in enumerate(rows):
        try:
            rec = parse_record(row)
        except ValueError as e:
            if on_error == "skip":
                skipped.append(i)
                continue
            raise PdraftError(f"{where(i)}: {e}") from None
        rec.origin = where(i)
        records.append(rec)
    if not records:
        raise PdraftError(f"{source}: empty prompt set (no usable rows)")
    return PromptSet(records, source, skipped)


def read_dataset(dataset_id: str, split: str = "train", on_error: OnError = "stop") -> PromptSet:
    """A Hugging Face `datasets` id; offline or unknown ids end with an error that names the id."""
    try:
        import datasets
    except ImportError:
        raise PdraftError(f"data source {dataset_id!r} looks like a datasets id but `datasets` is not installed") from None
    try:
        ds = datasets.load_dataset(dataset_id, split=split)
    except Exception as e:  # noqa: BLE001 - offline, not found, bad split all end here
        raise PdraftError(f"cannot load dataset {dataset_id!r} split {split!r} ({type(e).__name__})",
                          hint="check the id and split; offline, only datasets already in the local cache load") from None
    return _from_rows(ds, f"{dataset_id}[{split}]", on_error, lambda i: f"{dataset_id}[{split}][row {i}]")


def read_file(path: str | Path, on_error: OnError = "stop") -> PromptSet:
    path = Path(path)
    if path.is_dir():
        raise PdraftError(f"{path}: is a folder; expected a .jsonl or .parquet prompt file")
    if path.suffix.lower() == ".parquet":
        return read_parquet(path, on_error)
    return read_jsonl(path, on_error)


def builtin_prompts(name: str, on_error: OnError = "stop") -> PromptSet:
    """`code`, `prose` (held out from the target's training text: for bench and calibration), `code-train`,
    `prose-train` (from its training text: for drafter training), or several joined by `+` (interleaved, so
    that a max_samples cut keeps every kind)."""
    parts = name.split("+")
    bad = [p for p in parts if p not in BUILTIN_SETS]
    if bad or not parts:
        raise PdraftError(f"unknown builtin prompt set {BUILTIN_PREFIX}{name}",
                          hint="use builtin:code, builtin:prose, builtin:code-train, builtin:prose-train, or "
                               "several joined by +")
    try:
        from pdraft.targets.builtin import prompt_set_path
    except ImportError:
        raise PdraftError(f"prompt set {BUILTIN_PREFIX}{name}: the embedded target's prompt sets are not part of this build",
                          hint="pass a JSONL/Parquet file or a datasets id as data.source") from None
    sets = [read_file(prompt_set_path(p.removesuffix("-train"), "train" if p.endswith("-train") else "heldout"),
                      on_error) for p in parts]
    return interleave(sets, BUILTIN_PREFIX + name)


def interleave(sets: list[PromptSet], source: str) -> PromptSet:
    """Several prompt sets record by record (a, b, a, b, ...), so that a max_samples cut keeps every one."""
    mixed: list[Conversation] = []
    for i in range(max(len(s) for s in sets)):
        mixed.extend(s[i] for s in sets if i < len(s))
    return PromptSet(mixed, source, [n for s in sets for n in s.skipped])


ROW_RANGE = re.compile(r"^(?P<path>.+)\[(?P<start>\d*):(?P<stop>\d*)\]$")  # `file.jsonl[40:]`


def source_parts(source: str) -> list[str]:
    """A source joined by `+` into its parts: `a.jsonl[40:]+b.jsonl[100:]` is two files, and a builtin set's
    own `+` (`builtin:code-train+prose-train`) stays one part. A single existing path is never split."""
    if "+" not in source or Path(source).expanduser().exists():
        return [source]
    parts: list[str] = []
    for piece in source.split("+"):
        if parts and parts[-1].startswith(BUILTIN_PREFIX) and piece in BUILTIN_SETS:
            parts[-1] += "+" + piece
        else:
            parts.append(piece)
    return parts


def load_prompts(source: str, split: str = "train", max_samples: int | None = None,
                 on_error: OnError = "stop") -> PromptSet:
    """Resolve a data source string (recipe `data.source`, `calibrate.prompts`, a `bench.prompt_sets` item).

    A file may name a row range, Python-style (`humaneval.jsonl[40:]`: the records from the 41st on), so that
    training and calibration take the prompts a benchmark's first N leave out; several sources joined by `+`
    are interleaved record by record, so a `max_samples` cut keeps every one of them."""
    if on_error not in ("stop", "skip"):
        raise ValueError(f"on_error must be 'stop' or 'skip', got {on_error!r}")
    parts = source_parts(source)
    rows = ROW_RANGE.match(source) if len(parts) == 1 and not Path(source).expanduser().exists() else None
    if len(parts) > 1:
        prompts = interleave([load_prompts(p, split, None, on_error) for p in parts], source)
    elif rows:
        whole = load_prompts(rows["path"], split, None, on_error)
        start, stop = int(rows["start"] or 0), int(rows["stop"]) if rows["stop"] else None
        prompts = PromptSet(list(whole)[start:stop], source, list(whole.skipped))
    elif source.startswith(BUILTIN_PREFIX):
        prompts = builtin_prompts(source[len(BUILTIN_PREFIX):], on_error)
    elif Path(source).expanduser().exists():
        prompts = read_file(Path(source).expanduser(), on_error)
    elif source.lower().endswith((".jsonl", ".json", ".parquet")) or "\\" in source or source.startswith((".", "/", "~")):
        raise PdraftError(f"prompt file {source!r} not found")
    elif _DATASET_ID.match(source):
        prompts = read_dataset(source, split, on_error)
    else:
        raise PdraftError(f"data source {source!r} is neither a file nor a datasets id")
    if max_samples is not None:
        del prompts[max_samples:]
    return prompts
