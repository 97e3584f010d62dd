"""The one recipe format every pdraft command reads: typed YAML with strict keys, range checks, a one-line
description per field, dotted command-line overrides (`--set train.lr=3e-4`), and a resolved copy written
next to every artifact.

Errors name the file, the line, the key path, what was expected and what was found, one line per problem,
and suggest the closest known key for a misspelt one. Fields left as ``null`` whose value depends on the
target or the drafter (layer ids, hidden size, gamma) are derived by the command that knows them and written
into the resolved copy it saves.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from pdraft.errors import PdraftError, RecipeError
from pdraft.layer_ids import check_layer_ids
from pdraft.paths import atomic_write_text

RESOLVED_NAME = "recipe.resolved.yaml"
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes 64 bits; request seeds are hashed into 63
# Parsing limits: a recipe is a few kilobytes of plain keys; anything far past these is a mistake or an attack
# (a YAML alias bomb expands a few lines into billions of nodes, deep nesting exhausts the parser's stack).
MAX_RECIPE_BYTES = 1 << 20
MAX_NODES = 100_000  # YAML nodes after alias expansion
MAX_DEPTH = 32
MAX_INT_DIGITS = 20


class Section(BaseModel):
    # allow_inf_nan=False: `--set train.alpha_ce=inf` or `temperature: .nan` must be refused, never trained with.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


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
    max_context: int | None = F(None, "Longest prompt plus output in tokens; null = the target's max_position_embeddings.", ge=16)


class DataSection(Section):
    source: str = F("builtin:code-train+prose-train", "Training prompts: a JSONL/Parquet file, a datasets id, or the embedded target's training-split sets builtin:code-train / builtin:prose-train (joined by +).")
    split: str = F("train", "Split to read when source is a datasets id.")
    max_samples: int | None = F(None, "Use at most this many samples; null = all.", ge=1)
    max_length: int = F(256, "Truncate each training sequence to this many tokens.", ge=8, le=131072)
    chat_template: bool = F(True, "Apply the target's chat template to prompts, as decode does.")
    regenerate: bool = F(False, "Replace the responses with the target's own generations (recommended for real targets).")
    regenerate_max_new_tokens: int = F(256, "Tokens to generate per prompt when regenerating.", ge=1)
    regenerate_temperature: float = F(0.0, "Sampling temperature when regenerating (0 = greedy).", ge=0.0, le=5.0)
    cache_dir: str | None = F(None, "Hidden-state cache folder; null = OUTPUT_DIR/hidden.")
    cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = F("auto", "Stored dtype of the hidden states; auto = bf16 when the target computes in bf16, else fp16.")
    export_batch_tokens: int = F(8192, "Padded tokens per target forward during export.", ge=16)
    min_loss_tokens: int = F(1, "Drop sequences with fewer loss tokens (DeepSpec uses 14).", ge=1)
    regenerate_batch_size: int = F(8, "Prompts generated together when regenerating.", ge=1)
    skip_malformed: bool = F(False, "Skip malformed JSONL lines (their numbers are reported) instead of stopping.")
    shard_tokens: int = F(65536, "Tokens per hidden-state shard.", ge=256)


class DrafterSection(Section):
    kind: Literal["dflash", "dspark", "dflash2"] = F("dspark", "Drafter family: dflash (parallel block), dspark (plus sequential and confidence heads) or dflash2 (z-lab DFlash plus dynamic convolutions and a candidate selector; always the zlab block convention).")
    num_layers: int = F(5, "Number of drafter decoder layers.", ge=1, le=64)
    block_size: int = F(16, "Tokens per draft block (the largest gamma, see block_convention).", ge=1, le=32)
    block_convention: Literal["deepspec", "zlab"] = F("deepspec", "deepspec: the anchor is the first prediction position; zlab: the anchor is the bonus token and block_size-1 tokens are drafted.")
    denoise_steps: int = F(1, "Refinement passes over the block; decode must use the same number.", ge=1, le=16)
    mask_token_id: int | None = F(None, "Mask token id fed at undrafted positions; null = the tokenizer's mask token.", ge=0)
    hidden_size: int | None = F(None, "Drafter hidden size; null = the target's.", ge=8)
    intermediate_size: int | None = F(None, "Drafter MLP width; null = the target's.", ge=8)
    num_attention_heads: int | None = F(None, "Attention heads; null = the target's.", ge=1)
    num_key_value_heads: int | None = F(None, "Key/value heads; null = the target's.", ge=1)
    num_experts: int = F(0, "Mixture-of-experts MLP experts per layer; 0 = dense MLP.", ge=0, le=256)
    experts_top_k: int = F(2, "Experts each token is routed to when num_experts > 0.", ge=1, le=16)
    moe_intermediate_size: int | None = F(None, "Width of each expert's MLP; null = intermediate_size.", ge=8)
    sequential_head: Literal["markov", "gated", "rnn", "none"] = F("markov", "DSpark sequential head: Markov transition bias W1[x]W2, DeepSpec's gated Markov, the RNN head (eq. 6), or none.")
    markov_rank: int = F(256, "Rank r of the Markov head B(x,.) = W1[x] W2.", ge=1, le=4096)
    confidence_head: bool = F(True, "DSpark confidence head predicting each position's survival.")
    confidence_uses_markov: bool = F(True, "Feed the Markov embedding W1[x_{k-1}] to the confidence head (paper eq. 7).")
    conv_kernel_size: int = F(2, "DFlash2: taps of each grouped dynamic convolution (2 in the published drafters); at most block_size.", ge=1, le=32)
    conv_group_size: int = F(16, "DFlash2: channels sharing one dynamic coefficient per tap; must divide the drafter's hidden size.", ge=1, le=4096)
    selector_rank: int = F(256, "DFlash2: rank r of the candidate selector's predecessor/successor codebooks and hidden projection.", ge=1, le=4096)
    selector_top_k: int = F(16, "DFlash2: unary candidates per draft position the selector walks (K).", ge=1, le=1024)
    init_from: str | None = F(None, "Start from this drafter (folder or Hub id) instead of random weights.")


class TrainSection(Section):
    output_dir: str | None = F(None, "Where checkpoints go; null = OUTPUT_DIR/<drafter kind>.")
    online: bool = F(False, "Compute target features during training instead of reading the hidden-state cache.")
    steps: int = F(1000, "Optimizer steps.", ge=1)
    batch_size: int = F(8, "Sequences per micro-batch.", ge=1)
    grad_accum: int = F(1, "Micro-batches per optimizer step.", ge=1)
    lr: float = F(3e-4, "Peak learning rate (AdamW).", gt=0.0, le=1.0)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0.0, le=1.0)
    warmup_steps: int = F(50, "Linear warm-up steps before cosine decay.", ge=0)
    warmup_ratio: float | None = F(None, "Warm-up as a fraction of steps; overrides warmup_steps when set.", ge=0.0, lt=1.0)
    min_lr_ratio: float = F(0.1, "Final learning rate as a fraction of lr.", ge=0.0, le=1.0)
    grad_clip: float = F(1.0, "Clip the gradient norm to this value (0 = off).", ge=0.0)
    num_anchors: int = F(8, "Anchor positions sampled per sequence, each starting one training block.", ge=1, le=4096)
    alpha_ce: float = F(1.0, "Weight of the cross-entropy loss against the target's tokens.", ge=0.0)
    alpha_tv: float | None = F(None, "Weight of the total-variation loss against the target distribution; null = 0 for dflash, 1 for dspark.", ge=0.0)
    alpha_conf: float | None = F(None, "Weight of the confidence BCE loss; null = 0 for dflash, 1 for dspark.", ge=0.0)
    alpha_selector: float = F(1.0, "DFlash2: weight of the selector's K-way cross-entropy (teacher-forced on the gold predecessor); ignored by other kinds.", ge=0.0)
    confidence_target: Literal["tv", "greedy"] = F("tv", "Confidence label: 1 - TV (sampled serving, paper eq. 8) or argmax agreement (greedy serving).")
    loss_decay: float | None = F(None, "Position weight w_k = exp(-(k-1)/loss_decay); null = block size.", gt=0.0)
    loss_chunk_size: int = F(1024, "Positions per vocabulary-loss chunk; peak loss memory is about 6 x chunk x vocab x 4 bytes.", ge=1)
    fused_loss: bool = F(False, "Use the fused Triton CE + TV kernel on CUDA (the chunked torch loss elsewhere).")
    checkpoint_every: int = F(200, "Save a checkpoint every N steps.", ge=1)
    keep_checkpoints: int = F(2, "Checkpoints kept besides latest.", ge=1)
    eval_every: int = F(200, "Validate every N steps.", ge=1)
    log_every: int = F(10, "Append metrics to the log every N steps.", ge=1)
    distributed: Literal["auto", "none", "ddp", "fsdp"] = F("auto", "Multi-GPU strategy under torchrun; auto = ddp when WORLD_SIZE > 1.")


class CalibrateSection(Section):
    prompts: str = F("builtin:code+prose", "Held-out prompts for calibration (same forms as bench prompt sets).")
    num_prompts: int = F(64, "Prompts to decode for calibration data.", ge=1)
    max_new_tokens: int = F(64, "Tokens generated per calibration prompt.", ge=1)
    temperature: float = F(0.0, "Decoding temperature while collecting calibration data.", ge=0.0, le=5.0)
    gamma: int | None = F(None, "Draft length while collecting; null = the drafter's largest.", ge=1, le=32)
    held_out_fraction: float = F(0.3, "Share of prompts kept out of the fit to measure the after-ECE.", ge=0.0, lt=1.0)
    bins: int = F(15, "Bins of the expected calibration error.", ge=2, le=1000)
    binning: Literal["equal_mass", "equal_width"] = F("equal_mass", "How ECE bins are formed.")
    min_samples: int = F(50, "Fewest reached samples a position needs for its own temperature.", ge=1)
    sps_max_batch_tokens: int = F(64, "Largest verification batch (tokens) profiled for the scheduler's cost table.", ge=1)
    sps_repeats: int = F(5, "Timed repeats per batch size when profiling.", ge=1)
    sps_requests: int = F(8, "Requests the profiled verification tokens are spread over.", ge=1, le=1024)


class DecodeSection(Section):
    gamma: int | None = F(None, "Draft tokens per round; null = the drafter's largest.", ge=1, le=32)
    temperature: float = F(0.0, "Sampling temperature (0 = greedy).", ge=0.0, le=5.0)
    top_p: float = F(1.0, "Nucleus sampling mass (1 = off).", gt=0.0, le=1.0)
    top_k: int = F(0, "Top-k sampling (0 = off).", ge=0)
    max_new_tokens: int = F(128, "Tokens to generate per prompt.", ge=1)
    seed: int | None = F(None, "Seed of the sampling generator; null = runtime.seed.", ge=0, le=MAX_SEED)
    verify: Literal["full", "threshold", "scheduler"] = F("full", "Verification length: whole block, static confidence threshold, or the hardware-aware scheduler.")
    threshold: float = F(0.5, "Confidence threshold when verify = threshold.", ge=0.0, le=1.0)
    sps_table: str | None = F(None, "Scheduler cost table (JSON); null = the one next to the drafter.")
    batch_size: int = F(1, "Requests decoded together.", ge=1, le=1024)
    fused_kernels: bool = F(False, "Use the fused Triton sequential-head kernel for DSpark drafts on CUDA.")
    packed_verify: bool = F(True, "Verify only the real tokens of a batch (sum of 1 + l), not a padded rectangle.")
    compile: Literal["auto", "on", "off"] = F("auto", "Static KV and context caches and compiled passes: auto = static caches where the target's family allows, compiled (CUDA graphs) on CUDA only; on = compiled everywhere (torch.compile; CPU compiles take tens of seconds); off = the reference eager path (transformers' forward, any causal LM).")
    round_overhead_ms: float = F(0.0, "Per-round time outside verification (drafting, bookkeeping) the scheduler adds to its cost.", ge=0.0)
    chat_template: bool = F(True, "Wrap prompts in the target's chat template.")
    enable_thinking: bool = F(False, "Let the chat template enable thinking (Qwen3).")


class BenchSection(Section):
    gamma: str = F("4..16", "Draft lengths to sweep: a range A..B, a list 4,8,16, or one value.")

    @field_validator("gamma", mode="before")
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
    num_prompts: int = F(16, "Prompts per set.", ge=1)
    max_new_tokens: int = F(64, "Tokens generated per prompt.", ge=1)
    temperature: float = F(0.0, "Sampling temperature (0 = greedy).", ge=0.0, le=5.0)
    top_p: float = F(1.0, "Nucleus mass when sampling (1 = off, so temperature really samples).", gt=0.0, le=1.0)
    top_k: int = F(0, "Top-k when sampling (0 = off, so temperature really samples).", ge=0)
    batch_size: int = F(1, "Requests decoded together.", ge=1, le=1024)
    repeats: int = F(1, "Timed repeats; the median is reported.", ge=1)
    seed: int | None = F(None, "Seed for bench sampling; null = decode.seed, then runtime.seed.", ge=0, le=MAX_SEED)
    skip_malformed: bool = F(False, "Skip malformed JSONL lines in prompt sets (their numbers are reported) instead of stopping.")
    ngram_baseline: bool = F(True, "Include the n-gram prompt-lookup drafter as the training-free reference.")
    generate_baseline: bool = F(True, "Also time transformers' own model.generate() as a target-alone baseline; speedups are measured against the faster of it and pdraft's target-alone loop.")
    output_dir: str | None = F(None, "Report folder; null = OUTPUT_DIR/bench.")


class HubSection(Section):
    repo_id: str | None = F(None, "Hub repository to push to (owner/name).")
    private: bool = F(False, "Create the repository as private.")
    revision: str | None = F(None, "Branch to push to or revision to pull.")


class RuntimeSection(Section):
    device: str = F("auto", "auto (CUDA when present, else CPU), cpu, cuda or cuda:N.", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = F("auto", "Compute dtype; auto = bfloat16 on GPU, float32 on CPU.")
    seed: int = F(0, "Seed for every random choice.", ge=0, le=MAX_SEED)
    threads: int | None = F(None, "CPU threads for torch; null = torch's default.", ge=1, le=1024)
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = F("auto", "Attention kernel of the target; auto = sdpa.")
    cache_dir: str | None = F(None, "pdraft's cache folder (embedded targets); null = $PDRAFT_CACHE_DIR or the user cache.")
    offline: bool | None = F(None, "Never reach the Hub; null = follow HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE.")


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
        if d.kind == "dflash2":
            # What the engines serve (vllm qwen3_dflash2.py): the z-lab block, one pass, a dense MLP.
            if "block_convention" in d.model_fields_set and d.block_convention != "zlab":
                raise ValueError("drafter.kind dflash2 uses the zlab block convention (anchor + masks); drop "
                                 "drafter.block_convention or set it to zlab")
            if d.block_convention != "zlab":  # forced, so the resolved copy says what was built
                d.block_convention = "zlab"
            if d.block_size < 2:
                raise ValueError("drafter.block_size must be at least 2 for dflash2 (it drafts block_size-1 tokens)")
            if d.denoise_steps != 1 or d.num_experts > 1:
                raise ValueError("drafter.kind dflash2 drafts in one pass with a dense MLP: denoise_steps must be 1 "
                                 "and num_experts 0")
            if d.conv_kernel_size > d.block_size:
                raise ValueError(f"drafter.conv_kernel_size ({d.conv_kernel_size}) exceeds drafter.block_size "
                                 f"({d.block_size})")
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


class _TooLarge(Exception):
    """A YAML document past the parsing limits; the message says which."""


def _compose(text: str) -> yaml.Node | None:
    """The YAML node graph of `text`, or _TooLarge. Composing keeps an alias as a second reference to one
    node, so nothing has been expanded yet; the walk in _line_map counts the expansion."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise _TooLarge(f"nested deeper than {MAX_DEPTH} levels") from None


