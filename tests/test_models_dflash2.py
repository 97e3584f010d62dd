"""DFlash2's model part (pdraft.models.dflash2) against naive loops of its formulas: the grouped dynamic conv
(formula, identity start, block boundaries), the decoder layer reusing the DFlash backbone, the selector's edge
scores, the greedy walk (brute force, ties), the sampled walk (chi-square of its draws against the q it
returns, with a wrong-q negative control), the published checkpoint layout round trip, and the selector loss's
gold injection and metrics."""

from __future__ import annotations

import dataclasses
import json

import pytest

import torch
from safetensors.torch import save_file

from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.models.build import build_drafter, draft_step
from pdraft.models.checkpoint import load_drafter, save_drafter
from pdraft.models.dflash.config import DFlashConfig
from pdraft.models.dflash2.config import DFlash2Config
from pdraft.models.dflash2.conv import GroupedDynamicConv, grouped_dynamic_conv
from pdraft.models.dflash2.format import dflash2_config_from_json
from pdraft.models.dflash2.selector import CandidateSelector, greedy_walk, sampled_walk, selector_loss
from pdraft.models.dflash.model import DFlashDrafter
from test_decode_sampling import chi_square_p
from test_models_support import MASK, VOCAB, captured, tiny_target

ALPHA = 1e-3


@pytest.fixture(scope="module", name="target")
def _target():
    return tiny_target()


def tiny_dflash2(target, **kw):
    base = dict(mask_token_id=MASK, block_size=5, num_hidden_layers=2, conv_group_size=8, selector_rank=4,
                selector_top_k=6, seed=1)
    base.update(kw)
    d = build_drafter("dflash2", target.config, **base)
    d.attach_target(target)
    return d


