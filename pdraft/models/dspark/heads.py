"""DSpark's light heads (paper 3.1 and 3.2.1). Sequential heads add a transition bias to each position's base
logits given the token sampled just before it: the Markov head B(x_{k-1}, .) = W1[x_{k-1}] W2 (eq. 5), DeepSpec's
gated variant (W1 row scaled by a sigmoid gate of [h_k; W1[x_{k-1}]]), and the RNN head (eq. 6) whose state
carries the whole in-block prefix. The confidence head is eq. 7: a linear map of [h_k; W1[x_{k-1}]] (or h_k
alone) whose sigmoid is P(position k survives | 1..k-1 survived); it returns logits. Parameter names
(markov_w1, markov_w2, gate_proj, joint_proj, proj) are DeepSpec's."""

from __future__ import annotations

import torch
from torch import nn


class MarkovHead(nn.Module):
    """Stateless first-order transition bias. `step` takes and returns a state only so that every head
    shares one calling convention with the RNN head."""

    recurrent = False

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, out_size: int | None = None):
        super().__init__()
        self.rank = rank
        self.markov_w1 = nn.Embedding(vocab_size, rank)  # W1: [vocab, r], an embedding lookup
        # W2: r -> logits over the draft vocabulary (out_size; None = the whole vocabulary)
        self.markov_w2 = nn.Linear(rank, out_size or vocab_size, bias=False)

    def prev_embedding(self, prev_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w1(prev_ids.long())  # [..., r]

    def init_state(self, leading_shape, like: torch.Tensor) -> torch.Tensor | None:
        return None

    def features(self, state, prev_ids: torch.Tensor, hidden: torch.Tensor):
        """prev_ids [...], hidden [..., d] -> (new state, u [..., r]); the bias is u @ W2 (rank r)."""
        return state, self.prev_embedding(prev_ids)

    def step(self, state, prev_ids: torch.Tensor, hidden: torch.Tensor):
        """prev_ids [...], hidden [..., d] -> (new state, bias [..., vocab])."""
        state, u = self.features(state, prev_ids, hidden)
        return state, self.markov_w2(u)

    def teacher_forced_features(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Rank-r features for a whole block whose previous tokens are known: prev_ids [..., g], hidden
        [..., g, d] -> u [..., g, r]. Training multiplies them by W2 chunk by chunk (pdraft.train.losses)."""
        if not self.recurrent:  # position-wise heads need no loop
            return self.features(None, prev_ids, hidden)[1]
        state = self.init_state(prev_ids.shape[:-1], hidden)
        out = []
        for k in range(prev_ids.shape[-1]):
            state, u = self.features(state, prev_ids[..., k], hidden[..., k, :])
            out.append(u)
        return torch.stack(out, dim=-2)

    def teacher_forced(self, prev_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Biases for a whole block whose previous tokens are known -> [..., g, vocab]."""
        return self.markov_w2(self.teacher_forced_features(prev_ids, hidden))


class GatedMarkovHead(MarkovHead):
    def __init__(self, vocab_size: int, rank: int, hidden_size: int, out_size: int | None = None):
        super().__init__(vocab_size, rank, hidden_size, out_size)
        self.gate_proj = nn.Linear(hidden_size + rank, rank)

    def features(self, state, prev_ids, hidden):
        emb = self.prev_embedding(prev_ids)
        gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, emb.to(hidden.dtype)], dim=-1)))
        return state, gate.to(emb.dtype) * emb


class RNNHead(MarkovHead):
    """Eq. 6: z_k = [s_{k-1}; W1[x_{k-1}]; h_k]; one linear gives gate, candidate and output parts (in that
    order); s_k = g * s_{k-1} + (1 - g) * tanh(c); bias = W2 tanh(o). s_0 = 0."""

    recurrent = True

    def __init__(self, vocab_size: int, rank: int, hidden_size: int, out_size: int | None = None):
        super().__init__(vocab_size, rank, hidden_size, out_size)
        self.joint_proj = nn.Linear(2 * rank + hidden_size, 3 * rank)

    def init_state(self, leading_shape, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*leading_shape, self.rank, dtype=like.dtype, device=like.device)

    def features(self, state, prev_ids, hidden):
        z = torch.cat([state, self.prev_embedding(prev_ids).to(hidden.dtype), hidden], dim=-1)  # [..., 2r + d]
        gate_raw, cand_raw, out_raw = self.joint_proj(z).chunk(3, dim=-1)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1.0 - gate) * torch.tanh(cand_raw)
        return state, torch.tanh(out_raw)


SEQUENTIAL_HEAD_CLASSES = {"markov": MarkovHead, "gated": GatedMarkovHead, "rnn": RNNHead}


class ConfidenceHead(nn.Module):
    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1).float()  # logits [...]
