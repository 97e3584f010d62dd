"""Fault: `pdraft push` is SIGKILLed mid-commit. The Hub is replaced at the HTTP boundary (FakeHub of
tests/test_hub_support.py behind huggingface_hub.set_client_factory), extended so that its state outlives the
process: every request is appended to a log file as it arrives, and a commit is applied to a `remote` folder
only when the server has received the whole commit request (written to a temporary folder, then renamed, as a
server applies a commit atomically). The child process runs the real CLI and is SIGKILLed by the transport as
its commit request arrives. Then: the log shows the commit request was sent, the remote holds no commit and no
file, and the token was never printed; rerunning the push in this process commits the complete payload, and it
equals, file for file and byte for byte, what an uninterrupted push of the same folder commits."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reliability_support import FAKE_TOKEN, ROOT, TESTS, run_cli, world
from test_hub_support import FakeHub

FAULTS = [
    ("SIGKILL during push, as the commit request reaches the Hub",
     "tests/test_faults_push.py::test_sigkill_mid_commit_then_rerun_pushes_identical_payload",
     "the remote holds no partial commit; the rerun commits the complete payload, identical to an uninterrupted "
     "push's; the token is never printed"),
]
REPO = "someone/tiny-dspark"


class RemoteHub(FakeHub):
    """FakeHub whose requests and applied commits live on disk, so the parent can inspect them after a kill."""

    def __init__(self, state: Path, kill_on_commit: bool = False):
        super().__init__()
        self.state, self.kill_on_commit = Path(state), kill_on_commit
        (self.state / "remote").mkdir(parents=True, exist_ok=True)

    def handler(self, request):
        path = request.url.path
        with open(self.state / "requests.log", "a") as f:
            f.write(f"{request.method} {path}\n")
            f.flush()
            os.fsync(f.fileno())
        is_commit = request.method == "POST" and "/commit/" in path
        if is_commit and self.kill_on_commit:
            os.kill(os.getpid(), signal.SIGKILL)
        response = super().handler(request)
        if is_commit and response.status_code == 200:
            commit = self.commits[-1]
            n = len(list((self.state / "remote").iterdir()))
            tmp = self.state / f".commit-{n}.partial"
            for name, data in commit["files"].items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(data)
            os.rename(tmp, self.state / "remote" / f"commit-{n}")
        return response


def install(hub: RemoteHub) -> None:
    import httpx2
    import huggingface_hub

    huggingface_hub.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(hub.handler)))


CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from test_faults_push import RemoteHub, install
    install(RemoteHub({state!r}, kill_on_commit=True))
    from pdraft.cli.main import main
    sys.exit(main({argv!r}))
""")


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    from huggingface_hub.utils._http import default_client_factory

    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield
    import huggingface_hub

    huggingface_hub.set_client_factory(default_client_factory)


def files_of(remote: Path) -> dict[str, bytes]:
    return {p.relative_to(remote).as_posix(): p.read_bytes() for p in sorted(remote.rglob("*")) if p.is_file()}


def test_sigkill_mid_commit_then_rerun_pushes_identical_payload(hub_env, tmp_path):
    w = world()
    drafter = shutil.copytree(w.trained, tmp_path / "drafter")  # weights, config, recipe: a real trained drafter
    argv = ["push", str(drafter), REPO]

    straight = RemoteHub(tmp_path / "straight")  # the uninterrupted push, for reference
    install(straight)
    res = run_cli(argv)
    assert res.code == 0, res.err[-2000:]
    (expected,) = [files_of(p) for p in (tmp_path / "straight" / "remote").iterdir()]
    assert {"model.safetensors", "config.json", "README.md"} <= set(expected)

    state = tmp_path / "killed"
    script = CHILD.format(tests=str(TESTS), state=str(state), argv=argv)
    child = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.returncode == -9, child.stderr[-2000:]
    sent = (state / "requests.log").read_text().splitlines()
    assert sent[-1] == f"POST /api/models/{REPO}/commit/main"  # killed as the commit arrived
    assert list((state / "remote").iterdir()) == []  # no commit, not even part of one
    assert not list(state.glob(".commit-*"))
    assert FAKE_TOKEN not in child.stdout + child.stderr

    rerun = RemoteHub(state)  # the same remote, now answering normally
    install(rerun)
    res = run_cli(argv)
    assert res.code == 0, res.err[-2000:]
    assert FAKE_TOKEN not in res.out + res.err
    commits = list((state / "remote").iterdir())
    assert len(commits) == 1
    got = files_of(commits[0])
    assert got.keys() == expected.keys()
    for name in expected:
        assert got[name] == expected[name], name
    assert got["model.safetensors"] == (drafter / "model.safetensors").read_bytes()
    assert json.loads(got["config.json"]) == json.loads((drafter / "config.json").read_text())