def _line_map(root: yaml.Node | None) -> tuple[dict[tuple, int], list[str]]:
    """Map every key path in the YAML document to its 1-based line; also report duplicate keys, which
    PyYAML would otherwise resolve silently by keeping the last one. Raises _TooLarge past the limits on
    depth, expanded node count (aliases included), key kind and integer size, before anything is built."""
    lines: dict[tuple, int] = {}
    duplicates: list[str] = []
    count = 0

    def walk(node: yaml.Node, path: tuple) -> None:
        nonlocal count
        count += 1
        if count > MAX_NODES:
            raise _TooLarge(f"more than {MAX_NODES} values once aliases are expanded (a YAML alias bomb?)")
        if len(path) > MAX_DEPTH:
            raise _TooLarge(f"line {node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise _TooLarge(f"line {key_node.start_mark.line + 1}: a mapping key must be a plain name, "
                                    f"found a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}")
                key = key_node.value
                if key in seen:
                    duplicates.append(f"line {key_node.start_mark.line + 1}: {_dotted(path + (key,))}: key appears twice")
                seen.add(key)
                lines[path + (key,)] = key_node.start_mark.line + 1
                walk(value_node, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[path + (i,)] = item.start_mark.line + 1
                walk(item, path + (i,))
        elif node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_INT_DIGITS:
            raise _TooLarge(f"line {node.start_mark.line + 1}: an integer of {len(node.value)} digits")

    if root is not None:
        walk(root, ())
    return lines, duplicates


def _bounded_yaml(text: str) -> tuple[Any, dict[tuple, int], list[str]]:
    """(value, key lines, duplicate keys) of a YAML text, checked against the limits before it is built."""
    lines, duplicates = _line_map(_compose(text))
    return yaml.safe_load(text), lines, duplicates


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path) if path else "<top level>"


