"""The one rule for a sampling temperature, read by every path that takes one (the recipe's temperature keys,
so decode, bench and its generate() baseline, calibration and regeneration; and pdraft.models.api.SamplingParams,
which every drafter and the sampling code see): 0 means greedy, and a positive temperature must be at least
MIN_TEMPERATURE. Below it, logits / temperature overflows (1e-300 turns every logit into +-inf: generate()
crashed on the NaN softmax and decode drew token 0 instead of the greedy token), and a temperature that small
is greedy in all but name. It is refused, not rounded to greedy, so a run never reports a temperature it did
not use. The floor sits far above where the division overflows (float32 logits up to 1e32 divide safely by
1e-6) and a decade below vLLM's greedy cut (vllm/sampling_params.py `_SAMPLING_EPS = 1e-5`: vLLM decodes a
temperature below it greedily), so pdraft's own tests may sample at 1e-6 to reach the argmax by sampling.
Torch-free, so checking a recipe never imports torch."""

from __future__ import annotations

import math

MIN_TEMPERATURE = 1e-6  # smallest positive temperature (module docstring)
MAX_TEMPERATURE = 5.0  # above it every distribution is close to uniform: a typo, not a setting


def temperature_problem(value: float) -> str | None:
    """Why `value` is not a temperature pdraft samples at (None when it is one: 0, or in [MIN, MAX])."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"expected a finite number, found {value!r}"
    if value < 0 or value > MAX_TEMPERATURE:
        return f"expected 0 (greedy) or a value in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], found {value:g}"
    if 0 < value < MIN_TEMPERATURE:
        return (f"{value:g} is below the smallest temperature pdraft samples at, {MIN_TEMPERATURE:g} (logits / "
                f"temperature would overflow); use 0 for greedy")
    return None


def check_temperature(value: float) -> float:
    """`value`, or ValueError with temperature_problem's sentence (a pydantic validator's contract)."""
    problem = temperature_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


__all__ = ["MIN_TEMPERATURE", "MAX_TEMPERATURE", "temperature_problem", "check_temperature"]
