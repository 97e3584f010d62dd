"""Acceptance of a verified draft prefix: how many of the l drafted tokens a request keeps and which token the
target adds itself. Greedy: accept while the draft equals the target argmax; the added token is the target
argmax at the first mismatch (or after the last draft). Sampling: the standard speculative rejection rule
(Leviathan et al., Chen et al.): accept d_k with probability min(1, p_t(d_k) / p_d(d_k)); at the first
rejection draw from the normalised residual (p_t - p_d)+, and when all l are accepted draw the bonus token from
p_t. Every request of a batch is handled at once with masks; randomness comes only from the uniforms the caller
passes (the engine's per-request streams, pdraft.streams), so a seed reproduces a run."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdraft.models.sampling import greedy_ids, inverse_cdf, is_greedy, probs_from_logits
from pdraft.models.api import SamplingParams


@dataclass
class Acceptance:
    accepted: torch.Tensor  # [batch] long: a, number of leading drafts kept (0 <= a <= l)
    next_token: torch.Tensor  # [batch] long: the target's own token at position a (correction or bonus)


def accept(
    target_logits: torch.Tensor,  # [batch, L+1, vocab]: logits after the anchor and after each draft
    drafts: torch.Tensor,  # [batch, L] long
    draft_probs: torch.Tensor | None,  # [batch, L, vocab] the distributions the drafts were sampled from
    lengths: torch.Tensor,  # [batch] long: l, how many drafts each request verified (0 <= l <= L)
    sampling: SamplingParams | None,
    # [batch, K+1] uniforms in [0, 1), K >= L, any device: columns 0..L-1 drive the acceptance tests, the last
    # column the correction/bonus draw. A fixed column for that draw keeps a request's randomness independent
    # of L, which depends on the other requests of the batch. None: fresh ones from torch's CPU generator.
    uniforms: torch.Tensor | None = None,
) -> Acceptance:
    batch, width = drafts.shape
    dev = target_logits.device  # the book keeps drafts and lengths on the CPU; the test runs where the logits are
    drafts, lengths = drafts.to(dev), lengths.to(dev)
    rows = torch.arange(batch, device=dev)
    in_prefix = torch.arange(width, device=dev).unsqueeze(0) < lengths.unsqueeze(1)  # [batch, L]
    if is_greedy(sampling):
        best = greedy_ids(target_logits)  # [batch, L+1]
        ok = (drafts == best[:, :width]) & in_prefix
        accepted = ok.long().cumprod(-1).sum(-1)  # [batch]
        return Acceptance(accepted, best[rows, accepted])

    p_t = probs_from_logits(target_logits, sampling)  # [batch, L+1, vocab]
    if draft_probs is None:
        # A drafter that proposed deterministically under sampling: its distribution is the one-hot of the
        # draft, which the same rule handles exactly (accept with probability p_t(d)).
        draft_probs = torch.nn.functional.one_hot(drafts, p_t.shape[-1]).float()
    draft_probs = draft_probs.float()
    idx = drafts.unsqueeze(-1)
    p_t_tok = p_t[:, :width].gather(-1, idx).squeeze(-1)  # [batch, L]
    p_d_tok = draft_probs.gather(-1, idx).squeeze(-1)  # [batch, L]
    if uniforms is None:
        uniforms = torch.rand(batch, width + 1)
    uniforms = uniforms.to(dev).float()
    u = uniforms[:, :width]  # [batch, L]
    ok = (u * p_d_tok < p_t_tok) & in_prefix  # u < p_t / p_d without dividing by p_d
    accepted = ok.long().cumprod(-1).sum(-1)  # [batch]

    final = p_t[rows, accepted]  # [batch, vocab]: bonus distribution when everything was accepted
    rejected = accepted < lengths
    if rejected.any():
        pad = torch.zeros(batch, 1, p_t.shape[-1], device=dev)
        p_d_at = torch.cat([draft_probs, pad], dim=1)[rows, accepted]  # [batch, vocab]
        residual = (final - p_d_at).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        # mass is 0 only when p_t == p_d, where a rejection has probability 0; keep p_t for float safety.
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), final)
        final = torch.where(rejected.unsqueeze(-1), residual, final)
    next_token = inverse_cdf(final, uniforms[:, -1])  # [batch]
    return Acceptance(accepted, next_token)
