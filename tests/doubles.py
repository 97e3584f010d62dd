"""Test doubles of the drafter API, for proving the engine lossless before (and independently of) the real
DFlash/DSpark drafters, and for benchmarking the engine's own overhead. They are not drafters anyone would
ship: `RandomDrafter` proposes tokens from random distributions that depend on the previous draft token (like
DSpark's Markov head) with a confidence that depends on the previous token too; `OracleDrafter` proposes a
known reference continuation with a chosen miss rate. Both check the engine's side of the contract: context
positions arrive in order with no gaps or repeats, with features of the documented width."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdraft.models.sampling import is_greedy, probs_from_logits, sample
from pdraft.errors import PdraftError
from pdraft.models.api import DraftState, Drafter, Proposal


@dataclass
class DoubleConfig:
    vocab_size: int
    hidden_size: int
    target_layer_ids: list[int]
    block_size: int = 16
    kind: str = "dspark"
    block_convention: str = "deepspec"
    mask_token_id: int = 0
    denoise_steps: int = 1
    has_confidence: bool = True


class DoubleState(DraftState):
    """Keeps, per request, the target features of every committed context position, in order."""

    def __init__(self, batch_size: int):
        super().__init__()
        self.features: list[list[torch.Tensor]] = [[] for _ in range(batch_size)]
        self.lengths = [0] * batch_size
        self.requests = list(range(batch_size))  # the request each row holds (rows drop out as requests finish)

    def place(self, rows: torch.Tensor, other: DoubleState) -> None:
        """Rows take `other`'s requests (continuous batching): their context is the new requests'."""
        for i, r in enumerate(rows.tolist()):
            self.features[r], self.lengths[r] = list(other.features[i]), other.lengths[i]

    def select(self, rows: torch.Tensor) -> DoubleState:
        kept = DoubleState(0)
        for name in ("features", "lengths", "requests"):
            setattr(kept, name, [getattr(self, name)[i] for i in rows.tolist()])
        return kept


class _ContextChecking(Drafter):
    def __init__(self, config: DoubleConfig):
        super().__init__()
        self.config = config

    def attach_target(self, target_model) -> None:
        return None

    def max_gamma(self) -> int:
        return self.config.block_size

    def new_state(self, batch_size: int, capacity: int | None = None) -> DoubleState:
        return DoubleState(batch_size)

    def extend_context(self, state, target_hidden, positions, valid=None, token_ids=None) -> None:
        width = len(self.config.target_layer_ids) * self.config.hidden_size
        if target_hidden.shape[-1] != width:
            raise AssertionError(f"context features have width {target_hidden.shape[-1]}, expected {width}")
        valid = torch.ones(positions.shape, dtype=torch.bool) if valid is None else valid
        for b in range(positions.shape[0]):
            got = positions[b][valid[b]].tolist()
            want = list(range(state.lengths[b], state.lengths[b] + len(got)))
            if got != want:
                raise AssertionError(f"request {b}: context positions {got}, expected {want}")
            state.features[b].extend(target_hidden[b][valid[b]].clone().unbind(0))
            state.lengths[b] += len(got)

    def _check(self, state, anchor_positions, gamma):
        if not 1 <= gamma <= self.max_gamma():
            raise PdraftError(f"gamma {gamma} out of range 1..{self.max_gamma()}")
        for b, pos in enumerate(anchor_positions.tolist()):
            if state.lengths[b] != pos:  # the context holds 0..n-2 exactly when the anchor is at n-1
                raise AssertionError(f"request {b}: anchor at {pos} but context has {state.lengths[b]} tokens")


class RandomDrafter(_ContextChecking):
    """Random proposals from a valid distribution: logits_k = base + M[x_{k-1}], confidence_k = C[x_{k-1}]."""

    def __init__(self, config: DoubleConfig, seed: int = 0, sharpness: float = 3.0):
        super().__init__(config)
        g = torch.Generator().manual_seed(seed)
        v = config.vocab_size
        self.markov = torch.randn(v, v, generator=g) * sharpness  # [vocab, vocab]
        self.conf = torch.randn(v, generator=g) * 2.0 + 1.0  # [vocab] confidence logit after token x
        self.noise = torch.Generator().manual_seed(seed + 1)

    def propose(self, state, anchor_ids, anchor_positions, gamma, sampling=None, uniforms=None) -> Proposal:
        self._check(state, anchor_positions, gamma)
        batch = anchor_ids.shape[0]
        prev = anchor_ids
        if not is_greedy(sampling) and uniforms is None:
            uniforms = torch.rand(batch, gamma)
        tokens, probs, conf = [], [], []
        for k in range(gamma):
            logits = self.markov[prev] + torch.randn(batch, self.config.vocab_size, generator=self.noise)
            conf.append(self.conf[prev])  # depends on x_{k-1} only, known before x_k is drawn
            if is_greedy(sampling):
                tok = logits.argmax(-1)
            else:
                p = probs_from_logits(logits, sampling)  # [batch, vocab]
                tok = sample(p, uniforms[:, k])
                probs.append(p)
            tokens.append(tok)
            prev = tok
        return Proposal(
            tokens=torch.stack(tokens, 1),
            probs=torch.stack(probs, 1) if probs else None,
            confidence=torch.stack(conf, 1) if self.config.has_confidence else None,
        )


class OracleDrafter(_ContextChecking):
    """Proposes references[b][pos + 1 + k] (a known continuation, e.g. the target's greedy output), each token
    replaced by a random one with probability `miss_rate`. Greedy proposals (probs None)."""

    def __init__(self, config: DoubleConfig, references: list[list[int]], miss_rate: float = 0.2, seed: int = 0):
        super().__init__(config)
        self.references = [list(r) for r in references]
        self.miss_rate = miss_rate
        self.noise = torch.Generator().manual_seed(seed)

    def propose(self, state, anchor_ids, anchor_positions, gamma, sampling=None, uniforms=None) -> Proposal:
        self._check(state, anchor_positions, gamma)
        batch = anchor_ids.shape[0]
        rand = torch.randint(0, self.config.vocab_size, (batch, gamma), generator=self.noise)
        miss = torch.rand(batch, gamma, generator=self.noise) < self.miss_rate
        tokens = rand.clone()
        for b, pos in enumerate(anchor_positions.tolist()):
            ref = self.references[state.requests[b]][pos + 1 : pos + 1 + gamma]
            tokens[b, : len(ref)] = torch.tensor(ref, dtype=torch.long)
        tokens = torch.where(miss, rand, tokens)
        # Confidence of position k looks at position k-1 only (a miss there predicts trouble), so it is known
        # before x_k is drawn, as the scheduler's losslessness requires.
        shifted = torch.cat([torch.zeros(batch, 1, dtype=torch.bool), miss[:, :-1]], dim=1)
        confidence = torch.where(shifted, -2.0, 3.0) if self.config.has_confidence else None
        return Proposal(tokens=tokens, probs=None, confidence=confidence)


def widen(module: torch.nn.Module, scale: float, seed: int = 1) -> None:
    """Overwrite every weight matrix of `module` with N(0, scale^2) draws of one seeded generator: wider weights
    than the init, so a test drafter's drafts depend on their inputs and are sometimes accepted."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def tiny_target(vocab_size: int = 64, hidden_size: int = 32, num_layers: int = 3, context: int = 256,
                seed: int = 0, init_std: float = 0.3) -> torch.nn.Module:
    """A random-weight Qwen3 causal LM small enough for unit tests (float32, eval mode). The weights are drawn
    wider than transformers' default 0.02, which gives a near-constant model that ignores its context and so
    would let cache bugs go unnoticed; with 0.3 the greedy output depends on the whole context."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=hidden_size // 4, max_position_embeddings=context, tie_word_embeddings=True,
        initializer_range=init_std,
    )
    return Qwen3ForCausalLM(config).float().eval()
