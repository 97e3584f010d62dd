"""The embedded default target: deterministic builds, the cache (second process, corruption, concurrent first
use), loading through transformers like a real Qwen3, the shipped weights and prompt sets, and the held-out
split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pdraft.errors import PdraftError
from pdraft.targets import builtin
from pdraft.targets.builtin import corpus as corpus_mod
from fixtures_builtin import TEST_TARGET  # builtin_test_target and builtin_test_cache come from conftest.py

REPO = Path(__file__).resolve().parents[1]
WEIGHT_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json",
                "generation_config.json")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _sigkill_at_optimizer_step(n: int, call: str) -> None:
    """Run `call` (Python, with `build` and `builtin` imported) in a subprocess that SIGKILLs itself in the
    middle of its n-th optimizer step."""
    code = (
        "import os, signal, torch\n"
        "from pdraft.targets import builtin\n"
        "from pdraft.targets.builtin import build\n"
        "step, calls = torch.optim.AdamW.step, [0]\n"
        "def dying_step(self, *a, **k):\n"
        "    calls[0] += 1\n"
        f"    if calls[0] == {n}: os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return step(self, *a, **k)\n"
        "torch.optim.AdamW.step = dying_step\n"
        f"{call}\n"
    )
    died = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    assert died.returncode == -9, died.stderr[-2000:]


def _count_optimizer_steps(monkeypatch) -> list[int]:
    """Count this process's optimizer steps from now on (in the returned one-element list): a build that ignored
    its checkpoint would also end bit-identical (it is deterministic), so identity alone does not show a resume."""
    import torch

    steps, real_step = [0], torch.optim.AdamW.step

    def counting_step(self, *a, **k):
        steps[0] += 1
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", counting_step)
    return steps


def test_same_seed_gives_identical_weights_and_another_seed_does_not(builtin_test_target, tmp_path):
    again = tmp_path / "again"
    builtin.build(TEST_TARGET, again, seed=0, progress=False)
    for name in WEIGHT_FILES:
        assert (again / name).read_bytes() == (builtin_test_target / name).read_bytes(), name
    other = tmp_path / "other"
    builtin.build(TEST_TARGET, other, seed=1, progress=False)
    assert (other / "model.safetensors").read_bytes() != (builtin_test_target / "model.safetensors").read_bytes()
    # The tokenizer is trained on the corpus only, so it does not depend on the seed.
    assert (other / "tokenizer.json").read_bytes() == (builtin_test_target / "tokenizer.json").read_bytes()


def test_killed_build_resumes_from_its_checkpoint_to_identical_weights(builtin_test_target, tmp_path, monkeypatch):
    out = tmp_path / "killed"
    # A real SIGKILL in the middle of a step after the checkpoint at step 40 (the 47th optimizer step of 80):
    # the resumed build must redo steps 41-47 from the checkpoint, not from where the process died.
    _sigkill_at_optimizer_step(47, f"build({TEST_TARGET!r}, {str(out)!r}, progress=False, checkpoint_every=20)")
    ckpts = out / ".build-checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step_40"
    assert not (out / "model.safetensors").exists()

    steps = _count_optimizer_steps(monkeypatch)
    builtin.build(TEST_TARGET, out, progress=False, checkpoint_every=20)
    assert steps[0] == 80 - 40
    for name in WEIGHT_FILES:
        assert (out / name).read_bytes() == (builtin_test_target / name).read_bytes(), name
    assert not ckpts.exists()  # removed once the build completed
    assert builtin.verify(out) is None


def test_a_first_use_killed_while_building_resumes_in_the_cache(builtin_test_target, tmp_path, monkeypatch):
    # The cache builds a target it does not ship; killed at the 57th step (after the checkpoint at 50), the next
    # use must resume from that checkpoint rather than start the build again.
    _sigkill_at_optimizer_step(57, f"builtin.resolve({TEST_TARGET!r}, cache_dir={str(tmp_path)!r}, progress=False)")
    folder = builtin.target_dir(TEST_TARGET, tmp_path)
    assert not folder.exists()

    steps = _count_optimizer_steps(monkeypatch)
    assert builtin.resolve(TEST_TARGET, cache_dir=tmp_path, progress=False) == folder
    assert steps[0] == 80 - 50
    assert builtin.verify(folder) is None
    for name in WEIGHT_FILES:
        assert (folder / name).read_bytes() == (builtin_test_target / name).read_bytes(), name
    assert not any(p.name.startswith(".build-") for p in folder.parent.iterdir())  # the partial build is gone
    # and so is the killed process's temporary folder (issue 60: `.tmp-<name>-*` stayed in the cache for good)
    assert not any(p.name.startswith((".tmp-", ".trash-")) for p in folder.parent.iterdir())


def test_a_checkpoint_of_another_build_is_refused(tmp_path):
    import torch

    from pdraft.targets.builtin.builder import _checkpoint, _resume

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    gen = torch.Generator().manual_seed(0)
    _checkpoint(tmp_path, 10, model, opt, gen, {"seed": 0}, 1.0, 2.0)
    assert _resume(tmp_path, {"seed": 0}, model, opt, gen) == (10, 1.0, 2.0)
    with pytest.raises(PdraftError, match="different build"):
        _resume(tmp_path, {"seed": 1}, model, opt, gen)


def test_second_process_uses_the_cache_without_rebuilding(builtin_test_target, builtin_test_cache):
    install = (builtin_test_target / "install.json").read_bytes()
    code = (
        "import time; t = time.perf_counter()\n"
        "from pdraft.targets.builtin import resolve\n"
        f"p = resolve({TEST_TARGET!r}, cache_dir={str(builtin_test_cache)!r}, progress=False)\n"
        "print(p); print(time.perf_counter() - t)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    path, seconds = out.stdout.split()
    assert Path(path) == builtin_test_target
    assert (builtin_test_target / "install.json").read_bytes() == install  # not re-made
    assert float(seconds) < 1.0, seconds


def test_corrupted_cache_entry_is_detected_and_rebuilt(builtin_test_target, tmp_path):
    import shutil

    cache = tmp_path / "cache"
    folder = builtin.target_dir(TEST_TARGET, cache)
    shutil.copytree(builtin_test_target, folder)
    original = (folder / "model.safetensors").read_bytes()
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0x01
    (folder / "model.safetensors").write_bytes(bytes(damaged))
    assert "sha256" in builtin.verify(folder)

    with pytest.warns(RuntimeWarning, match="corrupt"):
        path = builtin.resolve(TEST_TARGET, cache_dir=cache, progress=False)
    assert path == folder and builtin.verify(path) is None
    assert (path / "model.safetensors").read_bytes() == original  # rebuilt, deterministically
    assert json.loads((path / "install.json").read_text())["source"] == "built"
    assert not [p for p in folder.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_a_cache_entry_of_other_shipped_weights_is_replaced(builtin_test_target, tmp_path, monkeypatch):
    """An upgrade that ships new weights must not keep serving the old ones from a sound cache entry."""
    import shutil
    import warnings

    from pdraft.targets.builtin import cache as cache_mod
    from pdraft.targets.builtin.builder import write_manifest

    shipped_root = tmp_path / "weights"
    shutil.copytree(builtin_test_target, shipped_root / TEST_TARGET)
    monkeypatch.setattr(cache_mod, "SHIPPED_DIR", shipped_root)
    cache = tmp_path / "cache"
    folder = builtin.target_dir(TEST_TARGET, cache)
    shutil.copytree(builtin_test_target, folder)
    weights = folder / "model.safetensors"
    older = bytearray(weights.read_bytes())
    older[-1] ^= 0x01  # an older release's weights, with a manifest of their own: sound, but not these
    weights.write_bytes(bytes(older))
    write_manifest(folder, TEST_TARGET, 0)
    assert builtin.verify(folder) is None

    with pytest.warns(RuntimeWarning, match="other weights than the ones this pdraft ships"):
        path = builtin.resolve(TEST_TARGET, cache_dir=cache, progress=False)
    assert (path / "model.safetensors").read_bytes() == (shipped_root / TEST_TARGET / "model.safetensors").read_bytes()
    assert json.loads((path / "install.json").read_text())["source"] == "shipped"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current entry is used as it is
        assert builtin.resolve(TEST_TARGET, cache_dir=cache, progress=False) == path


def test_loads_like_a_qwen3_target(builtin_test_target):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(builtin_test_target)
    tok = AutoTokenizer.from_pretrained(builtin_test_target)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.float32
    text = tok.apply_chat_template([{"role": "user", "content": "def add(a, b):"}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=False)
    assert text == "<|im_start|>user\ndef add(a, b):<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text, return_tensors="pt").input_ids  # [1, seq]
    assert tok.decode(ids[0]) == text
    out = model(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    assert out.hidden_states[-1].shape == (1, ids.shape[1], model.config.hidden_size)
    mask = builtin.mask_token_id(tok)
    assert tok.convert_ids_to_tokens(mask) == "<|mask|>"
    assert json.loads((builtin_test_target / "tokenizer_config.json").read_text())["mask_token_id"] == mask
    assert mask < model.config.vocab_size


def test_mask_token_id_requires_a_mask_token():
    class NoMask:
        mask_token_id = None
        unk_token_id = None

        def convert_tokens_to_ids(self, token):
            return None

    with pytest.raises(PdraftError, match="mask token"):
        builtin.mask_token_id(NoMask())


def test_unknown_builtin_name_lists_the_known_ones(tmp_path):
    with pytest.raises(PdraftError) as err:
        builtin.resolve("tiny-nonsense", cache_dir=tmp_path)
    assert "builtin:tiny-stdlib" in err.value.one_line()
    assert builtin.target_dir("builtin:tiny-stdlib", tmp_path) == tmp_path / "targets" / "tiny-stdlib"


def test_held_out_modules_never_appear_in_training(builtin_test_target):
    split = json.loads((builtin_test_target / "corpus.json").read_text())
    assert split["train_files"] and split["held_out_files"]
    assert not set(split["train_files"]) & set(split["held_out_files"])
    assert all(corpus_mod.is_held_out_module(f) for f in split["held_out_files"])
    assert not any(corpus_mod.is_held_out_module(f) for f in split["train_files"])
    # The full file list splits the same way, and test folders are never part of it.
    files = corpus_mod.stdlib_files()
    held = [f for f in files if corpus_mod.is_held_out_module(f)]
    assert 0.02 < len(held) / len(files) < 0.15
    assert not any("/test/" in f or f.startswith("test/") or "/tests/" in f for f in files)


@pytest.mark.parametrize("kind", ["code", "prose"])
def test_prompt_sets_parse_and_come_from_held_out_text(kind):
    lines = builtin.prompt_set_path(kind).read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 200
    prompts = [json.loads(line)["turns"] for line in lines]
    assert all(len(t) == 1 and isinstance(t[0], str) and t[0].strip() for t in prompts)
    if kind == "code":
        assert all(t[0].startswith(("def ", "async def ")) for t in prompts)
        assert all(t[0].endswith(('"', "'")) for t in prompts)  # ends at the docstring's quotes, no newline
        # Every signature comes from a held-out module, never from a training one.
        held_sources = "\n".join((corpus_mod.stdlib_root() / f).read_text(encoding="utf-8")
                                 for f in corpus_mod.stdlib_files() if corpus_mod.is_held_out_module(f))
        assert all(t[0].splitlines()[0].strip() in held_sources for t in prompts)
    # The training-split set (for drafters) never shares a prompt with the held-out set (for bench).
    train = [json.loads(line)["turns"][0] for line in
             builtin.prompt_set_path(kind, split="train").read_text(encoding="utf-8").splitlines()]
    assert len(train) >= 1000
    assert not set(train) & {t[0] for t in prompts}
    with pytest.raises(PdraftError):
        builtin.prompt_set_path("poetry")
    with pytest.raises(PdraftError):
        builtin.prompt_set_path(kind, split="validation")


shipped = builtin.shipped_dir("tiny-stdlib")
needs_shipped = pytest.mark.skipif(shipped is None, reason="the shipped tiny-stdlib weights are not present")


@needs_shipped
@pytest.mark.slow
def test_shipped_weights_verify_and_their_metrics_hold():
    from pdraft.targets.builtin.builder import evaluate_folder

    assert builtin.verify(shipped) is None
    recorded = json.loads((shipped / "metrics.json").read_text())["held_out"]
    # Code must be clearly more predictable than prose. The issue aims at 0.35 code top-1; the shipped
    # 900-step build reaches about 0.26 (see metrics.json), so the floor here guards against regressions.
    assert recorded["code"]["top1"] >= 0.25
    assert recorded["code"]["top1"] > recorded["prose"]["top1"] + 0.05
    assert recorded["code"]["loss"] < recorded["prose"]["loss"]
    # Re-measure on fewer held-out windows: the recorded figures are what the shipped weights do.
    measured = evaluate_folder(shipped, n_tokens=4096, loop_prompts=0)["held_out"]
    for domain in ("code", "prose"):
        assert abs(measured[domain]["top1"] - recorded[domain]["top1"]) < 0.05, domain
    assert measured["code"]["top1"] > measured["prose"]["top1"]


@needs_shipped
def test_concurrent_first_use_materialises_one_whole_folder(tmp_path):
    code = (
        "from pdraft.targets.builtin import resolve\n"
        f"print(resolve('builtin:tiny-stdlib', cache_dir={str(tmp_path)!r}, progress=False))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_env())
             for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    folder = builtin.target_dir("tiny-stdlib", tmp_path)
    assert [Path(o) for o in outs] == [folder, folder]
    assert builtin.verify(folder) is None
    assert json.loads((folder / "install.json").read_text())["source"] == "shipped"
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.startswith(".")) == ["tiny-stdlib"]
    assert not [p for p in folder.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a healthy entry resolves silently
        assert builtin.resolve("tiny-stdlib", cache_dir=tmp_path) == folder


def test_cli_build_prints_the_metrics_as_json(builtin_test_target, tmp_path):
    from typer.testing import CliRunner

    from pdraft.cli.target import app

    result = CliRunner().invoke(app, ["build", "builtin:tiny-stdlib-test", "--out", str(tmp_path / "t"), "--json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout[result.stdout.index("{"):])
    assert set(metrics["held_out"]) == {"code", "prose"}
    assert 0.0 <= metrics["held_out"]["code"]["top1"] <= 1.0
    assert metrics["held_out"] == json.loads((builtin_test_target / "metrics.json").read_text())["held_out"]
    by_pos = metrics["held_out"]["code"]["loss_by_position"]  # the test variant trains on 128-token windows
    assert set(by_pos) == {"0-16", "16-64"} and all(v > 0 for v in by_pos.values())


def test_user_turn_newline_is_the_only_difference_and_the_shipped_record_keeps_its_keys():
    import random

    from pdraft.targets.builtin.builder import VARIANTS, _config_record, _format_documents
    from pdraft.targets.builtin.cache import SHIPPED_DIR

    docs = ["def f(x):\n    return x\ndef g():\n    pass\nclass C:\n    pass\n"] * 20
    kept = _format_documents(docs, random.Random(3), 1.0)
    dropped = _format_documents(docs, random.Random(3), 1.0, user_turn_newline=False)
    # Same cuts (same rng draws); only the newline before the user turn's <|im_end|> differs.
    assert all("\n<|im_end|>\n<|im_start|>assistant" in d for d in kept)
    assert not any("\n<|im_end|>\n<|im_start|>assistant" in d for d in dropped)
    assert [d.replace("\n<|im_end|>\n<|im_start|>assistant", "<|im_end|>\n<|im_start|>assistant", 1)
            for d in kept] == dropped
    # The shipped target's metrics.json (and a resumable build's fingerprint) record the config without the
    # newer field while it holds its default; the candidate records that it differs.
    shipped_keys = json.loads((SHIPPED_DIR / "tiny-stdlib" / "metrics.json").read_text())["config"]
    assert _config_record(VARIANTS["tiny-stdlib"]) == shipped_keys
    assert _config_record(VARIANTS["tiny-stdlib-candidate"])["user_turn_newline"] is False