def _model_at(path: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] = Recipe
    for part in path:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def _describe_found(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{value!r} ({type(value).__name__})"


def _format_error(err: dict, where: str, lines: dict[tuple, int], overridden: dict[tuple, str]) -> str:
    path = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-after")))
    key = _dotted(path)
    if path in overridden:
        loc = f"--set {overridden[path]}"
    else:
        line = next((lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in lines), None)
        loc = f"{where}:{line}" if line else where
    etype = err["type"]
    if etype == "extra_forbidden":
        model = _model_at(path[:-1])
        known = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), known, n=1, cutoff=0.5)
        hint = f"; did you mean '{_dotted(path[:-1] + (close[0],))}'?" if close else (
            f"; known keys here: {', '.join(known)}" if known else "")
        return f"{loc}: {key}: unknown key{hint}"
    if etype == "value_error":  # our own validators' messages are whole sentences: show them as they are
        return f"{loc}: {key + ': ' if path else ''}{err['msg'].removeprefix('Value error, ')}"
    # pydantic says "Input should be a valid integer, unable to parse ..."; keep the expectation only.
    expected = err["msg"].removeprefix("Input should be ").split(", unable")[0]
    if etype == "model_type":
        expected = "a mapping of keys"
    elif expected.startswith(("less", "greater")):
        expected = "a value " + expected
    return f"{loc}: {key}: expected {expected}, found {_describe_found(err.get('input'))}"


