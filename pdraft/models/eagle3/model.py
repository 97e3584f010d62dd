"""The EAGLE-3 drafter (Li et al., NeurIPS 2025) as the engines run it: the autoregressive baseline beside the
parallel families. Its state is its own KV cache; drafting is a chain of gamma sequential passes per round.

Inputs, as vLLM pairs them (vllm/v1/spec_decode/llm_base_proposer.py `set_inputs_first_pass`: input ids shifted
by one, the next token in the last slot): the entry at position p reads the fused target features of p,
fc([h_low; h_mid; h_high]), and the embedding of the token at p + 1, at RoPE position p. An entry can only be
computed once the token after it is known, so the state keeps the features of committed tokens whose entry is
still *pending* (the last one always waits for the next anchor) with their own tokens (`extend_context`'s
`token_ids`). A proposal then runs:

  pass 1      every pending entry's key and value at once; these entries are the target's own and join the
              cache for good. Only the last one's output is read (-> draft 1), so only its query attends
              (causal over the cache) and only its row runs o_proj and the MLP
  pass k>1    one query per request at position anchor + k - 2: the previous pass's output before the final
              norm (vLLM's `hidden_prenorm`) and the embedding of draft k-1 -> draft k; its key and value are
              written past the committed length, so they are dropped by construction: the next round writes
              the target's entries for those positions over them (the cache rolls back with the target's)

so gamma drafts cost gamma passes. Drafts come from an LM head over `draft_vocab_size` tokens mapped into the
target vocabulary by `d2t` (target id = draft id + d2t[draft id], vLLM's `compute_logits`); `t2d` marks the
target ids drafted. `Proposal.probs` is the exact draft distribution in the target vocabulary, zero outside the
draft vocabulary, for the lossless rejection rule.

Training-time test (`forward_train`, EAGLE-3 paper section 3.2 and Figure 6): one causal pass computes every
real entry of a sequence (step 1 of every chain), then K - 1 steps unroll the chain of each anchor on the
drafter's own outputs, each step attending to the real entries up to the chain's root and to the chain's own
earlier steps, at the positions decoding uses, so training sees exactly the attention pattern a proposal runs.
The tokens fed are the sequence's (teacher forcing; a chain whose drafts diverge is rejected at that point
anyway). The reference trainers (EAGLE `traineagle3/cnets.py`, SpecForge `core/eagle3.py`) also shift the
step-0 mask by one key per step, which hides real context from later steps (questioned in SafeAILab/EAGLE issue
247); pdraft keeps the decode-time pattern."""

from __future__ import annotations

import math

import torch
from torch import nn

from pdraft.errors import PdraftError
from pdraft.models.api import Drafter, DraftState, Proposal, SamplingParams, TrainOutput
from pdraft.models.eagle3.config import Eagle3Config
from pdraft.models.eagle3.layer import Eagle3Layer
from pdraft.models.layers import RMSNorm, fast_linear, fused_pass
from pdraft.models.sampling import greedy_ids, is_greedy, probs_from_logits, sample, top_probability
from pdraft.models.vocab import check_vocab_map, choose_vocabulary, draft_vocabulary, register_vocab_buffers, vocab_ids

__all__ = ["Eagle3Drafter", "Eagle3State", "draft_vocabulary"]


