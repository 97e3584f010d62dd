"""The static decode path (pdraft.decode.static_target): its forward over the target's own modules on a
preallocated, position-indexed KV cache gives the reference runner's logits and features round after round
(random verify lengths, finished requests, random accepted counts: rollback by length only), the same
prefill features as a fresh full forward, and refuses targets it cannot run exactly."""

import pytest
import torch

from doubles import tiny_target
from pdraft.decode.static_target import LeanTarget, StaticVerifier, capacity_for, unsupported_reason
from pdraft.decode.target_runner import PackedVerifier
from pdraft.errors import PdraftError
from pdraft.targets.capture import capture_layers, stack_captured
from test_decode_greedy import HIDDEN, LAYERS, PROMPTS, VOCAB


def lockstep(model, layer_ids, rounds=40, seed=0, width=7, padded=False, fuse=True):
    """Reference and static runners driven by the same random rounds; asserts every round."""
    ref = PackedVerifier(model, layer_ids)
    static = StaticVerifier(LeanTarget(model, layer_ids, fuse=fuse), room=rounds * width, padded=padded)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        fr, fs = ref.prefill(PROMPTS), static.prefill(PROMPTS)
        torch.testing.assert_close(fs.hidden[fs.valid], fr.hidden[fr.valid], rtol=1e-4, atol=1e-5)
        positions = torch.tensor([len(p) - 1 for p in PROMPTS])
        anchors = torch.tensor([p[-1] for p in PROMPTS])
        for step in range(rounds):
            lengths = torch.randint(-1, width, (len(PROMPTS),), generator=g)
            lengths[step % len(PROMPTS)] = width - 1
            drafts = torch.randint(0, VOCAB, (len(PROMPTS), int(lengths.max())), generator=g)
            lr, hr = ref.verify(anchors, positions, drafts, lengths)
            ls, hs = static.verify(anchors, positions, drafts, lengths)
            real = torch.arange(lr.shape[1]).unsqueeze(0) <= lengths.unsqueeze(1)
            torch.testing.assert_close(ls[real], lr[real], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(hs[real], hr[real], rtol=1e-4, atol=1e-5)
            assert (ls[~real] == 0).all() and (hs[~real] == 0).all()
            accepted = torch.minimum(torch.randint(0, 3, lengths.shape, generator=g), lengths.clamp(min=0))
            accepted = torch.where(lengths >= 0, accepted, -1)
            assert torch.equal(ref.commit(accepted), static.commit(accepted))
            live = lengths >= 0
            anchors = torch.where(live, drafts[torch.arange(len(PROMPTS)), accepted.clamp(min=0) - 1], anchors)
            anchors = torch.where(live & (accepted == 0), 5, anchors)
            positions = positions + torch.where(live, accepted + 1, 0)
    return static


@pytest.mark.filterwarnings("ignore:this drafter reads the target's last layer")
@pytest.mark.parametrize("padded,fuse", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("layer_ids", [LAYERS, [-1, 1], [0, 1]])
def test_static_matches_reference_round_after_round(layer_ids, padded, fuse):
    """Packed (the real tokens only) and padded (every grid cell, padding into the scratch slot: the CUDA
    graph layout), with the projections fused (eager) and the model's own (compiled)."""
    model = tiny_target(VOCAB, HIDDEN, num_layers=3, seed=1)
    static = lockstep(model, layer_ids, padded=padded, fuse=fuse)
    assert static.cache.capacity % 128 == 0  # one allocation, rounded: no growth across rounds


@pytest.mark.filterwarnings("ignore:this drafter reads the target's last layer")
def test_legacy_last_layer_feature_is_taken_after_the_final_norm():
    model = tiny_target(VOCAB, HIDDEN, num_layers=3, seed=2)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    lean = LeanTarget(model, [0, 2])
    with torch.no_grad(), capture_layers(model, [0, 2]) as captured:
        model(torch.tensor([prompt[:-1]]))
    fresh = stack_captured(captured, [0, 2])[0]
    with torch.no_grad():
        feats = StaticVerifier(lean, room=8).prefill([prompt])
    torch.testing.assert_close(feats.hidden[0], fresh, rtol=1e-4, atol=1e-5)


def test_grouped_and_plain_heads_and_rope_scaling():
    """Fewer key/value heads than query heads (folded into the query axis) and as many (no folding), a linear
    RoPE scaling read from the model's own rotary module, projection biases (fused with the weights)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    for kv, rope, bias in ((1, None, False), (4, {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, True)):
        torch.manual_seed(0)
        cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=kv, head_dim=8, max_position_embeddings=256,
                          initializer_range=0.3, attention_bias=bias, **({"rope_parameters": rope} if rope else {}))
        model = Qwen3ForCausalLM(cfg).eval()
        lockstep(model, [0], rounds=12)


def test_refuses_what_it_cannot_run_exactly():
    model = tiny_target(VOCAB, HIDDEN, num_layers=3)
    assert unsupported_reason(model) is None
    model.config.model_type = "gemma"
    assert "gemma" in unsupported_reason(model)
    with pytest.raises(PdraftError, match="static decode path cannot run this target"):
        LeanTarget(model)


def test_capacity_rounds_up_but_covers_the_need():
    assert capacity_for(1, 4096) == 128 and capacity_for(129, 4096) == 256
    assert capacity_for(300, 200) == 300  # a need past the limit is never cut
