"""The layer-id rule: id i is transformers' hidden_states[i + 1] and the pre-norm state vLLM captures, -1 is
hidden_states[0], ids strictly increase, the last layer is refused (legacy drafters: warned, post-norm)."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from pdraft.errors import PdraftError
from pdraft import layer_ids as rule_mod
from pdraft.targets.capture import capture_layers, check_layer_ids, default_layer_ids, stack_captured

L = 4


@pytest.fixture(scope="module")
def tiny_qwen3():
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=L,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    return Qwen3ForCausalLM(cfg).eval()


def _inputs_of_layers_and_norm(model):
    """Independent capture of the pre-norm residual stream: the input of decoder layer i + 1 (or of the final
    norm for i = L-1) is what leaves decoder layer i, hidden + residual, before any norm."""
    seen: dict[int, torch.Tensor] = {}
    handles = []
    for j, layer in enumerate(model.model.layers):
        handles.append(layer.register_forward_pre_hook(
            lambda _m, args, kwargs, j=j: seen.__setitem__(j - 1, args[0] if args else kwargs["hidden_states"]),
            with_kwargs=True))
    handles.append(model.model.norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__(L - 1, args[0])))
    return seen, handles


def test_every_allowed_id_is_hidden_states_i_plus_1_and_the_pre_norm_state(tiny_qwen3):
    ids = [-1, 0, 1, 2]  # every id the rule allows on a 4-layer target
    x = torch.randint(0, 97, (2, 7))
    pre_norm, handles = _inputs_of_layers_and_norm(tiny_qwen3)
    try:
        with torch.no_grad(), capture_layers(tiny_qwen3, ids) as captured:
            out = tiny_qwen3(x, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    embeds = tiny_qwen3.model.embed_tokens(x)
    torch.testing.assert_close(captured[-1], embeds, rtol=0, atol=0)  # -1 = the embedding output
    for i in ids:
        torch.testing.assert_close(captured[i], out.hidden_states[i + 1], rtol=0, atol=0)
        torch.testing.assert_close(captured[i], pre_norm[i], rtol=0, atol=0)
    stacked = stack_captured(captured, ids)
    assert stacked.shape == (2, 7, 4 * 32)
    torch.testing.assert_close(stacked[..., :32], embeds, rtol=0, atol=0)  # concatenated in layer order


def test_legacy_last_layer_keeps_the_post_norm_state_with_a_warning(tiny_qwen3, monkeypatch):
    monkeypatch.setattr(rule_mod, "_warned", set())
    x = torch.randint(0, 97, (1, 5))
    pre_norm, handles = _inputs_of_layers_and_norm(tiny_qwen3)
    try:
        with pytest.warns(UserWarning, match="last layer"), torch.no_grad(), \
                capture_layers(tiny_qwen3, [1, L - 1]) as captured:
            out = tiny_qwen3(x, output_hidden_states=True)
    finally:
        for h in handles:
            h.remove()
    post_norm = tiny_qwen3.model.norm(pre_norm[L - 1])
    torch.testing.assert_close(captured[L - 1], post_norm, rtol=0, atol=0)  # as old drafters were trained
    assert not torch.allclose(captured[L - 1], pre_norm[L - 1])


def test_hooks_are_removed(tiny_qwen3):
    layers = tiny_qwen3.model.layers
    before = [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in layers]
    with capture_layers(tiny_qwen3, [-1, 1, 2]):
        assert len(layers[1]._forward_hooks) == before[1][0] + 1
        assert len(layers[0]._forward_pre_hooks) == before[0][1] + 1
    assert [(len(m._forward_hooks), len(m._forward_pre_hooks)) for m in layers] == before


def test_default_layer_ids_never_pick_the_last_layer():
    assert default_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # DeepSpec's published Qwen3-4B choice
    assert default_layer_ids(4, 3) == [0, 1, 2]  # the quickstart's 4-layer embedded target
    assert default_layer_ids(1, 1) == [-1]
    for layers in range(1, 40):
        for n in range(1, max(layers - 1, 1) + 1):
            ids = default_layer_ids(layers, n)
            assert check_layer_ids(ids, layers, legacy_last=False) == ids, (layers, n)
            assert len(ids) == n, (layers, n)
    with pytest.raises(PdraftError, match="distinct layer ids"):
        default_layer_ids(4, 4)


@pytest.mark.parametrize("ids, message", [
    ([2, 1], "not in increasing order"),
    ([1, 1], "repeat"),
    ([0, 3], "last decoder layer: no serving engine can read it"),
    ([0, 4], "out of range"),
    ([-2, 1], "out of range"),
    ("023", "must be a list of integers"),
    (["0", "2"], "must be integers"),
    ([True, 2], "must be integers"),
    ([1.0, 2], "must be integers"),
    ([], "empty"),
])
def test_refused_ids_are_one_line_errors(ids, message):
    with pytest.raises(PdraftError, match=message) as e:
        check_layer_ids(ids, L, legacy_last=False)
    assert "\n" not in str(e.value)


def test_last_layer_is_only_warned_for_drafters_already_written(monkeypatch):
    monkeypatch.setattr(rule_mod, "_warned", set())
    with pytest.warns(UserWarning, match="retrain it on ids up to 2"):
        assert check_layer_ids([0, 3], L) == [0, 3]
    assert check_layer_ids([-1, 0, 2], L, legacy_last=False) == [-1, 0, 2]