def _line_of(problem: str) -> int:
    head = problem.split(": ", 1)[0]
    tail = head.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    """`train.lr=3e-4` -> (("train", "lr"), 0.0003). Values are read as YAML, so lists and null work."""
    if "=" not in item:
        raise RecipeError([f"--set {item}: expected KEY=VALUE with a dotted key, e.g. train.lr=3e-4"])
    key, raw = item.split("=", 1)
    path = tuple(p for p in key.strip().split(".") if p)
    if not path:
        raise RecipeError([f"--set {item}: the key is empty"])
    try:
        value = _bounded_yaml(raw)[0] if raw.strip() else None
    except yaml.YAMLError as e:
        raise RecipeError([f"--set {item}: value is not valid YAML ({e.__class__.__name__})"]) from None
    except _TooLarge as e:
        raise RecipeError([f"--set {item}: value refused: {e}"]) from None
    # YAML 1.1 reads 3e-4 (no dot) as a string; accept it as the number users mean.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") and not value.isalpha() else value
        except ValueError:
            pass
    return path, value


def _apply_override(data: dict, path: tuple[str, ...], value: Any, item: str) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise RecipeError([f"--set {item}: {_dotted(path[: i + 1])} is not a section"])
        node = child
    node[path[-1]] = value


def load_recipe(path: str | Path | None = None, overrides: list[str] | None = None) -> Recipe:
    """Read, override and validate a recipe. With no path, the defaults (the embedded quickstart) are used.
    Raises RecipeError with one line per problem."""
    where = str(path) if path else "<defaults>"
    lines: dict[tuple, int] = {}
    data: Any = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise RecipeError([f"{p}: recipe file not found"])
        if p.is_dir():
            raise RecipeError([f"{p}: is a folder, expected a YAML recipe file"])
        try:
            with p.open("rb") as f:  # bounded: /dev/zero or a multi-gigabyte file is never read whole
                blob = f.read(MAX_RECIPE_BYTES + 1)
            if len(blob) > MAX_RECIPE_BYTES:
                raise RecipeError([f"{p}: larger than {MAX_RECIPE_BYTES >> 20} MiB; a recipe is a small YAML file"])
            text = blob.decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RecipeError([f"{p}: cannot read the recipe ({e.__class__.__name__}: {getattr(e, 'strerror', None) or e})"]) from None
        try:
            data, lines, duplicates = _bounded_yaml(text)
        except _TooLarge as e:
            raise RecipeError([f"{p}: recipe refused: {e}"]) from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f":{mark.line + 1}" if mark else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise RecipeError([f"{p}{line}: malformed YAML: {problem}"]) from None
        if duplicates:
            raise RecipeError([f"{p}:{d.removeprefix('line ')}" for d in duplicates])
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RecipeError([f"{p}:1: <top level>: expected a mapping of sections, found {_describe_found(data)}"])
    overridden: dict[tuple, str] = {}
    for item in overrides or []:
        key_path, value = parse_override(item)
        _apply_override(data, key_path, value, item)
        overridden[key_path] = item
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        problems = [_format_error(err, where, lines, overridden) for err in e.errors()]
        raise RecipeError(sorted(problems, key=_line_of)) from None
    recipe._source = str(Path(path).resolve()) if path else None
    return recipe


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
    """Write the resolved recipe next to an artifact; every artifact writer calls this."""
    path = Path(folder) / RESOLVED_NAME
    atomic_write_text(path, dump_resolved(recipe, derived))
    return path


