"""The DSpark drafter (paper 3.1, 3.2.1): the DFlash backbone runs once over the block, then a light sequential
head samples the drafts left to right, each position's logits U_k + B_k(x_{k-1}, .) conditioned on the token
drawn just before it (x_0 = the anchor), and the confidence head scores each position from [h_k; W1[x_{k-1}]]
(or h_k). Sampling is per position from the head-adjusted logits, so `Proposal.probs` holds exactly the
distributions the tokens were drawn from."""

from __future__ import annotations

from functools import partial

import torch

from pdraft.kernels import cpu_walks
from pdraft.kernels.dispatch import use_triton
from pdraft.models.api import Proposal, TrainOutput
from pdraft.models.dflash.model import DFlashDrafter
from pdraft.models.dspark.config import DSparkConfig
from pdraft.models.dspark.fused_seq_head import fusable, fused_sample_block
from pdraft.models.dspark.heads import SEQUENTIAL_HEAD_CLASSES, ConfidenceHead, MarkovHead
from pdraft.models.layers import derived
from pdraft.models.sampling import is_greedy, probs_from_logits, select, top_probability
from pdraft.models.vocab import spread_probs


class DSparkDrafter(DFlashDrafter):
    def __init__(self, config: DSparkConfig):
        super().__init__(config)
        self.markov_head = None
        if config.has_sequential_head:
            cls = SEQUENTIAL_HEAD_CLASSES[config.sequential_head]
            # W1 embeds the previous token (a target id), W2 writes the draft vocabulary (vLLM qwen3_dspark.py)
            self.markov_head = cls(config.vocab_size, config.markov_rank, config.hidden_size,
                                   out_size=config.draft_vocab_size)
        self.confidence_head = None
        if config.confidence_head:
            width = config.hidden_size + (config.markov_rank if config.confidence_with_markov else 0)
            self.confidence_head = ConfidenceHead(width)
        # Runtime switch, not a config field (never saved): sample the block with the fused Triton kernel
        # (pdraft.models.dspark.fused_seq_head) where Triton can run; elsewhere, or for gated/RNN heads, the loop below.
        self.use_fused_kernel = False

    def set_fused_kernels(self, on: bool) -> None:
        self.use_fused_kernel = bool(on)

    def confidence(self, hidden: torch.Tensor, prev_ids: torch.Tensor) -> torch.Tensor | None:
        """hidden [..., d], prev_ids [...] -> confidence logits [...] (eq. 7 before the sigmoid)."""
        if self.confidence_head is None:
            return None
        if self.config.confidence_with_markov:
            emb = self.markov_head.prev_embedding(prev_ids).to(hidden.dtype)
            hidden = torch.cat([hidden, emb], dim=-1)
        return self.confidence_head(hidden)

    def sample_block(self, hidden, anchor_ids, sampling, uniforms) -> Proposal:
        """hidden [batch, gamma, d]; anchor_ids [batch]; uniforms [batch, gamma] (None when greedy). One cheap
        step per position; no backbone re-run."""
        if self.use_fused_kernel:
            if fusable(self) and use_triton(hidden.device):
                return fused_sample_block(self, hidden, anchor_ids, sampling, uniforms)
        head = self.markov_head
        if is_greedy(sampling) and type(head) is MarkovHead:
            walks = cpu_walks.kernels() if hidden.device.type == "cpu" else None
            if walks is not None:
                return self._compiled_greedy_walk(walks, hidden, anchor_ids)
            return self._greedy_markov_walk(self.draft_logits(hidden), hidden, anchor_ids)
        base = self.draft_logits(hidden)  # [batch, gamma, V_d]
        b, gamma = base.shape[:2]
        state = head.init_state((b,), hidden) if head is not None else None
        prev = anchor_ids
        tokens, probs, logits = [], [], []
        for k in range(gamma):  # the walk: only what the next position's token depends on
            step = base[:, k]
            if head is not None:
                state, bias = head.step(state, prev, hidden[:, k])
                step = step + bias.float()
            tok, p = select(step, sampling, None if uniforms is None else uniforms[:, k])
            tok = self.to_target(tok)  # the next step's previous token, and the draft, are target ids
            tokens.append(tok)
            probs.append(p)
            logits.append(step)
            prev = tok
        tokens = torch.stack(tokens, dim=1)  # [batch, gamma]
        probs = None if probs[0] is None else torch.stack(probs, dim=1)
        top = partial(lambda steps, q: top_probability(torch.stack(steps, dim=1), q), logits, probs)  # when read
        if probs is not None and self.config.reduced_vocab:  # q exactly zero outside the draft vocabulary
            probs = spread_probs(probs, self.vocab_ids(), self.config.vocab_size)
        # Confidence and top probability read each position's token before it, all known now: one call each for
        # the whole block instead of one per position inside the walk.
        prevs = torch.cat([anchor_ids.reshape(b, 1).to(tokens), tokens[:, :-1]], dim=1)  # [batch, gamma]
        return Proposal(tokens=tokens, probs=probs, confidence=self.confidence(hidden, prevs), top_prob=top)

    def _walk_weights(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The Markov head's W1 [vocab, r] and W2 transposed [r, vocab], contiguous in the logits' dtype, kept
        until either weight changes: converted and laid out per pass, W2 alone is a 1 MB copy, and a product
        over the transposed view costs 1.4x one over contiguous rows (19 against 13 us a step, issue 38). (W2
        read in bfloat16 by the compiled walk was timed too: 0.36 against 0.30 ms, no gain.)"""
        head = self.markov_head
        w1, w2 = head.markov_w1.weight, head.markov_w2.weight
        return derived(head, "_walk_weights", (w1, w2),
                       lambda: (w1.detach().to(dtype).contiguous(), w2.detach().t().to(dtype).contiguous()),
                       extra=(dtype,))

    def _markov_walk(self, base, anchor_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy walk of the plain Markov head in three operations a position (the row of W1, one fused
        base + u W2 product, the argmax), into buffers allocated once: the same logits and tokens as the
        general loop, with a fraction of its per-position operations (a round's cost on a CPU, issue 38).
        base [batch, gamma, V_d] -> (draft ids [batch, gamma], logits [batch, gamma, V_d]).

        On a CPU with a C compiler the loop runs compiled (pdraft.kernels.cpu_walks), the same sums in its own
        order. Solving it in Jacobi sweeps instead (every position's logits in one product from guessed previous
        tokens, settled left to right) was measured and is slower: on the quickstart's DSpark only 30% of drawn
        tokens are their position's base argmax, so a block of 16 took 6-16 sweeps (2.0 against 0.42 ms)."""
        b, gamma, vocab = base.shape
        w1, w2t = self._walk_weights(base.dtype)  # [vocab, r], [r, vocab]
        walks = cpu_walks.kernels() if base.device.type == "cpu" else None
        if walks is not None:  # the whole walk in one compiled loop (pdraft.kernels.cpu_walks)
            return walks.markov_walk(base, anchor_ids, w1, w2t, self.d2t if self.config.reduced_vocab else None)[:2]
        logits = torch.empty(gamma, b, vocab, dtype=base.dtype, device=base.device)  # [gamma, batch, vocab]
        tokens = torch.empty(gamma, b, dtype=torch.long, device=base.device)
        best = torch.empty(gamma, b, dtype=base.dtype, device=base.device)  # the maxima, unread
        base_t = base.transpose(0, 1)  # [gamma, batch, vocab]
        prev = anchor_ids.reshape(b).long()
        for k in range(gamma):
            torch.addmm(base_t[k], w1[prev], w2t, out=logits[k])
            torch.max(logits[k], dim=-1, out=(best[k], tokens[k]))  # argmax's index, ties and all (greedy_ids)
            prev = self.to_target(tokens[k])  # W1 embeds target ids
        return tokens.t(), logits.transpose(0, 1)  # [batch, gamma], [batch, gamma, V_d]

    def _compiled_greedy_walk(self, walks: cpu_walks.Walks, hidden, anchor_ids) -> Proposal:
        """The greedy walk and the confidence head in one compiled loop over the head's own-dtype logits (the loop
        widens them as it reads): eq. 7's logit h_k . w_h + b (+ W1[x_{k-1}] . w_1) comes out beside the tokens.
        A bfloat16 head's weights go to the AVX-512 BF16 walk in their own dtype (exactly their values, half the
        bytes of W2 per step: 0.19 -> 0.125 ms for 16 steps over 4,096; cpu_walks.vnni_layout)."""
        head = self.markov_head
        if walks.vnni and head.markov_w1.weight.dtype == torch.bfloat16 == head.markov_w2.weight.dtype:
            w1, w2t = derived(head, "_vnni_weights", (head.markov_w1.weight, head.markov_w2.weight),
                              lambda: cpu_walks.vnni_layout(head.markov_w1.weight, head.markov_w2.weight.t()))
        else:
            w1, w2t = self._walk_weights(torch.float32)
        conf = None
        if self.confidence_head is not None:
            weight, d = self.confidence_head.proj.weight[0], hidden.shape[-1]
            conf = (hidden, weight[:d], float(self.confidence_head.proj.bias[0]),
                    weight[d:] if self.config.confidence_with_markov else None)
        tokens, logits, conf = walks.markov_walk(self.head_logits(hidden), anchor_ids, w1, w2t,
                                                 self.d2t if self.config.reduced_vocab else None, conf)
        return Proposal(tokens=self.to_target(tokens), probs=None, confidence=conf,
                        top_prob=partial(top_probability, logits, None))

    def _greedy_markov_walk(self, base, hidden, anchor_ids) -> Proposal:
        b = base.shape[0]
        tokens, logits = self._markov_walk(base, anchor_ids)
        tokens = self.to_target(tokens)
        prevs = torch.cat([anchor_ids.reshape(b, 1).to(tokens), tokens[:, :-1]], dim=1)  # [batch, gamma]
        return Proposal(tokens=tokens, probs=None, confidence=self.confidence(hidden, prevs),
                        top_prob=partial(top_probability, logits, None))

    @torch.no_grad()
    def tree_block(self, state, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, width: int):
        """The backbone pass, its logits and a shape planned from the sequential head's conditionals along the
        greedy chain (the base logits' marginals are far flatter than what the head drafts from: planned on
        them, a trained DSpark's 32 nodes went wide where its chain goes deep, and its tree drafted fewer tokens
        than its chain). The greedy chain is a function of the backbone pass alone, never of a drawn token, so
        the shape stays fixed before anything is sampled, as the sampled acceptance needs."""
        block = super().tree_block(state, anchor_ids, anchor_positions, width)
        if self.markov_head is None:
            return block
        hidden = block.data["hidden"]  # [b, G, d]
        cond = self.full_logits(self._chain_logits(self.draft_logits(hidden), hidden, anchor_ids))  # [b, G, vocab]
        top = torch.softmax(cond.float(), dim=-1).topk(width, dim=-1).values  # [b, G, width]
        return type(block)(top=top, data=block.data)

    def _chain_logits(self, base, hidden, anchor_ids) -> torch.Tensor:
        """The head-adjusted logits [batch, G, V_d] of each position given the greedy chain's token before it."""
        head = self.markov_head
        if type(head) is MarkovHead:
            return self._markov_walk(base, anchor_ids)[1]
        state, prev, out = head.init_state((base.shape[0],), hidden), anchor_ids.reshape(-1).long(), []
        for k in range(base.shape[1]):
            state, bias = head.step(state, prev, hidden[:, k])
            out.append(base[:, k] + bias.float())
            prev = self.to_target(out[-1].argmax(-1))
        return torch.stack(out, dim=1)

    def tree_step(self, block, depth: int, rows: torch.Tensor, prev_ids: torch.Tensor, carry, sampling):
        """A node's children are drawn as the chain draws the next position: the base logits plus the
        sequential head's bias given the node's token, its recurrent state carried along the path."""
        step = block.data["logits"][rows, depth - 1]  # [M, vocab]
        head = self.markov_head
        if head is not None:
            hidden = block.data["hidden"][rows, depth - 1]  # [M, d]
            state = carry if carry is not None else head.init_state((rows.numel(),), hidden)
            carry, bias = head.step(state, prev_ids.to(hidden.device), hidden)
            step = step + self.full_logits(bias.float())  # a draft vocabulary's bias, -inf outside it
        return step, None if is_greedy(sampling) else probs_from_logits(step, sampling), carry

    def forward_train(self, *args, compute_logits: bool = True, **kwargs) -> TrainOutput:
        """DFlash's teacher-forced pass plus the heads, with the true previous tokens standing in for the sampled
        ones (teacher forcing). Without logits (the chunked losses) the sequential head gives its features u_k
        and its W2 instead of the bias u_k W2."""
        out = super().forward_train(*args, compute_logits=compute_logits, **kwargs)
        hidden, prev_ids = out.hidden, out.prev_ids
        out.confidence_logits = self.confidence(hidden, prev_ids)  # [b, N, G] or None
        if self.markov_head is None:
            return out
        if compute_logits:  # the bias is over the draft vocabulary, as the head's logits
            out.logits = self.full_logits(self.draft_logits(hidden) + self.markov_head.teacher_forced(prev_ids,
                                                                                                      hidden).float())
        else:
            out.seq_features = self.markov_head.teacher_forced_features(prev_ids, hidden)  # [b, N, G, r]
            out.seq_w2 = self.markov_head.markov_w2.weight.t()  # [r, vocab]
        return out
