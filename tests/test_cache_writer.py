"""The cache writer: stored features equal a direct forward's hidden states, the estimate, a full disk,
resuming, and refusing to mix settings."""

import shutil
from collections import namedtuple

import pytest
import torch
from safetensors.torch import load_file

from pdraft.cache import format as fmt
from pdraft.cache.reader import HiddenCache, collate
from pdraft.cache.writer import plan_batches, plan_shards, write_cache
from pdraft.data.prompts import read_jsonl
from pdraft.data.templates import build_sequences
from pdraft.errors import PdraftError
from pdraft.recipe import RuntimeSection, TargetSection
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from test_data_tinytarget import make_tiny_target, write_chat_jsonl


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cachew")
    # float32 compute, pinned: `runtime.dtype: auto` is bf16 on a CPU with bf16 units, and these tests compare
    # stored features tightly with a direct forward (the bf16 default is test_default_storage_follows_the_compute).
    target = load_target(TargetSection(id=str(make_tiny_target(root / "t")), layer_ids=[0, 2]),
                         make_runtime(RuntimeSection(dtype="float32")))
    records = read_jsonl(write_chat_jsonl(root / "d.jsonl", 12))
    seqs, _ = build_sequences(target.tokenizer, records, 256)
    return target, seqs


def test_plans_are_deterministic_and_bounded():
    assert plan_shards([100, 100, 100, 300, 50], 256) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert plan_batches([10, 30, 20, 5], 64) == [(0, 2), (2, 4)]  # padded 2x30=60, then 2x20=40


def test_features_match_direct_forward(setup, tmp_path):
    target, seqs = setup
    # Small batches so several sequences share a padded forward; float32 storage to compare tightly.
    write_cache(target, seqs, tmp_path, shard_tokens=256, dtype="float32", batch_tokens=300)
    cache = HiddenCache(tmp_path, target=target, verify="open")
    assert len(cache) == len(seqs) and cache.dtype == torch.float32
    for i in (0, 5, len(seqs) - 1):
        item = cache[i]
        ids = torch.tensor([seqs[i].input_ids])
        out = target.model(input_ids=ids, output_hidden_states=True)
        expect = torch.cat([out.hidden_states[j + 1][0] for j in target.layer_ids], dim=-1)  # [T, 2*H]
        torch.testing.assert_close(item["target_hidden_states"], expect, rtol=1e-5, atol=1e-5)
        # The last hidden state is the final-norm output: the LM head on it gives the model's logits.
        torch.testing.assert_close(item["target_last_hidden_states"], out.hidden_states[-1][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(target.model.lm_head(item["target_last_hidden_states"]), out.logits[0], rtol=1e-4, atol=1e-4)
        assert item["input_ids"].tolist() == seqs[i].input_ids
        assert item["loss_mask"].tolist() == [bool(m) for m in seqs[i].loss_mask]
    batch = collate([cache[0], cache[1]])
    assert batch["target_hidden_states"].shape == (2, max(len(seqs[0]), len(seqs[1])), 64)
    assert batch["attention_mask"].sum().item() == len(seqs[0]) + len(seqs[1])


def test_default_cpu_storage_is_float16(setup, tmp_path):
    target, seqs = setup
    write_cache(target, seqs[:3], tmp_path, shard_tokens=256)
    item = HiddenCache(tmp_path, target=target)[0]
    assert item["target_hidden_states"].dtype == torch.float16
    out = target.model(input_ids=torch.tensor([seqs[0].input_ids]), output_hidden_states=True)
    torch.testing.assert_close(item["target_hidden_states"][:, :32].float(), out.hidden_states[1][0], rtol=2e-3, atol=2e-3)


def test_default_storage_follows_the_compute(setup, tmp_path):
    """data.cache_dtype auto: bf16 when the target computes in bf16 (runtime.dtype auto on a CPU with bf16 units,
    or asked for), the stored values those of its forward."""
    target, seqs = setup
    bf16 = load_target(TargetSection(id=str(target.path), layer_ids=[0, 2]), make_runtime(RuntimeSection(dtype="bfloat16")))
    write_cache(bf16, seqs[:3], tmp_path, shard_tokens=256)
    item = HiddenCache(tmp_path, target=bf16)[0]
    assert item["target_hidden_states"].dtype == torch.bfloat16
    out = bf16.model(input_ids=torch.tensor([seqs[0].input_ids]), output_hidden_states=True)
    torch.testing.assert_close(item["target_hidden_states"][:, :32], out.hidden_states[1][0], rtol=2e-2, atol=2e-2)


def test_estimate_only_writes_nothing(setup, tmp_path):
    target, seqs = setup
    seen = []
    res = write_cache(target, seqs, tmp_path / "c", estimate_only=True, on_estimate=lambda e, r: seen.append((e, r)))
    est, remaining = seen[0]
    tokens = sum(len(s) for s in seqs)
    assert est.tokens == tokens and est.total_bytes == tokens * (3 * 32 * 2 + 5) + 8 * (len(seqs) + est.shards) + 1024 * est.shards
    assert remaining == est.total_bytes and res.estimate_only and not (tmp_path / "c").exists()


def test_full_disk_refuses_and_writes_nothing(setup, tmp_path, monkeypatch):
    target, seqs = setup
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**6, 10**6 - 1000, 1000))
    with pytest.raises(PdraftError, match=r"not enough disk .* needs .* 1000 B free"):
        write_cache(target, seqs, tmp_path / "c", shard_tokens=256)
    assert not (tmp_path / "c").exists()


