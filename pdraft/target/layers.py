"""Which target layers feed the drafter, and how their hidden states are captured in one forward pass.

Layer-id convention (the one DeepSpec, vLLM and SGLang use): id ``i`` means the output of decoder layer
``i``, which is transformers' ``hidden_states[i + 1]`` (``hidden_states[0]`` is the embedding output). As in
transformers, the output of the last decoder layer is taken after the model's final norm, because that is
what ``hidden_states[num_layers]`` holds. Capture uses forward hooks, so only the chosen layers are kept in
memory instead of every layer's states.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from pdraft.errors import PdraftError


def default_layer_ids(num_target_layers: int, num_ids: int) -> list[int]:
    """Spread `num_ids` layer ids evenly from layer 1 to layer L-3 (both included).

    The very first and last layers are skipped: the first is close to the embeddings and the last few are
    specialised for the next-token logits, which the drafter already gets through the shared LM head. For a
    36-layer Qwen3-4B and 5 ids this gives DeepSpec's published choice [1, 9, 17, 25, 33].
    """
    if num_ids < 1:
        raise PdraftError(f"need at least one target layer id, got {num_ids}")
    if num_target_layers < 1:
        raise PdraftError(f"target has no decoder layers ({num_target_layers})")
    if num_ids > num_target_layers:
        raise PdraftError(f"cannot pick {num_ids} distinct layer ids from a target with {num_target_layers} layers")
    if num_ids == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end - start + 1 < num_ids:  # shallow targets: spread over every layer instead
        start, end = 0, num_target_layers - 1
    span = end - start
    # The step span / (num_ids - 1) is at least 1 here, so rounding never repeats an id.
    return [int(round(start + i * span / (num_ids - 1))) for i in range(num_ids)]


def check_layer_ids(layer_ids: Sequence[int], num_target_layers: int) -> list[int]:
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise PdraftError("target layer ids are empty")
    for i in ids:
        if not 0 <= i < num_target_layers:
            raise PdraftError(
                f"target layer id {i} is out of range: the target has {num_target_layers} decoder layers "
                f"(valid ids 0..{num_target_layers - 1})"
            )
    if len(set(ids)) != len(ids):
        raise PdraftError(f"target layer ids repeat: {ids}")
    return ids


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layers of a transformers causal LM (Qwen3, Llama, Gemma and most others)."""
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise PdraftError(f"cannot find the decoder layers of {type(model).__name__}: expected `.model.layers`")
    return layers


def final_norm(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", model)
    norm = getattr(inner, "norm", None)
    if norm is None:
        raise PdraftError(f"cannot find the final norm of {type(model).__name__}: expected `.model.norm`")
    return norm


@contextlib.contextmanager
def capture_layers(model: nn.Module, layer_ids: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Inside the block, every forward of `model` records the chosen layers' outputs into the yielded dict
    (id -> [batch, seq, hidden]), following the convention in the module docstring."""
    layers = decoder_layers(model)
    ids = check_layer_ids(layer_ids, len(layers))
    last = len(layers) - 1
    norm = final_norm(model)
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def hook_for(i: int):
        def hook(_module, _inputs, output):
            captured[i] = output[0] if isinstance(output, tuple) else output

        return hook

    try:
        for i in ids:
            # The last layer's state is the final norm's output, taken from the model's own norm call.
            handles.append((norm if i == last else layers[i]).register_forward_hook(hook_for(i)))
        yield captured
    finally:
        for h in handles:
            h.remove()


def stack_captured(captured: dict[int, torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenate captured states in layer-id order: [batch, seq, len(layer_ids) * hidden]."""
    missing = [i for i in layer_ids if i not in captured]
    if missing:
        raise RuntimeError(f"layers {missing} were not captured; was the forward run inside capture_layers()?")
    return torch.cat([captured[i] for i in layer_ids], dim=-1)