def explain(prefix: str | None = None) -> list[tuple[str, str, str, str]]:
    """(key path, type, default, description) for every field under `prefix` (a section or a key)."""
    rows: list[tuple[str, str, str, str]] = []

    def type_name(annotation: Any) -> str:
        name = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
        return name or str(annotation).replace("typing.", "")

    def walk(model: type[BaseModel], path: tuple) -> None:
        for name, field in model.model_fields.items():
            key = path + (name,)
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, Section):
                walk(ann, key)
                continue
            ops = {"Ge": ">=", "Gt": ">", "Le": "<=", "Lt": "<"}
            bounds = [f"{ops[type(m).__name__]} {getattr(m, type(m).__name__.lower())}" for m in field.metadata
                      if type(m).__name__ in ops]
            typ = type_name(ann) + (f" ({', '.join(bounds)})" if bounds else "")
            rows.append((_dotted(key), typ, repr(field.default), field.description or ""))

    walk(Recipe, ())
    if prefix:
        rows = [r for r in rows if r[0] == prefix or r[0].startswith(prefix + ".")]
        if not rows:
            keys = [r[0] for r in explain()] + list(SECTIONS)
            close = difflib.get_close_matches(prefix, keys, n=1, cutoff=0.5)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise RecipeError([f"{prefix}: no such recipe section or key{hint}"])
    return rows
