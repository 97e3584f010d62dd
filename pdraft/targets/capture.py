"""Which target layers feed the drafter, and how their hidden states are captured in one forward pass.

Layer-id rule (the one DeepSpec, vLLM and SGLang read, and the only one pdraft accepts): id ``i`` is the
output of decoder layer ``i`` (transformers' ``hidden_states[i + 1]``, which for ``i <= L - 2`` is also the
pre-norm hidden + residual that vLLM captures), ``-1`` is the embedding output (``hidden_states[0]``), ids
are strictly increasing (every engine concatenates features in layer order), and the last decoder layer
``L - 1`` is refused: vLLM captures it before the final norm, SGLang never reaches its capture point and
DeepSpec refuses it, so a drafter trained on it is served with other features than it learned. Drafters
pdraft wrote before this rule with the last layer still decode (its state is taken after the final norm, as
they were trained) with a warning; export refuses them. `check_layer_ids` (pdraft.layer_ids, re-exported here)
is the one function that says so; every command calls it. Capture uses forward hooks, so only the chosen layers are kept in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from pdraft.errors import PdraftError
from pdraft.layer_ids import EMBEDDING, LAST_LAYER_WHY, check_layer_ids, default_layer_ids  # noqa: F401  (the rule)


def _inner(model: nn.Module, name: str, what: str):
    """`model.model.<name>` of a transformers causal LM (Qwen3, Llama, Gemma and most others), or one line."""
    part = getattr(getattr(model, "model", model), name, None)
    if part is None:
        raise PdraftError(f"cannot find the {what} of {type(model).__name__}: expected `.model.{name}`")
    return part


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return _inner(model, "layers", "decoder layers")


def final_norm(model: nn.Module) -> nn.Module:
    return _inner(model, "norm", "final norm")


@contextlib.contextmanager
def capture_layers(model: nn.Module, layer_ids: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """Inside the block, every forward of `model` records the chosen layers' states into the yielded dict
    (id -> [batch, seq, hidden]), following the rule in the module docstring."""
    layers = decoder_layers(model)
    ids = check_layer_ids(layer_ids, len(layers))
    last = len(layers) - 1
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def hook_for(i: int):
        def hook(_module, _inputs, output):
            captured[i] = output[0] if isinstance(output, tuple) else output

        return hook

    def embedding_hook(_module, args, kwargs):
        # The input of decoder layer 0 is the embedding output as the model uses it (after any scaling, e.g.
        # Gemma's), which is what transformers records as hidden_states[0].
        captured[EMBEDDING] = args[0] if args else kwargs["hidden_states"]

    try:
        for i in ids:
            if i == EMBEDDING:
                handles.append(layers[0].register_forward_pre_hook(embedding_hook, with_kwargs=True))
            elif i == last:
                # Legacy drafters only (check_layer_ids warned): they were trained on the last layer after the
                # final norm, so they get that state, taken from the model's own norm call.
                handles.append(final_norm(model).register_forward_hook(hook_for(i)))
            else:
                handles.append(layers[i].register_forward_hook(hook_for(i)))
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
