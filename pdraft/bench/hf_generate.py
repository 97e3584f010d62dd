"""transformers' own `model.generate()` as a bench baseline: the loop users already run, timed in the same process
on the same prompts, batch size, token budget, stop tokens and sampling settings as pdraft's target-alone run.

Timing. A logits processor stamps the clock each time generate hands it the next token's logits, that is after
every forward. The first token comes out of the prefill forward and is left out with it (pdraft's runs leave
their prefill out too); every later token costs one step, s_i = t_i - t_{i-1}. Each step becomes one
RoundRecord (gamma 0, one token committed, round_s = s_i) for every request still generating, so
pdraft.metrics.summarize computes its TPOT by the one definition every run uses: a request's time is the sum
of the steps it took part in, divided by its tokens. Batches are left-padded with an attention mask, as
generate requires for decoder-only models; a request stops at its first stop token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from pdraft.metrics import RoundRecord, join_batches

GENERATE_LABEL = "transformers generate()"


class _StepClock:
    """A logits processor that only records when it is called."""

    def __init__(self):
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.stamps.append(time.perf_counter())
        return scores


def generate_batch(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_token_ids: Sequence[int],
                   pad_token_id: int, sampling=None, seed: int = 0) -> tuple[list[list[int]], list[RoundRecord]]:
    """(outputs up to and including the first stop token, the per-step records) of one generate() call."""
    from transformers import GenerationConfig, LogitsProcessorList

    device = next(model.parameters()).device
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_token_id, dtype=torch.long)  # [batch, longest]
    mask = torch.zeros_like(ids)
    for j, p in enumerate(prompts):
        ids[j, longest - len(p):] = torch.tensor(list(p))
        mask[j, longest - len(p):] = 1
    sampled = sampling is not None and sampling.temperature > 0 and sampling.top_k != 1
    config = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=sampled,
                              pad_token_id=pad_token_id, eos_token_id=sorted(eos_token_ids) or None,
                              **(dict(temperature=sampling.temperature, top_k=sampling.top_k or None,
                                      top_p=sampling.top_p) if sampled else {}))
    clock = _StepClock()
    if sampled:
        torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config,
                             logits_processor=LogitsProcessorList([clock]))
    stops = set(eos_token_ids)
    outputs = []
    for row in out[:, longest:].tolist():
        cut = next((k + 1 for k, t in enumerate(row) if t in stops), len(row))
        outputs.append(row[:cut])
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]  # s_2, s_3, ...
    records = [RoundRecord(r, i, 0, 0, 0, 1, 0.0, s, s) for i, s in enumerate(steps, start=1)
               for r, o in enumerate(outputs) if len(o) > i]
    return outputs, records


def measure_generate(model, prompts: Sequence[Sequence[int]], *, batch_size: int, max_new_tokens: int,
                     eos_token_ids: Sequence[int], pad_token_id: int, sampling=None, seed: int = 0
                     ) -> tuple[list[list[int]], list[RoundRecord]]:
    """All prompts in batches of `batch_size`; rounds and requests numbered across batches."""
    outputs, batches = [], []
    for start in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[start:start + batch_size]]
        out, records = generate_batch(model, chunk, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                                      pad_token_id=pad_token_id, sampling=sampling, seed=seed + start)
        outputs.extend(out)
        batches.append((records, len(chunk)))
    return outputs, join_batches(batches)
