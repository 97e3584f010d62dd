"""The typed configuration of an EAGLE-3 drafter (Li et al., NeurIPS 2025): the target's feature layers (low, mid,
high by default, read by one fusion linear 3H -> H), one decoder layer whose attention reads [token embedding ;
hidden state] (2H), a final norm and an LM head over a reduced draft vocabulary of `draft_vocab_size` tokens
(the whole target vocabulary allowed). Field names follow the config.json the engines read (transformers'
Llama/Qwen3 names, `draft_vocab_size`, `norm_before_residual`; FORMAT.md beside this file cites the reader of
each); `ttt_steps` is the number of steps training-time test unrolled, kept so a card and a resumed run say
how the drafter was trained. The embedding is the target's (never saved); the hidden size therefore equals
the target's, which config.json states as `target_hidden_size`."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdraft.errors import PdraftError
from pdraft.layer_ids import check_layer_ids
from pdraft.models.config_base import BACKBONE_LIMITS, DrafterConfig
from pdraft.models.family import MAX_GAMMA, Limit

TTT_STEPS = 7  # EAGLE-3's and SpecForge's default unroll (`length=7` in both trainers)
# The one range of each setting of EAGLE-3's own, for its recipe key and its config.json field alike (issue 33);
# its transformer's shape and draft vocabulary take every family's (config_base.BACKBONE_LIMITS).
LIMITS = {"ttt_steps": Limit(1, MAX_GAMMA)}
DRAFT_VOCAB = 32000  # SpecForge's and the EAGLE-3 releases' draft vocabulary; capped at the target's
STEP_DECAY = 0.8  # EAGLE-3 (traineagle3/main.py), SpecForge and DeepSpec weight step k's loss by 0.8^(k-1)


@dataclass
class Eagle3Config(DrafterConfig):
    hidden_size: int
    vocab_size: int  # the target's vocabulary: draft ids map into it
    num_target_layers: int | None  # decoder layers of the target; None: a published checkpoint that does not say
    target_layer_ids: list[int]  # pdraft convention: id i = output of decoder layer i (pdraft/layer_ids.py)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int | None = None  # None = min(32000, vocab_size)
    num_hidden_layers: int = 1  # EAGLE-3 has one decoder layer; the engines' `midlayer.` names assume it
    ttt_steps: int = TTT_STEPS  # training-time-test steps it was trained with
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 40960
    # vLLM's and speculators' variant: the hidden state is normed before it becomes the residual (speculators
    # writes True by default, EAGLE and SpecForge checkpoints False).
    norm_before_residual: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k (the Qwen3 decoder of Eagle3Qwen3ForCausalLM)
    extra: dict = field(default_factory=dict)  # foreign config.json fields kept verbatim

    kind = "eagle3"
    model_type = "pdraft_eagle3"
    limits = {**BACKBONE_LIMITS, **LIMITS}
    feature_layers = 3  # low, mid, high: how many target layers build_drafter picks when none are given

    def __post_init__(self) -> None:
        if self.draft_vocab_size is None:  # EAGLE-3's 32000, or the whole vocabulary of a smaller target
            self.draft_vocab_size = min(DRAFT_VOCAB, int(self.vocab_size))
        super().__post_init__()

    # ---- what the rest of pdraft asks every config ------------------------------------------------------
    @property
    def has_confidence(self) -> bool:
        return False

    @property
    def num_gamma(self) -> int:
        """Most drafts one proposal yields: any chain length up to the shared ceiling (one pass per draft)."""
        return MAX_GAMMA

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size  # the embedding is the target's, so the widths are one

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    def validate(self) -> None:
        super().validate()  # every field of `limits` in its range
        bad = self.bad
        for name in ("vocab_size", "head_dim", "num_target_layers"):  # bounded by the target, not by a Limit
            value = getattr(self, name)
            if value is None and name == "num_target_layers":  # a published checkpoint that does not say
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                bad(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_hidden_layers != 1:
            bad(f"num_hidden_layers must be 1 (EAGLE-3's single decoder layer, the engines' `midlayer.`), got "
                f"{self.num_hidden_layers}")
        if self.draft_vocab_size > self.vocab_size:
            bad(f"draft_vocab_size {self.draft_vocab_size} exceeds the vocabulary ({self.vocab_size})")
        if self.num_attention_heads % self.num_key_value_heads:
            bad(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})")
        if self.attention_bias:  # vLLM's Llama and Qwen3 layers bias o_proj differently; no EAGLE-3 release has one
            bad("attention biases are not supported (no published EAGLE-3 drafter has them)")
        if self.hidden_act != "silu":
            bad(f"only the silu activation is supported, got {self.hidden_act!r}")
        try:  # the one layer-id rule; no EAGLE-3 pdraft wrote ever read the last layer, so it is refused outright
            depth = None if self.num_target_layers is None else int(self.num_target_layers)
            self.target_layer_ids = check_layer_ids(self.target_layer_ids, depth, legacy_last=False,
                                                    where="target_layer_ids")
        except PdraftError as e:
            bad(e.message)

    # ---- the model card (pdraft.hub.card) -------------------------------------------------------------
    def card_heads(self) -> str:
        return ""

    def card_lines(self) -> list[str]:
        vocab = (f"{self.draft_vocab_size} of the target's {self.vocab_size} tokens (d2t/t2d)" if self.reduced_vocab
                 else f"the whole vocabulary ({self.vocab_size} tokens)")
        return [f"- Autoregressive: gamma drafts take gamma sequential passes (a chain); largest gamma {self.num_gamma};"
                f" trained with training-time test over {self.ttt_steps} steps",
                f"- Target layers read: {self.target_layer_ids} (id i = output of decoder layer i), fused by one "
                f"linear; draft vocabulary: {vocab}"]
