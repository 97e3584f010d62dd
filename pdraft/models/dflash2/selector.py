"""DFlash2's candidate selector: per draft position the top-K tokens of the target's LM head (the unary
candidates, after `output_multiplier` and softcapping), a low-rank score for every adjacent pair,
edge(p -> c) = unary[c] + <P[p] * W h, S[c]> (P, S: predecessor / successor codebooks [vocab, rank], W: the
hidden projection, h: the position's hidden state), and a walk through the K x K lattice from the anchor (the
predecessor of position 0). Greedy decoding takes the argmax at each step, ties to the lowest candidate index,
as vLLM's `_selector_walk_kernel` (vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py). Sampled decoding draws
each step from softmax(edge(prev -> .) / T) over the K candidates by inverse CDF from a given uniform, and
returns that distribution scattered over the vocabulary (zero outside the K candidates): the exact
conditional draft distribution q the rejection rule needs. (vLLM draws with Gumbel noise instead and caches
the same scores as its draft logits; the distribution is the same.) Training adds a K-way cross-entropy of
the selector, teacher-forced on the gold predecessor, with the gold token put into the loss candidate set
when the top-K misses it; the metrics keep serving semantics (no injection). Its label is the gold token
(`train.selector_target: token`, the SpecForge recipe) or, with `distribution`, the target's own distribution
over the same K loss candidates (its last hidden state times its LM head's rows of those ids, softmax at T=1):
a one-hot label teaches a sharp K-way softmax, while sampled decoding draws from that softmax and accepts with
sum_v min(p, q), so at T=1 it is the target's shape over the candidates that the selector should learn."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pdraft.errors import PdraftError
from pdraft.kernels import cpu_bf16
from pdraft.kernels.cpu_loss import gather_dot
from pdraft.models.dflash2.config import SELECTOR_TARGETS
from pdraft.models.layers import derived, fast_linear, fused_pass
from pdraft.models.sampling import inverse_cdf


def transform_unary(logits: torch.Tensor, output_multiplier: float, softcap: float | None) -> torch.Tensor:
    """LM-head logits -> unary scores (float32): times output_multiplier, then cap * tanh(x / cap)."""
    x = logits.float()
    if float(output_multiplier) != 1.0:  # skipped when it is the identity: one operation fewer a pass
        x = x * float(output_multiplier)
    return x if softcap is None else torch.tanh(x / softcap) * softcap


def unary_candidates(logits: torch.Tensor, k: int, output_multiplier: float = 1.0,
                     softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., vocab] -> (ids [..., K] long, unary [..., K] float32), best first. The top-K is taken on
    the raw logits and the transform applied after, as vLLM's `compute_candidates` does (the same set, since
    the transform is increasing)."""
    compiled = cpu_bf16.topk(logits, k)  # bfloat16 on a CPU: one compiled loop (39 -> 13 us for 16 x 1024)
    values, ids = compiled if compiled is not None else torch.topk(logits, k, dim=-1)
    return ids, transform_unary(values, output_multiplier, softcap)


