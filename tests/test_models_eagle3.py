"""The EAGLE-3 drafter (pdraft/models/eagle3/): training-time test unrolls exactly the chain a proposal runs
(same attention, positions and outputs, to float32 rounding), the drafter's KV cache rolls back with the
target's (a state after a round equals a state built from the committed tokens alone), the draft vocabulary
is the most frequent response tokens with d2t/t2d as the engines read them and q is zero outside it, and the
config round-trips through to_dict and the `LlamaForCausalLMEagle3` config.json, refusing what it cannot be."""

import json

import pytest
import torch

from doubles import widen as widen_weights
from pdraft.errors import PdraftError
from pdraft.models import load_drafter, save_drafter
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter, draft_step
from pdraft.models.eagle3.config import Eagle3Config
from pdraft.models.eagle3.format import eagle3_config_from_json, eagle3_config_to_json
from pdraft.models.eagle3.model import draft_vocabulary
from pdraft.models.families import config_from_dict, detect_family, family_of
from pdraft.models.schema import check_drafter_config
from test_models_support import VOCAB, captured, tiny_target, tiny_target_config

target = pytest.fixture(scope="module")(lambda: tiny_target())


def make(target, *, widen: float = 0.3, seed: int = 1, counts_seed: int | None = 3, **kw):
    """An EAGLE-3 for the tiny target with weights wider than the init (so chains depend on their inputs) and,
    with `counts_seed`, a draft vocabulary chosen from random token counts."""
    d = build_drafter("eagle3", target.config, seed=seed, **kw)
    widen_weights(d, widen, seed)
    d.attach_target(target)
    if counts_seed is not None:
        d.init_from_tokens(torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(counts_seed)))
    return d.eval()


VARIANTS = {"reduced vocab": dict(draft_vocab_size=60), "whole vocab": {},
            "qwen3 q/k norm": dict(draft_vocab_size=60, qk_norm=True),
            "norm before residual": dict(draft_vocab_size=50, norm_before_residual=True)}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_training_time_test_unrolls_the_chain_a_proposal_runs(target, variant):
    """forward_train's step k of anchor a equals pass k of a proposal from the committed tokens before a, fed the
    sequence's tokens: the sampled q of every pass is softmax of the training logits at that step."""
    d = make(target, ttt_steps=5, **VARIANTS[variant])
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (2, 22), generator=g)
    feats = captured(target, ids, d.config.target_layer_ids)
    anchors = torch.tensor([[1, 9, 13], [4, 5, 16]])
    with torch.no_grad():
        out = d.forward_train(ids, feats, anchors)
    assert out.hidden.shape == (2, 3, 5, 32) and out.head is d.lm_head.weight
    for b in range(2):
        for n in range(3):
            a = int(anchors[b, n])
            p = draft_step(d, feats[b:b + 1, :a], ids[b, a], 5, SamplingParams(1.0), torch.rand(1, 5),
                           context_ids=ids[b, :a])
            state = d.new_state(1)
            d.extend_context(state, feats[b:b + 1, :a], torch.arange(a)[None], token_ids=ids[b:b + 1, :a])
            forced = d.propose(state, ids[b:b + 1, a], torch.tensor([a]), 5, SamplingParams(1.0), torch.rand(1, 5),
                               forced=ids[b:b + 1, a + 1:a + 5])
            want = torch.softmax(out.logits[b, n], -1)  # [K, vocab], zero outside the draft vocabulary
            assert torch.allclose(forced.probs[0], want, atol=1e-5), (variant, b, n)
            assert torch.allclose(p.probs[0, 0], want[0], atol=1e-5)  # pass 1 does not depend on feeding
    assert out.target_ids[0, 0].tolist() == ids[0, 2:7].tolist() and out.label_valid.all()


def test_a_chain_without_its_root_is_not_supervised(target):
    d = make(target)
    ids = torch.randint(0, VOCAB, (1, 12))
    out = d.forward_train(ids, captured(target, ids, d.config.target_layer_ids), torch.tensor([[0, 3]]))
    assert not out.label_valid[0, 0].any() and out.label_valid[0, 1].all()


def test_the_cache_rolls_back_with_the_target(target):
    """After a proposal (whose passes 2..gamma wrote past the committed length) and the commit of 2 of its
    drafts, the next proposal equals one from a fresh state given the committed tokens alone."""
    d = make(target, draft_vocab_size=60)
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(4))
    feats = captured(target, ids, d.config.target_layer_ids)
    state = d.new_state(2)
    d.extend_context(state, feats[:, :9], torch.arange(9).expand(2, 9), token_ids=ids[:, :9])
    d.propose(state, ids[:, 9], torch.tensor([9, 9]), 6)  # drafts, then a round commits 9, 10, 11 (2 kept)
    d.extend_context(state, feats[:, 9:12], torch.arange(9, 12).expand(2, 3), token_ids=ids[:, 9:12])
    u = torch.rand(2, 6)
    after = d.propose(state, ids[:, 12], torch.tensor([12, 12]), 6, SamplingParams(0.9), u)
    fresh = d.new_state(2)
    d.extend_context(fresh, feats[:, :12], torch.arange(12).expand(2, 12), token_ids=ids[:, :12])
    alone = d.propose(fresh, ids[:, 12], torch.tensor([12, 12]), 6, SamplingParams(0.9), u)
    assert torch.equal(after.tokens, alone.tokens)
    assert torch.allclose(after.probs, alone.probs, atol=1e-6)


