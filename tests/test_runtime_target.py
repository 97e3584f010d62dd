"""The shared runtime and target loading from a local folder, a Hub id in offline mode, and bad inputs."""

import pytest
import torch
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from pdraft.errors import PdraftError
from pdraft.recipe import RuntimeSection, TargetSection
from pdraft.runtime import cpu_has_bf16, make_runtime
from pdraft.targets.loader import load_target


@pytest.fixture(scope="module")
def local_target(tmp_path_factory):
    """A tiny random Qwen3 saved as a Hugging Face folder with a small tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_qwen3")
    vocab = {chr(ord("a") + i): i for i in range(26)} | {"<unk>": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=27, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    return folder


def test_runtime_defaults_on_cpu():
    rt = make_runtime(RuntimeSection(seed=3))
    assert rt.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert rt.dtype == (torch.bfloat16 if rt.is_cuda or cpu_has_bf16() else torch.float32)
    a = torch.rand(3, generator=rt.generator())
    b = torch.rand(3, generator=make_runtime(RuntimeSection(seed=3)).generator())
    assert torch.equal(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_requested_without_cuda():
    with pytest.raises(PdraftError, match="no CUDA device"):
        make_runtime(RuntimeSection(device="cuda"))


def test_load_local_target_and_features(local_target):
    t = load_target(TargetSection(id=str(local_target), num_layer_ids=3))
    assert t.num_layers == 6 and t.hidden_size == 32 and t.max_context == 64
    assert t.layer_ids == [1, 2, 3]  # spread from 1 to L-3, never the last layer (5)
    ids = torch.tensor([[1, 2, 3, 4]])
    out, feats = t.forward_features(ids, output_hidden_states=True)
    assert feats.shape == (1, 4, 96)
    torch.testing.assert_close(feats[..., 32:64], out.hidden_states[3], rtol=0, atol=0)
    assert isinstance(t.tokenizer, type(AutoTokenizer.from_pretrained(local_target)))


def test_explicit_layer_ids_checked(local_target):
    with pytest.raises(PdraftError, match="out of range"):
        load_target(TargetSection(id=str(local_target), layer_ids=[0, 6]))


def test_offline_uncached_hub_id_fails_fast(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    rt = make_runtime(RuntimeSection(offline=True))
    with pytest.raises(PdraftError, match="'Qwen/Qwen3-4B' is not in the local Hub cache and offline mode is on"):
        load_target(TargetSection(id="Qwen/Qwen3-4B"), rt)


def test_pickle_only_folder_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04")
    with pytest.raises(PdraftError, match="only pickled weights"):
        load_target(TargetSection(id=str(tmp_path)))


@pytest.mark.parametrize("bad", ["./missing-folder", "a/b/c", "not a repo id"])
def test_unknown_targets(bad):
    with pytest.raises(PdraftError, match="not found"):
        load_target(TargetSection(id=bad))