# ---- the convolution ------------------------------------------------------------------------------------------
def naive_conv(x, delta, base, block_size, group_size):
    b, s, d = x.shape
    out = torch.zeros_like(x)
    for bi in range(b):
        for i in range(s):
            for c in range(d):
                for t in range(base.shape[0]):
                    if i % block_size - t < 0:  # the tap would reach into the previous block
                        continue
                    out[bi, i, c] += (base[t, c] + delta[bi, i, t, c // group_size]) * x[bi, i - t, c]
    return out


@pytest.mark.parametrize("blocks", [3, 1])  # one block a row is what a decode pass convolves
@pytest.mark.parametrize("taps,block", [(2, 4), (3, 5), (4, 3)])
def test_conv_matches_the_per_element_formula(taps, block, blocks):
    g = torch.Generator().manual_seed(taps * 10 + block)
    hidden, group = 12, 4
    x = torch.randn(2, blocks * block, hidden, generator=g, dtype=torch.float64)
    delta = torch.randn(2, blocks * block, taps, hidden // group, generator=g, dtype=torch.float64)
    base = torch.randn(taps, hidden, generator=g, dtype=torch.float64)
    torch.testing.assert_close(grouped_dynamic_conv(x, delta, base, block), naive_conv(x, delta, base, block, group))


def test_prepare_and_finish_split_one_projection_of_the_normed_input():
    torch.manual_seed(0)
    conv = GroupedDynamicConv(hidden=8, taps=2, group_size=4, block_size=4).double()
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x, y = torch.randn(1, 8, 8, dtype=torch.float64), torch.randn(1, 8, 8, dtype=torch.float64)
    delta = (x @ conv.kernel_projection.weight.t()).view(1, 8, 2, 2, 2)  # [b, s, side, taps, groups]
    pre, post_delta = conv.prepare(x)
    torch.testing.assert_close(pre, naive_conv(x, delta[:, :, 0], conv.base_kernel[0].detach(), 4, 4))
    torch.testing.assert_close(conv.finish(y, post_delta),
                               naive_conv(y, delta[:, :, 1], conv.base_kernel[1].detach(), 4, 4))


def test_identity_initialised_conv_is_a_no_op():
    conv = GroupedDynamicConv(hidden=16, taps=3, group_size=4, block_size=5)
    assert torch.equal(conv.base_kernel[:, 0], torch.ones(2, 16)) and not conv.base_kernel[:, 1:].any()
    assert not conv.kernel_projection.weight.any()
    x, y = torch.randn(2, 10, 16), torch.randn(2, 10, 16)
    pre, delta = conv.prepare(x)
    assert torch.equal(pre, x) and torch.equal(conv.finish(y, delta), y)


def test_taps_never_cross_a_block_boundary():
    torch.manual_seed(0)
    block, hidden = 4, 8
    x = torch.randn(1, 3 * block, hidden)
    delta, base = torch.randn(1, 3 * block, 3, 2), torch.randn(3, hidden)
    out = grouped_dynamic_conv(x, delta, base, block)
    for j in range(3 * block):
        bumped = x.clone()
        bumped[0, j] += 100.0
        diff = (grouped_dynamic_conv(bumped, delta, base, block) - out).abs().amax(-1)[0]  # [seq]
        changed = set(torch.nonzero(diff > 1e-4).flatten().tolist())
        # position j reaches j, j+1, j+2 (3 taps) but only inside its own block
        assert changed == {i for i in range(j, j + 3) if i // block == j // block}


def test_fresh_dflash2_backbone_equals_the_dflash_backbone(target):
    """Identity convs + the reused DFlash sublayers: a fresh DFlash2 drafter's hidden states are those of a
    DFlash drafter holding the same backbone weights (so the layer order wraps, never replaces, the backbone)."""
    d2 = tiny_dflash2(target)
    fields = {k: v for k, v in d2.config.to_dict().items() if k in {f.name for f in dataclasses.fields(DFlashConfig)}}
    d1 = DFlashDrafter(DFlashConfig(**fields))
    d1.attach_target(target)
    missing, unexpected = d1.load_state_dict(d2.state_dict(), strict=False)
    assert not missing and all("conv" in k or "candidate_selector" in k for k in unexpected)
    ids = torch.randint(0, VOCAB - 1, (2, 14))
    feats = captured(target, ids, d2.config.target_layer_ids)
    anchors = torch.tensor([[1, 6], [0, 7]])
    h1 = d1.forward_train(ids, feats, anchors, compute_logits=False).hidden
    h2 = d2.forward_train(ids, feats, anchors, compute_logits=False).hidden
    torch.testing.assert_close(h2, h1)
    with torch.no_grad():  # and a trained (non-identity) conv does change them
        d2.layers[0].mlp_conv.base_kernel[1, 1] = 0.5
    assert not torch.allclose(d2.forward_train(ids, feats, anchors, compute_logits=False).hidden, h1)


# ---- the selector ---------------------------------------------------------------------------------------------
def random_selector(vocab=23, rank=5, k=4, hidden=7, seed=0):
    torch.manual_seed(seed)
    sel = CandidateSelector(hidden, vocab, rank, k).double()
    with torch.no_grad():
        sel.successor_codebook.normal_()
        sel.predecessor_codebook.normal_()
    return sel


def distinct_candidates(b, length, k, vocab, g):
    return torch.stack([torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(length)])
                        for _ in range(b)])  # [b, L, K]


def test_edge_scores_match_a_naive_loop():
    sel = random_selector()
    g = torch.Generator().manual_seed(1)
    b, length, k = 2, 3, 4
    cand = distinct_candidates(b, length, k, 23, g)
    unary = torch.randn(b, length, k, generator=g, dtype=torch.float64)
    hidden = torch.randn(b, length, 7, generator=g, dtype=torch.float64)
    anchors = torch.tensor([5, 11])
    got = sel.edge_scores(cand, unary, hidden, anchors)
    w = sel.hidden_projection.weight.detach()
    P, S = sel.predecessor_codebook.detach(), sel.successor_codebook.detach()
    for bi in range(b):
        for pos in range(length):
            wh = w @ hidden[bi, pos]
            for p in range(k):
                pred = anchors[bi] if pos == 0 else cand[bi, pos - 1, p]
                for c in range(k):
                    want = unary[bi, pos, c] + (P[pred] * wh * S[cand[bi, pos, c]]).sum()
                    assert torch.isclose(got[bi, pos, p, c].double(), want, atol=1e-5), (bi, pos, p, c)


def test_greedy_walk_equals_a_brute_force_argmax_walk_with_ties_to_the_lowest_index():
    g = torch.Generator().manual_seed(2)
    b, length, k = 16, 5, 4
    cand = distinct_candidates(b, length, k, 30, g)
    scores = torch.randint(0, 3, (b, length, k, k), generator=g).float()  # few values: many ties
    tokens, idx = greedy_walk(scores, cand)
    for bi in range(b):
        prev = 0
        for pos in range(length):
            row = scores[bi, pos, prev].tolist()
            prev = row.index(max(row))  # list.index: the first (lowest) maximal index
            assert idx[bi, pos] == prev and tokens[bi, pos] == cand[bi, pos, prev]


def test_sampled_walk_draws_from_the_q_it_returns():
    g = torch.Generator().manual_seed(3)
    length, k, vocab, temp, n = 2, 4, 12, 0.7, 40_000
    cand = distinct_candidates(1, length, k, vocab, g)
    scores = torch.randn(1, length, k, k, generator=g) * 1.5
    tokens, q = sampled_walk(scores.expand(n, -1, -1, -1), cand.expand(n, -1, -1), temp,
                             torch.rand(n, length, generator=g), vocab)
    # q is a distribution over the K candidates only, and exactly the softmax of the walked row
    torch.testing.assert_close(q.sum(-1), torch.ones(n, length))
    assert torch.isclose(q.gather(2, cand.expand(n, -1, -1)).sum(-1), torch.ones(n, length)).all()
    p0 = torch.softmax(scores[0, 0, 0] / temp, -1)  # position 0: every row holds the anchor's edges
    torch.testing.assert_close(q[:, 0].gather(1, cand[:, 0].expand(n, -1)), p0.expand(n, -1))
    first_idx = (cand[0, 0][None, :] == tokens[:, :1]).int().argmax(-1)  # [n]
    p1 = torch.softmax(scores[0, 1] / temp, -1)  # [K prev, K]
    torch.testing.assert_close(q[:, 1].gather(1, cand[:, 1].expand(n, -1)), p1[first_idx])
    # the draws follow q: chi-square on the joint of the two drafted tokens
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    for a in range(k):
        joint[cand[0, 0, a], cand[0, 1]] = (p0[a] * p1[a]).double()
    counts = torch.bincount(tokens[:, 0] * vocab + tokens[:, 1], minlength=vocab * vocab).view(vocab, vocab)
    assert chi_square_p(counts, joint) > ALPHA
    # negative control: the joint at another temperature (a wrong q) is rejected by the same harness
    w0, w1 = torch.softmax(scores[0, 0, 0] / 1.4, -1), torch.softmax(scores[0, 1] / 1.4, -1)
    wrong = torch.zeros_like(joint)
    for a in range(k):
        wrong[cand[0, 0, a], cand[0, 1]] = (w0[a] * w1[a]).double()
    assert chi_square_p(counts, wrong) < ALPHA


def test_drafter_proposals_walk_the_selector(target):
    d = tiny_dflash2(target)
    with torch.no_grad():
        d.candidate_selector.successor_codebook.normal_()  # make the pair term matter
    feats = torch.randn(2, 6, d.fc.in_features)
    greedy = draft_step(d, feats, [3, 4])
    sampled = draft_step(d, feats, [3, 4], sampling=SamplingParams(temperature=0.9), uniforms=torch.rand(2, 4))
    assert greedy.tokens.shape == (2, 4) and greedy.probs is None
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(2, 4))
    assert (sampled.probs.gather(2, sampled.tokens[..., None]) > 0).all()
    assert ((sampled.probs > 0).sum(-1) <= d.config.selector_top_k).all()


# ---- the published checkpoint layout ----------------------------------------------------------------------------
PUBLISHED = {
    "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "hidden_size": 32, "intermediate_size": 48,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "hidden_act": "silu", "max_position_embeddings": 512,
    "num_target_layers": 4, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "dflash_config": {"block_size": 6, "conv_kernel_size": 2, "conv_group_size": 8, "target_layer_ids": [0, 2],
                      "mask_token_id": MASK, "selector_rank": 4, "selector_top_k": 5, "output_multiplier": 1.25,
                      "final_logit_softcapping": 20.0},
}


def published_weights(cfg: dict) -> dict[str, torch.Tensor]:
    """Random weights under the names and shapes the engines load (qwen3_dflash2.py, SpecForge dflash2.py)."""
    g = torch.Generator().manual_seed(7)
    h, dc, v = cfg["hidden_size"], cfg["dflash_config"], cfg["vocab_size"]
    taps, groups, r = dc["conv_kernel_size"], h // dc["conv_group_size"], dc["selector_rank"]
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    inter = cfg["intermediate_size"]
    shapes = {"fc.weight": (h, len(dc["target_layer_ids"]) * h), "hidden_norm.weight": (h,), "norm.weight": (h,),
              "candidate_selector.predecessor_codebook": (v, r), "candidate_selector.successor_codebook": (v, r),
              "candidate_selector.hidden_projection.weight": (r, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)})
        for conv in ("attention_conv", "mlp_conv"):
            shapes[p + conv + ".base_kernel"] = (2, taps, h)
            shapes[p + conv + ".kernel_projection.weight"] = (2 * taps * groups, h)
    return {name: torch.randn(*shape, generator=g) * 0.1 for name, shape in shapes.items()}