class CandidateSelector(nn.Module):
    """`candidate_selector.*`: predecessor_codebook [vocab, rank], successor_codebook [vocab, rank],
    hidden_projection.weight [rank, hidden]. The successor codebook starts at zero (as SpecForge initialises
    it), so an untrained selector scores every edge by its unary logit alone and walks the per-position argmax."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab, rank))
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        nn.init.normal_(self.predecessor_codebook, 0.0, std)
        nn.init.zeros_(self.successor_codebook)
        nn.init.normal_(self.hidden_projection.weight, 0.0, std)

    def projected(self, hidden: torch.Tensor) -> torch.Tensor:
        """W h [..., rank] for hidden [..., hidden], through the measured product when no gradient is taken."""
        proj = self.hidden_projection
        hidden = hidden.to(proj.weight.dtype)
        return fast_linear(proj)(hidden) if fused_pass() else proj(hidden)

    def float_books(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The predecessor and successor codebooks as contiguous float32, kept until either changes (the
        compiled walk reads them; a bfloat16 drafter's would be converted every pass)."""
        books = (self.predecessor_codebook, self.successor_codebook)
        return derived(self, "_float_books", books, lambda: tuple(p.detach().float().contiguous() for p in books))

    def build_products(self) -> None:
        """The hidden projection's measured product plan, built before any timed round (prepare_products)."""
        fast_linear(self.hidden_projection)

    def pair_scores(self, pred_ids: torch.Tensor, cand_ids: torch.Tensor, unary: torch.Tensor,
                    hidden: torch.Tensor) -> torch.Tensor:
        """Scores of the edges from one predecessor per row: pred_ids [...]; cand_ids / unary [..., K];
        hidden [..., hidden] -> [..., K] float32."""
        wh = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))  # [..., rank]
        gate = rows_of(self.predecessor_codebook, pred_ids) * wh  # [..., rank]
        return unary.float() + gather_dot(gate, self.successor_codebook, cand_ids)  # [..., K]

    def edge_scores(self, cand_ids: torch.Tensor, unary: torch.Tensor, hidden: torch.Tensor,
                    anchor_ids: torch.Tensor) -> torch.Tensor:
        """The whole lattice: cand_ids / unary [batch, L, K]; hidden [batch, L, hidden]; anchor_ids [batch] ->
        scores [batch, L, K (predecessor index), K (candidate index)] float32. Position 0's predecessor is the
        anchor for every row p."""
        b, length, k = cand_ids.shape
        pred = torch.cat([anchor_ids.reshape(-1, 1, 1).expand(-1, 1, k), cand_ids[:, :-1]], dim=1)  # [b, L, K]
        gate = self.predecessor_codebook[pred] * self.projected(hidden)[:, :, None]  # [b, L, K, rank]
        succ = self.successor_codebook[cand_ids]  # [b, L, K, rank]
        # unary + gate . succ as one batched product over the b * L positions (an einsum and an add cost two
        # more operations: a DFlash2 pass on a CPU is mostly per-operation cost, issue 38)
        unary_rows = unary.float().reshape(b * length, 1, k).expand(-1, k, -1)  # [b L, K (pred), K (cand)]
        scores = torch.baddbmm(unary_rows, gate.float().reshape(b * length, k, -1),
                               succ.float().reshape(b * length, k, -1).transpose(1, 2))
        return scores.view(b, length, k, k)


