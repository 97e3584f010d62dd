"""The typed configuration of the KV-injection backbone every parallel family shares: `DFlashConfig`, which is
also the DFlash family's own config (pdraft/models/dflash/); DSpark's and DFlash2's configs extend it in their
folders. Sizes default to the target's (the drafter shares the target's embedding and LM head, so its hidden
size and vocabulary must equal the target's). `to_dict`/`from_dict` round-trip every field; the checkpoint
layouts (pdraft.models.formats and each family's format.py) map these configs onto the DeepSpec, z-lab and
DFlash2 `config.json` layouts. Serialisation and the range of every setting in LIMITS are inherited
(pdraft.models.config_base.DrafterConfig); `validate` adds the rules between fields. A config also describes
itself for the model card (`card_lines`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdraft.errors import PdraftError
from pdraft.layer_ids import check_layer_ids
from pdraft.models.config_base import BACKBONE_LIMITS, DrafterConfig
from pdraft.models.family import MAX_GAMMA, Limit

CONVENTIONS = ("deepspec", "zlab")
# The backbone's settings, one range each, by config.json field name: the recipe's `drafter` keys that set them
# (RECIPE_KEYS) and the config.json schema (pdraft.models.schema) both take these.
LIMITS = {
    **BACKBONE_LIMITS,  # the transformer's shape and the draft vocabulary, every family's (config_base)
    "block_size": Limit(1, MAX_GAMMA),
    "denoise_steps": Limit(1, 16),
    "mask_token_id": Limit(0, 1 << 22),
    "num_experts": Limit(0, 256),
    "num_experts_per_tok": Limit(1, 16, off=0),
    "moe_intermediate_size": Limit(8, 1 << 18, off=0),  # 0 = intermediate_size
}
# recipe `drafter` key -> the config field it sets, where the names differ (recipe_fields below maps them)
RECIPE_KEYS = {"num_layers": "num_hidden_layers", "experts_top_k": "num_experts_per_tok"}


def recipe_fields(section) -> dict:
    """The backbone's config fields a recipe `drafter` section sets (sizes left null take the target's): what
    every parallel family's FamilySpec.config_fields starts from."""
    out = dict(num_hidden_layers=section.num_layers, block_size=section.block_size,
               block_convention=section.block_convention, denoise_steps=section.denoise_steps,
               num_experts=section.num_experts, num_experts_per_tok=section.experts_top_k,
               draft_vocab_size=section.draft_vocab_size)
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "moe_intermediate_size"):
        if getattr(section, name) is not None:
            out[name] = getattr(section, name)
    return out


def quickstart_over_target_head(section) -> list[str]:
    """The quickstart runs the parallel families over the target's LM head whatever the recipe's draft vocabulary
    (EAGLE-3's there): on the quickstart a 1024-token one lowers DFlash's validation tau from 3.01 to 2.42
    (docs/DRAFTERS.md, "Draft vocabulary"). A FamilySpec.quickstart override."""
    return ["drafter.draft_vocab_size=null"] if section.draft_vocab_size is not None else []