def test_resume_after_lost_shard_is_identical(setup, tmp_path):
    target, seqs = setup
    res = write_cache(target, seqs, tmp_path, shard_tokens=256, batch_tokens=300)
    assert res.num_shards >= 3 and res.manifest["complete"]
    before = {e["file"]: e["sha256"] for e in res.manifest["shards"]}
    first = load_file(tmp_path / "shard-00001.safetensors")
    (tmp_path / "shard-00001.safetensors").unlink()
    (tmp_path / "shard-00002.safetensors").write_bytes(b"garbage")  # damaged: redone, not trusted
    (tmp_path / ".tmp-shard-00003.safetensors").write_bytes(b"left by a kill")
    again = write_cache(target, seqs, tmp_path, shard_tokens=256, batch_tokens=300)
    assert again.shards_done_before == res.num_shards - 2 and again.shards_written == 2
    assert {e["file"]: e["sha256"] for e in again.manifest["shards"]} == before
    assert not list(tmp_path.glob(".tmp-*"))
    assert torch.equal(load_file(tmp_path / "shard-00001.safetensors")["hidden"], first["hidden"])
    assert write_cache(target, seqs, tmp_path, shard_tokens=256, batch_tokens=300).shards_written == 0


def test_changed_settings_refused_until_fresh(setup, tmp_path):
    target, seqs = setup
    write_cache(target, seqs, tmp_path, shard_tokens=256)
    with pytest.raises(PdraftError, match=r"started with other settings \(changed: shard_tokens, plan\)"):
        write_cache(target, seqs, tmp_path, shard_tokens=512)
    with pytest.raises(PdraftError, match=r"changed: .*data"):
        write_cache(target, seqs[:-1], tmp_path, shard_tokens=256)
    res = write_cache(target, seqs, tmp_path, shard_tokens=512, fresh=True)
    assert res.shards_done_before == 0 and len(list(tmp_path.glob("shard-*"))) == res.num_shards


def test_empty_dataset_and_bad_dtype(setup, tmp_path):
    target, seqs = setup
    with pytest.raises(PdraftError, match="empty dataset"):
        write_cache(target, [], tmp_path)
    with pytest.raises(PdraftError, match="cache dtype 'int8'"):
        write_cache(target, seqs, tmp_path, dtype="int8")
    assert fmt.read_manifest(tmp_path) is None
