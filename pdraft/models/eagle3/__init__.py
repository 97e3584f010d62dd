"""EAGLE-3 (Li et al., NeurIPS 2025), the autoregressive drafter family: its config (config.py), its single decoder
layer (layer.py), the drafter with its KV cache and training-time test (model.py), the `LlamaForCausalLMEagle3`
checkpoint layout (format.py, FORMAT.md) and its registry entry (family.py)."""
