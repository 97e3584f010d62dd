"""Targets: Hugging Face causal LMs loaded with transformers (local folder, Hub id or the embedded default),
and the capture of chosen decoder layers' hidden states that every drafter is fed."""
