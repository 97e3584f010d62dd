"""DFlash's model, which is also the KV-injection backbone DSpark and DFlash2 extend (DFlash arXiv:2602.06036,
DSpark paper 2.2). Context features H_ctx = RMSNorm(fc([H_l1; ...; H_lm])) of committed
tokens are projected to keys and values in every draft layer and kept in a preallocated, position-indexed
`ContextCache` (pdraft.models.context_cache), extended as tokens are committed (rejected drafts never enter it);
the draft block (anchor, then mask tokens) attends bidirectionally to itself and to all cached context, with RoPE
positions continuing from the context (block slot j sits at anchor position + j).

Block conventions, as the reference code does them (both feed [anchor, mask x (block_size - 1)] at positions
anchor .. anchor + block_size - 1, with the context holding tokens strictly before the anchor):
- "deepspec" (deepseek-ai/DeepSpec): output slot j predicts the token at anchor + j + 1, so block_size inputs
  give block_size drafts; the anchor's own slot is the first prediction.
- "zlab" (z-lab/dflash): output slot j >= 1 predicts the token at its own position anchor + j and slot 0 is
  dropped, so the block drafts block_size - 1 tokens.
Draft i (1-based) is therefore always the token at anchor + i; only the slot it is read from differs.

Every proposal runs the full trained block, whatever gamma the engine asks for, and returns its first gamma
drafts: the block attends bidirectionally, so a shorter block would be a different model from the one trained.
With denoise_steps > 1 each extra pass writes the previous pass's greedy (argmax of base logits) drafts into
slots 1..block_size-1 in place of the mask tokens; only the last pass is sampled. The article describes
iterative refinement without fixing how tokens are fed back; greedy feedback keeps proposals deterministic
given the final pass's sampling, so the returned `probs` stay the exact distribution of the returned tokens."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from pdraft import gemm
from pdraft.errors import PdraftError
from pdraft.models.api import Drafter, DraftState, Proposal, SamplingParams, TrainOutput, TreeBlock
from pdraft.models.dflash.config import DFlashConfig
from pdraft.models.context_cache import ContextCache
from pdraft.models.layers import DecoderLayer, RMSNorm, fast_linear, fused_pass
from pdraft.models.sampling import is_greedy, probs_from_logits, select, top_probability
from pdraft.models.vocab import (check_vocab_map, choose_vocabulary, register_vocab_buffers, spread_logits, spread_probs,
                                 vocab_ids)


class DFlashDrafter(Drafter):
    """DFlash: the backbone and the shared LM head, sampled position by position independently."""

    compilable_pass = True  # one backbone pass of fixed shapes per block (pdraft.decode.backend compiles it)

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fc = nn.Linear(len(config.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.reduced_vocab:  # its own head over the draft vocabulary (`lm_head` in the files the engines read)
            self.draft_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
            register_vocab_buffers(self, config.draft_vocab_size, config.vocab_size)

    # ---- target sharing (attach_target, embed: pdraft.models.api.Drafter) -------------------------------
    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head_logits(hidden).float()

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> the drafting head's logits [..., V_d] in the head's own dtype (its own head over a
        draft vocabulary, else the target's): for a caller that reads a few of them (DFlash2's top-K) and need
        not convert them all to float32 first."""
        if self.config.reduced_vocab:
            hidden = hidden.to(self.draft_head.weight.dtype)
            # a decode pass: the measured backend (pdraft.gemm), not torch's default, which took 100-400 us for
            # a 16 x 1024 bfloat16 head on a 2-core CPU (a third of a DFlash2 pass, issue 38); training keeps the
            # Linear, whose weights change every step (a plan is timed when built)
            fast = fused_pass() and not self.training
            return fast_linear(self.draft_head)(hidden) if fast else self.draft_head(hidden)
        head = self._target()[1]
        hidden = hidden.to(head.weight.dtype)
        sharded = hasattr(head.weight, "full_tensor")  # a tensor-parallel target's DTensor: its module's own hooks
        if not torch.is_grad_enabled() and isinstance(head, nn.Linear) and not sharded:  # a pass without
            return gemm.for_linear(head)(hidden)  # gradients: the backend measured fastest here, shared with the
        return head(hidden)  # target's

    def max_gamma(self) -> int:
        return self.config.num_gamma

    def build_products(self) -> None:
        """The draft head's measured product plan, built before any timed round (layers.prepare_products)."""
        if self.config.reduced_vocab:
            fast_linear(self.draft_head)

    # ---- the draft vocabulary (drafter.draft_vocab_size; pdraft.models.vocab) ----------------------------
    @property
    def needs_token_counts(self) -> bool:
        return self.config.reduced_vocab

    def vocab_ids(self) -> torch.Tensor | None:
        """[V_d] long: the target id of every draft id; None when the drafter drafts over the whole vocabulary."""
        return vocab_ids(self.d2t) if self.config.reduced_vocab else None

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> float logits over the draft vocabulary [..., V_d] (the target's LM head over the whole
        vocabulary when the drafter has no draft vocabulary)."""
        return self.head_logits(hidden).float()

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., V_d] -> [..., vocab], -inf outside the draft vocabulary."""
        vocab = self.vocab_ids()
        return logits if vocab is None else spread_logits(logits, vocab, self.config.vocab_size)

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft ids -> target ids (vLLM qwen3_dspark.py `map_draft_to_target`)."""
        return draft_ids if not self.config.reduced_vocab else draft_ids + self.d2t[draft_ids]

    def check_weights(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        """d2t / t2d of a draft vocabulary by the one rule EAGLE-3's are checked with (in range, one-to-one, right
        length, integer)."""
        if self.config.reduced_vocab:
            check_vocab_map(tensors["d2t"], tensors["t2d"], self.config.vocab_size, self.config.draft_vocab_size, where)

    @torch.no_grad()
    def init_from_tokens(self, counts: torch.Tensor) -> None:
        """A fresh drafter with a draft vocabulary: the training responses' most frequent tokens (d2t / t2d) and
        its head started from the target head's rows of them."""
        if self.config.reduced_vocab:
            choose_vocabulary(self, counts, self.draft_head, None if self._shared is None else self._shared[1].weight)

    # ---- context ----------------------------------------------------------------------------------------
    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[batch, t, m * hidden] captured target layers -> H_ctx [batch, t, hidden] (paper eq. 2)."""
        want = len(self.config.target_layer_ids) * self.config.hidden_size
        if target_hidden.shape[-1] != want:
            raise PdraftError(f"target hidden states have width {target_hidden.shape[-1]}, expected {want} "
                              f"({len(self.config.target_layer_ids)} layers x hidden {self.config.hidden_size})")
        x = target_hidden.to(self.fc.weight.dtype)  # decoding: the measured product (issue 38)
        return self.hidden_norm(fast_linear(self.fc)(x) if fused_pass() else self.fc(x))

    def new_state(self, batch_size: int, capacity: int | None = None) -> ContextCache:
        """An empty context cache (pdraft.models.context_cache) for `capacity` positions, preallocated; None =
        grow as needed."""
        w, cfg = self.fc.weight, self.config
        return ContextCache.allocate(len(self.layers), batch_size, cfg.num_key_value_heads, cfg.head_dim,
                                     capacity or 0, dtype=w.dtype, device=w.device)

    @torch.no_grad()
    def extend_context(self, state: ContextCache, target_hidden: torch.Tensor, positions: torch.Tensor,
                       valid: torch.Tensor | None = None, token_ids: torch.Tensor | None = None) -> None:
        b, t = target_hidden.shape[:2]
        if b != state.batch_size or tuple(positions.shape) != (b, t):
            raise PdraftError(f"extend_context: state has batch {state.batch_size}, hidden states "
                              f"{tuple(target_hidden.shape[:2])}, positions {tuple(positions.shape)}")
        dev = state.lengths.device
        valid = torch.ones(b, t, dtype=torch.bool, device=dev) if valid is None else valid.to(dev).bool()
        positions = positions.to(dev)
        ctx = self.context_features(target_hidden.to(dev))  # [batch, t, hidden]
        rope = self.layers[0].self_attn.rope(positions, ctx.dtype)  # one table for every layer
        kv = [layer.self_attn.context_kv(ctx, positions, rope) for layer in self.layers]  # per layer [b, kv, t, d] x 2
        state.write(torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv]), positions, valid)

    # ---- the backbone ---------------------------------------------------------------------------------
    def backbone(self, ids: torch.Tensor, positions: torch.Tensor, ctx_kv, mask: torch.Tensor | None) -> torch.Tensor:
        """ids/positions [batch, q]; ctx_kv: per layer (k, v) [batch, kv_heads, T, head_dim];
        mask [batch, 1, q, T + q] (None: every query attends to everything) -> hidden [batch, q, hidden] after
        the final norm."""
        x = self.embed(ids)
        rope = self.layers[0].self_attn.rope(positions, x.dtype)  # the block's rotary tables, once per pass
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, rope, k, v, mask)
        return self.norm(x)

    def draft_slots(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., block_size, d] -> [..., G, d]: the slot each draft i is read from (see module docstring)."""
        return hidden if self.config.block_convention == "deepspec" else hidden[..., 1:, :]

    @torch.no_grad()
    def propose(self, state: DraftState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, gamma: int,
                sampling: SamplingParams | None = None, uniforms: torch.Tensor | None = None) -> Proposal:
        if not 1 <= int(gamma) <= self.max_gamma():
            raise PdraftError(f"gamma must be 1..{self.max_gamma()} for this drafter "
                              f"(block_size {self.config.block_size}, {self.config.block_convention} convention), "
                              f"got {gamma}")
        anchor_ids = anchor_ids.reshape(state.batch_size).to(state.lengths.device).long()
        hidden = self.block_hidden(state, anchor_ids, anchor_positions)  # [b, G, hidden]
        if not is_greedy(sampling):
            uniforms = torch.rand(state.batch_size, int(gamma)) if uniforms is None else uniforms  # [b, gamma]
            uniforms = uniforms.to(hidden.device)
        return self.sample_block(hidden[:, : int(gamma)], anchor_ids, sampling, uniforms)

    def block_hidden(self, state: DraftState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor
                     ) -> torch.Tensor:
        """The one backbone pass over [anchor, mask...] (denoise passes included): anchor_ids [b] on the state's
        device -> hidden [b, G, hidden], draft i read from row i - 1; `propose` samples a chain from it and
        `tree_block` a tree (pdraft.models.tree)."""
        cfg, dev = self.config, state.lengths.device
        b, size = state.batch_size, cfg.block_size
        ids = torch.full((b, size), cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[:, 0] = anchor_ids
        positions = anchor_positions.reshape(b, 1).to(dev).long() + torch.arange(size, device=dev)  # [b, size]
        ctx_kv, mask = self._block_context(state, size)
        for step in range(cfg.denoise_steps):
            hidden = self.draft_slots(self.backbone(ids, positions, ctx_kv, mask))  # [b, G, hidden]
            if step + 1 < cfg.denoise_steps:
                ids[:, 1:] = self.to_target(self.draft_logits(hidden).argmax(-1))[:, : size - 1]
        return hidden

    @staticmethod
    def _block_context(state: DraftState, size: int):
        """What a block pass of `size` queries attends to: per layer the cached (keys, values), and the mask
        [batch, 1, size, T + size] (True = may attend) over [context ; block], or None. On a CPU outside compiled
        code, when every request has the same committed length (always at batch 1), the cache is sliced to that
        length and no mask is needed: the same attention in six fewer operations, and SDPA's unmasked kernel
        (a tenth of a block pass on a CPU, issue 38). Elsewhere the shapes stay fixed by the capacity, as CUDA
        graphs need."""
        lengths, dev, b = state.lengths, state.lengths.device, state.batch_size
        if dev.type == "cpu" and not torch.compiler.is_compiling():
            n = int(lengths[0])
            if b == 1 or bool((lengths == n).all()):
                return [(k[:, :, :n], v[:, :, :n]) for k, v in zip(state.keys, state.values)], None
        cap = state.keys[0].shape[2]
        ctx_ok = torch.arange(cap, device=dev)[None, :] < lengths[:, None]  # [b, T]
        mask = torch.cat([ctx_ok, torch.ones(b, size, dtype=torch.bool, device=dev)], dim=1)
        return list(zip(state.keys, state.values)), mask[:, None, None, :].expand(b, 1, size, cap + size)

    def sample_block(self, hidden, anchor_ids, sampling, uniforms) -> Proposal:
        """hidden [batch, gamma, d], uniforms [batch, gamma] (None when greedy) -> Proposal. DFlash: every
        position independently."""
        # greedy: the argmax of the head's own-dtype logits, the same ids as over their float32 copies (the
        # conversion is exact), which only a policy reading the top probability then makes (issue 38)
        logits = self.head_logits(hidden) if is_greedy(sampling) else self.draft_logits(hidden)  # [batch, gamma, V_d]
        tokens, probs = select(logits, sampling, uniforms)
        top = partial(top_probability, logits, probs)  # computed only if a policy reads it
        vocab = self.vocab_ids()
        if vocab is not None:  # into the target's ids; q exactly zero outside the draft vocabulary
            tokens, probs = vocab[tokens], None if probs is None else spread_probs(probs, vocab, self.config.vocab_size)
        return Proposal(tokens=tokens, probs=probs, confidence=None, top_prob=top)

    # ---- trees (pdraft.models.tree) ---------------------------------------------------------------------
    @torch.no_grad()
    def tree_block(self, state: DraftState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor,
                   width: int) -> TreeBlock:
        """The backbone pass and its logits; the shape is planned from their temperature-1 softmax."""
        anchor_ids = anchor_ids.reshape(state.batch_size).to(state.lengths.device).long()
        hidden = self.block_hidden(state, anchor_ids, anchor_positions)  # [b, G, hidden]
        logits = self.full_logits(self.draft_logits(hidden))  # [b, G, vocab], -inf outside a draft vocabulary
        top = torch.softmax(logits, dim=-1).topk(width, dim=-1).values  # [b, G, width]
        return TreeBlock(top=top, data={"hidden": hidden, "logits": logits})

    def tree_step(self, block: TreeBlock, depth: int, rows: torch.Tensor, prev_ids: torch.Tensor, carry,
                  sampling: SamplingParams | None):
        """DFlash: every node of a depth has that position's distribution, whatever its token."""
        logits = block.data["logits"][rows, depth - 1]  # [M, vocab]
        return logits, None if is_greedy(sampling) else probs_from_logits(logits, sampling), None

    # ---- training --------------------------------------------------------------------------------------
    def forward_train(self, input_ids: torch.Tensor, target_hidden: torch.Tensor, anchor_positions: torch.Tensor,
                      block_input_ids: torch.Tensor | None = None, compute_logits: bool = True) -> TrainOutput:
        """Teacher-forced pass over N blocks per sequence, as DeepSpec trains: input_ids [batch, S];
        target_hidden [batch, S, m * hidden] for every token; anchor_positions [batch, N] (0 <= a < S);
        block_input_ids [batch, N, block_size] overrides [anchor, mask...] (e.g. to train denoise passes).
        compute_logits=False skips the vocabulary-sized tensors and returns the hidden states and the
        sequential-head features instead, for the chunked losses of pdraft.train.losses.
        Block n attends to context tokens strictly before its anchor and bidirectionally within itself."""
        cfg = self.config
        b, s = input_ids.shape
        n, size, dev = anchor_positions.shape[1], cfg.block_size, input_ids.device
        anchors = anchor_positions.long()
        offsets = torch.arange(size, device=dev)
        if block_input_ids is None:
            block_input_ids = torch.full((b, n, size), cfg.mask_token_id, dtype=torch.long, device=dev)
            block_input_ids[:, :, 0] = torch.gather(input_ids, 1, anchors)
        positions = (anchors[:, :, None] + offsets).reshape(b, n * size)  # [b, N * size]
        ctx = self.context_features(target_hidden)  # [b, S, hidden]
        ctx_pos = torch.arange(s, device=dev).expand(b, s)
        ctx_rope = self.layers[0].self_attn.rope(ctx_pos, ctx.dtype)
        ctx_kv = [layer.self_attn.context_kv(ctx, ctx_pos, ctx_rope) for layer in self.layers]
        q_anchor = anchors.repeat_interleave(size, dim=1)  # [b, N * size]
        ctx_ok = torch.arange(s, device=dev)[None, None, :] < q_anchor[:, :, None]  # [b, N * size, S]
        q_block = torch.arange(n * size, device=dev) // size
        same = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)  # [b, N * size, N * size]
        mask = torch.cat([ctx_ok, same], dim=2)[:, None]
        hidden = self.backbone(block_input_ids.reshape(b, n * size), positions, ctx_kv, mask)
        hidden = self.draft_slots(hidden.reshape(b, n, size, -1))  # [b, N, G, hidden]
        g = hidden.shape[2]
        lab = anchors[:, :, None] + torch.arange(1, g + 1, device=dev)  # [b, N, G]
        flat_ids = input_ids[:, None, :].expand(b, n, s)
        target_ids = torch.gather(flat_ids, 2, lab.clamp(max=s - 1))
        prev_ids = torch.gather(flat_ids, 2, (lab - 1).clamp(max=s - 1))
        base = self.full_logits(self.draft_logits(hidden)) if compute_logits else None  # [b, N, G, vocab]
        own = self.config.reduced_vocab  # the chunked losses read its head and vocabulary (pdraft.train.losses)
        return TrainOutput(base_logits=base, logits=base, confidence_logits=None, target_ids=target_ids,
                           prev_ids=prev_ids, label_valid=lab < s, hidden=hidden,
                           head=self.draft_head.weight if own else None, vocab=self.vocab_ids())