class Eagle3State(DraftState):
    """The drafter's KV cache of committed entries ([batch, kv_heads, capacity, head_dim], entry j at position j,
    `lengths` real) and the pending committed tokens whose entry waits for the token after them."""

    def __init__(self, keys, values, lengths, pend_hidden, pend_ids, pend_pos, pend_count):
        super().__init__(keys=keys, values=values, lengths=lengths)
        self.pend_hidden = pend_hidden  # [batch, P, H] fused target features fc([h_low; h_mid; h_high])
        self.pend_ids = pend_ids  # [batch, P] long: the token at each pending position
        self.pend_pos = pend_pos  # [batch, P] long
        self.pend_count = pend_count  # [batch] long: pending entries of each request (left-aligned)

    def widen_pending(self, width: int) -> None:
        """Pending buffers at least `width` entries wide (zero-padded; never narrowed)."""
        grow = width - self.pend_ids.shape[1]
        if grow > 0:
            self.pend_hidden = nn.functional.pad(self.pend_hidden, (0, 0, 0, grow))
            self.pend_ids = nn.functional.pad(self.pend_ids, (0, grow))
            self.pend_pos = nn.functional.pad(self.pend_pos, (0, grow))

    def place(self, rows: torch.Tensor, other: Eagle3State) -> None:
        """Rows `rows` [k] become `other`'s k requests (continuous batching: a slot takes a new request whose
        context was queued in a state of its own): its committed entries and its pending queue, the pending
        buffers widened when the new request's queue is longer (a longer prompt)."""
        rows = rows.to(self.lengths.device)
        if int(other.lengths.max()) > self.keys[0].shape[2]:
            raise RuntimeError("internal: placing more committed EAGLE-3 entries than the cache holds")
        for mine, theirs in zip(self.keys + self.values, other.keys + other.values):
            n = min(mine.shape[2], theirs.shape[2])
            mine[rows, :, :n] = theirs[:, :, :n].to(mine.dtype)
        self.widen_pending(other.pend_ids.shape[1])
        width = other.pend_ids.shape[1]
        for name in ("pend_hidden", "pend_ids", "pend_pos"):
            mine = getattr(self, name)
            mine[rows] = 0
            mine[rows, :width] = getattr(other, name).to(mine.dtype)
        self.pend_count = self.pend_count.index_copy(0, rows, other.pend_count)
        self.lengths = self.lengths.index_copy(0, rows, other.lengths)

    def select(self, rows: torch.Tensor) -> Eagle3State:
        rows = rows.to(self.lengths.device)
        pick = lambda x: x.index_select(0, rows)  # noqa: E731
        return Eagle3State([pick(k) for k in self.keys], [pick(v) for v in self.values], pick(self.lengths),
                           pick(self.pend_hidden), pick(self.pend_ids), pick(self.pend_pos), pick(self.pend_count))


