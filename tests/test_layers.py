"""The layer-id convention: id i is transformers' hidden_states[i + 1], checked on a small Qwen3."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from pdraft.errors import PdraftError
from pdraft.target.layers import capture_layers, check_layer_ids, default_layer_ids, stack_captured


@pytest.fixture(scope="module")
def tiny_qwen3():
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return Qwen3ForCausalLM(cfg).eval()


def test_layer_id_i_is_hidden_states_i_plus_1(tiny_qwen3):
    ids = [0, 1, 2, 3]
    x = torch.randint(0, 97, (2, 7))
    with torch.no_grad(), capture_layers(tiny_qwen3, ids) as captured:
        out = tiny_qwen3(x, output_hidden_states=True)
    for i in ids:
        torch.testing.assert_close(captured[i], out.hidden_states[i + 1], rtol=0, atol=0)
    stacked = stack_captured(captured, [3, 1])
    assert stacked.shape == (2, 7, 64)
    torch.testing.assert_close(stacked[..., :32], out.hidden_states[4], rtol=0, atol=0)


def test_hooks_are_removed(tiny_qwen3):
    before = [len(layer._forward_hooks) for layer in tiny_qwen3.model.layers]
    with capture_layers(tiny_qwen3, [1, 2]):
        assert len(tiny_qwen3.model.layers[1]._forward_hooks) == before[1] + 1
    assert [len(layer._forward_hooks) for layer in tiny_qwen3.model.layers] == before


def test_default_layer_ids_match_deepspec_qwen3_4b():
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    for layers in range(1, 40):
        for n in range(1, layers + 1):
            ids = default_layer_ids(layers, n)
            assert ids == sorted(ids) and len(set(ids)) == n and all(0 <= i < layers for i in ids), (layers, n)
    with pytest.raises(PdraftError, match="distinct layer ids"):
        default_layer_ids(3, 4)


def test_out_of_range_layer_id_is_a_user_error():
    with pytest.raises(PdraftError, match="out of range"):
        check_layer_ids([0, 4], 4)
