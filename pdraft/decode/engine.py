"""`generate(...)`: lossless speculative decoding of a batch of prompts with a drafter of any registered family
(DFlash, DSpark, DFlash2, EAGLE-3; pdraft.models.families) and a Hugging Face causal-LM target; with
`drafter=None` the target decodes alone through the very same loop (gamma = 0: each round verifies only the anchor), which is the
baseline every speedup is measured against. A run's settings come resolved and checked in one DecodeSettings
(pdraft.decode.settings). The round is a composition of parts chosen once, when the run starts:

    backend         pdraft.decode.backend       reference eager, static caches eager, or static compiled
                                                (decode.compile: auto | on | off)
    proposer        pdraft.decode.proposer      the drafter proposes gamma tokens per request (one pass, or a
                                                chain of gamma for an autoregressive drafter)
    policy          pdraft.policies             how many each request verifies (a registered policy), and what
                                                it learns from the round once it is accepted
    verifier        pdraft.decode.target_runner one target pass over [anchor, drafts], packed or padded,
                    pdraft.decode.static_target capturing the drafter's layers (reference / static cache)
    acceptance      pdraft.decode.acceptance    keep a prefix of the drafts plus one target token
    commit          verifier.commit, proposer.extend, _Book.commit: roll the target KV cache back to the
                    committed length (the static cache: by length alone), extend the drafter's context, append
                    the tokens
    tree            pdraft.decode.tree_round    with DecodeSettings.tree: the same round on a tree of
                                                candidates from one parallel pass (propose_tree, verify_tree,
                                                accept_tree, commit_tree); the kept path goes on as a chain

Sampled decoding draws every random number from the request's own stream (pdraft.streams): seeded from
(seed, index of the request in the call) or from `seeds`, so a request's output does not depend on its batch.

Continuous batching (`concurrency=C`, the static path only): the rows are C slots fed from a queue of the
requests. At the top of each round every free slot takes the next request: its prompt is prefilled into that
row of the target's static cache from position 0 (StaticVerifier.refill), the drafter builds the new request's
context in a one-row state placed in that row (Proposer.refill: the context cache's row, EAGLE-3's own KV row),
the book's row and the row's random stream are the new request's, and its first token comes from the prefill
with the one draw the batched loop spends on it; the other rows keep decoding. A request therefore draws the
same numbers whatever C is, and with full verification its output does not depend on C. Prefills are timed
apart (RoundRecord.prefill_s) and left out of the rounds' times with the first token each gives. The reference
DynamicCache path cannot rewrite a row in place, so it refuses `concurrency` in one line.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from pdraft.metrics import RoundRecord, Summary, summarize
from pdraft.decode import backend as backends
from pdraft.decode.acceptance import accept
from pdraft.policies.base import VerifyConfig, VerifyPolicy, make_policy
from pdraft.decode.proposer import Proposer
from pdraft.decode.settings import DecodeSettings
from pdraft.decode.tree_round import TreeRound
from pdraft.models.api import Proposal
from pdraft.streams import Streams, request_seeds
from pdraft.errors import PdraftError
from pdraft.models.sampling import is_greedy


@dataclass
class RoundEvent:
    """Passed to the `on_round` callback after every round, for streaming."""

    round: int
    new_tokens: list[list[int]]  # per row, the tokens committed this round (empty once finished); a row is a
    # request, or under continuous batching a slot (records[i].request says which request)
    records: list[RoundRecord]  # one per request that took part in the round


@dataclass
class GenerateResult:
    output_ids: list[list[int]]  # per request, the generated tokens (prompt excluded)
    finish_reasons: list[str]  # per request: "eos", "length" (max_new_tokens) or "context"
    records: list[RoundRecord] = field(default_factory=list)
    backend: str = ""  # what ran: reference eager, static eager, static compiled (pdraft.decode.backend)
    compile_s: float = 0.0  # compilation during this call, taken out of the rounds' times (compiled code is
    # kept for the process and serves every later call, so it is a one-off cost, reported here)
    refills: int = 0  # continuous batching: slots taken by a request after an earlier one left them

    def summary(self) -> Summary:
        return summarize(self.records)


def check_prompts(target_config, prompts) -> None:
    """Every mistake a user can make with the prompts, as a one-line PdraftError."""
    cfg = target_config
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


def generate(
    target: torch.nn.Module,
    drafter,  # pdraft.models.api.Drafter, already attached to `target`; None = target alone
    prompts: Sequence[Sequence[int]],
    settings: DecodeSettings | None = None,  # None: DecodeSettings(**fields)
    *,
    verify: VerifyConfig | None = None,  # the policy with the drafter's files (policy.build_verify); None: settings'
    eos_token_ids: Sequence[int] = (),
    seeds: Sequence[int] | None = None,  # one stream seed per prompt; None: from (settings.seed, index)
    on_round: Callable[[RoundEvent], None] | None = None,
    concurrency: int | None = None,  # None: every prompt in one batch; C: continuous batching over C slots
    **fields,  # DecodeSettings fields (gamma, sampling, max_new_tokens, seed, denoise_steps, ...) to set or change
) -> GenerateResult:
    settings = DecodeSettings(**fields) if settings is None else settings.replace(**fields) if fields else settings
    verify = verify or settings.verify_config()
    check_prompts(target.config, prompts)
    gamma = settings.check_drafter(target.config, drafter, verify)
    if seeds is not None and len(seeds) != len(prompts):
        raise PdraftError(f"{len(seeds)} seeds for {len(prompts)} prompts: give one per prompt")
    if drafter is not None and settings.fused_kernels is not None:
        drafter.set_fused_kernels(settings.fused_kernels)  # takes effect on CUDA only
    seeds = list(seeds) if seeds is not None else request_seeds(settings.seed, 0, len(prompts))
    backend = backends.resolve(settings.compile, target)
    if concurrency is not None:
        if int(concurrency) < 1:
            raise PdraftError(f"concurrency must be at least 1, got {concurrency}")
        if not backend.static:  # a DynamicCache row cannot be rewritten in place: refused, never emulated
            raise PdraftError(f"continuous batching (concurrency {concurrency}) needs the static decode path; "
                              f"this run is on the reference path ({backend.why})",
                              hint="decode.compile auto or on, with a target the static path covers")
    slots = len(prompts) if concurrency is None else min(int(concurrency), len(prompts))
    tree = TreeRound(*settings.tree) if settings.tree is not None and drafter is not None else None
    verifier = backends.target_runner(target, drafter.config.target_layer_ids if drafter is not None else None,
                                      backend, packed=verify.packed,
                                      room=settings.max_new_tokens + (tree.nodes if tree is not None else 0))
    book = _Book(prompts, settings.max_new_tokens, verifier.max_positions, set(eos_token_ids),
                 slots=None if concurrency is None else slots)
    capacity = min(max(len(p) for p in prompts) + settings.max_new_tokens, verifier.max_positions)
    proposer = (Proposer(drafter, slots, gamma, capacity=capacity, propose=backends.drafter_pass(drafter, backend),
                         argmax_drafts=settings.draft_sample_method == "greedy") if drafter is not None else None)
    policy = make_policy(verify)
    with torch.no_grad():
        if concurrency is None:
            result = _decode(book, proposer, policy, verifier, settings.sampling, Streams(seeds), on_round,
                             tree=tree)
        else:
            verifier.reserve(slots, max(len(p) for p in prompts))
            result = _decode(book, proposer, policy, verifier, settings.sampling, Streams(seeds[:slots]), on_round,
                             queue=_Queue(prompts, seeds), tree=tree)
    result.backend = backend.name
    return result


def _decode(book: _Book, proposer: Proposer | None, policy: VerifyPolicy, verifier, sampling, streams: Streams,
            on_round, queue: _Queue | None = None, tree: TreeRound | None = None) -> GenerateResult:
    """The decode loop. Without a queue every request is prefilled at once; with one (continuous batching) the
    book's rows are slots: at the top of each round every free slot takes the next request (`_refill`). Those
    prefills are timed apart (RoundRecord.prefill_s) and left out of the round's time, with the first token
    each one yields, as every prefill is (the batched one here, transformers generate()'s in bench): decode
    metrics measure decoding, and the prefill's share is reported beside them."""
    if queue is None:
        ctx = verifier.prefill(book.prompts)  # hidden [batch, T, F] of the prompts, all but their last token
        if proposer is not None:
            proposer.prefill(ctx.hidden, ctx.positions, ctx.valid, ctx.ids)
    result = GenerateResult(book.outputs, book.reasons)
    for round_no in itertools.count():
        t0, c0 = time.perf_counter(), backends.compile_clock()
        first: dict[int, list[int]] = {}  # slot -> the first token of the request it took this round
        done: list[RoundRecord] = []  # requests that took a slot this round and finished on their first token
        if queue is not None:
            _refill(book, queue, proposer, verifier, sampling, streams, round_no, first, done)
        t_draft, c_draft = time.perf_counter(), backends.compile_clock()
        prefill_s = t_draft - t0 - (c_draft - c0) if queue is not None else 0.0
        caps = book.caps()  # [batch] most drafts each request may verify; -1 = finished
        running = (caps >= 0).nonzero().flatten()  # [running]
        if running.numel() == 0:
            if done:
                _finish_round(result, done, t0, c0, on_round, round_no, book, first, prefill_s=prefill_s)
            break
        # The first token of every request comes from the target alone, as vLLM and SGLang take it from the
        # prefill: the anchor is still the last prompt token, a position drafters are never trained to draft
        # from (training anchors are response tokens), so drafting there is a round thrown away. (Continuous
        # batching takes it inside the refill.)
        gamma = proposer.gamma if proposer is not None and (round_no > 0 or queue is not None) else 0
        drafted = tree.nodes if tree is not None and gamma else gamma  # a tree draws one uniform per node
        # [batch, 2*drafted+1]: the drafts' uniforms, then the acceptance tests' and the correction/bonus draw's
        u = None if is_greedy(sampling) else streams.draw(running, 2 * drafted + 1)
        p = (proposer.propose(running, book.anchors, book.anchor_pos, sampling, None if u is None else u[:, :gamma])
             if gamma and tree is None else None)  # tokens [batch, gamma], probs [batch, gamma, vocab], confidence
        c1 = backends.compile_clock()
        draft_s = time.perf_counter() - t_draft - (c1 - c_draft)
        if tree is not None and gamma:  # a tree round: pdraft.decode.tree_round, the chain's steps on a tree
            o = tree.round(proposer, verifier, book, caps, running, gamma, sampling, u)
            p, lengths, drafts, logits, hidden, acc, keep = o.tree, o.lengths, o.drafts, o.logits, o.hidden, o.acc, o.keep
            draft_s, verify_s, accept_s, commit_s = draft_s + o.draft_s, o.verify_s, o.accept_s, o.commit_s
        else:
            lengths = policy.lengths(p, caps)  # [batch] l; -1 = finished
            width = max(int(lengths.max()), 0)
            drafts = p.tokens[:, :width] if p is not None else book.no_drafts  # [batch, L]
            t1 = time.perf_counter()
            logits, hidden = verifier.verify(book.anchors, book.anchor_pos, drafts, lengths)  # [batch, L+1, vocab|F]
            compiled = backends.compile_clock() - c0
            t2 = time.perf_counter()
            verify_s = t2 - t1 - (compiled - (c1 - c0))
            probs = p.probs[:, :width] if p is not None and p.probs is not None else None  # [batch, L, vocab]
            acc = accept(logits, drafts, probs, lengths.clamp(min=0), sampling,
                         None if u is None else u[:, gamma:])  # accepted [batch], next_token [batch]
            policy.observe(p, lengths, acc.accepted, verify_s)
            t3 = time.perf_counter()
            keep = verifier.commit(acc.accepted)  # [batch, L+1]: the anchor and the accepted drafts
            accept_s, commit_s = t3 - t2, time.perf_counter() - t3
        if proposer is not None:
            t4 = time.perf_counter()
            proposer.extend(hidden, keep, book.anchors, book.anchor_pos, drafts, acc.accepted)
            draft_s += time.perf_counter() - t4
        new = book.commit(drafts, acc.accepted, acc.next_token, lengths)  # per request, the tokens committed
        round_s = time.perf_counter() - t_draft - (backends.compile_clock() - c_draft)  # the refills left out
        conf = (p.confidence.tolist() if isinstance(p, Proposal) and p.confidence is not None
                else None)  # [batch][gamma]
        records = [RoundRecord(book.request[b], round_no, gamma, int(lengths[b]), int(acc.accepted[b]),
                               len(new[b]), draft_s, verify_s, round_s, conf[b] if conf is not None else None,
                               tree=tree.shape(b) if tree is not None and gamma else None,
                               accept_s=accept_s, commit_s=commit_s)
                   for b in range(len(new)) if lengths[b] >= 0]
        new = [first.get(b, []) + t for b, t in enumerate(new)]
        for r in done:  # every record of a round carries the round's times
            r.draft_s, r.verify_s, r.accept_s, r.commit_s = draft_s, verify_s, accept_s, commit_s
        _finish_round(result, done + records, t0, c0, on_round, round_no, book, first, new, round_s, prefill_s)
    if queue is not None:
        result.output_ids, result.finish_reasons, result.refills = queue.outputs, queue.reasons, queue.refills
    return result


def _finish_round(result: GenerateResult, records: list[RoundRecord], t0: float, c0: float, on_round, round_no,
                  book: _Book, first: dict, new: list | None = None, round_s: float | None = None,
                  prefill_s: float = 0.0) -> None:
    """Stamp the round's times on every record of it (summarize counts a round's time once per round number)."""
    compiled = backends.compile_clock() - c0
    round_s = 0.0 if round_s is None else round_s  # a round of refills alone: no decode time
    for r in records:
        r.round_s, r.prefill_s = round_s, prefill_s
    result.compile_s += compiled
    result.records.extend(records)
    if on_round is not None:
        on_round(RoundEvent(round_no, new if new is not None else [first.get(b, []) for b in range(book.slots)],
                            records))


class _Queue:
    """The requests of a continuous-batching run, taken in order; each keeps its own output and stream seed."""

    def __init__(self, prompts, seeds):
        self.prompts, self.seeds = prompts, list(seeds)
        self.next = 0
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.reasons: list[str] = ["" for _ in prompts]
        self.refills = 0  # slots taken by a request after an earlier request left them

    def __bool__(self) -> bool:
        return self.next < len(self.prompts)


def _refill(book: _Book, queue: _Queue, proposer: Proposer | None, verifier, sampling, streams: Streams,
            round_no: int, first: dict, done: list[RoundRecord]) -> None:
    """Every free slot takes the next request while there is one: its prompt is prefilled into that row of the
    target's cache (StaticVerifier.refill), the drafter's context row restarts from it (Proposer.refill), the
    row draws from the request's own stream, and its first token is taken from the prefill's logits with one
    draw of that stream, as the batched loop takes it in its first round. A request that finishes on that
    token (EOS, a budget of one) leaves the slot at once to the next."""
    for slot in range(book.slots):
        while queue and book.free(slot):
            req = queue.next
            queue.next += 1
            queue.refills += book.request[slot] >= 0
            prompt = queue.prompts[req]
            streams.reseed(slot, queue.seeds[req])
            logits, feats = verifier.refill(slot, prompt)  # logits [vocab], features [n, F] | None
            u = None if is_greedy(sampling) else streams.draw(torch.tensor([slot]), 1)[slot:slot + 1]  # [1, 1]
            acc = accept(logits.view(1, 1, -1), book.no_drafts[:1], None, torch.zeros(1, dtype=torch.long),
                         sampling, u)
            if proposer is not None:
                proposer.refill(slot, feats, torch.tensor(list(prompt), dtype=torch.long))
            token = int(acc.next_token[0])
            book.start(slot, req, prompt, queue.outputs[req], queue.reasons, token)
            first[slot] = [token]
            if book.free(slot):  # finished on its first token: one record, and the slot is free again
                done.append(RoundRecord(req, round_no, 0, 0, 0, 0))
                first.pop(slot)


class _Book:
    """Per-row bookkeeping of the decode loop: outputs, anchors, budgets, finish reasons. A row holds one request
    for a whole run, or (continuous batching, `slots` given) one request after another: `request[b]` is the
    one it holds now (-1: none yet), and `start` hands it the next."""

    def __init__(self, prompts, max_new_tokens: int, context: int, eos: set[int], slots: int | None = None):
        self.prompts = prompts
        rows = len(prompts) if slots is None else slots
        self.slots = rows
        self.request = list(range(rows)) if slots is None else [-1] * rows
        self.lengths = [len(p) for p in prompts] if slots is None else [1] * rows  # committed tokens, prompt included
        self.outputs: list[list[int]] = [[] for _ in range(rows)]
        self.reasons: list[str] = ["" if slots is None else "free" for _ in range(rows)]
        self.by_request: list[str] | None = None  # continuous batching: the finish reasons, by request
        self.anchors = torch.tensor([int(p[-1]) for p in prompts] if slots is None else [0] * rows,
                                    dtype=torch.long)  # [batch]
        self.anchor_pos = torch.tensor([n - 1 for n in self.lengths], dtype=torch.long)  # [batch]
        self.no_drafts = torch.zeros(rows, 0, dtype=torch.long)  # [batch, 0]: a round without drafts
        self.max_new, self.context, self.eos = max_new_tokens, context, eos

    def free(self, b: int) -> bool:
        return bool(self.reasons[b])

    def start(self, b: int, request: int, prompt, output: list[int], reasons: list[str], token: int) -> None:
        """Row b takes `request` (its prompt prefilled, `token` its first token); `output` is its output list."""
        self.request[b], self.outputs[b], self.by_request = request, output, reasons
        self.reasons[b], self.lengths[b] = "", len(prompt)
        self._append(b, [token])

    def caps(self) -> torch.Tensor:
        """Tokens a request may still commit minus one (the target's own token): a cap on verified drafts.
        It depends only on lengths, never on drafted tokens, so capping keeps decoding lossless."""
        caps = [min(self.max_new - len(o), self.context - n) - 1 if not r else -1
                for o, n, r in zip(self.outputs, self.lengths, self.reasons)]
        return torch.tensor(caps, dtype=torch.long)

    def commit(self, drafts, accepted, next_token, lengths) -> list[list[int]]:
        rows, acc, nxt = drafts.tolist(), accepted.tolist(), next_token.tolist()
        new: list[list[int]] = []
        for b in range(self.slots):
            if int(lengths[b]) < 0:
                new.append([])
                continue
            new.append(self._append(b, rows[b][: acc[b]] + [nxt[b]]))
        return new

    def _append(self, b: int, tokens: list[int]) -> list[int]:
        """Append a round's tokens to row b's output (cut after a stop token); returns what was appended."""
        out = self.outputs[b]
        for i, tok in enumerate(tokens):
            if tok in self.eos:
                tokens = tokens[: i + 1]
                self._finish(b, "eos")
                break
        out.extend(tokens)
        self.lengths[b] += len(tokens)
        self.anchors[b] = tokens[-1]
        self.anchor_pos[b] = self.lengths[b] - 1
        if not self.reasons[b] and len(out) >= self.max_new:
            self._finish(b, "length")
        elif not self.reasons[b] and self.lengths[b] >= self.context:
            self._finish(b, "context")
        return tokens

    def _finish(self, b: int, reason: str) -> None:
        self.reasons[b] = reason
        if self.by_request is not None:
            self.by_request[self.request[b]] = reason