def test_published_checkpoint_round_trips_in_names_shapes_and_fields(tmp_path, target):
    src = tmp_path / "published"
    src.mkdir()
    weights = published_weights(PUBLISHED)
    save_file(weights, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps(PUBLISHED))
    d = load_drafter(src)
    cfg = d.config
    assert (cfg.block_size, cfg.num_gamma, cfg.conv_kernel_size, cfg.conv_group_size) == (6, 5, 2, 8)
    assert (cfg.selector_rank, cfg.selector_top_k) == (4, 5)
    assert (cfg.output_multiplier, cfg.final_logit_softcapping) == (1.25, 20.0)
    out = save_drafter(d, tmp_path / "again")
    from safetensors.torch import load_file
    back = load_file(str(out / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in back.items()} == {k: tuple(v.shape) for k, v in weights.items()}
    assert all(torch.equal(back[k], weights[k]) for k in weights)
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == ["DFlash2DraftModel"]
    for key, value in PUBLISHED["dflash_config"].items():
        assert written["dflash_config"][key] == value, key
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "num_key_value_heads", "head_dim", "num_target_layers"):
        assert written[key] == PUBLISHED[key], key
    assert load_drafter(out).config == cfg  # and it loads back to the same typed config
    d.attach_target(target)  # the loaded drafter drafts
    assert draft_step(d, torch.randn(1, 4, d.fc.in_features), 3).tokens.shape == (1, 5)