def rows_of(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """table [n, d] rows at ids [...] -> [..., d]: `table[ids]` as an embedding lookup, whose gather and
    gradient on a CPU cost about 60% of advanced indexing's (the selector's candidate rows: ~40k rows a step)."""
    return F.embedding(ids, table)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] -> [...] long: the lowest index holding the maximum (the walk kernel's tie rule), stated
    explicitly rather than relying on torch.argmax's tie order on every device."""
    k = x.shape[-1]
    idx = torch.arange(k, device=x.device).expand_as(x)
    return torch.where(x == x.max(-1, keepdim=True).values, idx, k).min(-1).values


def greedy_walk(scores: torch.Tensor, cand_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [batch, L, K, K]; cand_ids [batch, L, K] -> (tokens [batch, L], indices [batch, L]). Step l picks
    the best edge out of the candidate chosen at l - 1 (row 0 at l = 0, where all rows hold the anchor's edges);
    ties go to the lowest candidate index."""
    b, length, k = cand_ids.shape
    if scores.device.type == "cpu":  # the lattice is small (L x K x K a row): walk it in Python, not ~10 ops a step
        lattice = scores.tolist()
        picks = []
        for row in lattice:
            prev, path = 0, []
            for edges in row:  # edges[p] = the K scores out of predecessor p
                out = edges[prev]
                prev = out.index(max(out))  # the lowest index holding the maximum
                path.append(prev)
            picks.append(path)
        idx = torch.tensor(picks, dtype=torch.long).reshape(b, length)
    else:
        rows = torch.arange(b, device=scores.device)
        prev = torch.zeros(b, dtype=torch.long, device=scores.device)
        steps = []
        for step in range(length):
            row = scores[rows, step, prev]  # [b, K]
            prev = first_argmax(row)
            steps.append(prev)
        idx = torch.stack(steps, dim=1)
    return cand_ids.gather(2, idx[..., None])[..., 0], idx


def sampled_walk(scores: torch.Tensor, cand_ids: torch.Tensor, temperature: float, uniforms: torch.Tensor,
                 vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [batch, L, K, K]; cand_ids [batch, L, K] (distinct per position); temperature > 0; uniforms
    [batch, L] in [0, 1) -> (tokens [batch, L], q [batch, L, vocab] float32). Step l draws from
    softmax(scores[prev, :] / T) by inverse CDF with uniforms[:, l]; q[:, l] is that distribution on the
    candidates' token ids and zero elsewhere, i.e. the exact law of token l given the drafted tokens before it."""
    b, length, k = cand_ids.shape
    dev = scores.device
    rows = torch.arange(b, device=dev)
    prev = torch.zeros(b, dtype=torch.long, device=dev)
    uniforms = uniforms.to(dev).float()
    q = torch.zeros(b, length, vocab_size, dtype=torch.float32, device=dev)
    picks = []
    for step in range(length):
        probs = torch.softmax(scores[rows, step, prev].float() / float(temperature), dim=-1)  # [b, K]
        prev = inverse_cdf(probs, uniforms[:, step])
        q[:, step].scatter_(1, cand_ids[:, step], probs)
        picks.append(prev)
    idx = torch.stack(picks, dim=1)
    return cand_ids.gather(2, idx[..., None])[..., 0], q


# ---- training ---------------------------------------------------------------------------------------------
@dataclass
class SelectorLossOutput:
    loss: torch.Tensor  # scalar, differentiable: alpha_selector x the weighted mean K-way cross-entropy to the label
    ce: torch.Tensor  # the weighted mean cross-entropy to the gold token (detached), whichever the label
    recall: torch.Tensor  # share of valid positions whose gold token is among the unary top-K
    selector_accuracy: torch.Tensor  # share where the best edge out of the gold predecessor (true top-K) is gold
    unary_accuracy: torch.Tensor  # share where the unary top-1 is gold (what DFlash alone would draft)
    lift: torch.Tensor  # selector_accuracy - unary_accuracy
    # Mean over supervised positions of the total variation between the selector's T=1 softmax over the loss
    # candidates and the target's distribution over them; None without the target's hidden states.
    tv: torch.Tensor | None = None

    def metrics(self) -> dict[str, float]:
        out = {"selector_ce": float(self.ce), "candidate_recall": float(self.recall),
               "selector_accuracy": float(self.selector_accuracy), "unary_accuracy": float(self.unary_accuracy),
               "selector_lift": float(self.lift)}
        return out if self.tv is None else out | {"selector_tv": float(self.tv)}


def candidate_distribution(target_hidden: torch.Tensor, target_head: torch.Tensor,
                           cand_ids: torch.Tensor) -> torch.Tensor:
    """The target's distribution over K candidates: target_hidden [..., hidden_t] (its last, final-norm hidden
    state at the position that predicts the draft token), target_head [vocab, hidden_t] (its LM head),
    cand_ids [..., K] target ids -> softmax over K of hidden . head[id] at T=1 [..., K] float32, no gradient.
    The logits are the raw head products, as pdraft.train.losses takes the target's distribution for TV."""
    with torch.no_grad():
        logits = gather_dot(target_hidden.float(), target_head, cand_ids)  # [..., K]
        return torch.softmax(logits, dim=-1)


def selector_loss(selector: CandidateSelector, logits: torch.Tensor, hidden: torch.Tensor, target_ids: torch.Tensor,
                  prev_ids: torch.Tensor, valid: torch.Tensor, *, alpha: float, output_multiplier: float = 1.0,
                  softcap: float | None = None, weights: torch.Tensor | None = None,
                  head_weight: torch.Tensor | None = None, vocab: torch.Tensor | None = None,
                  target: str = "token", target_hidden: torch.Tensor | None = None,
                  target_head: torch.Tensor | None = None,
                  candidates: tuple[torch.Tensor, torch.Tensor] | None = None) -> SelectorLossOutput:
    """The selector term. logits [..., vocab] (the drafter's LM-head logits per draft position); hidden
    [..., hidden]; target_ids / prev_ids [...] the gold token and its gold predecessor (the anchor at the first
    position); valid [...] bool; weights [...] per-position weights (the DFlash decay; None = 1).

    The loss candidate set is the unary top-K, except that where the gold token is missing it replaces the
    K-th (weakest) candidate, so the cross-entropy always has a target and stays K-way; the metrics use the
    true top-K. Gradients reach the selector and, through the unary scores, the backbone. With `head_weight`
    ([vocab, hidden], the LM head `logits` came from, computed without gradient) the K + 1 unary scores that
    need a gradient are recomputed as hidden . W[id]: the same numbers and gradient as through the whole
    vocabulary's logits, without a [positions, vocab] backward (it was a fifth of a DFlash2 CPU step).

    With a draft vocabulary, `vocab` [V_d] holds the target id of every draft id: `logits` and `head_weight` are
    over the draft vocabulary, the candidates and the codebooks over target ids (what decoding walks), and a
    position whose gold token lies outside the draft vocabulary (which the drafter can never draft) leaves the
    loss (its recall and accuracies count as misses).

    `target` is the label (SELECTOR_TARGETS): "token", the gold token's index among the loss candidates, or
    "distribution", the target's own distribution over them (`candidate_distribution` of `target_hidden`
    [..., hidden_t], aligned with `target_ids`, and `target_head` [vocab, hidden_t]), as a soft-label
    cross-entropy with the same weights. Given the target's hidden states, either label also reports `tv`.

    `candidates` (ids, unary) [..., K] each, as `unary_candidates` gives them, stand in for `logits` (then None)
    when the caller formed them slice by slice; `head_weight` must come with them."""
    if target not in SELECTOR_TARGETS:
        raise PdraftError(f"selector target must be one of {', '.join(SELECTOR_TARGETS)}, got {target!r}")
    if target == "distribution" and (target_hidden is None or target_head is None):
        raise PdraftError("the selector's distribution target needs the target's last hidden states and LM head")
    if candidates is None and logits is None or candidates is not None and head_weight is None:
        raise ValueError("selector_loss takes the logits, or the candidates with the head weight")
    k = selector.top_k
    local, unary = candidates if candidates is not None else \
        unary_candidates(logits, k, output_multiplier, softcap)  # [..., K] ids into the head's rows
    ids = local if vocab is None else vocab[local]  # [..., K] target ids
    if head_weight is not None:
        def scores_of(cand):  # [..., c] head rows -> unary [..., c], differentiable in hidden
            raw = gather_dot(hidden.float(), head_weight, cand)
            return transform_unary(raw, output_multiplier, softcap)

        unary = scores_of(local)
    gold = target_ids[..., None]
    supervised = valid  # the positions the cross-entropy is taken over
    if vocab is None:
        gold_local = gold
    else:  # the gold token's draft id; -1 where it is not drafted
        to_draft = torch.full((selector.predecessor_codebook.shape[0],), -1, dtype=torch.long, device=vocab.device)
        to_draft.index_copy_(0, vocab, torch.arange(len(vocab), device=vocab.device))
        gold_local = to_draft[gold]
        supervised = valid & (gold_local[..., 0] >= 0)
        gold_local = gold_local.clamp_min(0)  # a stand-in row for the positions left out of the loss
    hit = ids == gold  # [..., K]
    in_topk = hit.any(-1)
    with torch.no_grad():
        uni_ok = ids[..., 0] == target_ids
    gold_unary = (transform_unary(logits.gather(-1, gold_local), output_multiplier, softcap) if head_weight is None
                  else scores_of(gold_local))  # [..., 1]
    loss_ids = torch.where(in_topk[..., None], ids, torch.cat([ids[..., :-1], gold], dim=-1))
    loss_unary = torch.where(in_topk[..., None], unary, torch.cat([unary[..., :-1], gold_unary], dim=-1))
    label = torch.where(in_topk, hit.int().argmax(-1), torch.full_like(target_ids, k - 1))
    scores = selector.pair_scores(prev_ids, loss_ids, loss_unary, hidden)  # [..., K]
    with torch.no_grad():  # where the gold token is among the top K the loss's edges are the served ones; where
        # it is not, the selector cannot pick it: no second lattice of the served candidates is needed
        sel_ok = in_topk & (ids.gather(-1, first_argmax(scores)[..., None])[..., 0] == target_ids)
    ce = F.cross_entropy(scores.reshape(-1, k), label.reshape(-1), reduction="none").view(label.shape)
    w = supervised.float() if weights is None else supervised.float() * weights.float()
    ce_mean = (ce * w).sum() / w.sum().clamp_min(1e-12)
    term, tv = ce_mean, None
    if target_hidden is not None and target_head is not None:
        p_t = candidate_distribution(target_hidden, target_head, loss_ids)  # [..., K]
        with torch.no_grad():
            gap = 0.5 * (torch.softmax(scores.detach(), dim=-1) - p_t).abs().sum(-1)  # [...]
            tv = (gap * supervised).sum() / supervised.float().sum().clamp_min(1.0)
        if target == "distribution":
            soft = -(p_t * torch.log_softmax(scores, dim=-1)).sum(-1)  # [...]
            term = (soft * w).sum() / w.sum().clamp_min(1e-12)
    n = valid.float().sum().clamp_min(1.0)

    def share(x):
        return (x & valid).float().sum() / n

    sel_acc, uni_acc = share(sel_ok), share(uni_ok)
    return SelectorLossOutput(loss=float(alpha) * term, ce=ce_mean.detach(), recall=share(in_topk),
                              selector_accuracy=sel_acc, unary_accuracy=uni_acc, lift=sel_acc - uni_acc, tv=tv)


__all__ = ["transform_unary", "unary_candidates", "CandidateSelector", "first_argmax", "greedy_walk", "sampled_walk",
           "SelectorLossOutput", "candidate_distribution", "selector_loss"]
