"""Every file pdraft writes goes through the one no-follow write path, pdraft/paths.py (issue 45, class 1; the
rule is in that module's docstring). The scanner reads the package's source with `ast` and lists every call that
can create or change a file: `open`/`Path.open`/`os.fdopen` in a writing mode, `Path.write_text`/`write_bytes`,
`os.open` with a writing flag, `json.dump`/`torch.save`/`np.save`, a library that writes by name (`save_file`,
`savefig`, `save_pretrained`, `to_json_file`), `shutil`'s copies and moves, and a subprocess whose output is
an inline `open(...)`. Such a call is allowed only

- in pdraft/paths.py (the path itself) and pdraft/locks.py (an exclusive create, O_EXCL, of the lock file);
- inside a callback handed to the path (`atomic_write_with`, `ledger.write_with`, `write_files_with`), which
  receives the exclusive temporary it writes to;
- at the few sites of ALLOWED, each with the reason its target cannot be a link.

A new writer that bypasses the path fails `test_every_writer_goes_through_the_no_follow_path`; the scanner is
also run on planted sources holding each kind of writer, which it must find."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pdraft"
HOMES = {"pdraft/paths.py", "pdraft/locks.py"}
PATH_CALLS = {"atomic_write_with", "write_with", "write_files_with"}  # hand their callback an exclusive temporary
# (file, enclosing function, the call) -> why its target is never a link someone else placed.
ALLOWED = {
    ("pdraft/hub/pull.py", "_install", "shutil.copyfile"): "copies into the folder staged_dir just made with mkdtemp",
    ("pdraft/targets/builtin/cache.py", "_fill", "shutil.copyfile"): "copies into the folder resolve() just made "
                                                                    "with mkdtemp",
    ("pdraft/cli/common.py", "one_target_copy", "open"): "os.devnull, opened for a non-zero rank's output",
    ("pdraft/engines/vllm_worker.py", "_replies", "os.fdopen"): "a copy of the worker's own stdout (fd 1), no file name",
}
WRITING_MODES = set("wax+")
NAMED_WRITERS = {"save_file", "savefig", "save_pretrained", "to_json_file", "save"}
SHUTIL_WRITERS = {"copy", "copy2", "copyfile", "copytree", "move", "copyfileobj"}
OS_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}


def _name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = _name(func.value)
        return f"{base}.{func.attr}" if base else func.attr
    return ""


def _mode(call: ast.Call, position: int) -> str | None:
    """The constant mode argument of an open-like call ('r' when absent), None when not a constant."""
    node = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None and len(call.args) > position:
        node = call.args[position]
    if node is None:
        return "r"
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _writes(call: ast.Call) -> str | None:
    """What the call writes with, or None when it writes no file."""
    name = _name(call.func)
    last = name.rsplit(".", 1)[-1]
    if name in ("open", "io.open", "os.fdopen") or (last == "open" and name not in ("os.open", "tarfile.open")
                                                      and isinstance(call.func, ast.Attribute)):
        mode = _mode(call, 1 if name in ("open", "io.open", "os.fdopen") else 0)
        if mode is None or WRITING_MODES & set(mode):
            return name
        return None
    if name == "os.open":
        flags = {n.attr for a in call.args[1:2] for n in ast.walk(a) if isinstance(n, ast.Attribute)}
        return name if flags & OS_WRITE_FLAGS else None
    if last in ("write_text", "write_bytes") and isinstance(call.func, ast.Attribute) and not name.startswith("ledger."):
        return name
    if name in ("json.dump", "torch.save", "np.save", "numpy.save", "pickle.dump"):
        return name
    if last in NAMED_WRITERS and name not in ("save",) and not name.startswith(("ledger.", "self.")):
        return name
    if name.startswith("shutil.") and last in SHUTIL_WRITERS:
        return name
    if last in ("Popen", "run", "call", "check_call", "check_output") and name.startswith("subprocess."):
        for k in call.keywords:
            if k.arg in ("stdout", "stderr") and isinstance(k.value, ast.Call):
                return f"{name}({k.arg}=...)"
    return None


def _callbacks(tree: ast.AST) -> set[int]:
    """ids of the nodes inside callbacks handed to the path: lambdas passed to a PATH_CALLS call, and nested
    functions whose name is passed to one."""
    inside: set[int] = set()
    handed: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func).rsplit(".", 1)[-1] in PATH_CALLS:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if isinstance(arg, ast.Lambda):
                    inside.update(id(n) for n in ast.walk(arg))
                elif isinstance(arg, ast.Name):
                    handed.add(arg.id)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in handed:
            inside.update(id(n) for n in ast.walk(node))
    return inside


def _functions(tree: ast.AST) -> dict[int, str]:
    """id of every node -> the name of the outermost function holding it."""
    owner: dict[int, str] = {}
    for node in tree.body if isinstance(tree, ast.Module) else []:
        for top in ast.walk(node) if isinstance(node, ast.ClassDef) else [node]:
            if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(top):
                    owner.setdefault(id(n), top.name)
    return owner


def bypasses(files) -> list[str]:
    """Every writing call outside the path, its callbacks and ALLOWED: `file:line: function: call`."""
    found = []
    for rel, text in files:
        if rel in HOMES:
            continue
        tree = ast.parse(text)
        callbacks, owner = _callbacks(tree), _functions(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or id(node) in callbacks:
                continue
            what = _writes(node)
            if what is None:
                continue
            function = owner.get(id(node), "<module>")
            if (rel, function, what.split("(")[0]) in ALLOWED:
                continue
            found.append(f"{rel}:{node.lineno}: {function}: {what}")
    return found


def sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).as_posix(), path.read_text()


def test_every_writer_goes_through_the_no_follow_path():
    found = bypasses(sources())
    assert not found, ("these calls write a file without pdraft/paths.py's no-follow path (use atomic_write_*, "
                       "ledger.write_*, write_files_with, open_append or open_in_place):\n" + "\n".join(found))


def test_the_allowed_sites_still_exist():
    """An ALLOWED entry whose call is gone is a stale exemption: removed, so nothing else can hide behind it."""
    texts = dict(sources())
    for (rel, function, call) in ALLOWED:
        tree = ast.parse(texts[rel])
        owner = _functions(tree)
        assert any(isinstance(n, ast.Call) and (_writes(n) or "").split("(")[0] == call
                   and owner.get(id(n)) == function for n in ast.walk(tree)), (rel, function, call)


PLANTED = {
    "open-w": "def f(p):\n    with open(p, 'w') as fh:\n        fh.write('x')\n",
    "open-a-kw": "def f(p):\n    open(p, mode='a').close()\n",
    "open-mode-variable": "def f(p, m):\n    open(p, m).close()\n",
    "path-open-wb": "def f(p):\n    p.open('wb').close()\n",
    "fdopen-w": "import os\ndef f(fd):\n    os.fdopen(fd, 'w')\n",
    "write_text": "def f(p):\n    p.write_text('x')\n",
    "write_bytes": "def f(p):\n    p.with_name('y').write_bytes(b'x')\n",
    "os-open-creat": "import os\ndef f(p):\n    os.open(p, os.O_CREAT | os.O_WRONLY)\n",
    "json-dump": "import json\ndef f(d, fh):\n    json.dump(d, fh)\n",
    "torch-save": "import torch\ndef f(d, p):\n    torch.save(d, p)\n",
    "save_file": "from safetensors.torch import save_file\ndef f(t, p):\n    save_file(t, str(p))\n",
    "savefig": "def f(fig, p):\n    fig.savefig(p)\n",
    "save_pretrained": "def f(model, p):\n    model.save_pretrained(str(p))\n",
    "shutil-copy": "import shutil\ndef f(a, b):\n    shutil.copyfile(a, b)\n",
    "popen-stdout-open": "import subprocess\ndef f(p):\n    subprocess.Popen(['x'], stderr=open(p))\n",
}
CLEAN = {
    "read": "def f(p):\n    with open(p, 'rb') as fh:\n        return fh.read()\n",
    "path-read": "def f(p):\n    return p.open('r').read()\n",
    "ledger": "from pdraft import ledger\ndef f(p):\n    ledger.write_text(p, 'x')\n",
    "callback-lambda": "from pdraft.paths import atomic_write_with\ndef f(fig, p):\n"
                       "    atomic_write_with(p, lambda tmp: fig.savefig(tmp))\n",
    "callback-def": "from pdraft import ledger\ndef f(p):\n    def write(tmp):\n        with open(tmp, 'wb') as o:\n"
                    "            o.write(b'x')\n    ledger.write_with(p, write)\n",
    "popen-pipe": "import subprocess\ndef f():\n    subprocess.Popen(['x'], stdout=subprocess.PIPE)\n",
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_scanner_finds_every_kind_of_writer(name):
    assert bypasses([("pdraft/planted.py", PLANTED[name])]), name


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_the_scanner_passes_the_path_and_reads(name):
    assert not bypasses([("pdraft/planted.py", CLEAN[name])]), name
