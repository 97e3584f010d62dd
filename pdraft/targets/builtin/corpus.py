"""The embedded target's text: the Python standard library sources (code, the low-entropy domain) and the
English prose every CPython installation carries (the `pydoc_data.topics` reference text and module /
function docstrings). A fixed, hash-chosen part of both is held out for validation, benchmarking and the
shipped prompt sets, and never trained on. Everything here is deterministic for a given interpreter: files
are walked in sorted order and the split depends only on names, not on the machine or a random seed."""

from __future__ import annotations

import ast
import hashlib
import re
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# Folders that hold tests or third-party code, not the library itself.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
# pydoc_data/topics.py is the prose source itself; encodings' charmap tables are megabytes of hex literals.
_SKIP_FILES = {"pydoc_data/topics.py"}
_MAX_FILE_BYTES = 200_000

HELD_OUT_MODULE_PERCENT = 6
HELD_OUT_TOPIC_PERCENT = 12


def _bucket(name: str) -> int:
    """A stable 0..99 bucket for a name (sha256, so it does not depend on PYTHONHASHSEED)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "big") % 100


def is_held_out_module(relpath: str) -> bool:
    """Whether a stdlib file (path relative to the stdlib root, '/'-separated) is held out."""
    return _bucket("module:" + relpath) < HELD_OUT_MODULE_PERCENT


def is_held_out_topic(topic: str) -> bool:
    """Whether a `pydoc_data.topics` entry is held out."""
    return _bucket("topic:" + topic) < HELD_OUT_TOPIC_PERCENT


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    """Every library `.py` file (tests, vendored packages and data tables excluded), sorted, relative paths."""
    root = root or stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(p in _SKIP_DIRS for p in parts[:-1]) or parts[-1].startswith("test_") or rel in _SKIP_FILES:
            continue
        if parts[0] == "encodings" and parts[-1] not in {"__init__.py", "aliases.py"}:
            continue
        if path.stat().st_size > _MAX_FILE_BYTES:
            continue
        out.append(rel)
    return out


@dataclass
class Corpus:
    """Training and held-out documents of both domains, in a fixed order."""

    train_files: list[str] = field(default_factory=list)
    held_out_files: list[str] = field(default_factory=list)
    train_code: list[str] = field(default_factory=list)
    held_out_code: list[str] = field(default_factory=list)
    train_prose: list[str] = field(default_factory=list)
    held_out_prose: list[str] = field(default_factory=list)
    held_out_topics: list[str] = field(default_factory=list)

    def digest(self) -> str:
        """A sha256 over every document, so a build records exactly which text it saw."""
        h = hashlib.sha256()
        for part in (self.train_code, self.train_prose, self.held_out_code, self.held_out_prose):
            for doc in part:
                h.update(doc.encode("utf-8"))
                h.update(b"\0")
        return h.hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of a source file, cleaned, long enough to be prose."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) >= 120 and ">>>" not in doc:
                out.append(doc)
    return out


def _is_prose_paragraph(par: str) -> bool:
    """Running English text, not a heading, grammar rule or indented code sample."""
    if len(par) < 80 or par.startswith(" ") or "::=" in par or ">>>" in par:
        return False
    letters = sum(c.isalpha() or c == " " for c in par)
    return letters / len(par) > 0.85 and par.rstrip().endswith((".", ":"))


def topic_paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n\s*\n", text) if _is_prose_paragraph(p.strip("\n"))]


def load_corpus(max_train_bytes: int | None = None, max_held_out_bytes: int | None = None) -> Corpus:
    """Read the stdlib and pydoc topics. The byte caps (for the test variant) keep a prefix of the sorted
    lists, so a small corpus is a deterministic subset of the full one."""
    import pydoc_data.topics

    root = stdlib_root()
    c = Corpus()
    train_bytes = held_bytes = 0
    for rel in stdlib_files(root):
        held = is_held_out_module(rel)
        cap, used = (max_held_out_bytes, held_bytes) if held else (max_train_bytes, train_bytes)
        if cap is not None and used >= cap:
            continue  # checked before reading, so the test variant does not read the whole stdlib
        text = _read(root / rel)
        if not text or not text.strip():
            continue
        if held:
            c.held_out_files.append(rel)
            c.held_out_code.append(text)
            c.held_out_prose.extend(docstrings(text))
            held_bytes += len(text)
        else:
            c.train_files.append(rel)
            c.train_code.append(text)
            c.train_prose.extend(docstrings(text))
            train_bytes += len(text)
    for topic in sorted(pydoc_data.topics.topics):
        text = pydoc_data.topics.topics[topic]
        if is_held_out_topic(topic):
            c.held_out_topics.append(topic)
            c.held_out_prose.extend(topic_paragraphs(text))
        elif max_train_bytes is None or train_bytes < max_train_bytes:
            c.train_prose.append(text)
            train_bytes += len(text)
    return c


# --- prompt sets --------------------------------------------------------------------------------------

def code_prompts(held_out_files: list[str], limit: int = 300) -> list[str]:
    """Function signatures with their docstrings from held-out modules, dedented, to be continued."""
    root = stdlib_root()
    out = []
    for rel in held_out_files:
        source = _read(root / rel)
        if source is None:
            continue
        lines = source.splitlines()
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.decorator_list:
                continue
            body0 = node.body[0]
            if ast.get_docstring(node) is None or len(node.body) < 2 or body0.end_lineno is None:
                continue
            # From the `def` line through the docstring's closing quotes: the body is left to the model. No
            # trailing newline: BPE merges a newline with the next line's indentation, so a prompt ending in a
            # bare "\n" token would be a boundary the model rarely saw before a body (it starts a new `def`).
            snippet = textwrap.dedent("\n".join(lines[node.lineno - 1: body0.end_lineno]))
            # A docstring line at column 0 defeats dedent; such a prompt would start indented.
            if 60 <= len(snippet) <= 1200 and snippet.startswith(("def ", "async def ")):
                out.append(snippet)
    # Spread over modules rather than taking the first modules' functions: stable order by hash.
    out.sort(key=lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest())
    return out[:limit]


_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)", re.S)


def prose_prompts(held_out_prose: list[str], limit: int = 300) -> list[str]:
    """The first sentence or two (at least ~60 characters) of each held-out prose passage."""
    out, seen = [], set()
    for passage in held_out_prose:
        flat = " ".join(passage.split())
        prompt = ""
        for m in _SENTENCE.finditer(flat):
            prompt += m.group(1) + " "
            if len(prompt) >= 60:
                break
        prompt = prompt.strip()
        if 60 <= len(prompt) <= 600 and prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
    out.sort(key=lambda s: hashlib.sha256(s.encode("utf-8")).hexdigest())
    return out[:limit]