class Eagle3Drafter(Drafter):
    """EAGLE-3: fc, one decoder layer (`midlayer`), the final norm and its own LM head over the draft vocabulary;
    the token embedding is the target's, frozen and never saved."""

    needs_token_counts = True  # the draft vocabulary is the training responses' most frequent tokens

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if config.reduced_vocab:  # the engines' names; a whole-vocabulary drafter has neither (vLLM then has none)
            register_vocab_buffers(self, config.draft_vocab_size, config.vocab_size)

    # ---- the target (attach_target, embed: pdraft.models.api.Drafter) and the vocabulary ---------------
    def vocab_ids(self) -> torch.Tensor | None:
        """[draft_vocab] long: the target id of every draft id (vLLM: arange + draft_id_to_target_id); None when
        the draft vocabulary is the target's."""
        return vocab_ids(self.d2t) if self.config.reduced_vocab else None

    def check_weights(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """d2t / t2d as one rule (pdraft.models.vocab): in range, one-to-one, right length, integer."""
        if self.config.reduced_vocab:
            check_vocab_map(tensors["d2t"], tensors["t2d"], self.config.vocab_size, self.config.draft_vocab_size, where)

    @torch.no_grad()
    def init_from_tokens(self, counts: torch.Tensor) -> None:
        """A fresh drafter's data-dependent start: the draft vocabulary from the training responses' token
        counts [vocab] (d2t offsets and the t2d mask), and the LM head's rows from the target's head rows of
        those tokens when a target is attached (EAGLE-3 starts its head at random; on short runs this start
        converges much faster, and the head trains freely from there)."""
        target_head = None if self._shared is None else self._shared[1].weight  # [vocab, H]
        if self.config.reduced_vocab:
            choose_vocabulary(self, counts, self.lm_head, target_head)
        elif target_head is not None:  # the whole vocabulary: the target's head as it is
            self.lm_head.weight.copy_(target_head.to(self.lm_head.weight))

    def _draw(self, hidden: torch.Tensor, sampling: SamplingParams | None, uniforms: torch.Tensor | None):
        """hidden [batch, H] before the final norm -> (target ids [batch], q [batch, vocab] or None when greedy,
        top probability [batch]: Proposal.top_prob).
        The greedy draft is the draft logits' argmax mapped into the target ids; draft ids are in increasing
        target-id order, so a tie resolves as vLLM's argmax over its -inf-filled target-vocabulary logits."""
        normed, head = self.norm(hidden), self.lm_head
        # drafting: the measured product (torch's default took 100-400 us for a bfloat16 1,024-row head)
        logits = (fast_linear(head)(normed) if fused_pass() and not self.training else head(normed)).float()
        vocab = self.vocab_ids()
        if is_greedy(sampling):
            draft = greedy_ids(logits)
            return (draft if vocab is None else vocab[draft]), None, top_probability(logits, None)
        q = probs_from_logits(logits, sampling)  # [batch, draft_vocab]
        draft = sample(q, uniforms)
        if vocab is None:
            return draft, q, top_probability(logits, q)
        full = q.new_zeros(q.shape[0], self.config.vocab_size)  # q = 0 outside the draft vocabulary
        full[:, vocab] = q
        return vocab[draft], full, top_probability(logits, q)

    def max_gamma(self) -> int:
        return self.config.num_gamma

    def build_products(self) -> None:
        """The head's measured product plan, built before any timed round (layers.prepare_products)."""
        fast_linear(self.lm_head)

    def train_gamma(self) -> int:
        return self.config.ttt_steps

    # ---- drafting ---------------------------------------------------------------------------------------
    def new_state(self, batch_size: int, capacity: int | None = None) -> Eagle3State:
        w, cfg = self.fc.weight, self.config
        cap = (int(capacity) + cfg.num_gamma) if capacity else 0
        kv = lambda: torch.zeros(batch_size, cfg.num_key_value_heads, cap, cfg.head_dim, dtype=w.dtype,  # noqa: E731
                                 device=w.device)
        zeros = lambda *shape, dtype=torch.long: torch.zeros(*shape, dtype=dtype, device=w.device)  # noqa: E731
        return Eagle3State([kv()], [kv()], zeros(batch_size), zeros(batch_size, 0, cfg.hidden_size, dtype=w.dtype),
                           zeros(batch_size, 0), zeros(batch_size, 0), zeros(batch_size))

    @torch.no_grad()
    def extend_context(self, state: Eagle3State, target_hidden: torch.Tensor, positions: torch.Tensor,
                       valid: torch.Tensor | None = None, token_ids: torch.Tensor | None = None) -> None:
        """Queue the committed tokens' fused features with their own tokens (the entries are computed when the
        token after each is known: at the next proposal)."""
        b, t = target_hidden.shape[:2]
        if token_ids is None:
            raise PdraftError("an EAGLE-3 drafter pairs every hidden state with the token after it: "
                              "extend_context needs the committed token ids (token_ids)")
        if b != state.batch_size or tuple(positions.shape) != (b, t) or tuple(token_ids.shape) != (b, t):
            raise PdraftError(f"extend_context: state has batch {state.batch_size}, hidden states "
                              f"{tuple(target_hidden.shape[:2])}, positions {tuple(positions.shape)}, token ids "
                              f"{tuple(token_ids.shape)}")
        dev = state.lengths.device
        valid = torch.ones(b, t, dtype=torch.bool, device=dev) if valid is None else valid.to(dev).bool()
        feats = self.context_features(target_hidden.to(dev))  # [b, t, H]
        slots = state.pend_count[:, None] + valid.long().cumsum(1) - 1  # [b, t] where each valid entry goes
        new_count = state.pend_count + valid.long().sum(1)
        need = int(new_count.max()) if b else 0
        state.widen_pending(need)
        bi, ti = torch.nonzero(valid, as_tuple=True)
        si = slots[bi, ti]
        state.pend_hidden[bi, si] = feats[bi, ti]
        state.pend_ids[bi, si] = token_ids.to(dev)[bi, ti].long()
        state.pend_pos[bi, si] = positions.to(dev)[bi, ti].long()
        state.pend_count = new_count

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[batch, t, m * H] captured target layers -> fc(...) [batch, t, H] (vLLM `combine_hidden_states`)."""
        want = len(self.config.target_layer_ids) * self.config.hidden_size
        if target_hidden.shape[-1] != want:
            raise PdraftError(f"target hidden states have width {target_hidden.shape[-1]}, expected {want} "
                              f"({len(self.config.target_layer_ids)} layers x hidden {self.config.hidden_size})")
        return self.fc(target_hidden.to(self.fc.weight.dtype))

    def _reserve(self, state: Eagle3State, need: int) -> None:
        cap = state.keys[0].shape[2]
        if need > cap:  # grow geometrically so steady decoding rarely reallocates
            grow = max(need, 2 * cap) - cap
            state.keys = [nn.functional.pad(k, (0, 0, 0, grow)) for k in state.keys]
            state.values = [nn.functional.pad(v, (0, 0, 0, grow)) for v in state.values]

    @torch.no_grad()
    def propose(self, state: Eagle3State, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, gamma: int,
                sampling: SamplingParams | None = None, uniforms: torch.Tensor | None = None,
                forced: torch.Tensor | None = None) -> Proposal:
        """gamma drafts in gamma sequential passes (module docstring). `forced` [batch, gamma - 1] feeds given
        tokens to passes 2..gamma instead of the drafts (tests compare a chain with training-time test)."""
        if not 1 <= int(gamma) <= self.max_gamma():
            raise PdraftError(f"gamma must be 1..{self.max_gamma()} for this drafter, got {gamma}")
        gamma, b, dev = int(gamma), state.batch_size, state.lengths.device
        anchors = anchor_ids.reshape(b).to(dev).long()
        apos = anchor_positions.reshape(b).to(dev).long()
        count = state.pend_count
        if not bool(((count > 0) & (state.lengths + count == apos)).all()):
            raise PdraftError("the EAGLE-3 state does not end right before the anchor: every committed token up to "
                              "the anchor must be given to extend_context first")
        if not is_greedy(sampling):
            uniforms = (torch.rand(b, gamma) if uniforms is None else uniforms).to(dev)  # [b, gamma]
        # The pending buffers keep the width of the longest queue they ever held (the prompt's); pass 1 runs over
        # the columns some request fills this round, not over that width (a prompt-sized pass every round).
        width = int(count.max())
        pend_ids, pend_hidden, pend_pos = (x[:, :width] for x in (state.pend_ids, state.pend_hidden, state.pend_pos))
        self._reserve(state, int((state.lengths + width).max()) + gamma)
        layer, cache_k, cache_v = self.midlayer, state.keys[0], state.values[0]
        rows = torch.arange(b, device=dev)
        slot = torch.arange(cache_k.shape[2], device=dev)  # [cap]
        # Pass 1: every pending entry, ids shifted by one with the anchor after the last (vLLM's rotation). Every
        # entry's keys and values go into the cache; only the root entry (anchor - 1, the last) drafts, so only its
        # query attends and only its row runs o_proj and the MLP (the other rows' outputs are never read).
        nxt = torch.cat([pend_ids[:, 1:], pend_ids[:, :1]], dim=1)  # [b, P]
        nxt[rows, count - 1] = anchors
        q, k, v, res = layer.project(self.embed(nxt), pend_hidden, pend_pos)
        slots = state.lengths[:, None] + torch.arange(width, device=dev)  # [b, P]
        cache_k[rows[:, None], :, slots] = k.transpose(1, 2).to(cache_k.dtype)
        cache_v[rows[:, None], :, slots] = v.transpose(1, 2).to(cache_v.dtype)
        root = count - 1  # [b]
        mask = (slot[None, :] <= (state.lengths + root)[:, None])[:, None, None]  # [b, 1, 1, cap]: causal
        attn = layer.self_attn.attend(q[rows, :, root][:, :, None], cache_k, cache_v, mask)  # [b, 1, heads * d]
        hidden = layer.finish(attn, res[rows, root][:, None])[:, 0]  # [b, H]: drafts the token after the anchor
        state.lengths = state.lengths + count  # the target's entries stay; nothing is pending any more
        state.pend_count = torch.zeros_like(count)
        tokens, probs, top = [], [], []
        for k_step in range(gamma):
            if k_step:  # pass k_step + 1: one query per request at position anchor + k_step - 1
                fed = tokens[-1] if forced is None else forced[:, k_step - 1].to(dev)
                pos = apos + k_step - 1
                at = state.lengths + k_step - 1  # [b] past the committed length: dropped after this round
                q, k, v, res = layer.project(self.embed(fed[:, None]), hidden[:, None], pos[:, None])
                cache_k[rows, :, at] = k[:, :, 0].to(cache_k.dtype)
                cache_v[rows, :, at] = v[:, :, 0].to(cache_v.dtype)
                mask = (slot[None, :] <= at[:, None])[:, None, None]  # [b, 1, 1, cap]
                hidden = layer.finish(layer.self_attn.attend(q, cache_k, cache_v, mask), res)[:, 0]
            tok, q_full, best = self._draw(hidden, sampling, None if uniforms is None else uniforms[:, k_step])
            tokens.append(tok)
            probs.append(q_full)
            top.append(best)
        return Proposal(tokens=torch.stack(tokens, 1), probs=None if probs[0] is None else torch.stack(probs, 1),
                        confidence=None, top_prob=torch.stack(top, 1))

    # ---- training-time test ----------------------------------------------------------------------------
    def forward_train(self, input_ids: torch.Tensor, target_hidden: torch.Tensor, anchor_positions: torch.Tensor,
                      block_input_ids: torch.Tensor | None = None, compute_logits: bool = True) -> TrainOutput:
        """K = ttt_steps unrolled steps for the chain of every anchor: input_ids [batch, S], target_hidden
        [batch, S, m * H], anchor_positions [batch, N]; step k (1-based) drafts the token at anchor + k from the
        root entry at anchor - 1 (k = 1) or from step k - 1's output (k > 1), as `propose` does. Returns hidden
        [batch, N, K, H] after the final norm with the drafter's own head and vocabulary for the loss."""
        if block_input_ids is not None:
            raise PdraftError("an EAGLE-3 drafter has no draft block to override (block_input_ids)")
        cfg, layer, attn = self.config, self.midlayer, self.midlayer.self_attn
        b, s = input_ids.shape
        n, steps, dev = anchor_positions.shape[1], cfg.ttt_steps, input_ids.device
        anchors = anchor_positions.long()  # [b, N]
        nxt = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)  # [b, S]: the token after each position
        pos = torch.arange(s, device=dev).expand(b, s)
        q, k0, v0, res = layer.project(self.embed(nxt), self.context_features(target_hidden), pos)
        causal = torch.ones(s, s, dtype=torch.bool, device=dev).tril()[None, None]
        real = layer.finish(attn.attend(q, k0, v0, causal), res)  # [b, S, H]: every real entry's output
        root = (anchors - 1).clamp(min=0)
        hidden = torch.gather(real, 1, root[..., None].expand(b, n, real.shape[-1]))  # [b, N, H] step 1
        outs = [hidden]
        keys0, vals0 = attn.repeat_kv(k0), attn.repeat_kv(v0)  # [b, heads, S, d]
        seen = torch.arange(s, device=dev)[None, None, :] < anchors[:, :, None]  # [b, N, S]: entries up to root
        chain_k, chain_v = [], []
        scale = attn.head_dim ** -0.5
        for step in range(2, steps + 1):
            fed = torch.gather(input_ids, 1, (anchors + step - 1).clamp(max=s - 1))  # [b, N] the token at a+k-1
            q, k, v, res = layer.project(self.embed(fed), hidden, anchors + step - 2)
            chain_k.append(attn.repeat_kv(k))
            chain_v.append(attn.repeat_kv(v))
            ck, cv = torch.stack(chain_k, 3), torch.stack(chain_v, 3)  # [b, heads, N, k-1, d]: own chain only
            s0 = (q @ keys0.transpose(-1, -2)) * scale  # [b, heads, N, S]
            s0 = s0.masked_fill(~seen[:, None], float("-inf"))
            sc = torch.einsum("bhnd,bhnjd->bhnj", q, ck) * scale  # [b, heads, N, k-1]
            w = torch.softmax(torch.cat([s0, sc], -1).float(), -1).to(q.dtype)
            o = w[..., :s] @ vals0 + torch.einsum("bhnj,bhnjd->bhnd", w[..., s:], cv)  # [b, heads, N, d]
            hidden = layer.finish(o.transpose(1, 2).reshape(b, n, -1), res)
            outs.append(hidden)
        hidden = self.norm(torch.stack(outs, 2))  # [b, N, K, H]
        lab = anchors[:, :, None] + torch.arange(1, steps + 1, device=dev)  # [b, N, K]
        flat = input_ids[:, None, :].expand(b, n, s)
        target_ids = torch.gather(flat, 2, lab.clamp(max=s - 1))
        prev_ids = torch.gather(flat, 2, (lab - 1).clamp(max=s - 1))
        valid = (lab < s) & (anchors[:, :, None] >= 1)  # a chain needs its root entry at anchor - 1
        logits = None
        if compute_logits:
            draft = self.lm_head(hidden).float()  # [b, N, K, draft_vocab]
            vocab = self.vocab_ids()
            logits = draft if vocab is None else draft.new_full((*draft.shape[:-1], cfg.vocab_size),
                                                                -math.inf).index_copy(-1, vocab, draft)
        return TrainOutput(base_logits=logits, logits=logits, confidence_logits=None, target_ids=target_ids,
                           prev_ids=prev_ids, label_valid=valid, hidden=hidden, head=self.lm_head.weight,
                           vocab=self.vocab_ids())