def test_the_first_pass_runs_only_the_entries_pending_this_round(target, monkeypatch):
    """The pending buffers keep the prompt's width; a later round's first pass must run the round's own entries
    (here 3: the anchor and 2 accepted drafts), not a prompt-sized pass every round."""
    d = make(target, draft_vocab_size=60)
    ids = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(4))
    feats = captured(target, ids, d.config.target_layer_ids)
    state = d.new_state(1)
    d.extend_context(state, feats[:, :20], torch.arange(20)[None], token_ids=ids[:, :20])
    widths = []
    project = d.midlayer.project
    monkeypatch.setattr(d.midlayer, "project", lambda e, h, p: widths.append(e.shape[1]) or project(e, h, p))
    d.propose(state, ids[:, 20], torch.tensor([20]), 4)
    d.extend_context(state, feats[:, 20:23], torch.arange(20, 23)[None], token_ids=ids[:, 20:23])
    d.propose(state, ids[:, 23], torch.tensor([23]), 4)
    assert widths == [20, 1, 1, 1, 3, 1, 1, 1]


def test_requests_of_different_lengths_draft_as_they_would_alone(target):
    d = make(target, draft_vocab_size=60)
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(5))
    feats = captured(target, ids, d.config.target_layer_ids)
    lens = [6, 11]
    valid = torch.arange(11)[None] < torch.tensor(lens)[:, None]
    state = d.new_state(2)
    d.extend_context(state, feats[:, :11], torch.arange(11).expand(2, 11), valid, token_ids=ids[:, :11])
    u = torch.rand(2, 4)
    both = d.propose(state, ids[torch.arange(2), lens], torch.tensor(lens), 4, SamplingParams(1.0), u)
    for b, n in enumerate(lens):
        one = draft_step(d, feats[b:b + 1, :n], ids[b, n], 4, SamplingParams(1.0), u[b:b + 1], context_ids=ids[b, :n])
        assert torch.equal(both.tokens[b], one.tokens[0]) and torch.allclose(both.probs[b], one.probs[0], atol=1e-6)


def test_draft_vocabulary_and_the_mapping_the_engines_read(target):
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    assert draft_vocabulary(counts, 4).tolist() == [0, 2, 3, 5]  # the 4 most frequent, in id order
    assert draft_vocabulary(torch.tensor([2, 0, 2, 0, 2]), 2).tolist() == [0, 2]  # ties: the lower id
    d = make(target, draft_vocab_size=60)
    vocab = d.vocab_ids()
    assert torch.equal(vocab, torch.arange(60) + d.d2t)  # vLLM: target id = draft id + d2t[draft id]
    assert d.t2d.sum() == 60 and d.t2d[vocab].all() and (vocab.diff() > 0).all()
    feats = captured(target, torch.randint(0, VOCAB, (1, 8)), d.config.target_layer_ids)
    for sampling in (SamplingParams(1.0), SamplingParams(0.7, top_k=5, top_p=0.9)):
        p = draft_step(d, feats, 3, 8, sampling, torch.rand(1, 8), context_ids=torch.arange(8))
        assert torch.allclose(p.probs.sum(-1), torch.ones(1, 8))
        assert (p.probs[..., ~d.t2d] == 0).all()  # q = 0 outside the draft vocabulary
        assert d.t2d[p.tokens].all() and (p.probs.gather(-1, p.tokens[..., None]) > 0).all()
    greedy = draft_step(d, feats, 3, 8, context_ids=torch.arange(8))
    assert greedy.probs is None and d.t2d[greedy.tokens].all()


def test_the_lm_head_starts_from_the_target_rows_of_its_vocabulary(target):
    d = build_drafter("eagle3", target.config, seed=0, draft_vocab_size=40)
    d.attach_target(target)
    d.init_from_tokens(torch.arange(VOCAB))  # the 40 highest ids are the most frequent
    assert d.vocab_ids().tolist() == list(range(VOCAB - 40, VOCAB))
    assert torch.equal(d.lm_head.weight, target.lm_head.weight[VOCAB - 40:])


