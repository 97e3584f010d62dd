"""The target layer-id rule, with no dependency on torch or transformers so that the recipe can check ids
without loading the target package: id ``i`` is the output of decoder layer ``i``, ``-1`` is the embedding
output, ids are strictly increasing, and the last decoder layer is refused (pdraft.targets.capture says why and
captures the states). `check_layer_ids` is the one function that says so; every command calls it."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence

from pdraft.errors import PdraftError

EMBEDDING = -1  # layer id of the embedding output (transformers' hidden_states[0])
LAST_LAYER_WHY = ("no serving engine can read it: vLLM captures it before the final norm, SGLang never reaches "
                  "its capture point, DeepSpec refuses it")


def default_layer_ids(num_target_layers: int, num_ids: int) -> list[int]:
    """Spread `num_ids` layer ids evenly from layer 1 to layer L-3 (both included).

    The very first and last layers are skipped: the first is close to the embeddings and the last few are
    specialised for the next-token logits, which the drafter already gets through the shared LM head. For a
    36-layer Qwen3-4B and 5 ids this gives DeepSpec's published choice [1, 9, 17, 25, 33]. Shallow targets
    spread over 0..L-2 instead; the last layer is never picked (see the module docstring).
    """
    if num_ids < 1:
        raise PdraftError(f"need at least one target layer id, got {num_ids}")
    if num_target_layers < 1:
        raise PdraftError(f"target has no decoder layers ({num_target_layers})")
    if num_target_layers == 1:  # the only decoder layer is the last one: the embedding output is all there is
        if num_ids > 1:
            raise PdraftError(f"cannot pick {num_ids} layer ids from a 1-layer target (only -1, the embedding "
                              f"output, is allowed)")
        return [EMBEDDING]
    if num_ids > num_target_layers - 1:
        raise PdraftError(f"cannot pick {num_ids} distinct layer ids from a target with {num_target_layers} layers "
                          f"(ids 0..{num_target_layers - 2}; the last layer is not a feature layer)")
    if num_ids == 1:
        return [min(num_target_layers // 2, num_target_layers - 2)]
    start, end = 1, num_target_layers - 3
    if end - start + 1 < num_ids:  # shallow targets: spread over every allowed layer instead
        start, end = 0, num_target_layers - 2
    span = end - start
    # The step span / (num_ids - 1) is at least 1 here, so rounding never repeats an id.
    return [int(round(start + i * span / (num_ids - 1))) for i in range(num_ids)]


def check_layer_ids(layer_ids: Sequence[int], num_target_layers: int | None = None, *,
                    legacy_last: bool = True, where: str = "target layer ids") -> list[int]:
    """The layer-id rule (module docstring): return the ids as ints or raise a one-line PdraftError.

    `num_target_layers` None checks what needs no target (integers, strictly increasing, >= -1). The last
    layer L-1 is refused when `legacy_last` is False (everything that makes or exports a drafter: recipe,
    train, export-hidden, export); when True (reading a drafter pdraft already wrote: checkpoint load,
    pull, decode) it is accepted with a warning, because such drafters were trained on it."""
    if isinstance(layer_ids, (str, bytes)) or not isinstance(layer_ids, Sequence):
        raise PdraftError(f"{where} must be a list of integers, got {layer_ids!r}")
    ids = []
    for i in layer_ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise PdraftError(f"{where} must be integers, got {i!r} in {list(layer_ids)}")
        ids.append(int(i))
    if not ids:
        raise PdraftError(f"{where} are empty")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        what = "repeat" if len(set(ids)) != len(ids) else "are not in increasing order"
        raise PdraftError(f"{where} {what}: {ids} (ids must be strictly increasing: every engine concatenates "
                          f"the features in layer order)")
    if ids[0] < EMBEDDING:
        raise PdraftError(f"{where}: id {ids[0]} is out of range (-1 is the embedding output, i >= 0 the output "
                          f"of decoder layer i)")
    if num_target_layers is None:
        return ids
    last = num_target_layers - 1
    for i in ids:
        if i > last:
            raise PdraftError(f"target layer id {i} is out of range: the target has {num_target_layers} decoder "
                              f"layers (valid ids -1..{last - 1})")
    if ids[-1] == last:
        if not legacy_last:
            raise PdraftError(f"target layer id {last} is the target's last decoder layer: {LAST_LAYER_WHY} "
                              f"(valid ids -1..{last - 1})")
        _warn_legacy_last(last)
    return ids


_warned: set[int] = set()


def _warn_legacy_last(last: int) -> None:
    if last not in _warned:  # once per process: load, decode and capture all check the same drafter
        _warned.add(last)
        warnings.warn(f"this drafter reads the target's last layer ({last}), taken after the final norm as it was "
                      f"trained; {LAST_LAYER_WHY}, so retrain it on ids up to {last - 1} before exporting it",
                      stacklevel=3)
