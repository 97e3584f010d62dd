"""`pdraft decode` as library calls, shared by the command and the quickstart lifecycle: `DecodeRun.prepare`
resolves a run's verification policy with the files beside its drafter (before any model is loaded, so that a
missing cost table is reported at once), `load_drafter` loads and attaches the drafter to the target, and
`decode` decodes prompts `batch_size` at a time through pdraft.decode.engine.generate, each prompt drawing from
its own stream (so its output does not depend on the batch it falls in)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.decode.engine import GenerateResult, RoundEvent, generate
from pdraft.decode.inputs import load_attached_drafter
from pdraft.policies.base import VerifyConfig
from pdraft.decode.settings import DecodeSettings
from pdraft.streams import request_seeds


@dataclass
class DecodeRun:
    settings: DecodeSettings
    verify: VerifyConfig  # the run's policy with the drafter's calibration and cost table
    drafter_dir: Path | None  # None: the target alone
    files: dict = field(default_factory=dict)  # which files beside the drafter the policy read

    @classmethod
    def prepare(cls, settings: DecodeSettings, drafter_dir: str | Path | None = None, *, device=None,
                warn: Callable[[str], None] | None = None) -> DecodeRun:
        verify, used = settings.build_verify(drafter_dir=drafter_dir, device=device, warn=warn)
        return cls(settings, verify, Path(drafter_dir) if drafter_dir is not None else None, used)

    def load_drafter(self, target_model):
        """The run's drafter, loaded (checked against the target) and attached to it; None for the target alone."""
        return None if self.drafter_dir is None else load_attached_drafter(self.drafter_dir, target_model)

    def decode(self, target_model, drafter, prompts: Sequence[Sequence[int]], *, eos_token_ids: Sequence[int] = (),
               seeds: Sequence[int] | None = None, on_round: Callable[[RoundEvent], None] | None = None,
               on_batch: Callable[[], None] | None = None) -> list[GenerateResult]:
        """One GenerateResult per batch of `settings.batch_size` prompts. seeds: one stream seed per prompt (None:
        from (settings.seed, index)); on_batch: called after each batch."""
        seeds = list(seeds) if seeds is not None else request_seeds(self.settings.seed, 0, len(prompts))
        batch, results = self.settings.batch_size, []
        for start in range(0, len(prompts), batch):
            results.append(generate(target_model, drafter, prompts[start:start + batch], self.settings,
                                    verify=self.verify, eos_token_ids=eos_token_ids,
                                    seeds=seeds[start:start + batch], on_round=on_round))
            if on_batch is not None:
                on_batch()
        return results


__all__ = ["DecodeRun"]
