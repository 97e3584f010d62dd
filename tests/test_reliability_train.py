"""Reliability, building a drafter: `env --target`, `export-hidden` and `train` given broken targets (missing,
no config, malformed config, truncated or header-damaged weights), broken prompt files (missing, a folder,
binary, empty, malformed lines), prompts longer than the target's context, a cache made for another target,
truncated and bit-flipped cache shards, a damaged manifest, a run folder of another kind and a damaged
checkpoint: each fails with one line and exit code 2 and changes nothing (contract in
reliability_support.check). Damaged copies are made in the case's own folder; the shared artifacts are never
touched."""

import json
import shutil

import reliability_support
from reliability_support import Case, bitflip, check, copy_tree, param, truncate, write

w = reliability_support.w  # the shared world, a module fixture


# ---- damaged targets (each a copy in the case folder) ---------------------------------------------------------
def target_copy(w, t, damage):
    return copy_tree(w.target, t / "target", damage)


def header_flip(path):
    """Flip a bit inside the JSON header: HF target weights carry no checksum, so a flip in the tensor bytes of a
    third-party target cannot be detected by anyone; a flip in the header must be."""
    data = bytearray(path.read_bytes())
    data[20] ^= 0x40
    path.write_bytes(bytes(data))


TARGET_DAMAGE = [
    ("target-missing", "a target folder that does not exist", None, r"target '.*nope' not found"),
    ("target-no-config", "a target folder without config.json",
     lambda f: (f / "config.json").unlink(), r"has no config\.json"),
    ("target-config-malformed", "a target config.json that is not JSON",
     lambda f: write(f / "config.json", "{not json"), r"config\.json is not valid JSON"),
    ("target-config-binary", "a target config.json of binary bytes (unreadable)",
     lambda f: write(f / "config.json", b"\xff\xfe\x00\x81"), r"config\.json is not valid JSON"),
    ("target-weights-truncated", "truncated target weights (model.safetensors cut in half)",
     lambda f: truncate(f / "model.safetensors"), r"cannot load from .*truncated or corrupted safetensors"),
    ("target-weights-header-flipped", "a bit flipped in the target weights' header",
     lambda f: header_flip(f / "model.safetensors"), r"cannot load from .*truncated or corrupted safetensors \(header is not JSON\)"),
    ("target-weights-folder", "a folder named model.safetensors (unreadable weights)",
     lambda f: ((f / "model.safetensors").unlink(), (f / "model.safetensors").mkdir()), r"cannot load from"),
    ("target-pickle-only", "a target with only pickle weights (pytorch_model.bin)",
     lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"), r"only pickled weights"),
    # issue 20: validate before allocating
    ("target-vocab-1e9", "a target config.json with vocab_size 10**9",
     lambda f: _set_config(f, vocab_size=10**9), r"config\.json: vocab_size is 1000000000, expected a value in"),
    ("target-100k-layers", "a target config.json with 100000 layers",
     lambda f: _set_config(f, num_hidden_layers=100_000), r"num_hidden_layers is 100000, expected a value in 1\.\.1024"),
    ("target-intermediate-1.5M", "a target config.json with intermediate_size 1500000",
     lambda f: _set_config(f, intermediate_size=1_500_000), r"intermediate_size is 1500000"),
    ("target-hidden-string", "a target config.json with hidden_size \"32\"",
     lambda f: _set_config(f, hidden_size="32"), r"hidden_size is '32', expected a whole number"),
    ("target-million-experts", "a target config.json with num_experts 1000000",
     lambda f: _set_config(f, num_experts=1_000_000), r"num_experts is 1000000, expected a value in 0\.\.4096"),
    ("target-config-list", "a target config.json holding a JSON list",
     lambda f: write(f / "config.json", "[1, 2]"), r"config\.json does not hold a JSON object"),
    ("target-weight-missing", "target weights without one decoder weight (transformers would leave it random)",
     lambda f: _drop_weight(f, "model.layers.1.mlp.down_proj.weight"),
     r"its weights do not cover the model: 1 of \d+ weights missing, e\.g\. model\.layers\.1\.mlp\.down_proj\.weight"),
    ("target-weight-wrong-shape", "target weights with one tensor of another shape",
     lambda f: _reshape_weight(f, "model.norm.weight"), r"weight model\.norm\.weight \(16,\) \(the config implies \(32,\)\)"),
    ("target-weights-sparse", "target weights padded to 256 MB with a sparse hole",
     lambda f: _sparse(f / "model.safetensors"), r"the header describes \d+ bytes of tensors, the file holds"),
]


def _set_config(folder, **fields):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(fields)
    write(folder / "config.json", json.dumps(cfg))


def _drop_weight(folder, name):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors[name]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _reshape_weight(folder, name):
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors[name] = tensors[name][:16].clone()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _sparse(path, size=256 << 20):
    with open(path, "r+b") as f:
        f.truncate(size)


def _target_case(command, name, what, damage, expect):
    def argv(w, t):
        folder = t / "nope" if damage is None else target_copy(w, t, damage)
        base = {"env": ["env", str(w.recipe), "--target"], "export-hidden": ["export-hidden", str(w.recipe)],
                "train": ["train", str(w.recipe)]}[command]
        return [*base, "--set", f"target.id={folder}", "--set", f"data.cache_dir={t / 'cache'}",
                "--set", f"train.output_dir={t / 'run'}"]
    return Case(command, name, what, argv, expect)


CASES = [_target_case(cmd, *d) for cmd in ("env", "export-hidden", "train") for d in TARGET_DAMAGE]


# ---- export-hidden: data -----------------------------------------------------------------------------------
def export(source_maker, *extra):
    def argv(w, t):
        return ["export-hidden", str(w.recipe), "--set", f"data.source={source_maker(w, t)}",
                "--set", f"data.cache_dir={t / 'cache'}", *extra]
    return argv


CASES += [
    Case("export-hidden", "data-missing", "a prompt file that does not exist",
         export(lambda w, t: t / "nope.jsonl"), r"nope\.jsonl"),
    Case("export-hidden", "data-folder", "a folder where the prompt file is expected (unreadable)",
         export(lambda w, t: (t / "d.jsonl").mkdir() or t / "d.jsonl"), r"d\.jsonl"),
    Case("export-hidden", "data-binary", "a prompt file of binary bytes / invalid UTF-8 (unreadable)",
         export(lambda w, t: write(t / "d.jsonl", b"\xff\xfe\x00\x81\n\x80\x80\n")), r"d\.jsonl"),
    Case("export-hidden", "data-empty", "an empty prompt file",
         export(lambda w, t: write(t / "d.jsonl", "")), r"empty dataset|no record|empty"),
    Case("export-hidden", "data-malformed-line", "a prompt file with a malformed JSON line",
         export(lambda w, t: write(t / "d.jsonl", w.data.read_text() + "{broken\n")), r"d\.jsonl:7: invalid JSON"),
    Case("export-hidden", "data-wrong-fields", "a JSONL prompt file without turns/prompt fields",
         export(lambda w, t: write(t / "d.jsonl", '{"title": "hello"}\n')), r"d\.jsonl:1: no .turns."),
    Case("export-hidden", "cache-of-another-target", "an existing cache made for another target (same folder)",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", f"target.id={w.other_target}"],
         r"another target|other settings|made for"),
    Case("export-hidden", "cache-dir-is-a-file", "data.cache_dir naming a file",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", f"data.cache_dir={write(t / 'f', 'x')}"], r"cache folder .*/f is a file"),
    Case("export-hidden", "manifest-malformed", "a cache folder whose manifest.json is not JSON",
         lambda w, t: ["export-hidden", str(w.recipe), "--set",
                       f"data.cache_dir={write(t / 'cache' / 'manifest.json', '{oops').parent}"],
         r"unreadable cache manifest"),
]


# ---- train: the cache and the run folder -------------------------------------------------------------------
def cache_copy(w, t, damage=None):
    return copy_tree(w.cache, t / "cache", damage)


def train_with_cache(damage):
    def argv(w, t):
        return ["train", str(w.recipe), "--set", f"data.cache_dir={cache_copy(w, t, damage)}",
                "--set", f"train.output_dir={t / 'run'}"]
    return argv


def edit_manifest(change):
    def damage(folder):
        m = json.loads((folder / "manifest.json").read_text())
        change(m)
        (folder / "manifest.json").write_text(json.dumps(m))
    return damage


SHARD = "shard-00000.safetensors"
CASES += [
    Case("train", "no-cache", "no hidden-state cache in data.cache_dir",
         lambda w, t: ["train", str(w.recipe), "--set", f"data.cache_dir={t / 'empty'}",
                       "--set", f"train.output_dir={t / 'run'}"], r"no hidden-state cache here"),
    Case("train", "cache-of-another-target", "a cache made for another target",
         lambda w, t: ["train", str(w.recipe), "--set", f"target.id={w.other_target}",
                       "--set", f"train.output_dir={t / 'run'}"], r"made for another target"),
    Case("train", "cache-other-layers", "a cache made for other target layer ids",
         lambda w, t: ["train", str(w.recipe), "--set", "target.layer_ids=[0,1,2]",
                       "--set", f"train.output_dir={t / 'run'}"], r"made for target layer ids"),
    Case("train", "cache-shard-truncated", "a truncated cache shard",
         train_with_cache(lambda f: truncate(f / SHARD)), r"truncated or altered"),
    Case("train", "cache-shard-bit-flipped", "a bit-flipped cache shard",
         train_with_cache(lambda f: bitflip(f / SHARD)), r"corrupted \(sha256 differs"),
    Case("train", "cache-shard-missing", "a cache shard deleted",
         train_with_cache(lambda f: (f / SHARD).unlink()), r"is missing"),
    Case("train", "cache-shard-folder", "a folder where a cache shard is expected (unreadable)",
         train_with_cache(lambda f: ((f / SHARD).unlink(), (f / SHARD).mkdir())), SHARD),
    Case("train", "cache-incomplete", "an interrupted (incomplete) cache",
         train_with_cache(edit_manifest(lambda m: m.update(complete=False))), r"incomplete"),
    Case("train", "manifest-binary", "a manifest.json of binary bytes (unreadable)",
         train_with_cache(lambda f: write(f / "manifest.json", b"\xff\xfe\x00\x81")), r"unreadable cache manifest"),
    Case("train", "manifest-future-version", "a manifest of an unknown format version",
         train_with_cache(edit_manifest(lambda m: m.update(version=99))), r"version 99 is not supported"),
    Case("train", "run-of-another-kind", "a run folder holding a dspark run, recipe asks for dflash",
         lambda w, t: ["train", str(w.recipe), "--set", "drafter.kind=dflash", "--set", "train.steps=4"],
         r"holds a dspark run"),
    Case("train", "checkpoint-bit-flipped", "resuming from a bit-flipped checkpoint",
         lambda w, t: ["train", str(w.recipe), "--set", "train.steps=4", "--set",
                       f"train.output_dir={_damaged_run(w, t, lambda f: bitflip(f / 'step_2' / 'model.safetensors'))}"],
         r"step_2.*(corrupted|unreadable)"),
    Case("train", "checkpoint-truncated", "resuming from a truncated checkpoint",
         lambda w, t: ["train", str(w.recipe), "--set", "train.steps=4", "--set",
                       f"train.output_dir={_damaged_run(w, t, lambda f: truncate(f / 'step_2' / 'trainer_state.safetensors'))}"],
         r"step_2.*(truncated|corrupted|unreadable)"),
    Case("train", "latest-names-missing", "a run whose latest pointer names a missing checkpoint",
         lambda w, t: ["train", str(w.recipe), "--set", "train.steps=4", "--set",
                       f"train.output_dir={_damaged_run(w, t, lambda f: shutil.rmtree(f / 'step_2'))}"],
         r"names 'step_2', which is missing"),
    Case("train", "init-from-other-target", "drafter.init_from a drafter of another target",
         lambda w, t: ["train", str(w.recipe), "--set", f"drafter.init_from={w.dspark_other}",
                       "--set", f"train.output_dir={t / 'run'}"], r"does not fit the target"),
    Case("train", "init-from-bit-flipped", "drafter.init_from a bit-flipped drafter checkpoint",
         lambda w, t: ["train", str(w.recipe), "--set", f"train.output_dir={t / 'run'}", "--set",
                       f"drafter.init_from={bitflip(copy_tree(w.dspark, t / 'd') / 'model.safetensors').parent}"],
         r"corrupted"),
]


def test_init_from_starts_from_the_saved_weights(w):
    """drafter.init_from (used by the cases above) really loads the checkpoint's weights."""
    import torch

    from pdraft.models import load_drafter
    from pdraft.models.build import build_from_recipe
    from pdraft.recipe import load_recipe
    from pdraft.targets.loader import load_target
    from pdraft.train.loop import _init_from

    r = load_recipe(w.recipe)
    target = load_target(r.target)
    drafter = build_from_recipe(r.drafter, target, seed=123)
    _init_from(drafter, str(w.trained), target)
    saved = load_drafter(w.trained, target.config).state_dict()
    mine = drafter.state_dict()
    assert mine.keys() == saved.keys() and all(torch.equal(mine[k], saved[k]) for k in mine)


def _damaged_run(w, t, damage):
    return copy_tree(w.run_dir, t / "run", damage)


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