@dataclass
class DFlashConfig(DrafterConfig):
    """A DFlash drafter. Field names follow transformers' Qwen3 config where one exists."""

    hidden_size: int
    vocab_size: int
    num_target_layers: int  # decoder layers of the target
    target_layer_ids: list[int]  # id i = transformers hidden_states[i + 1], -1 = embeddings (pdraft/layer_ids.py)
    mask_token_id: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int = 5  # drafter depth
    block_size: int = 16
    # "deepspec": the anchor is the first prediction position, block_size inputs give block_size drafts.
    # "zlab": the anchor is the bonus token, the block drafts block_size - 1 tokens after it.
    block_convention: str = "deepspec"
    denoise_steps: int = 1  # backbone passes per proposal; > 1 refines the block iteratively
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    attention_bias: bool = False
    hidden_act: str = "silu"
    max_position_embeddings: int = 40960
    num_experts: int = 0  # 0 or 1 = dense MLP
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 0  # 0 = intermediate_size
    # Rows of the drafter's own LM head over the most frequent tokens (pdraft.models.vocab), mapped into the
    # target's vocabulary by d2t/t2d as vLLM's qwen3_dflash.py / qwen3_dspark.py read them; None = none: the
    # target's LM head over the whole vocabulary (a value equal to vocab_size means the same).
    draft_vocab_size: int | None = None
    extra: dict = field(default_factory=dict)  # target config fields kept verbatim for DeepSpec-layout export

    kind = "dflash"
    model_type = "pdraft_dflash"
    limits = LIMITS

    def __post_init__(self) -> None:
        if self.draft_vocab_size is not None and int(self.draft_vocab_size) == int(self.vocab_size):
            self.draft_vocab_size = None  # the whole vocabulary is the target's head: one way to say it
        super().__post_init__()

    @property
    def has_confidence(self) -> bool:
        return False

    @property
    def reduced_vocab(self) -> bool:
        return self.draft_vocab_size is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_gamma(self) -> int:
        """Most draft tokens one proposal yields (max_gamma)."""
        return self.block_size if self.block_convention == "deepspec" else self.block_size - 1

    def validate(self) -> None:
        super().validate()  # every field of LIMITS in its range
        bad = self.bad
        if self.block_convention not in CONVENTIONS:
            bad(f"block_convention must be one of {CONVENTIONS}, got {self.block_convention!r}")
        if self.block_convention == "zlab" and self.block_size < 2:
            bad("the zlab convention needs block_size >= 2 (the anchor takes one slot)")
        for name in ("vocab_size", "head_dim", "num_target_layers"):  # bounded by the target, not by a Limit
            if int(getattr(self, name)) < 1:
                bad(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            bad(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads})")
        try:  # the one layer-id rule; a drafter pdraft wrote with the last layer still loads (with a warning)
            self.target_layer_ids = check_layer_ids(self.target_layer_ids, int(self.num_target_layers),
                                                    where="target_layer_ids")
        except PdraftError as e:
            bad(e.message)
        if not 0 <= self.mask_token_id < self.vocab_size:
            bad(f"mask_token_id {self.mask_token_id} is outside the vocabulary (size {self.vocab_size})")
        if self.is_moe and not 1 <= self.num_experts_per_tok <= self.num_experts:
            bad(f"num_experts_per_tok must be 1..{self.num_experts}, got {self.num_experts_per_tok}")
        if self.hidden_act != "silu":
            bad(f"only the silu activation is supported, got {self.hidden_act!r}")
        if self.draft_vocab_size is not None and not 1 <= int(self.draft_vocab_size) < int(self.vocab_size):
            bad(f"draft_vocab_size must be 1..{self.vocab_size} (the vocabulary), got {self.draft_vocab_size}")

    # ---- the model card (pdraft.hub.card) -------------------------------------------------------------
    def card_heads(self) -> str:
        """What the drafter adds to the backbone, appended to the card's "Kind" line ("" = nothing)."""
        return ""

    def card_lines(self) -> list[str]:
        """The card's lines about the block and the features the drafter reads."""
        convention = ("DeepSpec (the anchor is the first prediction slot: block_size drafts per block)"
                      if self.block_convention == "deepspec" else
                      "z-lab (the anchor is the bonus token: block_size − 1 drafts per block)")
        vocab = (f"{self.draft_vocab_size} of the target's {self.vocab_size} tokens (own head, d2t/t2d)"
                 if self.reduced_vocab else f"the target's LM head over all {self.vocab_size} tokens")
        return [f"- Block size: {self.block_size}; convention: {convention}; largest gamma: {self.num_gamma}",
                f"- Target layers read: {self.target_layer_ids} (id i = output of decoder layer i); mask token id: "
                f"{self.mask_token_id}; denoise steps: {self.denoise_steps}; draft vocabulary: {vocab}"]
