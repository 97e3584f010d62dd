"""`generate(...)`: lossless speculative decoding of a batch of prompts with a parallel drafter (DFlash or
DSpark) and a Hugging Face causal-LM target; with `drafter=None` the target decodes alone through the very
same loop (gamma = 0: each round verifies only the anchor), which is the baseline every speedup is measured
against. One round: the drafter proposes gamma tokens in one pass; the verification policy picks how many
each request sends to the target (full / threshold / scheduler); one target pass verifies [anchor, drafts]
and captures the drafter's layers; acceptance keeps a prefix plus one target token; the target KV cache is
rolled back to the committed length and the drafter's context is extended with the new tokens' features.
Sampled decoding draws every random number from the request's own stream (pdraft.streams): seeded from
(seed, index of the request in the call) or from `seeds`, so a request's output does not depend on its batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from pdraft.metrics import RoundRecord, Summary, summarize
from pdraft.decode.acceptance import accept
from pdraft.streams import Streams, request_seeds
from pdraft.models.sampling import check_params, is_greedy
from pdraft.decode.scheduler import VerifyConfig, verify_lengths
from pdraft.decode.target_runner import TargetRunner
from pdraft.errors import PdraftError
from pdraft.models.api import SamplingParams
from pdraft.target.layers import check_layer_ids


@dataclass
class RoundEvent:
    """Passed to the `on_round` callback after every round, for streaming."""

    round: int
    new_tokens: list[list[int]]  # per request, the tokens committed this round (empty once finished)
    records: list[RoundRecord]  # one per request that took part in the round


@dataclass
class GenerateResult:
    output_ids: list[list[int]]  # per request, the generated tokens (prompt excluded)
    finish_reasons: list[str]  # per request: "eos", "length" (max_new_tokens) or "context"
    records: list[RoundRecord] = field(default_factory=list)
    prefill_s: float = 0.0

    def summary(self) -> Summary:
        return summarize(self.records)


def check_inputs(target, drafter, prompts, gamma: int, denoise_steps: int | None) -> None:
    """Every mistake a user can make with these arguments, as a one-line PdraftError."""
    cfg = target.config
    context = int(getattr(cfg, "max_position_embeddings", 1 << 30))
    if not prompts:
        raise PdraftError("no prompts to decode")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise PdraftError(f"prompt {i} is empty: give at least one token")
        if len(p) >= context:
            raise PdraftError(
                f"prompt {i} has {len(p)} tokens but the target's context is {context} tokens "
                "(max_position_embeddings): no room left to generate"
            )
        bad = [t for t in p if not 0 <= int(t) < cfg.vocab_size]
        if bad:
            raise PdraftError(f"prompt {i} has token ids outside the target vocabulary (0..{cfg.vocab_size - 1}): "
                              f"{bad[:5]}")
    if drafter is None:
        return
    dcfg = drafter.config
    if int(dcfg.vocab_size) != int(cfg.vocab_size):
        raise PdraftError(f"drafter was built for another target: vocabulary {dcfg.vocab_size} vs the target's "
                          f"{cfg.vocab_size}")
    hidden = int(getattr(dcfg, "target_hidden_size", None) or dcfg.hidden_size)
    if hidden != int(cfg.hidden_size):
        raise PdraftError(f"drafter was built for another target: hidden size {hidden} vs the target's "
                          f"{cfg.hidden_size}")
    layers = getattr(dcfg, "num_target_layers", None)
    if layers is not None and int(layers) != int(cfg.num_hidden_layers):
        raise PdraftError(f"drafter was built for another target: {layers} target layers vs the target's "
                          f"{cfg.num_hidden_layers}")
    try:
        check_layer_ids(dcfg.target_layer_ids, int(cfg.num_hidden_layers))
    except PdraftError as e:
        raise PdraftError(f"drafter was built for another target: {e.message}") from None
    if not 1 <= gamma <= drafter.max_gamma():
        raise PdraftError(f"gamma {gamma} is out of range: this drafter drafts 1..{drafter.max_gamma()} tokens")
    trained = int(getattr(dcfg, "denoise_steps", 1))
    if denoise_steps is not None and int(denoise_steps) != trained:
        raise PdraftError(
            f"this drafter was trained with {trained} denoise step(s) and must be decoded with {trained}: with "
            f"{denoise_steps} it refines blocks it never learned to refine, and acceptance collapses"
        )


def generate(
    target: torch.nn.Module,
    drafter,  # pdraft.models.api.Drafter, already attached to `target`; None = target alone
    prompts: Sequence[Sequence[int]],
    *,
    gamma: int | None = None,  # default: drafter.max_gamma()
    sampling: SamplingParams | None = None,  # None or temperature 0 = greedy
    max_new_tokens: int = 128,
    eos_token_ids: Sequence[int] = (),
    seed: int = 0,  # request i draws from a stream seeded from (seed, i) ...
    seeds: Sequence[int] | None = None,  # ... unless given its own stream seed here (one per prompt)
    verify: VerifyConfig | None = None,
    denoise_steps: int | None = None,  # if given, must equal drafter.config.denoise_steps
    on_round: Callable[[RoundEvent], None] | None = None,
) -> GenerateResult:
    verify = verify or VerifyConfig()
    gamma = 0 if drafter is None else int(gamma if gamma is not None else drafter.max_gamma())
    check_inputs(target, drafter, prompts, gamma, denoise_steps)
    check_params(sampling)
    if seeds is not None and len(seeds) != len(prompts):
        raise PdraftError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one per prompt")
    if max_new_tokens < 1:
        raise PdraftError(f"max-new-tokens must be >= 1, got {max_new_tokens}")
    if verify.mode != "full" and drafter is not None and not getattr(drafter.config, "has_confidence", False):
        raise PdraftError(f"verification mode {verify.mode!r} needs a drafter with a confidence head (DSpark)")
    with torch.no_grad():
        return _decode(target, drafter, prompts, gamma, sampling, max_new_tokens, set(eos_token_ids),
                       Streams(seeds if seeds is not None else request_seeds(seed, 0, len(prompts))), verify,
                       on_round)


def _decode(target, drafter, prompts, gamma, sampling, max_new_tokens, eos, streams, verify, on_round):
    batch = len(prompts)
    runner = TargetRunner(target, drafter.config.target_layer_ids if drafter is not None else None,
                          packed=verify.packed)
    book = _Book(prompts, max_new_tokens, runner.max_positions, eos)
    start = time.perf_counter()
    state = drafter.new_state(batch) if drafter is not None else None
    ctx = runner.prefill(prompts)
    if drafter is not None and ctx.hidden.shape[1] > 0:
        drafter.extend_context(state, ctx.hidden, ctx.positions, ctx.valid)
    result = GenerateResult(book.outputs, book.reasons, prefill_s=time.perf_counter() - start)
    empty = torch.zeros(batch, 0, dtype=torch.long)
    live = torch.arange(batch)  # the requests the drafter's state holds, in batch order
    for round_no in itertools.count():
        caps = book.caps()  # [batch] most drafts each request may verify; -1 = finished
        running = (caps >= 0).nonzero().flatten()
        if running.numel() == 0:
            break
        t0 = time.perf_counter()
        # The first token of every request comes from the target alone, as vLLM and SGLang take it from the
        # prefill: the anchor is still the last prompt token, a position drafters are never trained to draft
        # from (training anchors are response tokens), so drafting there is a round thrown away.
        drafting = drafter is not None and round_no > 0
        step_gamma = gamma if drafting else 0
        # [batch, 2*gamma+1]: the drafts' uniforms, then the acceptance tests' and the correction/bonus draw's
        u = None if is_greedy(sampling) else streams.draw(running, 2 * step_gamma + 1)
        p = None
        if drafting:
            if running.numel() < live.numel():  # requests finished: the drafter stops drafting for them
                state = state.select(torch.searchsorted(live, running))
                live = running
            p = drafter.propose(state, book.anchors[live], book.anchor_pos[live], gamma, sampling,
                                None if u is None else u[live, :gamma])
            if live.numel() < batch:
                p = p.scatter(live, batch)
        draft_s = time.perf_counter() - t0
        lengths = verify_lengths(verify, step_gamma, p.confidence if p else None, caps)  # [batch]
        width = max(int(lengths.max()), 0)
        drafts = p.tokens[:, :width] if p else empty  # [batch, L]
        t1 = time.perf_counter()
        logits, hidden = runner.verify(book.anchors, book.anchor_pos, drafts, lengths)  # [batch, L+1, vocab]
        verify_s = time.perf_counter() - t1
        probs = p.probs[:, :width] if p is not None and p.probs is not None else None
        acc = accept(logits, drafts, probs, lengths.clamp(min=0), sampling,
                     None if u is None else u[:, step_gamma:])
        keep = runner.commit(acc.accepted)  # [batch, L+1]: the anchor and the accepted drafts
        if drafter is not None:
            t2 = time.perf_counter()
            t = int(acc.accepted.max()) + 1
            positions = book.anchor_pos[live].unsqueeze(1) + torch.arange(t)  # [live, t]
            drafter.extend_context(state, hidden[live, :t], positions, keep[live, :t])
            draft_s += time.perf_counter() - t2
        new = book.commit(drafts, acc.accepted, acc.next_token, lengths)
        round_s = time.perf_counter() - t0
        conf = p.confidence.tolist() if p is not None and p.confidence is not None else None  # [batch][gamma]
        records = [RoundRecord(b, round_no, step_gamma, int(lengths[b]), int(acc.accepted[b]), len(new[b]),
                               draft_s, verify_s, round_s, conf[b] if conf is not None else None)
                   for b in range(batch) if lengths[b] >= 0]
        result.records.extend(records)
        if on_round is not None:
            on_round(RoundEvent(round_no, new, records))
    return result


class _Book:
    """Per-request bookkeeping of the decode loop: outputs, anchors, budgets, finish reasons."""

    def __init__(self, prompts, max_new_tokens: int, context: int, eos: set[int]):
        self.lengths = [len(p) for p in prompts]  # committed tokens, prompt included
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.reasons: list[str] = ["" for _ in prompts]
        self.anchors = torch.tensor([int(p[-1]) for p in prompts], dtype=torch.long)  # [batch]
        self.anchor_pos = torch.tensor([n - 1 for n in self.lengths], dtype=torch.long)  # [batch]
        self.max_new, self.context, self.eos = max_new_tokens, context, eos

    def caps(self) -> torch.Tensor:
        """Tokens a request may still commit minus one (the target's own token): a cap on verified drafts.
        It depends only on lengths, never on drafted tokens, so capping keeps decoding lossless."""
        caps = [min(self.max_new - len(o), self.context - n) - 1 if not r else -1
                for o, n, r in zip(self.outputs, self.lengths, self.reasons)]
        return torch.tensor(caps, dtype=torch.long)

    def commit(self, drafts, accepted, next_token, lengths) -> list[list[int]]:
        rows, acc, nxt = drafts.tolist(), accepted.tolist(), next_token.tolist()
        new: list[list[int]] = []
        for b, out in enumerate(self.outputs):
            if int(lengths[b]) < 0:
                new.append([])
                continue
            tokens = rows[b][: acc[b]] + [nxt[b]]
            for i, tok in enumerate(tokens):
                if tok in self.eos:
                    tokens = tokens[: i + 1]
                    self.reasons[b] = "eos"
                    break
            out.extend(tokens)
            self.lengths[b] += len(tokens)
            self.anchors[b] = tokens[-1]
            self.anchor_pos[b] = self.lengths[b] - 1
            if not self.reasons[b] and len(out) >= self.max_new:
                self.reasons[b] = "length"
            elif not self.reasons[b] and self.lengths[b] >= self.context:
                self.reasons[b] = "context"
            new.append(tokens)
        return new
