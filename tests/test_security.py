"""Security: the package source (pdraft/**/*.py) never unpickles (`pickle.load`/`loads`, `Unpickler`,
`torch.load` without `weights_only=True`, `numpy.load(allow_pickle=True)`), never asks for
`trust_remote_code=True`, and never calls `eval`/`exec`; the scanner is an AST walk, checked first on planted
examples so that it cannot pass by finding nothing. And a token set in HF_TOKEN never appears in what push,
pull or env print (human and JSON views, logs at DEBUG), with the Hub replaced at the HTTP boundary."""

import ast
import logging

import pytest

from reliability_support import FAKE_TOKEN, ROOT, run_cli, world

PACKAGE = ROOT / "pdraft"


def _name(node) -> str:
    """Dotted name of a call's function: torch.load, pickle.loads, eval."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def findings(source: str, where: str = "<source>") -> list[str]:
    """Every unsafe construct in `source`, as 'where:line: what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            module = getattr(node, "module", None) or ""
            if module in ("pickle", "cPickle", "dill") and {"load", "loads", "Unpickler"} & set(names):
                found.append(f"{where}:{node.lineno}: from {module} import {', '.join(names)}")
            if module == "torch" and "load" in names:
                found.append(f"{where}:{node.lineno}: from torch import load (check weights_only where it is called)")
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        last = name.rsplit(".", 1)[-1]
        base = name.split(".", 1)[0]
        if base in ("pickle", "cPickle", "dill", "joblib") and last in ("load", "loads", "Unpickler"):
            found.append(f"{where}:{node.lineno}: {name}")
        if name == "torch.load" and not _is_true(kw.get("weights_only")):
            found.append(f"{where}:{node.lineno}: torch.load without weights_only=True")
        if last == "load" and base in ("np", "numpy") and _is_true(kw.get("allow_pickle")):
            found.append(f"{where}:{node.lineno}: {name}(allow_pickle=True)")
        if _is_true(kw.get("trust_remote_code")):
            found.append(f"{where}:{node.lineno}: trust_remote_code=True")
        if name in ("eval", "exec", "builtins.eval", "builtins.exec"):
            found.append(f"{where}:{node.lineno}: {name}()")
    for node in ast.walk(ast.parse(source)):  # trust_remote_code passed through a dict of kwargs
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "trust_remote_code" and _is_true(v):
                    found.append(f"{where}:{node.lineno}: {{'trust_remote_code': True}}")
    return found


PLANTED = """
import pickle, torch, numpy as np
from pickle import loads
pickle.load(open("x", "rb"))
torch.load("a.pt")
torch.load("a.pt", weights_only=False)
np.load("a.npy", allow_pickle=True)
AutoModel.from_pretrained("x", trust_remote_code=True)
kwargs = {"trust_remote_code": True}
eval(text)
exec(code)
model.eval()
torch.load("b.pt", weights_only=True)
"""


def test_scanner_finds_every_planted_construct():
    got = findings(PLANTED)
    lines = sorted(int(f.split(":")[1]) for f in got)
    # every unsafe line once, and neither model.eval() (line 13) nor the safe torch.load (line 14)
    assert lines == [3, 4, 5, 6, 7, 8, 9, 10, 11], got


def test_package_has_no_unsafe_loading_or_code_execution():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50  # the whole package, not an empty glob
    found = [f for path in files for f in findings(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


# ---- the token ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    import httpx2
    import huggingface_hub
    from huggingface_hub.utils._http import default_client_factory

    from test_hub_support import FakeHub

    hub = FakeHub(siblings=["config.json", "model.safetensors"])
    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub.handler)))
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield hub
    huggingface_hub.set_client_factory(default_client_factory)


def test_token_never_printed(fake_hub, monkeypatch, tmp_path, caplog):
    w = world()
    caplog.set_level(logging.DEBUG)
    runs = [
        (0, run_cli(["push", str(w.dspark), "someone/tiny-dspark"])),
        (0, run_cli(["push", str(w.dspark), "someone/tiny-dspark", "--json", "--private", "--revision", "v2"])),
        (2, run_cli(["pull", "someone/tiny-dspark", "--out", str(tmp_path / "o")])),  # the fake Hub has no files
        (0, run_cli(["pull", str(w.dspark), "--json"])),
        (0, run_cli(["env", "--json"])),
    ]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(w.hf_cache))
    runs.append((0, run_cli(["pull", "someone/tiny-dspark", "--json"])))
    for code, res in runs:
        assert res.code == code, res.err[-2000:]
        assert FAKE_TOKEN not in res.out + res.err
    assert FAKE_TOKEN not in caplog.text
    assert len(fake_hub.commits) == 2
    # the token did go to the Hub, and only in the Authorization header
    assert any(h.get("authorization") == f"Bearer {FAKE_TOKEN}" for _, _, h, _ in fake_hub.requests)
    for _, _, headers, body in fake_hub.requests:
        assert FAKE_TOKEN.encode() not in body
        assert all(FAKE_TOKEN not in v for k, v in headers.items() if k != "authorization")
