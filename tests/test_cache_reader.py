"""The cache reader refuses, in one line, corrupted, truncated, incomplete or foreign caches."""

import json

import pytest

from pdraft.cache import format as fmt
from pdraft.cache.reader import HiddenCache
from pdraft.cache.writer import write_cache
from pdraft.data.prompts import read_jsonl
from pdraft.data.templates import build_sequences
from pdraft.errors import PdraftError
from pdraft.recipe import TargetSection
from pdraft.targets.fingerprint import target_fingerprint
from pdraft.targets.loader import load_target
from test_data_tinytarget import make_tiny_target, write_chat_jsonl


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cacher")
    target = load_target(TargetSection(id=str(make_tiny_target(root / "t")), layer_ids=[0, 2]))
    seqs, _ = build_sequences(target.tokenizer, read_jsonl(write_chat_jsonl(root / "d.jsonl", 8)), 256)
    return root, target, seqs


@pytest.fixture
def cache(built, tmp_path):
    _, target, seqs = built
    write_cache(target, seqs, tmp_path, shard_tokens=256)
    return tmp_path


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in e.value.one_line()
    return e.value.one_line()


def test_bit_flip_detected_lazily_and_at_open(built, cache):
    _, target, _ = built
    shard = cache / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0x01  # one bit in the last tensor's data, so the header still parses
    shard.write_bytes(bytes(data))
    with pytest.raises(PdraftError) as e:
        HiddenCache(cache, target=target, verify="open")
    assert "shard-00001.safetensors is corrupted" in _one_line(e)
    lazy = HiddenCache(cache, target=target)  # opens: sizes are right
    lazy[0]  # shard 0 is fine
    second = lazy.shards[1]["sequences"][0]
    with pytest.raises(PdraftError, match="shard-00001.safetensors is corrupted"):
        lazy[second]


def test_truncated_shard_detected_at_open(built, cache):
    _, target, _ = built
    shard = cache / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(PdraftError) as e:
        HiddenCache(cache, target=target, verify="none")
    assert "shard-00000.safetensors is truncated or altered" in _one_line(e)
    shard.unlink()
    with pytest.raises(PdraftError, match="shard-00000.safetensors is missing"):
        HiddenCache(cache)


def test_other_layer_ids_refused(built, cache):
    _, target, _ = built
    with pytest.raises(PdraftError) as e:
        HiddenCache(cache, fingerprint=target_fingerprint(target), layer_ids=[1, 2])
    assert "made for target layer ids [0, 2], not [1, 2]" in _one_line(e)


def test_cache_with_a_refused_layer_id_is_refused(built, cache):
    # A cache written before the layer-id rule (the target's last layer) cannot feed a servable drafter.
    manifest = json.loads((cache / fmt.MANIFEST_NAME).read_text())
    manifest["layer_ids"] = [0, 3]
    (cache / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(PdraftError) as e:
        HiddenCache(cache)
    assert "target layer id 3 is the target's last decoder layer" in _one_line(e)


@pytest.mark.parametrize("change", [{"seed": 1}, {"hidden": 48}])
def test_other_target_refused(built, cache, change):
    root, _, _ = built
    other = load_target(TargetSection(id=str(make_tiny_target(root / f"other-{sorted(change)[0]}", **change)), layer_ids=[0, 2]))
    with pytest.raises(PdraftError) as e:
        HiddenCache(cache, target=other)
    assert "was made for another target" in _one_line(e)
    expected = "weights_sha256" if "seed" in change else "hidden_size"
    assert expected in e.value.message


def test_incomplete_and_missing_cache(built, cache, tmp_path_factory):
    manifest = fmt.read_manifest(cache)
    manifest["shards"].pop()
    manifest["complete"] = False
    fmt.write_manifest(cache, manifest)
    with pytest.raises(PdraftError, match=r"incomplete \(\d+ of \d+ shards\)"):
        HiddenCache(cache)
    with pytest.raises(PdraftError, match="no hidden-state cache here"):
        HiddenCache(tmp_path_factory.mktemp("nothing"))


def test_other_format_version_refused(cache):
    manifest = fmt.read_manifest(cache)
    manifest["version"] = 99
    fmt.write_manifest(cache, manifest)
    with pytest.raises(PdraftError, match="format version 99 is not supported"):
        HiddenCache(cache)
