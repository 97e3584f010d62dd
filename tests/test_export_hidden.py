"""`export-hidden` end to end on a tiny target: the printed estimate (per token and per sample, and for a 70B
target from its config.json alone), --json, a full disk (the refusal points at online training), an empty
dataset, regeneration, and a SIGKILLed export that resumes to a byte-identical cache."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import namedtuple
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from pdraft.cache import format as fmt
from pdraft.cache.reader import HiddenCache
from pdraft.cli.export_hidden import export_hidden
from pdraft.errors import PdraftError
from test_data_tinytarget import make_tiny_target, write_chat_jsonl

ROOT = Path(__file__).resolve().parents[1]
app = typer.Typer()
app.command()(export_hidden)

# Run in a child process; the patch SIGKILLs it at the Nth forward batch (mid-shard) or right after the
# Nth temporary shard is complete but before it is renamed.
KILLER = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.set_num_threads(1)
    import pdraft.cache.format as fmt
    import pdraft.cache.writer as w
    mode, at = sys.argv[1], int(sys.argv[2])
    count = [0]
    def hit():
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), signal.SIGKILL)
    if mode == "forward":
        states = w.target_states
        w.target_states = lambda *a, **k: (hit(), states(*a, **k))[1]
    else:
        replace = os.replace  # the shard's temporary is complete (written, fsynced) when it is renamed
        os.replace = lambda src, dst: (os.path.basename(str(src)).startswith(".tmp-shard") and hit(), replace(src, dst))[1]
    import typer
    from pdraft.cli.export_hidden import export_hidden
    app = typer.Typer()
    app.command()(export_hidden)
    app(sys.argv[3:])
""")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    target = make_tiny_target(root / "t")
    data = write_chat_jsonl(root / "d.jsonl", 30)
    return root, target, data


def _recipe(root: Path, target: Path, data: Path, cache: Path, **data_extra) -> Path:
    data_fields = {"source": str(data), "shard_tokens": 256, "cache_dir": str(cache), **data_extra}
    recipe = {"output_dir": str(root / "run"), "target": {"id": str(target), "num_layer_ids": 2}, "data": data_fields}
    path = root / f"recipe-{cache.name}.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


def _invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_estimate_prints_size_and_writes_nothing(env):
    root, target, data = env
    cache = root / "est"
    res = _invoke(_recipe(root, target, data, cache), "--estimate")
    assert res.exit_code == 0, res.output
    assert "cache size: 30 sequences" in res.output and "(2 layers + last) x 32 hidden x 2 B" in res.output
    assert "estimate only" in res.output and not cache.exists()
    res = _invoke(_recipe(root, target, data, cache), "--estimate", "--json")
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["estimate_only"] and summary["sequences"] == 30 and summary["bytes"] > summary["tokens"] * 197


def test_full_disk_refuses_before_writing(env, monkeypatch):
    root, target, data = env
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 4096, 4096))
    cache = root / "full"
    res = _invoke(_recipe(root, target, data, cache))
    assert isinstance(res.exception, PdraftError) and "not enough disk" in res.exception.one_line()
    assert not cache.exists()


def test_full_disk_refusal_suggests_online_training_with_the_estimate(env, monkeypatch):
    root, target, data = env
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 4096, 4096))
    res = _invoke(_recipe(root, target, data, root / "full2"))
    line = res.exception.one_line()
    assert "needs" in line and " a sample), 4.0 KB free" in line, line
    assert "train with train.online: true, which computes the target's hidden states during training" in line


# Llama-3.1-70B's shape (its config.json on the Hub): 80 layers of hidden 8192, 64 heads, 8 key/value heads.
LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
             "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False, "hidden_act": "silu"}