def test_published_config_without_selector_fields_is_refused_not_run_as_dflash():
    data = json.loads(json.dumps(PUBLISHED))
    del data["dflash_config"]["selector_top_k"]
    with pytest.raises(PdraftError, match="selector_top_k"):
        dflash2_config_from_json(data)
    data = json.loads(json.dumps(PUBLISHED))
    data["dflash_config"]["attention_mode"] = "mla"
    with pytest.raises(PdraftError, match="MLA"):
        dflash2_config_from_json(data)


def test_wrong_weight_shape_is_one_clean_error(tmp_path):
    weights = published_weights(PUBLISHED)
    weights["layers.1.mlp_conv.kernel_projection.weight"] = torch.zeros(3, 32)
    save_file(weights, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED))
    with pytest.raises(PdraftError, match="mlp_conv.kernel_projection.weight' has shape"):
        load_drafter(tmp_path)


@pytest.mark.parametrize("bad,match", [(dict(block_convention="deepspec"), "zlab"), (dict(conv_group_size=5), "divide"),
                                       (dict(denoise_steps=2), "one backbone pass"),
                                       (dict(output_multiplier=-1.0), "output_multiplier"),
                                       (dict(selector_top_k=VOCAB + 1), "selector_top_k")])
def test_config_refuses_what_the_engines_cannot_serve(bad, match):
    base = dict(hidden_size=32, vocab_size=VOCAB, num_target_layers=4, target_layer_ids=[0, 2], mask_token_id=MASK,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48)
    DFlash2Config(**base)
    with pytest.raises(PdraftError, match=match):
        DFlash2Config(**base, **bad)


def test_config_dict_round_trip():
    cfg = DFlash2Config(hidden_size=32, vocab_size=VOCAB, num_target_layers=4, target_layer_ids=[0, 2],
                        mask_token_id=MASK, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        intermediate_size=48, selector_top_k=7, final_logit_softcapping=30.0)
    assert DFlash2Config.from_dict(cfg.to_dict()) == cfg


# ---- the selector loss ------------------------------------------------------------------------------------------
def test_loss_injects_the_gold_only_when_the_top_k_misses_it():
    sel = random_selector(vocab=10, rank=3, k=3, hidden=4)
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]] * 3, dtype=torch.float64)
    hidden = torch.randn(3, 4, dtype=torch.float64)
    gold = torch.tensor([1, 7, 0])  # in the top-3, missing, in the top-3 (as the unary top-1)
    prev = torch.tensor([9, 8, 4])
    out = selector_loss(sel, logits, hidden, gold, prev, torch.ones(3, dtype=torch.bool), alpha=0.5)

    def ce(row, ids, label):
        s = sel.pair_scores(prev[row], torch.tensor(ids), logits[row, ids], hidden[row])
        return float(torch.nn.functional.cross_entropy(s[None].detach(), torch.tensor([label])))

    want = [ce(0, [0, 1, 2], 1), ce(1, [0, 1, 7], 2), ce(2, [0, 1, 2], 0)]  # row 1: gold replaces the 3rd
    assert float(out.ce) == pytest.approx(sum(want) / 3, rel=1e-6)
    assert float(out.loss.detach()) == pytest.approx(0.5 * sum(want) / 3, rel=1e-6)
    assert float(out.recall) == pytest.approx(2 / 3)
    assert float(out.unary_accuracy) == pytest.approx(1 / 3)  # only row 2's gold is the unary top-1
    served = [sel.pair_scores(prev[r], torch.tensor([0, 1, 2]), logits[r, :3], hidden[r]).argmax() for r in (0, 2)]
    sel_acc = (int(served[0] == 1) + int(served[1] == 0)) / 3  # row 1 (gold missing) can never be right
    assert float(out.selector_accuracy) == pytest.approx(sel_acc)
    assert float(out.lift) == pytest.approx(sel_acc - 1 / 3)
    out.loss.backward()
    assert sel.successor_codebook.grad[7].abs().sum() > 0  # the injected gold is trained
    assert sel.successor_codebook.grad[2, :].abs().sum() > 0  # the present-case rows keep candidate 2


