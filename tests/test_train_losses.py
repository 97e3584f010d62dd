"""Chunked losses equal the unchunked reference, gradients included, and peak memory follows the chunk."""

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


def test_identical_distributions_give_full_acceptance():
    w_lm = torch.randn(50, 8)
    h = torch.randn(5, 8)
    out = drafter_loss(h, w_lm, h.clone(), torch.zeros(5, dtype=torch.long), torch.ones(5), alpha_tv=1.0)
    torch.testing.assert_close(out.tv, torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(out.accept, torch.ones(5), atol=1e-6, rtol=0)


def test_position_weights_follow_the_paper():
    w = position_weights(torch.arange(3), 2.0)
    torch.testing.assert_close(w, torch.tensor([1.0, torch.e ** -0.5, torch.e ** -1.0]))
