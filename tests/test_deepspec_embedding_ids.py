"""A DeepSpec DSpark checkpoint with the RNN head and target layer ids [-1, 1, 2] (the embedding output first),
written here in DeepSpec's layout with random weights: `pull` accepts it, its features are DeepSpec's
(`extract_context_feature` in deepspec/modeling/dspark/common.py: id -1 -> hidden_states[0], id i ->
hidden_states[i + 1], concatenated in list order), and greedy decoding with it is the target's output token for
token. The cross-check against DeepSpec's own model code is in test_models_reference.py (needs its mirror)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from pdraft.decode.engine import generate
from pdraft.hub.pull import pull
from pdraft.models import SamplingParams, build_drafter, draft_step
from pdraft.targets.capture import capture_layers, stack_captured
from test_models_checkpoint import deepspec_config
from test_models_support import MASK, tiny_target

IDS = [-1, 1, 2]
PROMPTS = [[3, 5, 7, 11], [1, 2], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11, 12, 13]]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def checkpoint(target, tmp_path_factory):
    """DeepSpec's layout as its save_pretrained writes it: the target's config plus DeepSpec's fields, and the
    whole state dict with copies of the target's embedding and LM head."""
    d = build_drafter("dspark", target.config, seed=3, mask_token_id=MASK, block_size=4, num_hidden_layers=2,
                      markov_rank=8, sequential_head="rnn", confidence_head=True, target_layer_ids=IDS)
    with torch.no_grad():  # wide random weights so every feature, the head and the RNN state all matter
        for name, p in d.named_parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.normal_(1.0, 0.3)
    folder = tmp_path_factory.mktemp("deepspec-rnn")
    cfg = deepspec_config(target.config, num_hidden_layers=2, block_size=4, mask_token_id=MASK,
                          target_layer_ids=IDS, markov_rank=8, markov_head_type="rnn",
                          enable_confidence_head=True, confidence_head_with_markov=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v.detach().clone() for k, v in d.state_dict().items()}
    tensors["embed_tokens.weight"] = target.model.embed_tokens.weight.detach().clone()
    tensors["lm_head.weight"] = target.lm_head.weight.detach().clone()
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def pulled(checkpoint, target, tmp_path_factory):
    got = pull(str(checkpoint), out=tmp_path_factory.mktemp("pulled") / "d", target_config=target.config)
    assert got.family == "deepspec-dspark"
    assert got.config.target_layer_ids == IDS and got.config.sequential_head == "rnn"
    from pdraft.models.checkpoint import load_drafter

    drafter = load_drafter(got.path, target.config)
    drafter.attach_target(target)
    return drafter.eval()


def deepspec_features(target, seq) -> torch.Tensor:
    """DeepSpec's features from transformers' own hidden states: [1, T, 3 * hidden]."""
    with torch.no_grad():
        hs = target(seq, output_hidden_states=True).hidden_states
    return torch.cat([hs[0 if i == -1 else i + 1] for i in IDS], dim=-1)


def test_feature_minus_one_is_the_embedding_output(target, pulled):
    seq = torch.randint(0, MASK, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), capture_layers(target, pulled.config.target_layer_ids) as cap:
        target(seq)
    mine = stack_captured(cap, pulled.config.target_layer_ids)
    hidden = target.config.hidden_size
    with torch.no_grad():
        torch.testing.assert_close(mine[..., :hidden], target.model.embed_tokens(seq), rtol=0, atol=0)
    torch.testing.assert_close(mine, deepspec_features(target, seq), rtol=0, atol=0)
    # The drafts depend on that first slot: with the embedding chunk zeroed they change, so a capture that
    # put another state there would be caught by the draft comparison below too.
    feats = deepspec_features(target, seq)
    u = torch.rand(1, pulled.max_gamma(), generator=torch.Generator().manual_seed(0))  # the same draws each time
    a = draft_step(pulled, feats[:, :8], seq[:, 8], sampling=SamplingParams(temperature=1.0), uniforms=u)
    feats0 = feats.clone()
    feats0[..., :hidden] = 0
    b = draft_step(pulled, feats0[:, :8], seq[:, 8], sampling=SamplingParams(temperature=1.0), uniforms=u)
    assert not torch.equal(a.probs, b.probs)
    c = draft_step(pulled, mine[:, :8], seq[:, 8], sampling=SamplingParams(temperature=1.0), uniforms=u)
    assert torch.equal(a.tokens, c.tokens) and torch.equal(a.probs, c.probs)


def test_greedy_decode_is_the_target_output(target, pulled):
    ref = generate(target, None, PROMPTS, max_new_tokens=20).output_ids
    for gamma in (1, 3, 4):
        out = generate(target, pulled, PROMPTS, gamma=gamma, max_new_tokens=20)
        assert out.output_ids == ref, gamma
