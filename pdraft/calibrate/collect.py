"""Calibration data: run speculative decoding with full-block verification on held-out prompts and keep, for
every round and drafted position k, the raw confidence logit c_k, whether k was verified, whether it was
reached (k verified and 1..k-1 accepted) and whether the prefix 1..k survived ("accepted through k").

Full-block verification is what makes every drafted position an observation: with a threshold or the
scheduler, positions the policy cut would never be verified and their outcomes would be missing exactly where
confidence is low. The layout matches what SGLang's STS recorder stores (raw logits [N, gamma] and a prefix
mask whose row n has ones for positions < accepted_n; python/sglang/srt/speculative/dspark_components/
dspark_sts.py) plus a mask of verified positions, needed because pdraft's engine verifies fewer than gamma
drafts when a request is about to reach its token budget.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pdraft.metrics import RoundRecord
from pdraft.policies.base import check_confidence
from pdraft.decode.settings import DecodeSettings
from pdraft.errors import PdraftError
from pdraft.policies import FULL


@dataclass
class RoundData:
    """One array row per request-round; column k-1 holds drafted position k."""

    logits: np.ndarray  # [N, gamma] float64 raw confidence logits
    verified: np.ndarray  # [N] int: l, drafts sent to the target
    accepted: np.ndarray  # [N] int: a, drafts accepted
    prompt: np.ndarray  # [N] int: index of the prompt the round belongs to

    @property
    def gamma(self) -> int:
        return int(self.logits.shape[1])

    def __len__(self) -> int:
        return int(self.logits.shape[0])

    def positions(self) -> np.ndarray:
        return np.arange(1, self.gamma + 1)[None, :]  # [1, gamma]

    def observed(self) -> np.ndarray:
        """[N, gamma] bool: position k was verified."""
        return self.positions() <= self.verified[:, None]

    def reached(self) -> np.ndarray:
        """[N, gamma] bool: position k was verified and every earlier position accepted."""
        return self.observed() & (self.accepted[:, None] >= self.positions() - 1)

    def survived(self) -> np.ndarray:
        """[N, gamma] bool: positions 1..k were all accepted (the label of the cumulative survival a_k)."""
        return self.accepted[:, None] >= self.positions()

    def subset(self, rows: np.ndarray) -> RoundData:
        return RoundData(self.logits[rows], self.verified[rows], self.accepted[rows], self.prompt[rows])

    def split(self, held_out_fraction: float, seed: int = 0) -> tuple[RoundData, RoundData]:
        """(fit, held-out) split by prompt, never by round: rounds of one prompt are correlated, so a held-out
        measure must not see any round of a prompt the fit saw. held_out_fraction 0 gives (self, self)."""
        if held_out_fraction <= 0:
            return self, self
        prompts = sorted(set(self.prompt.tolist()))
        if len(prompts) < 2:
            raise PdraftError(f"a held-out split needs at least 2 prompts, the calibration data has {len(prompts)}",
                              hint="raise calibrate.num_prompts or pass --held-out 0")
        random.Random(seed).shuffle(prompts)
        n_held = min(max(1, round(held_out_fraction * len(prompts))), len(prompts) - 1)
        held = np.isin(self.prompt, np.array(prompts[:n_held]))
        return self.subset(~held), self.subset(held)

    def to_dict(self) -> dict:
        return {"logits": self.logits.tolist(), "verified": self.verified.tolist(),
                "accepted": self.accepted.tolist(), "prompt": self.prompt.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> RoundData:
        """The inverse of to_dict (calibrate-threshold's calibration/rounds.json)."""
        return cls(np.asarray(d["logits"], dtype=np.float64), np.asarray(d["verified"], dtype=np.int64),
                   np.asarray(d["accepted"], dtype=np.int64), np.asarray(d["prompt"], dtype=np.int64))


def from_records(records: Sequence[RoundRecord], prompt_offset: int = 0) -> RoundData:
    """Rows of the rounds that drafted with a confidence head (target-only rounds carry no confidence)."""
    rows = [r for r in records if r.confidence is not None and r.gamma > 0]
    if not rows:
        return RoundData(np.zeros((0, 0)), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                         np.zeros(0, dtype=np.int64))
    gamma = max(r.gamma for r in rows)
    if any(r.gamma != gamma for r in rows):
        raise PdraftError("calibration rounds drafted different numbers of tokens; collect them at one gamma")
    return RoundData(
        logits=np.array([r.confidence for r in rows], dtype=np.float64),
        verified=np.array([r.verified for r in rows], dtype=np.int64),
        accepted=np.array([r.accepted for r in rows], dtype=np.int64),
        prompt=np.array([r.request + prompt_offset for r in rows], dtype=np.int64),
    )


def concat(parts: Sequence[RoundData]) -> RoundData:
    parts = [p for p in parts if len(p)]
    if not parts:
        return from_records([])
    return RoundData(np.concatenate([p.logits for p in parts]), np.concatenate([p.verified for p in parts]),
                     np.concatenate([p.accepted for p in parts]), np.concatenate([p.prompt for p in parts]))


def collect(target_model, drafter, prompts: Sequence[Sequence[int]], settings: DecodeSettings, *,
            eos_token_ids: Sequence[int] = (), on_batch=None) -> RoundData:
    """Decode `prompts` with `settings` (DecodeSettings.from_recipe(recipe, "calibrate"): full-block
    verification) in batches of settings.batch_size and return every round's confidence and outcome. When
    sampling, prompt i draws from its own stream seeded from (settings.seed, i), as in `pdraft decode`."""
    from pdraft.decode.engine import generate
    from pdraft.streams import request_seeds

    check_confidence(drafter.config, "calibrate-threshold")
    if settings.verify != FULL:  # a policy that cuts drafts would leave low-confidence positions unobserved
        raise ValueError("calibration rounds are collected with full verification")
    parts = []
    batch = settings.batch_size
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        result = generate(target_model, drafter, chunk, settings, eos_token_ids=eos_token_ids,
                          seeds=request_seeds(settings.seed, start, len(chunk)))
        parts.append(from_records(result.records, prompt_offset=start))
        if on_batch is not None:
            on_batch(min(start + batch, len(prompts)), len(prompts))
    return concat(parts)
