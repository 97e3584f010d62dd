"""`pdraft decode` as library calls, shared by the command and the quickstart lifecycle: `DecodeRun.prepare`
resolves a run's verification policy with the files beside its drafter (before any model is loaded, so that a
missing cost table is reported at once), `load_drafter` loads and attaches the drafter to the target, and
`decode` decodes prompts `batch_size` at a time through pdraft.decode.engine.generate, each prompt drawing from
its own stream (so its output does not depend on the batch it falls in). `target_alone_loop` is the same loop as
the batch generator of data regeneration."""

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


def target_alone_loop(target):
    """pdraft's own target-alone loop as regeneration's batch generator (pdraft.data.regenerate.BatchLoop), or None
    for transformers' generate(). The loop (pdraft.decode.engine: static KV cache, per-row lengths, each row's
    uniforms from its own stream, one per token, as regeneration's generate() sampler draws them) gives the same
    tokens (tests/test_data_regenerate.py compares both, greedy and sampled) about a third faster on the
    quickstart's target. It is used in one process where the static path covers the target eagerly (a CPU; on
    CUDA that path compiles, which a one-off regeneration does not pay back); sharded or wrapped targets under
    torchrun keep generate(), which their collectives are tested with. The commands that regenerate (export-hidden,
    train, the quickstart) hand it to pdraft.data.prepare as `loop_for`."""
    import torch

    from pdraft.decode import backend

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return None
    chosen = backend.resolve("auto", target.model)
    if not chosen.static or chosen.compiled:
        return None

    def loop(prompts, max_new_tokens, stops, seeds, sampling):
        out = generate(target.model, None, prompts, max_new_tokens=max_new_tokens, eos_token_ids=stops, seeds=seeds,
                       sampling=sampling)
        return [list(row) for row in out.output_ids]

    return loop


__all__ = ["DecodeRun", "target_alone_loop"]