def test_loss_through_the_head_weight_equals_the_loss_through_the_logits():
    """head_weight: candidates from no-grad logits, the K + 1 scores recomputed as hidden . W[id]; the same
    loss, metrics and gradients (hidden and selector) as through the vocabulary's logits, with softcapping and a
    gold token outside the top-K."""
    torch.manual_seed(3)
    sel = random_selector(vocab=10, rank=3, k=3, hidden=4)
    w = torch.randn(10, 4, dtype=torch.float64)
    gold, prev = torch.tensor([1, 7, 0, 5]), torch.tensor([9, 8, 4, 2])
    grads = []
    for via_head in (False, True):
        hidden = torch.randn(4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
        logits = hidden @ w.t() if not via_head else (hidden @ w.t()).detach()
        out = selector_loss(sel, logits, hidden, gold, prev, torch.ones(4, dtype=torch.bool), alpha=0.7,
                            output_multiplier=1.5, softcap=3.0, head_weight=w if via_head else None)
        sel.zero_grad()
        out.loss.backward()
        grads.append((float(out.loss), out.metrics(), hidden.grad.clone(),
                      [p.grad.clone() for p in sel.parameters()]))
    (l0, m0, h0, p0), (l1, m1, h1, p1) = grads
    assert l1 == pytest.approx(l0, rel=1e-12) and m1 == pytest.approx(m0)
    assert h0.abs().sum() > 0
    torch.testing.assert_close(h1, h0)
    for a, b in zip(p1, p0):
        torch.testing.assert_close(a, b)


def test_loss_respects_validity_and_weights():
    sel = random_selector(vocab=10, rank=3, k=3, hidden=4)
    logits = torch.randn(4, 10, dtype=torch.float64)
    hidden = torch.randn(4, 4, dtype=torch.float64)
    gold, prev = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3])
    valid = torch.tensor([True, True, False, True])
    w = torch.tensor([1.0, 0.5, 9.0, 0.25], dtype=torch.float64)
    full = selector_loss(sel, logits, hidden, gold, prev, torch.ones(4, dtype=torch.bool), alpha=1.0)
    part = selector_loss(sel, logits, hidden, gold, prev, valid, alpha=1.0, weights=w)
    per_row = [float(selector_loss(sel, logits[i:i + 1], hidden[i:i + 1], gold[i:i + 1], prev[i:i + 1],
                                   torch.ones(1, dtype=torch.bool), alpha=1.0).ce) for i in range(4)]
    assert float(full.ce) == pytest.approx(sum(per_row) / 4, rel=1e-6)
    want = (per_row[0] * 1.0 + per_row[1] * 0.5 + per_row[3] * 0.25) / 1.75
    assert float(part.ce) == pytest.approx(want, rel=1e-6)


def test_coefficient_product_is_projection_plus_base():
    """A pass without gradients forms the conv's coefficients in one product (issue 38): the same numbers as the
    projection followed by the broadcast addition, and the same conv outputs."""
    torch.manual_seed(0)
    conv = GroupedDynamicConv(32, 3, 8, 5)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(2, 10, 32)
    delta = conv.kernel_projection(x).reshape(2, 10, 2, 3, 4)
    want = torch.stack([grouped_dynamic_conv(x, delta[:, :, 0], conv.base_kernel[0], 5),
                        grouped_dynamic_conv(x, delta[:, :, 1], conv.base_kernel[1], 5)])
    with torch.no_grad():
        pre, post = conv.prepare(x)
        got = torch.stack([pre, conv.finish(x, post)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # a changed weight is seen (the product is rebuilt)
        conv.base_kernel.add_(1.0)
        assert not torch.allclose(conv.prepare(x)[0], pre)