def test_context_tokens_are_required(target):
    d = make(target)
    state = d.new_state(1)
    with pytest.raises(PdraftError, match="token ids"):
        d.extend_context(state, torch.zeros(1, 3, d.fc.in_features), torch.arange(3)[None])
    d.extend_context(state, torch.zeros(1, 3, d.fc.in_features), torch.arange(3)[None], token_ids=torch.ones(1, 3))
    with pytest.raises(PdraftError, match="right before the anchor"):
        d.propose(state, torch.tensor([1]), torch.tensor([5]), 2)  # tokens 3 and 4 were never given


def test_config_round_trips_and_the_layout_the_engines_read(target, tmp_path):
    d = make(target, draft_vocab_size=60, ttt_steps=4)
    cfg = d.config
    assert config_from_dict(cfg.to_dict()) == cfg
    data = eagle3_config_to_json(cfg)
    check_drafter_config(data)
    assert data["architectures"] == ["LlamaForCausalLMEagle3"] and data["draft_vocab_size"] == 60
    assert data["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": cfg.target_layer_ids,
                                    "use_aux_hidden_state": True}
    assert data["target_hidden_size"] == 32 and detect_family(data) == "eagle3"
    assert eagle3_config_from_json(data) == cfg
    save_drafter(d, tmp_path / "d")
    names = set(json.loads((tmp_path / "d" / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (tmp_path / "d" / "model.safetensors").read_bytes()[:8], "little")]))
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "midlayer.hidden_norm.weight", "norm.weight",
            "lm_head.weight", "d2t", "t2d"} <= names and "embed_tokens.weight" not in names
    back = load_drafter(tmp_path / "d", target.config)
    assert back.config == cfg
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), d.state_dict().values()))


def published(**kw) -> dict:
    """A config.json as SpecForge writes one for a 4-layer target (its numbering: layer outputs)."""
    data = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 32,
            "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 2048,
            "vocab_size": VOCAB, "draft_vocab_size": 60, "hidden_act": "silu", "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}}
    data.update(kw)
    return data


def test_published_configs_and_their_layer_numbering():
    spec = eagle3_config_from_json(published())
    assert spec.target_layer_ids == [0, 1, 2] and spec.num_target_layers is None and spec.ttt_steps == 7
    assert family_of(published()) == "eagle-eagle3"
    top = published(eagle_config=None, eagle_aux_hidden_state_layer_ids=[1, 2, 3])  # vLLM's numbering
    assert eagle3_config_from_json(top).target_layer_ids == [0, 1, 2]
    qwen = eagle3_config_from_json(published(architectures=["Eagle3Qwen3ForCausalLM"], model_type="qwen3"))
    assert qwen.qk_norm and detect_family(published(architectures=["Eagle3Qwen3ForCausalLM"])) == "eagle3"
    full = published()
    full.pop("draft_vocab_size")
    assert eagle3_config_from_json(full).draft_vocab_size == VOCAB  # vLLM: absent = the whole vocabulary


@pytest.mark.parametrize("change, needle", [
    (dict(num_hidden_layers=2), "one"),
    (dict(eagle_config={"use_aux_hidden_state": False, "eagle_aux_hidden_state_layer_ids": [0, 1]}), "EAGLE-1/2"),
    (dict(norm_before_fc=True), "another network"),
    (dict(target_hidden_size=64), "target_hidden_size"),
    (dict(eagle_config={}), "does not name the target layers"),
    (dict(draft_vocab_size=VOCAB + 1), "exceeds"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 1]}), "increasing"),
    (dict(attention_bias=True), "biases"),
])
def test_what_cannot_be_an_eagle3_is_refused_in_one_line(change, needle):
    with pytest.raises(PdraftError, match=needle):
        eagle3_config_from_json(published(**change))


def test_given_layer_ids_are_used_on_a_target_too_shallow_for_the_default():
    """The quickstart builds an EAGLE-3 with the recipe's ids (one cache for every family): on a 2-layer target,
    whose default would need 3 distinct non-final layers, the ids given are used, not a default that cannot be."""
    shallow = tiny_target_config(num_hidden_layers=2)
    with pytest.raises(PdraftError, match="cannot pick 3 distinct layer ids"):
        build_drafter("eagle3", shallow, seed=0)
    d = build_drafter("eagle3", shallow, seed=0, target_layer_ids=[0])
    assert d.config.target_layer_ids == [0] and tuple(d.fc.weight.shape) == (32, 32)


def test_config_checks():
    base = dict(hidden_size=32, vocab_size=VOCAB, num_target_layers=4, target_layer_ids=[0, 1, 2],
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64)
    assert Eagle3Config(**base).draft_vocab_size == VOCAB  # min(32000, vocab)
    assert Eagle3Config(**{**base, "vocab_size": 50000}).draft_vocab_size == 32000
    for bad, needle in ((dict(target_layer_ids=[0, 3]), "last decoder layer"), (dict(ttt_steps=0), "ttt_steps"),
                        (dict(num_hidden_layers=2), "num_hidden_layers")):
        with pytest.raises(PdraftError, match=needle):
            Eagle3Config(**{**base, **bad})
