"""Chunked losses equal the unchunked reference, gradients included, and peak memory follows the chunk."""

import pytest
import torch
import torch.nn.functional as F

from pdraft.train.losses import drafter_loss, position_weights


def reference(h, w_lm, t_hidden, ids, weights, u, w2, conf, a_ce, a_tv, a_conf):
    draft = h @ w_lm.t() + u @ w2
    p_t = torch.softmax(t_hidden @ w_lm.t(), -1)
    p_d = torch.softmax(draft, -1)
    ce = F.cross_entropy(draft, ids, reduction="none")
    tv = 0.5 * (p_d - p_t).abs().sum(-1)
    bce = F.binary_cross_entropy_with_logits(conf, (1 - tv).detach(), reduction="none")
    w = weights / weights.sum()
    return a_ce * (ce * w).sum() + a_tv * (tv * w).sum() + a_conf * (bce * w).sum()


def test_chunked_equals_reference_with_grads():
    g = torch.Generator().manual_seed(0)
    n, d, v, r = 37, 16, 101, 4
    h = torch.randn(n, d, generator=g, requires_grad=True)
    u = torch.randn(n, r, generator=g, requires_grad=True)
    w2 = torch.randn(r, v, generator=g, requires_grad=True)
    conf = torch.randn(n, generator=g, requires_grad=True)
    w_lm, t_hidden = torch.randn(v, d, generator=g), torch.randn(n, d, generator=g)
    ids = torch.randint(0, v, (n,), generator=g)
    weights = position_weights(torch.arange(n) % 7, 4.0)
    out = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf,
                       alpha_ce=0.1, alpha_tv=1.8, alpha_conf=1.0, chunk_size=8)
    grads = torch.autograd.grad(out.loss, (h, u, w2, conf))
    ref = reference(h, w_lm, t_hidden, ids, weights, u, w2, conf, 0.1, 1.8, 1.0)
    ref_grads = torch.autograd.grad(ref, (h, u, w2, conf))
    torch.testing.assert_close(out.loss, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
    assert out.accept.shape == (n,) and bool(((0 <= out.accept) & (out.accept <= 1)).all())


def test_bf16_products_are_the_reference_over_bf16_rounded_operands():
    """products=bfloat16 (a bf16 CPU runtime): the head products take bf16 operands and the rest stays float32, so
    the loss and its gradients are the float32 reference's over the bf16-rounded hidden states and weights, to the
    rounding of the bf16 product outputs."""
    g = torch.Generator().manual_seed(1)
    n, d, v, r = 29, 32, 257, 4
    h = torch.randn(n, d, generator=g, requires_grad=True)
    u = torch.randn(n, r, generator=g, requires_grad=True)
    w2 = torch.randn(r, v, generator=g, requires_grad=True)
    conf = torch.randn(n, generator=g, requires_grad=True)
    w_lm, t_hidden = torch.randn(v, d, generator=g) / 4, torch.randn(n, d, generator=g)
    ids = torch.randint(0, v, (n,), generator=g)
    weights = position_weights(torch.arange(n) % 7, 4.0)
    out = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf, alpha_ce=0.1, alpha_tv=1.8,
                       alpha_conf=1.0, chunk_size=8, products=torch.bfloat16)
    grads = torch.autograd.grad(out.loss, (h, u, w2))
    bf = lambda x: x.detach().bfloat16().float().requires_grad_(x.requires_grad)  # noqa: E731
    hb, ub, w2b = bf(h), bf(u), bf(w2)
    ref = reference(hb, bf(w_lm), bf(t_hidden), ids, weights, ub, w2b, conf, 0.1, 1.8, 1.0)
    ref_grads = torch.autograd.grad(ref, (hb, ub, w2b))
    torch.testing.assert_close(out.loss, ref, rtol=2e-2, atol=2e-2)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-3)
    fp32 = drafter_loss(h, w_lm, t_hidden, ids, weights, u=u, w2=w2, conf_logits=conf, alpha_ce=0.1, alpha_tv=1.8,
                        alpha_conf=1.0, chunk_size=8)
    assert float(out.loss.detach()) != float(fp32.loss.detach())  # the bf16 products really ran


