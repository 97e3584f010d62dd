"""The compiled loss rows (pdraft.kernels.cpu_loss) against the torch path they stand in for: CE, TV, the draft's
argmax and the gradient of the logits, row by row and through `drafter_loss` (sliced and checkpointed), at every
ISA level that loads here; NaN rows; and the fallback to torch when the loops are off."""

import pytest
import torch

from pdraft.kernels import cc, cpu_loss
from pdraft.train import losses

LEVELS = cc.MARCHES if cc.x86() else ("native",)


def torch_rows(z, p_rows, inverse, ids):
    """_CeTv's arithmetic, written out in torch: ce, tv, argmax and the gradient for g_ce = 1, g_tv = 0.5."""
    z = z.clone().requires_grad_(True)
    p_t = p_rows[inverse]
    logp = torch.log_softmax(z, -1)
    ce = -logp.gather(-1, ids[:, None]).squeeze(-1)
    tv = 0.5 * (logp.exp() - p_t).abs().sum(-1)
    (ce.sum() + 0.5 * tv.sum()).backward()
    return ce.detach(), tv.detach(), z.detach().argmax(-1), z.grad


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("vocab", [1000, 4096, 37])
def test_rows_are_the_torch_rows(level, vocab):
    rows, why = cpu_loss.load(level)
    if rows is None:
        pytest.skip(why)
    g = torch.Generator().manual_seed(vocab)
    n, u = 300, 90
    z = 4 * torch.randn(n, vocab, generator=g)
    z[5, 3] = z[5, 9] = z[5].max() + 1  # a tie: the first index wins, as torch's argmax
    z[6] = -200.0  # every exp underflows but the maximum's
    z[6, 11] = 0.0
    p_rows = torch.softmax(3 * torch.randn(u, vocab, generator=g), -1)
    inverse, ids = torch.randint(0, u, (n,), generator=g), torch.randint(0, vocab, (n,), generator=g)
    p_d, ce, tv, m, best = rows.forward(z.clone(), p_rows, inverse, ids)
    want_ce, want_tv, want_best, want_grad = torch_rows(z, p_rows, inverse, ids)
    torch.testing.assert_close(ce, want_ce, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(tv, want_tv, rtol=1e-5, atol=2e-6)
    assert torch.equal(best, want_best) and best[5] == 3
    torch.testing.assert_close(p_d, torch.softmax(z, -1), rtol=1e-5, atol=1e-7)
    grad = rows.backward(p_d, p_rows, inverse, ids, m, torch.ones(n), torch.full((n,), 0.5))
    torch.testing.assert_close(grad, want_grad, rtol=1e-4, atol=1e-7)


def test_a_nan_row_gives_nan_figures_as_torch_does():
    rows, why = cpu_loss.load()
    if rows is None:
        pytest.skip(why)
    z = torch.randn(3, 50)
    z[1, 7] = float("nan")
    p_rows = torch.softmax(torch.randn(1, 50), -1)
    _, ce, tv, _, best = rows.forward(z, p_rows, torch.zeros(3, dtype=torch.long), torch.tensor([1, 2, 3]))
    assert ce[1].isnan() and tv[1].isnan() and best[1] == 7
    assert not ce[[0, 2]].isnan().any()


@pytest.mark.parametrize("chunk", [4096, 128])  # one slice pass, and checkpointed chunks (recomputed)
@pytest.mark.parametrize("label", ["tv", "greedy"])
def test_drafter_loss_is_the_same_with_and_without_the_rows(chunk, label, monkeypatch):
    if cpu_loss.kernels() is None:
        pytest.skip(cpu_loss.status())
    torch.manual_seed(0)
    n, hidden, vocab, t = 500, 48, 700, 200
    h = torch.randn(n, hidden, requires_grad=True)
    conf = torch.randn(n, requires_grad=True)
    u, w2 = torch.randn(n, 8, requires_grad=True), torch.randn(8, vocab, requires_grad=True)
    w, th = 0.3 * torch.randn(vocab, hidden), torch.randn(t, hidden)
    index, ids, weights = torch.randint(0, t, (n,)), torch.randint(0, vocab, (n,)), torch.rand(n)

    def run():
        for x in (h, conf, u, w2):
            x.grad = None
        out = losses.drafter_loss(h, w, th, ids, weights, t_index=index, u=u, w2=w2, conf_logits=conf,
                                  alpha_tv=1.0, alpha_conf=0.2, chunk_size=chunk, confidence_label=label)
        out.loss.backward()
        return [out.loss.detach(), out.ce, out.tv, out.conf, out.agree, out.accept] + \
            [x.grad.clone() for x in (h, conf, u, w2)]

    calls = {"n": 0}
    real = cpu_loss.Loss.forward

    def counted(self, *a):
        calls["n"] += 1
        return real(self, *a)

    monkeypatch.setattr(cpu_loss.Loss, "forward", counted)
    compiled = run()
    assert calls["n"] > 0  # the compiled rows ran
    monkeypatch.setenv(cc.ENV, "0")
    plain = run()
    assert calls["n"] == (1 if chunk == 4096 else 8)  # not again with the loops off (4 chunks, each run twice)
    for a, b in zip(compiled, plain):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_status_says_why_when_off(monkeypatch):
    monkeypatch.setenv(cc.ENV, "0")
    assert cpu_loss.kernels() is None and "torch" in cpu_loss.status()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dim", [256, 19])  # whole vectors, and a ragged tail
def test_gather_dot_and_its_gradients_are_the_gathered_einsums(level, dim, monkeypatch):
    rows, why = cpu_loss.load(level)
    if rows is None:
        pytest.skip(why)
    monkeypatch.setattr(cpu_loss, "kernels", lambda: rows)
    g = torch.Generator().manual_seed(dim)
    x = torch.randn(2, 70, dim, generator=g, requires_grad=True)
    table = torch.randn(50, dim, generator=g, requires_grad=True)
    idx = torch.randint(0, 50, (2, 70, 6), generator=g)  # rows repeat: the table's gradient accumulates
    idx[0, 0] = 3  # one row six times in one position
    upstream = torch.randn(2, 70, 6, generator=g)
    out = cpu_loss.gather_dot(x, table, idx)
    out.backward(upstream)
    got = (out.detach(), x.grad.clone(), table.grad.clone())
    x.grad = table.grad = None
    want = torch.einsum("...d,...kd->...k", x, table[idx])
    want.backward(upstream)
    torch.testing.assert_close(got[0], want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], table.grad, rtol=1e-5, atol=1e-5)
    frozen = table.detach()  # no gradient asked of a frozen table (the target's LM head)
    x.grad = None
    cpu_loss.gather_dot(x, frozen, idx).sum().backward()
    torch.testing.assert_close(x.grad, frozen[idx].sum(-2), rtol=1e-5, atol=1e-5)


def test_gather_dot_falls_back_off_the_float32_cpu_path(monkeypatch):
    monkeypatch.setenv(cc.ENV, "0")
    x, table, idx = torch.randn(4, 8), torch.randn(10, 8).bfloat16(), torch.randint(0, 10, (4, 3))
    torch.testing.assert_close(cpu_loss.gather_dot(x, table, idx), torch.einsum("md,mkd->mk", x, table.float()[idx]))
