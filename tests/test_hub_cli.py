"""The thin pull/push/export commands, wired into a local typer app the way main.py wires commands (main.py is
the lead's): JSON and human output, examples in --help, and user errors arriving as PdraftError."""

import json

import pytest
import typer
from typer.testing import CliRunner

from pdraft.cli.hub import export, pull, push
from pdraft.errors import PdraftError
from test_hub_support import write_family
from test_models_support import tiny_target

app = typer.Typer()
app.command("pull")(pull)
app.command("push")(push)
app.command("export")(export)
runner = CliRunner()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "drafter"
    write_family(path, "pdraft-dspark", tiny_target())
    return path


def test_pull_json_and_human(folder, tmp_path):
    res = runner.invoke(app, ["pull", str(folder), "--out", str(tmp_path / "o"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["family"] == "pdraft-dspark" and data["block_size"] == 4 and data["max_gamma"] == 4
    res = runner.invoke(app, ["pull", str(folder)])
    assert res.exit_code == 0 and "pdraft-dspark drafter ready" in res.stdout


def test_export_prints_serve_command(folder, tmp_path):
    res = runner.invoke(app, ["export", str(folder), "--format", "vllm", "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    assert "vllm serve Qwen/Qwen3-4B --speculative-config" in res.stdout


def test_push_offline_is_a_user_error(folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = runner.invoke(app, ["push", str(folder), "you/x"])
    assert isinstance(res.exception, PdraftError) and "offline" in res.exception.message


@pytest.mark.parametrize("cmd", ["pull", "push", "export"])
def test_help_has_examples(cmd):
    res = runner.invoke(app, [cmd, "--help"])
    assert res.exit_code == 0 and "Examples" in res.stdout and f"pdraft {cmd}" in res.stdout
