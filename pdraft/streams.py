"""Random streams for sampled decoding: one per request, as serving engines give each request its own seed
(vLLM's `SamplingParams(seed=...)`, SGLang's `sampling_seed`). Request i of a run seeded s draws from a CPU
`torch.Generator` seeded with a hash of (s, i), or with the request's own seed when its prompt gives one; the
drafter's sampling, the acceptance test and the residual resampling all take their uniforms from it. Every
running request draws the same count of numbers each round (2*gamma + 1, nothing when greedy) whatever the
rest of the batch does, so a request's output depends on the seed and its index in the run, not on which
batch it lands in or how large the batches are (up to floating-point differences between batch shapes), and
copies of one prompt are independent samples. The numbers are drawn on the CPU and moved to the model's
device, so a CPU generator never meets a CUDA tensor. `run_seed` is the one place a command's seed is read
from the recipe and its flag."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch


def run_seed(recipe, flag: int | None = None, section: str = "decode") -> int:
    """The seed of a run's sampling streams: the command's --seed flag, else `<section>.seed` (bench has its
    own), else decode.seed, else runtime.seed."""
    for value in (flag, getattr(getattr(recipe, section, None), "seed", None), recipe.decode.seed):
        if value is not None:
            return int(value)
    return int(recipe.runtime.seed)


def request_seed(seed: int, index: int) -> int:
    """The stream seed of request `index` of a run seeded `seed`: a hash of both, so that nearby seeds and
    indices give unrelated streams (seed + index would make request 1 of seed 0 request 0 of seed 1)."""
    digest = hashlib.blake2b(f"pdraft-request:{int(seed)}:{int(index)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: any torch.Generator accepts it


def request_seeds(seed: int, start: int, count: int, own: Sequence[int | None] | None = None) -> list[int]:
    """Stream seeds of requests start .. start+count-1 of a run; `own[i]` (a prompt's own `seed` field), where
    not None, is used as it is, as vLLM uses SamplingParams.seed."""
    own = list(own) if own is not None else [None] * count
    return [int(s) if s is not None else request_seed(seed, start + i) for i, s in enumerate(own)]


class Streams:
    """One CPU generator per request of a batch, seeded from `seeds` [batch]."""

    def __init__(self, seeds: Sequence[int]):
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]

    def reseed(self, row: int, seed: int) -> None:
        """Row `row` takes a new request (continuous batching): from now on it draws from that request's stream."""
        self.generators[row] = torch.Generator().manual_seed(int(seed))

    def draw(self, rows: torch.Tensor, n: int) -> torch.Tensor:
        """[batch, n] float32 uniforms in [0, 1) on the CPU: n from each stream in `rows` (a [k] long tensor of
        batch rows), zeros in the other rows, which draw nothing."""
        out = torch.zeros(len(self.generators), n)
        for r in rows.tolist():
            g = self.generators[r]
            out[r] = torch.rand(n, generator=g, device=g.device)  # on the generator's own device, then here
        return out
