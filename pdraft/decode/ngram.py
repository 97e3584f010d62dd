"""The n-gram prompt-lookup drafter: the training-free baseline every bench run includes. It proposes gamma tokens
by finding the most recent earlier occurrence of the context's last n tokens (prompt + output, n from
`max_ngram` down to `min_ngram`) and copying what followed it; a copy that runs into the end of the context
continues from its own proposal, so a repeating pattern is extended periodically. With no match at all it
proposes the anchor token repeated (a deterministic fallback the target mostly rejects). Proposals are
deterministic, so `probs` is None: the engine's rejection sampler treats them as one-hot distributions, which
keeps sampled decoding exact.

How it knows the tokens: the engine hands a drafter only the anchor (last committed token) and its position
each round, plus target features it has no use for here. The drafter is given each request's prompt ids at
construction and rebuilds the committed history itself: between two rounds the engine commits a drafts (which
are this drafter's own proposal prefix) and one target token (the new anchor), so the new anchor's position
says how many of its drafts were kept. This works with pdraft.decode.engine unchanged. Unlike vLLM's n-gram
proposer it always returns exactly gamma tokens (the drafter API requires a full block) and it searches the
most recent match rather than the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pdraft.errors import PdraftError
from pdraft.models.api import DraftState, Drafter, Proposal, SamplingParams
from pdraft.models.family import MAX_GAMMA


@dataclass
class NgramConfig:
    """Engine-facing config: the engine checks vocabulary, hidden size and layer ids against the target, so
    these mirror the target; one tapped layer keeps the (unused) feature capture cheap."""

    vocab_size: int
    hidden_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    max_ngram: int = 3  # longest suffix looked up (vLLM: prompt_lookup_max)
    min_ngram: int = 1  # shortest suffix looked up (vLLM: prompt_lookup_min)
    block_size: int = MAX_GAMMA  # largest gamma; no model limits it: the ceiling every drafter shares
    kind: str = "ngram"
    block_convention: str = "deepspec"
    mask_token_id: int = 0
    denoise_steps: int = 1
    has_confidence: bool = False


class NgramState(DraftState):
    """Per request: the committed token ids (prompt + output) and the last proposal, from which the next
    round's anchor position tells how many drafts were kept."""

    def __init__(self, prompts: Sequence[Sequence[int]]):
        super().__init__()
        self.history: list[list[int]] = [[int(t) for t in p] for p in prompts]
        self.drafts: list[list[int]] = [[] for _ in prompts]

    def select(self, rows: torch.Tensor) -> NgramState:
        kept = NgramState([])
        kept.history = [self.history[i] for i in rows.tolist()]
        kept.drafts = [self.drafts[i] for i in rows.tolist()]
        return kept


class NgramDrafter(Drafter):
    """Prompt-lookup drafting for the batch of `prompts` one `generate` call decodes (build one per call)."""

    def __init__(self, target_config, prompts: Sequence[Sequence[int]], *, max_ngram: int = 3,
                 min_ngram: int = 1, max_gamma: int = MAX_GAMMA):
        super().__init__()
        if not 1 <= min_ngram <= max_ngram:
            raise PdraftError(f"n-gram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        layers = int(target_config.num_hidden_layers)
        self.config = NgramConfig(
            vocab_size=int(target_config.vocab_size), hidden_size=int(target_config.hidden_size),
            target_layer_ids=[-1], num_target_layers=layers,  # embeddings: no extra compute, allowed on any target
            max_ngram=max_ngram, min_ngram=min_ngram,
            block_size=max_gamma,
        )
        self.prompts = [list(map(int, p)) for p in prompts]

    def attach_target(self, target_model) -> None:
        return None  # no weights to share

    def max_gamma(self) -> int:
        return self.config.block_size

    def new_state(self, batch_size: int, capacity: int | None = None) -> NgramState:  # reads the prompts: no cache
        if batch_size != len(self.prompts):
            raise PdraftError(f"n-gram drafter was built for {len(self.prompts)} prompts, asked to decode "
                              f"{batch_size}: build one NgramDrafter per generate() call")
        return NgramState(self.prompts)

    def extend_context(self, state, target_hidden, positions, valid=None, token_ids=None) -> None:
        return None  # target features are not used; the history is rebuilt from anchors in propose()

    def propose(self, state: NgramState, anchor_ids: torch.Tensor, anchor_positions: torch.Tensor, gamma: int,
                sampling: SamplingParams | None = None, uniforms: torch.Tensor | None = None) -> Proposal:
        if not 1 <= gamma <= self.max_gamma():
            raise PdraftError(f"gamma {gamma} out of range 1..{self.max_gamma()} for the n-gram drafter")
        rows = []
        for b, (anchor, pos) in enumerate(zip(anchor_ids.tolist(), anchor_positions.tolist())):
            self._catch_up(state, b, int(anchor), int(pos))
            rows.append(self._lookup(state.history[b], gamma))
            state.drafts[b] = rows[-1]
        tokens = torch.tensor(rows, dtype=torch.long, device=anchor_ids.device)  # [batch, gamma]
        return Proposal(tokens=tokens, probs=None, confidence=None)

    @staticmethod
    def _catch_up(state: NgramState, b: int, anchor: int, pos: int) -> None:
        """Append the drafts the engine kept since the last round and the new anchor to request b's history."""
        history, known = state.history[b], len(state.history[b])
        if pos == known - 1 and history[-1] == anchor:
            return  # first round (the anchor is the prompt's last token) or a finished request
        kept = pos - known
        if not 0 <= kept <= len(state.drafts[b]):
            raise PdraftError(f"n-gram drafter lost track of request {b}: anchor at position {pos} but "
                              f"{known} tokens known and {len(state.drafts[b])} drafted")
        history.extend(state.drafts[b][:kept])
        history.append(anchor)

    def _lookup(self, history: list[int], gamma: int) -> list[int]:
        """gamma tokens that followed the most recent earlier occurrence of the longest matching suffix."""
        ids = torch.tensor(history, dtype=torch.long)  # [n_tokens]
        for n in range(min(self.config.max_ngram, len(history) - 1), self.config.min_ngram - 1, -1):
            suffix = ids[-n:]  # [n]
            windows = ids[:-1].unfold(0, n, 1)  # [n_tokens - n, n]: windows that end before the last token
            hits = (windows == suffix).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # first token after the most recent match
                out: list[int] = []
                for k in range(gamma):  # may run into its own proposal: periodic continuation
                    i = start + k
                    out.append(history[i] if i < len(history) else out[i - len(history)])
                return out
        return [history[-1]] * gamma
