"""The one recipe format every pdraft command reads: typed YAML with strict keys, range checks, a one-line
description per field, dotted command-line overrides (`--set train.lr=3e-4`), and a resolved copy written
next to every artifact. This module is the schema; reading the YAML within hard limits, the overrides, the
one-line errors and the field descriptions are pdraft.typed_yaml's, which `load_recipe` and `explain` call.

Errors name the file, the line, the key path, what was expected and what was found, one line per problem,
and suggest the closest known key for a misspelt one. Fields left as ``null`` whose value depends on the
target or the drafter (layer ids, hidden size, gamma) are derived by the command that knows them and written
into the resolved copy it saves. What depends on the drafter families and the verification policies comes from
their registries (pdraft.models.families, pdraft.policies): the `drafter.kind` and `decode.verify`
choices, the keys each family adds to `drafter` and `train` and its cross-checks. Both registries are
torch-free, so checking or explaining a recipe never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, create_model, field_validator, model_validator

from pdraft import typed_yaml
from pdraft.errors import PdraftError, RecipeError
from pdraft.layer_ids import check_layer_ids
from pdraft.models.dflash.config import CONVENTIONS, LIMITS, RECIPE_KEYS
from pdraft.models.families import FAMILIES
from pdraft.models.family import MAX_GAMMA
from pdraft.paths import RESOLVED_NAME
from pdraft.policies import DEFAULT as DEFAULT_POLICY
from pdraft.policies import NAMES as POLICY_NAMES
from pdraft.policies import POLICIES
from pdraft.policies import knobs as policy_knobs
from pdraft.policies import parse_tree
from pdraft.temperature import MAX_TEMPERATURE, check_temperature
from pdraft import ledger

MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes 64 bits; request seeds are hashed into 63
# Upper bounds of counts (issue 33): far above any real run, far below what would loop for days or exhaust memory
# (`bench.repeats: 1000000000` was accepted and never finished). One bound per setting, kept here.
MAX_STEPS = 100_000_000
MAX_TOKENS = 1 << 17  # tokens generated per prompt, or a sequence's tokens: the longest contexts served today
MAX_PROMPTS = 1_000_000  # prompts decoded by calibrate or per bench set
MAX_REPEATS = 1000  # timed repeats
MAX_COUNT = 1_000_000_000  # caps and thresholds on sample counts


def _tree_shape(value: Any) -> Any:
    """`decode.tree` by the `--tree` flag's rule, written once (pdraft.policies.parse_tree): `tree: 32` and `--set
    decode.tree=32` are read as an int, and the resolved copy records the width the budget chose ("32x4")."""
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected a node budget (32) or a budget and a width (32x4), got {value!r}")
    try:
        nodes, width = parse_tree(str(value), name="decode.tree")
    except PdraftError as e:  # "decode.tree: nodes must be in [1, 256], got 0": the key is named once
        raise ValueError(e.message.removeprefix("decode.tree ")) from None
    return f"{nodes}x{width}"


TreeShape = Annotated[str | None, BeforeValidator(_tree_shape)]
# Every temperature key: 0 = greedy, else within pdraft.temperature's floor and ceiling (one rule for every path).
Temperature = Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE), AfterValidator(check_temperature)]


class Section(BaseModel):
    # allow_inf_nan=False: `--set train.alpha_ce=inf` or `temperature: .nan` must be refused, never trained with.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    def written(self, keys) -> list[str]:
        """Those of `keys` the recipe gave with another value than the default: a key a run would drop is refused
        only then, since a resolved copy (recipe.resolved.yaml) writes every default out."""
        return [k for k in keys if k in self.model_fields_set and getattr(self, k) != type(self).model_fields[k].default]

    @model_validator(mode="before")
    @classmethod
    def _string_choices_yaml_made_booleans(cls, data: Any) -> Any:
        """Every field whose values are string choices takes them as the docs spell them, bare: YAML reads
        `compile: off` as False (pdraft.typed_yaml.string_choice_of_boolean); one rule for every such field."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, info in cls.model_fields.items():
            if name in out and get_origin(info.annotation) is Literal:
                out[name] = typed_yaml.string_choice_of_boolean(out[name], get_args(info.annotation))
        return out


def F(default: Any, description: str, **kw: Any) -> Any:  # noqa: N802 - reads like a declaration
    return Field(default, description=description, **kw)


class TargetSection(Section):
    id: str = F("builtin:tiny-stdlib", "Target model: a Hub id, a local folder, or builtin:NAME (embedded default).")
    revision: str | None = F(None, "Hub revision (branch, tag or commit) of the target; null = default branch.")
    layer_ids: list[StrictInt] | None = F(None, "Target layers fed to the drafter, strictly increasing: id i = output of decoder layer i, -1 = the embedding output; the last layer is refused (no engine serves it); null = spread evenly.")
    num_layer_ids: int = F(5, "How many layer ids to spread evenly when layer_ids is null.", ge=1, le=64)

    @field_validator("layer_ids", mode="before")
    @classmethod
    def _layer_rule(cls, value: Any) -> Any:
        # One line for the whole list (integers only: "023" or ["0", "2"] is refused, never read as digits), and
        # what needs no target; the last layer is checked where the depth is known (recipe check, target load).
        if value is not None:
            try:
                check_layer_ids(value, None, legacy_last=False, where="ids")
            except PdraftError as e:
                raise ValueError(e.message) from None
        return value
    max_context: int | None = F(None, "Longest prompt plus output in tokens; null = the target's max_position_embeddings.", ge=16, le=1 << 24)
    tensor_parallel: int = F(1, "Shard the target over this many processes under torchrun (transformers' tensor parallelism, tp_plan auto): groups of N consecutive ranks hold one copy of it and see the same data, and the drafter trains data-parallel across the groups. Must divide WORLD_SIZE and the target's attention and key/value heads; 1 = every process loads the whole target.", ge=1, le=1024)


class DataSection(Section):
    source: str = F("builtin:code-train+prose-train", "Training prompts: a JSONL/Parquet file, a datasets id, or the embedded target's training-split sets builtin:code-train / builtin:prose-train (joined by +).")
    split: str = F("train", "Split to read when source is a datasets id.")
    max_samples: int | None = F(None, "Use at most this many samples; null = all.", ge=1, le=MAX_COUNT)
    max_length: int = F(256, "Truncate each training sequence to this many tokens.", ge=8, le=131072)
    chat_template: bool = F(True, "Apply the target's chat template to prompts, as decode does.")
    regenerate: bool = F(False, "Replace the responses with the target's own generations (recommended for real targets).")
    regenerate_max_new_tokens: int = F(256, "Tokens to generate per prompt when regenerating.", ge=1, le=MAX_TOKENS)
    regenerate_temperature: Temperature = F(0.0, "Sampling temperature when regenerating (0 = greedy). Sampled responses give the drafter the contexts sampled serving reaches (the DSpark paper regenerates with the target's recommended sampling parameters); each prompt draws from its own seeded stream, so a resumed export writes the same data.")
    regenerate_top_k: int = F(0, "Top-k when regenerating with temperature > 0 (0 = off).", ge=0, le=1 << 24)
    regenerate_top_p: float = F(1.0, "Nucleus mass when regenerating with temperature > 0 (1 = off).", gt=0.0, le=1.0)
    regenerate_greedy_share: float = F(0.0, "With regenerate_temperature > 0: this share of the prompts, spread evenly over them, is regenerated greedily and the rest sampled (a mix; 0 = all sampled).", ge=0.0, le=1.0)
    cache_dir: str | None = F(None, "Hidden-state cache folder; null = OUTPUT_DIR/hidden.")
    cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = F("auto", "Stored dtype of the hidden states; auto = bf16 when the target computes in bf16, else fp16.")
    export_batch_tokens: int = F(8192, "Padded tokens per target forward during export.", ge=16, le=1 << 24)
    min_loss_tokens: int = F(1, "Drop sequences with fewer loss tokens (DeepSpec uses 14).", ge=1, le=MAX_TOKENS)
    regenerate_batch_size: int = F(8, "Prompts generated together when regenerating (with vllm: prompts per resumable chunk handed to the engine; a few hundred keeps it busy).", ge=1, le=1_000_000)
    regenerate_engine: Literal["transformers", "vllm", "llamacpp"] = F("transformers", "What regenerates the responses: the target in pdraft's own processes (`transformers`: pdraft's own target-alone loop where its static path covers the target in one process, else transformers' generate(), sharded by target.tensor_parallel; the same tokens either way), vLLM, driven in its own interpreter (data.vllm_python), or llama.cpp's llama-server (`llamacpp`: the pinned build, data.llamacpp_slots requests in flight, on data.llamacpp_gguf), each before pdraft loads the target; same chat template, stop ids, sampling and per-prompt seeds.")
    llamacpp_gguf: str | None = F(None, "With regenerate_engine llamacpp: the target's GGUF llama-server runs; null = the target's folder converted once to a float32 GGUF in the cache folder (the target's own weights; a quantized GGUF regenerates another model's responses).")
    llamacpp_slots: int = F(16, "With regenerate_engine llamacpp: requests in flight on llama-server's parallel slots (continuous batching; 16 was the fastest of 1, 4, 8, 16 and 32 for SmolLM2's float32 GGUF on a 2-core CPU: docs/SCALING.md); the context each needs is reserved per slot.", ge=1, le=256)
    vllm_args: dict[str, Any] = F({}, "With regenerate_engine vllm: keyword arguments for vllm.LLM(...), passed through as given (tensor_parallel_size, pipeline_parallel_size, gpu_memory_utilization, max_model_len, enforce_eager, ...); pdraft sets model, tokenizer and seed itself, and dtype unless given here.")
    vllm_start_timeout_s: float = F(30.0, "With regenerate_engine vllm (and the vLLM engine of bench and check-serving): seconds the interpreter in data.vllm_python may take to answer a one-line probe, and the worker its first line (sent before it imports vLLM), before pdraft stops it and says so.", gt=0.0, le=3600.0)
    vllm_load_timeout_s: float = F(1800.0, "With regenerate_engine vllm: seconds pdraft waits for the engine to load (weights, CUDA graphs) before it stops the worker and says so.", gt=0.0, le=86_400.0)
    vllm_chunk_timeout_s: float = F(3600.0, "With regenerate_engine vllm: seconds pdraft waits for one chunk of data.regenerate_batch_size prompts to come back before it stops the worker and says so.", gt=0.0, le=86_400.0)
    vllm_python: str | None = F(None, "With regenerate_engine vllm: the Python interpreter that has vLLM installed (vLLM pins its own torch, so it usually lives in its own venv, e.g. .venv-vllm/bin/python); null = the interpreter running pdraft.")

    @field_validator("vllm_args")
    @classmethod
    def _vllm_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        import json

        if len(value) > 64:
            raise ValueError(f"{len(value)} keyword arguments; vllm.LLM takes a few dozen at most")
        for key in value:
            if not str(key).isidentifier():
                raise ValueError(f"{key!r} is not a keyword argument name")
            if key in ("model", "tokenizer", "seed"):
                raise ValueError(f"{key} is set by pdraft (the target's folder and runtime.seed); drop it here")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"values must be plain YAML data (numbers, strings, lists, mappings): {e}") from None
        return value
    skip_malformed: bool = F(False, "Skip malformed JSONL lines (their numbers are reported) instead of stopping.")
    shard_tokens: int = F(65536, "Tokens per hidden-state shard.", ge=256, le=1 << 26)

    @model_validator(mode="after")
    def _sampling_keys_of_a_greedy_regeneration(self) -> DataSection:
        """Sampling settings written for a greedy regeneration would be dropped (issue 60): refused, naming both."""
        if self.regenerate_temperature == 0:
            written = self.written(("regenerate_top_k", "regenerate_top_p", "regenerate_greedy_share"))
            if written:
                raise ValueError(f"data.{written[0]} is a setting of sampled regeneration, but "
                                 f"data.regenerate_temperature is 0 (greedy), which does not read it: drop it, or "
                                 f"set data.regenerate_temperature > 0")
        return self


def _choices(names) -> Any:
    return Literal[tuple(names)]  # Literal['a', 'b', ...] from a registry's names


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def _section(name: str, *parts: type[BaseModel] | dict) -> type[Section]:
    """A Section model whose fields are those of `parts` in order: classes (their declared fields) and dicts of
    the keys the families add ({key: (annotation, FieldInfo)}), so each family's keys sit where they belong."""
    fields: dict[str, tuple] = {}
    for part in parts:
        items = part.items() if isinstance(part, dict) else ((k, (f.annotation, f)) for k, f in part.model_fields.items())
        for key, spec in items:
            if key in fields:
                raise ValueError(f"recipe key {name}.{key} is defined twice")
            fields[key] = spec
    return create_model(name, __base__=Section, **fields)


def _family_fields(section: str) -> dict:
    return {key: spec for family in FAMILIES for key, spec in getattr(family, f"{section}_fields").items()}


def _limited(key: str, default: Any, description: str) -> Any:
    """A `drafter` key whose range is the backbone setting's one limit (pdraft.models.dflash.config.LIMITS)."""
    return LIMITS[RECIPE_KEYS.get(key, key)].recipe_field(default, description)


class _DrafterBackbone(Section):
    kind: _choices(FAMILIES.kinds) = F(FAMILIES.default.kind, "Drafter family: " + _listing([f"{f.kind} ({f.summary})" for f in FAMILIES]) + ".")  # type: ignore[valid-type]
    num_layers: int = _limited("num_layers", 5, "Number of drafter decoder layers.")
    block_size: int = _limited("block_size", 16, "Tokens per draft block (the largest gamma, see block_convention).")
    block_convention: _choices(CONVENTIONS) = F("deepspec", "deepspec: the anchor is the first prediction position; zlab: the anchor is the bonus token and block_size-1 tokens are drafted.")  # type: ignore[valid-type]
    denoise_steps: int = _limited("denoise_steps", 1, "Refinement passes over the block; decode must use the same number.")
    mask_token_id: int | None = _limited("mask_token_id", None, "Mask token id fed at undrafted positions; null = the tokenizer's mask token.")
    hidden_size: int | None = _limited("hidden_size", None, "Drafter hidden size; null = the target's.")
    intermediate_size: int | None = _limited("intermediate_size", None, "Drafter MLP width; null = the target's.")
    num_attention_heads: int | None = _limited("num_attention_heads", None, "Attention heads; null = the target's.")
    num_key_value_heads: int | None = _limited("num_key_value_heads", None, "Key/value heads; null = the target's.")
    num_experts: int = _limited("num_experts", 0, "Mixture-of-experts MLP experts per layer; 0 = dense MLP.")
    experts_top_k: int = _limited("experts_top_k", 2, "Experts each token is routed to when num_experts > 0.")
    moe_intermediate_size: int | None = _limited("moe_intermediate_size", None, "Width of each expert's MLP; null = intermediate_size.")
    draft_vocab_size: int | None = _limited("draft_vocab_size", None, "Tokens of the drafter's own LM head: the most frequent tokens of the training responses, mapped into the target's vocabulary by d2t/t2d (as vLLM reads them); null = DFlash, DSpark and DFlash2 use the target's LM head over the whole vocabulary, EAGLE-3 min(32000, the vocabulary), its default. No engine serves a DFlash2 with one (export refuses it).")


class _DrafterTail(Section):
    init_from: str | None = F(None, "Start from this drafter (folder or Hub id) instead of random weights.")
    init_from_target: bool = F(False, "Start a fresh drafter's decoder layers and final norm from the target's top decoder layers and final norm (same-named parameters of the same shape; the rest stay random).")


# The backbone keys every family reads, then each family's own keys (in registration order), then init_from.
DrafterSection = _section("DrafterSection", _DrafterBackbone, _family_fields("drafter"), _DrafterTail)


class _TrainHead(Section):
    output_dir: str | None = F(None, "Where checkpoints go; null = OUTPUT_DIR/<drafter kind>.")
    online: bool = F(False, "Compute target features during training instead of reading the hidden-state cache.")
    steps: int = F(1000, "Optimizer steps.", ge=1, le=MAX_STEPS)
    batch_size: int = F(8, "Sequences per micro-batch.", ge=1, le=1 << 16)
    grad_accum: int = F(1, "Micro-batches per optimizer step.", ge=1, le=1 << 16)
    lr: float = F(3e-4, "Peak learning rate (AdamW).", gt=0.0, le=1.0)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0.0, le=1.0)
    warmup_steps: int = F(50, "Linear warm-up steps before cosine decay.", ge=0, le=MAX_STEPS)
    warmup_ratio: float | None = F(None, "Warm-up as a fraction of steps; overrides warmup_steps when set.", ge=0.0, lt=1.0)
    min_lr_ratio: float = F(0.1, "Final learning rate as a fraction of lr.", ge=0.0, le=1.0)
    grad_clip: float = F(1.0, "Clip the gradient norm to this value (0 = off).", ge=0.0, le=1e6)
    num_anchors: int = F(8, "Anchor positions sampled per sequence, each starting one training block.", ge=1, le=4096)
    alpha_ce: float = F(1.0, "Weight of the cross-entropy loss against the target's tokens.", ge=0.0, le=1e6)
    alpha_tv: float | None = F(None, "Weight of the total-variation loss against the target distribution; null = " + ", ".join(f"{f.loss_defaults.get('alpha_tv', 0.0):g} for {f.kind}" for f in FAMILIES) + ".", ge=0.0, le=1e6)
    alpha_kl: float | None = F(None, "Weight of the KL divergence from the target's distribution (restricted to the drafter's vocabulary); null = " + ", ".join(f"{f.loss_defaults.get('alpha_kl', 0.0):g} for {f.kind}" for f in FAMILIES) + ".", ge=0.0, le=1e6)
    alpha_conf: float | None = F(None, "Weight of the confidence BCE loss; null = 1 for a drafter with a confidence head (0 without one).", ge=0.0, le=1e6)


class _TrainTail(Section):
    confidence_target: Literal["tv", "greedy"] = F("tv", "Confidence label: 1 - TV (sampled serving, paper eq. 8) or argmax agreement (greedy serving).")
    loss_decay: float | None = F(None, "Position weight w_k = exp(-(k-1)/loss_decay); null = the block size (EAGLE-3: 1/ln 1.25, so w_k = 0.8^(k-1) as it trains).", gt=0.0, le=1e6)
    loss_chunk_size: int = F(1024, "Positions per vocabulary-loss chunk; peak loss memory is about 6 x chunk x vocab x 4 bytes.", ge=1, le=1 << 20)
    fused_loss: bool = F(False, "Use the fused Triton CE + TV kernel on CUDA (the chunked torch loss elsewhere).")
    checkpoint_every: int = F(200, "Save a checkpoint every N steps.", ge=1, le=MAX_STEPS)
    keep_checkpoints: int = F(2, "Checkpoints kept besides latest.", ge=1, le=10000)
    eval_every: int = F(200, "Validate every N steps.", ge=1, le=MAX_STEPS)
    log_every: int = F(10, "Append metrics to the log every N steps.", ge=1, le=MAX_STEPS)
    distributed: Literal["auto", "none", "ddp", "fsdp"] = F("auto", "Multi-GPU strategy under torchrun; auto = ddp when WORLD_SIZE > 1.")


# The shared loss weights, then each family's own (DFlash2's alpha_selector), then the rest.
TrainSection = _section("TrainSection", _TrainHead, _family_fields("train"), _TrainTail)


class CalibrateSection(Section):
    prompts: str = F("builtin:code+prose", "Held-out prompts for calibration (same forms as bench prompt sets).")
    num_prompts: int = F(64, "Prompts to decode for calibration data.", ge=1, le=MAX_PROMPTS)
    max_new_tokens: int = F(64, "Tokens generated per calibration prompt.", ge=1, le=MAX_TOKENS)
    temperature: Temperature = F(0.0, "Decoding temperature while collecting calibration data.")
    gamma: int | None = F(None, "Draft length while collecting; null = the drafter's largest.", ge=1, le=MAX_GAMMA)
    held_out_fraction: float = F(0.3, "Share of prompts kept out of the fit to measure the after-ECE.", ge=0.0, lt=1.0)
    bins: int = F(15, "Bins of the expected calibration error.", ge=2, le=1000)
    binning: Literal["equal_mass", "equal_width"] = F("equal_mass", "How ECE bins are formed.")
    min_samples: int = F(50, "Fewest reached samples a position needs for its own temperature.", ge=1, le=MAX_COUNT)
    sps_max_batch_tokens: int = F(64, "Largest verification batch (tokens) profiled for the scheduler's cost table.", ge=1, le=1 << 16)
    sps_repeats: int = F(5, "Timed repeats per batch size when profiling.", ge=1, le=MAX_REPEATS)
    sps_requests: int = F(8, "Requests the profiled verification tokens are spread over.", ge=1, le=1024)
    sps_engine: str | None = F(None, "Measure the cost table in a serving engine (vllm) instead of pdraft's own verifier, so that a policy deployed in that engine plans with its costs: the target served alone with prefix caching, B new tokens over cached contexts per step (docs/ENGINES.md); the table's metadata names the engine (`measured_in`). null = pdraft's verifier.", pattern=r"^[a-z][a-z0-9_-]{0,31}$")


class _DecodeHead(Section):
    # These defaults are also the library's: pdraft.decode.settings.DecodeSettings takes its own from here.
    gamma: int | None = F(None, "Draft tokens per round; null = the drafter's largest.", ge=1, le=MAX_GAMMA)
    temperature: Temperature = F(0.0, "Sampling temperature (0 = greedy).")
    top_p: float = F(1.0, "Nucleus sampling mass (1 = off).", gt=0.0, le=1.0)
    top_k: int = F(0, "Top-k sampling (0 = off).", ge=0, le=1 << 22)
    draft_sample_method: Literal["probabilistic", "greedy"] = F("probabilistic", "How drafts are drawn when sampling (temperature > 0): probabilistic = from the drafter's distribution, tested against it; greedy = the drafter's argmax, tested as a one-hot distribution (vLLM's speculative_config draft_sample_method, vllm/config/speculative.py, whose default is greedy). Both are lossless; at temperature 0 both are the argmax. A chain only: a sampled tree draws its children.")
    max_new_tokens: int = F(128, "Tokens to generate per prompt.", ge=1, le=MAX_TOKENS)
    seed: int | None = F(None, "Seed of the sampling generator; null = runtime.seed.", ge=0, le=MAX_SEED)
    verify: _choices(POLICY_NAMES) = F(DEFAULT_POLICY, "Verification length: " + _listing([f"{p.name} ({p.summary})" for p in POLICIES]) + ".")  # type: ignore[valid-type]


class _DecodeTail(Section):
    tree: TreeShape = F(None, "Verify a tree per round from the drafter's one parallel pass: a node budget (32, the width chosen: 4, fewer under 8 nodes) or budget x width (32x4); null = a chain of gamma drafts. DFlash, DSpark and DFlash2, with verify = full (docs/DECODE.md). pdraft decode decodes with it (--tree wins); pdraft bench runs each parallel drafter's tree beside its chain in the gamma sweep (--tree wins); calibration verifies a chain and does not read it.")
    sps_table: str | None = F(None, "Scheduler cost table (JSON); null = the one next to the drafter.")
    batch_size: int = F(1, "Requests decoded together.", ge=1, le=1024)
    fused_kernels: bool = F(False, "Use the fused Triton sequential-head kernel for DSpark drafts on CUDA.")
    packed_verify: bool = F(True, "Verify only the real tokens of a batch (sum of 1 + l), not a padded rectangle.")
    compile: Literal["auto", "on", "off"] = F("auto", "Static KV and context caches and compiled passes: auto = static caches where the target's family allows, compiled (CUDA graphs) on CUDA only; on = compiled everywhere (torch.compile; CPU compiles take tens of seconds); off = the reference eager path (transformers' forward, any causal LM).")
    chat_template: bool = F(True, "Wrap prompts in the target's chat template.")
    enable_thinking: bool = F(False, "Let the chat template enable thinking (Qwen3).")


# The run's keys, then the knobs the verification policies declare (pdraft.policies: threshold,
# round_overhead_ms; each with its one range), then the rest.
DecodeSection = _section("DecodeSection", _DecodeHead, {knob.key: knob.recipe_field() for knob in policy_knobs()},
                         _DecodeTail)


class BenchSection(Section):
    gamma: str = F("4..16", "Draft lengths to sweep: a range A..B, a list 4,8,16, or one value.")

    @field_validator("gamma", "sampled_gamma", mode="before")
    @classmethod
    def _gamma_text(cls, value: Any) -> Any:
        # `gamma: 8` and `--set bench.gamma=8` are read as an int, `gamma: [4, 8]` as a list: both mean the text.
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return str(value)
        if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ",".join(map(str, value))
        return value
    prompt_sets: list[str] = F(["builtin:code", "builtin:prose"], "Prompt sets: builtin:code, builtin:prose, DeepSpec-layout JSONL files, or datasets ids.")
    num_prompts: int = F(16, "Prompts per set.", ge=1, le=MAX_PROMPTS)
    max_new_tokens: int = F(64, "Tokens generated per prompt.", ge=1, le=MAX_TOKENS)
    temperature: Temperature = F(0.0, "Sampling temperature (0 = greedy).")
    top_p: float = F(1.0, "Nucleus mass when sampling (1 = off, so temperature really samples).", gt=0.0, le=1.0)
    top_k: int = F(0, "Top-k when sampling (0 = off, so temperature really samples).", ge=0, le=1 << 22)
    batch_size: int = F(1, "Requests decoded together.", ge=1, le=1024)
    repeats: int = F(1, "Timed repeats; the median is reported.", ge=1, le=MAX_REPEATS)
    seed: int | None = F(None, "Seed for bench sampling; null = decode.seed, then runtime.seed.", ge=0, le=MAX_SEED)
    skip_malformed: bool = F(False, "Skip malformed JSONL lines in prompt sets (their numbers are reported) instead of stopping.")
    ngram_baseline: bool = F(True, "Include the n-gram prompt-lookup drafter as the training-free reference.")
    generate_baseline: bool = F(True, "Also time transformers' own model.generate() as a target-alone baseline; speedups are measured against the faster of it and pdraft's target-alone loop.")
    float32_baseline: bool = F(True, "On a CPU run in a reduced dtype (runtime.dtype auto picks bfloat16 on CPUs with bf16 units), also time pdraft's target alone on a float32 copy of the target in the gamma sweep: on some CPUs a one-row float32 product is faster than a bfloat16 one, and speedups count against the fastest target alone whatever its dtype. Left out (with a warning) where the copy would not fit in half the free memory; nothing on a GPU or in a float32 run.")
    output_dir: str | None = F(None, "Report folder; null = OUTPUT_DIR/bench.")
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = F([], "Requests in flight for the serving sweep (continuous batching), e.g. [1, 4, 16, 32]; empty = the gamma sweep only (docs/BENCH.md).", max_length=64)
    temperatures: list[Temperature] = F([], "Temperatures the sweep runs side by side, e.g. [0, 1] (the gamma sweep's tables, recommendations and bench.json hold each; the serving sweep's too); empty = bench.temperature.", max_length=16)
    sampled_gamma: str | None = F(None, "Draft lengths of the gamma sweep at temperatures above 0 (a range, a list or one value, as bench.gamma); null = bench.gamma. A sampled run drafts more rounds per token, so a cheaper T=1 sweep runs fewer gammas (the quickstart: the middle one).")
    sampled_num_prompts: int | None = F(None, "Prompts per set of the gamma sweep at temperatures above 0 (the first ones of bench.num_prompts); null = bench.num_prompts.", ge=1, le=MAX_PROMPTS)
    policies: list[str] = F([], "Verification policies the serving sweep runs side by side (registered names: full, threshold, scheduler, ...); empty = decode.verify.", max_length=16)
    sla_tps: float | None = F(None, "Per-user tokens/s floor of the serving sweep: the best total throughput per contender at or above it.", gt=0.0, le=1e9)
    engine: str | None = F(None, "A serving engine to run the contenders in as well, beside pdraft's loop (vllm): each drafter exported to its format, the engine started in its own interpreter (data.vllm_python, else $VLLM_VENV, else this one) with and without speculation; its own figures fill the same table (docs/ENGINES.md). null = pdraft's loop only.", pattern=r"^[a-z][a-z0-9_-]{0,31}$")


class HubSection(Section):
    repo_id: str | None = F(None, "Hub repository to push to (owner/name).")
    private: bool = F(False, "Create the repository as private.")
    revision: str | None = F(None, "Branch to push to or revision to pull.")


class RuntimeSection(Section):
    device: str = F("auto", "auto (CUDA when present, else CPU), cpu, cuda or cuda:N.", pattern=r"^(auto|cpu|cuda(:\d{1,4})?)$")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = F("auto", "Compute dtype; auto = bfloat16 on GPU and on a CPU with bf16 units (avx512_bf16 or amx_bf16), float32 on other CPUs.")
    seed: int = F(0, "Seed for every random choice.", ge=0, le=MAX_SEED)
    threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] | None = F("auto", "CPU threads for torch; auto = a decode or bench run times one thread against every core on its own work and keeps the faster (training and export use every core); null = torch's default.")
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = F("auto", "Attention kernel of the target; auto = sdpa.")
    cache_dir: str | None = F(None, "pdraft's cache folder (embedded targets); null = $PDRAFT_CACHE_DIR or the user cache.")
    offline: bool | None = F(None, "Never reach the Hub; null = follow HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE.")
    dist_timeout_s: float = F(600.0, "Under torchrun: how long a process waits for the others to join, for a collective, or for a silent peer, in seconds (it says whom it waits for meanwhile); raise it for targets that take longer to load.", ge=1.0, le=86400.0)


class Recipe(Section):
    name: str = F("pdraft-run", "Name of this run, used in reports and model cards.")
    output_dir: str = F("runs/pdraft-run", "Folder for every artifact of the run (relative to the working directory).")
    target: TargetSection = F(TargetSection(), "The target model.")
    data: DataSection = F(DataSection(), "Training data.")
    drafter: DrafterSection = F(DrafterSection(), "The drafter to train or run.")
    train: TrainSection = F(TrainSection(), "Drafter training.")
    calibrate: CalibrateSection = F(CalibrateSection(), "Confidence calibration and the scheduler's cost table.")
    decode: DecodeSection = F(DecodeSection(), "Speculative decoding.")
    bench: BenchSection = F(BenchSection(), "Benchmarking.")
    hub: HubSection = F(HubSection(), "Hugging Face Hub.")
    runtime: RuntimeSection = F(RuntimeSection(), "Device, dtype, seeding and threads.")

    @model_validator(mode="after")
    def _cross_checks(self) -> Recipe:
        d = self.drafter
        if d.num_experts and d.experts_top_k > d.num_experts:
            raise ValueError(f"drafter.experts_top_k ({d.experts_top_k}) exceeds drafter.num_experts ({d.num_experts})")
        if d.block_convention == "zlab" and d.block_size < 2:
            raise ValueError("drafter.block_size must be at least 2 with the zlab convention (it drafts block_size-1 tokens)")
        check = FAMILIES.get(d.kind).recipe_check  # the family's own rules (DFlash2: the block the engines serve)
        if check is not None:
            check(d)
        return self

    # Where the recipe came from, for error messages and the resolved copy; not part of the schema.
    _source: str | None = None

    @property
    def source(self) -> str | None:
        return self._source


SECTIONS: dict[str, type[Section]] = {
    name: field.annotation  # type: ignore[misc]
    for name, field in Recipe.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, Section)
}


# --------------------------------------------------------------------------------------------- loading


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe. With no path, the defaults (the embedded quickstart) are used.
    Raises RecipeError with one line per problem."""
    data, lines = typed_yaml.read_document(path) if path is not None else ({}, {})
    recipe = typed_yaml.validate(Recipe, data, str(path) if path else "<defaults>", lines, overrides)
    recipe._source = str(Path(path).resolve()) if path else None
    return recipe


def read_resolved(blob: bytes, where: str) -> Recipe:
    """A resolved recipe read back from an artifact folder (a drafter's recipe.resolved.yaml when pushing,
    pulling, exporting or writing the model card): the recipe's own limits and schema, the one a recipe is
    written from, so a section that is not a mapping (`data: [...]`) or a value out of range is one line (the
    first problem, and how many there are), before any field is used."""
    if len(blob) > typed_yaml.MAX_RECIPE_BYTES:
        raise PdraftError(f"{where} is larger than {typed_yaml.MAX_RECIPE_BYTES >> 20} MiB; a resolved recipe is a "
                          f"small YAML file")
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise PdraftError(f"{where} is not UTF-8 text") from None
    try:
        data, lines = typed_yaml.parse_document(text, where)
        return typed_yaml.validate(Recipe, data, where, lines)
    except RecipeError as e:
        more = f" (and {len(e.problems) - 1} more problem(s))" if len(e.problems) > 1 else ""
        raise PdraftError(f"{e.problems[0]}{more}", hint="not a recipe this pdraft writes; remove the file from the "
                          "folder or regenerate it") from None


# --------------------------------------------------------------------------------------------- output


def resolved_dict(recipe: Recipe, derived: dict[str, Any] | None = None) -> dict:
    """Every field with its value (defaults filled in); `derived` ({"target.layer_ids": [...]}) fills the
    values a command worked out from the target or drafter."""
    data = recipe.model_dump(mode="json")
    for key, value in (derived or {}).items():
        node = data
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return data


def dump_resolved(recipe: Recipe, derived: dict[str, Any] | None = None) -> str:
    header = f"# resolved pdraft recipe (source: {recipe.source or 'defaults'})\n"
    return header + yaml.safe_dump(resolved_dict(recipe, derived), sort_keys=False, allow_unicode=True)


def save_resolved(recipe: Recipe, folder: str | Path, derived: dict[str, Any] | None = None) -> Path:
    """Write the resolved recipe next to an artifact (listed in the folder's ledger); every artifact writer
    calls this."""
    path = Path(folder) / RESOLVED_NAME
    ledger.write_text(path, dump_resolved(recipe, derived))
    return path


def explain(prefix: str | None = None) -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every field under `prefix` (a section or a key)."""
    return typed_yaml.describe(Recipe, Section, prefix)


__all__ = ["RESOLVED_NAME", "MAX_SEED", "Section", "Recipe", "SECTIONS", "TargetSection", "DataSection",
           "DrafterSection", "TrainSection", "CalibrateSection", "DecodeSection", "BenchSection", "HubSection",
           "RuntimeSection", "load_recipe", "read_resolved", "resolved_dict", "dump_resolved", "save_resolved", "explain"]