@pytest.mark.parametrize("slice_", [1024, 8])
def test_shared_target_rows_equal_per_position_rows_with_grads(monkeypatch, slice_):
    """t_index (positions reading shared target rows, the distribution computed once per distinct row) gives
    the loss, gradients, acceptance and greedy agreement of the per-position rows, in one chunk (no
    recomputation; in one slice, or with SLICE = 8 in several) and in several chunks (checkpointed)."""
    import pdraft.train.losses as losses

    monkeypatch.setattr(losses, "SLICE", slice_)
    g = torch.Generator().manual_seed(1)
    n, d, v, r, rows = 41, 16, 97, 4, 9
    t_rows = torch.randn(rows, d, generator=g)
    t_index = torch.randint(0, rows, (n,), generator=g)  # many positions read the same row
    w_lm = torch.randn(v, d, generator=g)
    ids = torch.randint(0, v, (n,), generator=g)
    weights = position_weights(torch.arange(n) % 5, 3.0)
    for chunk in (n, 8):
        h = torch.randn(n, d, generator=g, requires_grad=True)
        u = torch.randn(n, r, generator=g, requires_grad=True)
        w2 = torch.randn(r, v, generator=g, requires_grad=True)
        conf = torch.randn(n, generator=g, requires_grad=True)
        kw = dict(u=u, w2=w2, conf_logits=conf, alpha_ce=0.3, alpha_tv=1.0, alpha_conf=1.0, chunk_size=chunk,
                  confidence_label="greedy")
        shared = drafter_loss(h, w_lm, t_rows, ids, weights, t_index=t_index, **kw)
        plain = drafter_loss(h, w_lm, t_rows[t_index], ids, weights, **kw)
        ref = reference(h, w_lm, t_rows[t_index], ids, weights, u, w2, conf, 0.3, 1.0, 0.0)
        torch.testing.assert_close(shared.ce * 0.3 + shared.tv, ref)
        torch.testing.assert_close(shared.loss, plain.loss)
        for a, b in zip(torch.autograd.grad(shared.loss, (h, u, w2, conf)),
                        torch.autograd.grad(plain.loss, (h, u, w2, conf))):
            torch.testing.assert_close(a, b)
        torch.testing.assert_close(shared.accept, plain.accept)
        assert torch.equal(shared.agree, plain.agree)


def test_identical_distributions_give_full_acceptance():
    w_lm = torch.randn(50, 8)
    h = torch.randn(5, 8)
    out = drafter_loss(h, w_lm, h.clone(), torch.zeros(5, dtype=torch.long), torch.ones(5), alpha_tv=1.0)
    torch.testing.assert_close(out.tv, torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.accept, torch.ones(5), atol=1e-6, rtol=0)


def test_position_weights_follow_the_paper():
    w = position_weights(torch.arange(3), 2.0)
    torch.testing.assert_close(w, torch.tensor([1.0, torch.e ** -0.5, torch.e ** -1.0]))


def test_chunked_path_equals_full_logits_of_a_dspark_drafter():
    """forward_train(compute_logits=False) + drafter_loss gives the loss of the full logits, for each head."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pdraft.models import build_drafter

    torch.manual_seed(0)
    target = Qwen3ForCausalLM(Qwen3Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                          num_attention_heads=2, num_key_value_heads=1, head_dim=16)).eval()
    for head in ("markov", "gated", "rnn"):
        d = build_drafter("dspark", target.config, seed=0, mask_token_id=60, num_hidden_layers=1, block_size=4,
                          sequential_head=head, markov_rank=8, target_layer_ids=[0, 2])
        d.attach_target(target)
        seq = torch.randint(0, 60, (2, 12))
        feats = torch.randn(2, 12, 64)
        t_last = torch.randn(2, 12, 32)
        anchors = torch.tensor([[1, 5], [3, 7]])
        full = d.forward_train(seq, feats, anchors)
        lean = d.forward_train(seq, feats, anchors, compute_logits=False)
        torch.testing.assert_close(lean.hidden, full.hidden)
        w_lm = target.lm_head.weight
        t_h = torch.gather(t_last[:, None].expand(2, 2, 12, 32), 2,
                           (full.target_ids * 0 + anchors[..., None] + torch.arange(4)).unsqueeze(-1).expand(-1, -1, -1, 32))
        ones = torch.ones(16)
        chunked = drafter_loss(lean.hidden.reshape(16, 32), w_lm, t_h.reshape(16, 32), full.target_ids.reshape(16),
                               ones, u=lean.seq_features.reshape(16, -1), w2=lean.seq_w2,
                               conf_logits=lean.confidence_logits.reshape(16), alpha_ce=0.5, alpha_tv=1.0,
                               alpha_conf=1.0, chunk_size=5)
        logits = full.logits.reshape(16, -1)
        p_t = torch.softmax(t_h.reshape(16, 32) @ w_lm.t(), -1)
        ce = F.cross_entropy(logits, full.target_ids.reshape(16))
        tv = 0.5 * (torch.softmax(logits, -1) - p_t).abs().sum(-1)
        bce = F.binary_cross_entropy_with_logits(full.confidence_logits.reshape(16), (1 - tv).detach())
        torch.testing.assert_close(chunked.loss, 0.5 * ce + tv.mean() + bce, rtol=1e-5, atol=1e-6)


def test_greedy_confidence_label_is_argmax_agreement():
    torch.manual_seed(0)
    w_lm = torch.randn(30, 8)
    h, t = torch.randn(6, 8), torch.randn(6, 8)
    t[:3] = h[:3] * 3.0  # same argmax as the draft on the first three positions
    conf = torch.zeros(6, requires_grad=True)
    out = drafter_loss(h, w_lm, t, torch.zeros(6, dtype=torch.long), torch.ones(6), conf_logits=conf,
                       alpha_ce=0.0, alpha_conf=1.0, confidence_label="greedy")
    agree = ((h @ w_lm.t()).argmax(-1) == (t @ w_lm.t()).argmax(-1)).float()
    assert torch.equal(out.agree, agree) and agree[:3].eq(1).all()
    expected = F.binary_cross_entropy_with_logits(torch.zeros(6), agree)
    torch.testing.assert_close(out.loss, expected)
