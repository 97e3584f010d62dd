"""Triton kernels for the hot spots of decoding and training, each beside the plain torch reference it must
equal: `seq_head_triton` (DSpark's sequential head, sampling and confidence fused over a draft block; its
launcher and torch reference are pdraft.models.dspark.fused_seq_head) and `loss` (the
chunked CE + TV + confidence loss over the vocabulary, forward and backward, never holding [N, vocab]).
`dispatch` picks Triton on CUDA and the torch reference elsewhere; tests force Triton on CPU under
`TRITON_INTERPRET=1`. Triton is optional: without it every entry point runs its torch reference."""

from pdraft.kernels.dispatch import force_triton, interpreting, triton_importable, use_triton

__all__ = ["force_triton", "interpreting", "triton_importable", "use_triton"]
