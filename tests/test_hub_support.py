"""Local Hub stand-ins for the hub tests: drafter folders in each family's layout (written with save_drafter from
tiny drafters over the 4-layer test target), huggingface_hub's own cache layout
(models--owner--name/{blobs,snapshots/<commit>,refs/main}), and FakeHub, an HTTP-level stand-in for the Hub API
installed with huggingface_hub.set_client_factory (an httpx2 client over a MockTransport), so the client
library runs unchanged and only the network is replaced."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from huggingface_hub.utils._http import default_client_factory

from pdraft.ledger import LEDGER_NAME
from pdraft.models.checkpoint import save_drafter
from pdraft.paths import OWNED_MARKER
from test_models_support import tiny_drafter

RECIPE = ("name: tiny\ntarget:\n  id: Qwen/Qwen3-4B\n  revision: main\ndata:\n  source: builtin:code+prose\n"
          "  max_samples: 64\ntrain:\n  steps: 40\n  batch_size: 4\n  grad_accum: 1\n  lr: 0.001\n")
BOOKKEEPING = (LEDGER_NAME, OWNED_MARKER)
FAMILIES = ("pdraft-dspark", "pdraft-dflash", "deepspec-dspark", "deepspec-dflash", "zlab-dflash")


def make_drafter(family: str, target, seed: int = 1):
    if family.endswith("dspark"):
        return tiny_drafter("dspark", target, seed=seed)
    conv = "zlab" if family.startswith("zlab") else "deepspec"
    return tiny_drafter("dflash", target, seed=seed, block_convention=conv)


def write_family(folder: Path, family: str, target, seed: int = 1):
    """A checkpoint folder as that family's own tools write it; returns the drafter it holds."""
    d = make_drafter(family, target, seed)
    foreign = not family.startswith("pdraft")
    save_drafter(d, folder, include_shared=family.startswith("deepspec"),
                 recipe_yaml=None if foreign else RECIPE)
    if foreign:  # DeepSpec and z-lab write no pdraft object; z-lab adds an auto_map to its remote code
        data = json.loads((folder / "config.json").read_text())
        data.pop("pdraft")
        if family.startswith("zlab"):
            data["auto_map"] = {"AutoModel": "dflash.DFlashDraftModel"}
            (folder / "dflash.py").write_text("raise SystemExit('repository code must never run')\n")
        (folder / "config.json").write_text(json.dumps(data))
    return d


def put_in_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = "c0ffee" * 6 + "abcd",
                 ref: str = "main") -> Path:
    """Lay `files` out exactly as huggingface_hub's cache does; returns the snapshot folder."""
    owner, name = repo_id.split("/")
    repo = cache / f"models--{owner}--{name}"
    snap = repo / "snapshots" / commit
    for rel, blob in files.items():
        digest = hashlib.sha256(blob).hexdigest()
        (repo / "blobs").mkdir(parents=True, exist_ok=True)
        (repo / "blobs" / digest).write_bytes(blob)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(repo / "blobs" / digest, link.parent), link)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snap


def folder_files(folder: Path) -> dict[str, bytes]:
    """The files of a drafter folder as a repository would hold them: pdraft's own bookkeeping (the list of the
    files it wrote, the ownership marker) is never pushed, so no repository holds it."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name not in BOOKKEEPING}


class FakeHub:
    """Answers the Hub API calls huggingface_hub makes for create_repo, create_branch, create_commit (preupload,
    validate-yaml, commit) and model_info, and records every request (method, path, headers, body). Every commit
    request is recorded in `attempts`, refused ones included (status 500 under `fail_commit`); `commits` holds only
    the applied ones, i.e. what the remote repository now contains."""

    def __init__(self, *, fail_commit: bool = False, siblings: list[str] | None = None, sha: str = "f" * 40):
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.attempts: list[dict] = []  # {"header": ..., "files": {path: bytes}, "path": ..., "other": ..., "status"}
        self.commits: list[dict] = []  # the attempts with status 200
        self.fail_commit, self.siblings, self.sha = fail_commit, siblings or [], sha

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = request.read()
        path = request.url.path
        self.requests.append((request.method, path, dict(request.headers), body))
        if request.method == "POST" and path == "/api/repos/create":
            name = json.loads(body)["name"]
            org = json.loads(body).get("organization")
            return httpx2.Response(200, json={"url": f"https://huggingface.co/{org + '/' if org else ''}{name}"})
        if request.method == "POST" and path == "/api/validate-yaml":
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if request.method == "POST" and re.fullmatch(r"/api/models/[^/]+/[^/]+/branch/.+", path):
            return httpx2.Response(200, json={})
        if request.method == "POST" and re.fullmatch(r"/api/models/[^/]+/[^/]+/preupload/.+", path):
            files = json.loads(body)["files"]
            return httpx2.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular",
                                                         "shouldIgnore": False} for f in files]})
        if request.method == "POST" and re.fullmatch(r"/api/models/[^/]+/[^/]+/commit/.+", path):
            lines = [json.loads(x) for x in body.decode().splitlines() if x.strip()]
            files = {x["value"]["path"]: base64.b64decode(x["value"]["content"]) for x in lines if x["key"] == "file"}
            attempt = {"header": lines[0]["value"], "files": files, "path": path,
                       "other": [x for x in lines[1:] if x["key"] != "file"], "status": 500 if self.fail_commit else 200}
            self.attempts.append(attempt)
            if self.fail_commit:
                return httpx2.Response(500, json={"error": "Internal Error - We're working hard to fix this"})
            self.commits.append(attempt)
            repo = "/".join(path.split("/")[3:5])
            return httpx2.Response(200, json={"commitUrl": f"https://huggingface.co/{repo}/commit/{'a' * 40}",
                                              "commitOid": "a" * 40, "pullRequestUrl": None})
        if request.method == "GET" and re.fullmatch(r"/api/models/[^/]+/[^/]+(/revision/.+)?", path):
            repo = "/".join(path.split("/")[3:5])
            return httpx2.Response(200, json={"id": repo, "sha": self.sha,
                                              "siblings": [{"rfilename": n} for n in self.siblings]})
        return httpx2.Response(404, json={"error": f"FakeHub has no route for {request.method} {path}"})


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """Install a FakeHub at the HTTP boundary; no real network, no token file, a private Hub cache."""
    hubs: list[FakeHub] = []

    def install(**kw) -> FakeHub:
        hub = FakeHub(**kw)
        hubs.append(hub)
        huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub.handler)))
        return hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield install
    huggingface_hub.set_client_factory(default_client_factory)