def test_estimate_of_a_70b_target_from_its_config_alone(env):
    """No weights in the folder, nothing loaded: a config.json and a tokenizer are enough for the size, so a
    user sees what a 70B cache costs before anything runs."""
    root, target, data = env
    folder = root / "llama-70b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_70B))
    for f in Path(target).glob("tokenizer*"):
        shutil.copy(f, folder / f.name)
    recipe = {"output_dir": str(root / "run70"), "target": {"id": str(folder), "num_layer_ids": 5},
              "data": {"source": str(data), "cache_dir": str(root / "c70"), "max_length": 2048}}
    path = root / "recipe-70b.yaml"
    path.write_text(json.dumps(recipe))
    res = _invoke(path, "--estimate", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    # (5 layers + the last hidden state) x 8192 x 2 bytes (float16), + an int32 id and a uint8 mask
    assert summary["bytes_per_token"] == 6 * 8192 * 2 + 5 == 98_309
    assert summary["bytes_per_sample"] == summary["bytes"] // summary["sequences"]
    res = _invoke(path, "--estimate")
    assert "(5 layers + last) x 8192 hidden x 2 B" in res.output and "96.0 KB a token" in res.output, res.output
    assert not (root / "c70").exists() and not list(folder.glob("*.safetensors"))
    res = _invoke(path)  # the export itself needs the weights
    assert isinstance(res.exception, PdraftError) and "has no model.safetensors" in res.exception.one_line()


def test_empty_dataset_is_a_user_error(env):
    root, target, _ = env
    empty = root / "empty.jsonl"
    empty.write_text("\n\n")
    res = _invoke(_recipe(root, target, empty, root / "empty-cache"))
    assert isinstance(res.exception, PdraftError) and "empty prompt set" in res.exception.one_line()


def test_regenerated_responses_are_cached(env):
    root, target, data = env
    cache = root / "regen"
    recipe = _recipe(root, target, data, cache, regenerate=True, regenerate_max_new_tokens=6, max_samples=5)
    res = _invoke(recipe, "--json")
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (cache / "regenerated.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(5)) and all(1 <= len(r["response_ids"]) <= 6 for r in rows)
    ds = HiddenCache(cache)
    item = ds[0]
    n = len(rows[0]["response_ids"])
    assert item["input_ids"][-n:].tolist() == rows[0]["response_ids"] and int(item["loss_mask"].sum()) == n
    assert (cache / "recipe.resolved.yaml").exists()


def _child(mode: str, at: int, recipe: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-c", KILLER, mode, str(at), str(recipe)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_killed_export_resumes_to_identical_cache(env):
    root, target, data = env
    reference = root / "ref"
    assert _invoke(_recipe(root, target, data, reference)).exit_code == 0
    ref = fmt.read_manifest(reference)
    assert ref["complete"] and len(ref["shards"]) >= 6

    cache = root / "killed"
    recipe = _recipe(root, target, data, cache)
    first = _child("forward", 4, recipe)  # SIGKILL while computing shard 3
    assert first.returncode == -9, first.stderr[-2000:]
    partial = fmt.read_manifest(cache)
    assert not partial["complete"] and [e["index"] for e in partial["shards"]] == [0, 1, 2]
    assert not (cache / fmt.shard_name(3)).exists()

    second = _child("rename", 1, recipe)  # SIGKILL with shard 3 fully written under its temporary name
    assert second.returncode == -9, second.stderr[-2000:]
    assert list(cache.glob(f".tmp-{fmt.shard_name(3)}.*")) and not (cache / fmt.shard_name(3)).exists()
    assert len(fmt.read_manifest(cache)["shards"]) == 3
    with pytest.raises(PdraftError, match="incomplete"):
        HiddenCache(cache)

    res = _invoke(recipe)
    assert res.exit_code == 0, res.output
    assert "3 already done" in res.output
    final = fmt.read_manifest(cache)
    assert final["complete"] and final["shards"] == ref["shards"]
    for entry in ref["shards"]:
        assert (cache / entry["file"]).read_bytes() == (reference / entry["file"]).read_bytes()
    assert not list(cache.glob(".tmp-*"))
    HiddenCache(cache, verify="open")
