"""Load a target: a Hugging Face causal LM from a local folder, a Hub id (honouring offline mode) or the
embedded default (`builtin:NAME`), with its tokenizer, on the runtime's device and dtype, and with the layer
ids its drafter reads. Weights are read from safetensors only; pickled checkpoints are never loaded.

`inspect_target` is everything but the weights (config, tokenizer, generation config, layer ids): enough for a
size estimate of a 70B target from its config.json alone, and for regeneration by vLLM, which runs before
pdraft loads the weights. With `target.tensor_parallel: N` under torchrun the weights are loaded sharded by
transformers' own tensor parallelism (`DistributedConfig(tp_size=N)`, the model's tp plan, which needs
`accelerate`): the processes of a tensor-parallel group each hold 1/N of every sharded layer, and several
groups replicate the target across the data-parallel groups (`dp_replicate_size`, transformers' mesh order,
pdraft.runtime.Layout). Every member of a group gets the whole outputs (logits, hidden states), so capture,
generation and decoding run unchanged, in lockstep within the group.

A Hub id is first looked up in the local Hub cache; only when that fails and offline mode is off does
pdraft try the network, with short time-outs, so an unreachable Hub gives an error naming the id instead of
a hang.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError

from pdraft.errors import PdraftError
from pdraft.models.schema import MAX_CONFIG_BYTES
from pdraft.readback import parse_json, read_bytes
from pdraft.runtime import Runtime, join_group, layout, make_runtime
from pdraft.targets.capture import capture_layers, check_layer_ids, default_layer_ids, stack_captured

BUILTIN_PREFIX = "builtin:"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_TARGET_FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                 "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template*"]


@dataclass
class TargetInfo:
    """A target as its files describe it, without its weights: what a size estimate or another engine needs."""

    id: str
    path: Path
    config: object  # transformers PretrainedConfig
    tokenizer: object
    layer_ids: list[int]
    revision: str | None = None
    runtime: Runtime | None = field(default=None, repr=False)
    generation_config: object = field(default=None, repr=False)
    tensor_parallel: int = 1

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def max_context(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 2**31 - 1)


@dataclass
class Target(TargetInfo):
    """A loaded target model and what every command needs to know about it."""

    model: torch.nn.Module = field(default=None, repr=False)  # its config and generation_config are the fields'

    @torch.no_grad()
    def forward_features(self, input_ids: torch.Tensor, **kwargs):
        """One forward pass returning (model output, features [batch, seq, len(layer_ids) * hidden])."""
        with capture_layers(self.model, self.layer_ids) as captured:
            out = self.model(input_ids=input_ids, **kwargs)
        return out, stack_captured(captured, self.layer_ids)

    def lm_head_weight(self) -> torch.Tensor:
        """The LM head's weight [vocab, hidden] as one tensor. Sharded (tensor_parallel > 1) it is gathered once
        per process, a collective every member of the group makes at the same point: the training loss
        multiplies by the whole head, so every process holds vocab x hidden of it."""
        w = self.model.get_output_embeddings().weight
        if hasattr(w, "full_tensor"):  # a DTensor
            cached = getattr(self, "_full_head", None)
            if cached is None:
                cached = w.full_tensor().detach()
                self._full_head = cached
            return cached
        return w


def _looks_like_path(target_id: str) -> bool:
    return target_id.startswith((".", "/", "~")) or os.sep in target_id.strip("/").split("/", 1)[-1] or \
        target_id.count("/") != 1


def resolve_target_path(target_id: str, revision: str | None, runtime: Runtime) -> Path:
    """The local folder holding the target's config, weights and tokenizer."""
    if target_id.startswith(BUILTIN_PREFIX):
        try:
            from pdraft.targets import builtin
        except ImportError:
            raise PdraftError(f"target {target_id!r}: the embedded targets are not part of this build") from None
        return builtin.resolve(target_id[len(BUILTIN_PREFIX):], cache_dir=runtime.cache_dir)
    local = Path(target_id).expanduser()
    if local.exists():
        if not local.is_dir():
            raise PdraftError(f"target {target_id!r} is a file; expected a model folder with config.json")
        if not (local / "config.json").exists():
            raise PdraftError(f"target folder {target_id!r} has no config.json")
        return local
    if _looks_like_path(target_id) or not _REPO_ID.match(target_id):
        raise PdraftError(f"target {target_id!r} not found: no such folder, and it is not a Hub id (owner/name)")
    return _hub_snapshot(target_id, revision, runtime.offline)


def _hub_snapshot(repo_id: str, revision: str | None, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_TARGET_FILES, local_files_only=True))
    except Exception:  # noqa: BLE001 - any failure here just means "not cached"
        if offline:
            raise PdraftError(
                f"target {repo_id!r}{'@' + revision if revision else ''} is not in the local Hub cache and offline "
                "mode is on", hint="download it once with network access, or pass a local folder") from None
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", "10")
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", "30")
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_TARGET_FILES))
    except Exception as e:  # noqa: BLE001 - network, auth and not-found errors all end the same way
        reason = type(e).__name__
        raise PdraftError(f"cannot download target {repo_id!r}{'@' + revision if revision else ''} ({reason})",
                          hint="check the id, your network and HF_TOKEN, or set HF_HUB_OFFLINE=1 to use the cache only") from None


def target_num_layers(target_id: str) -> int | None:
    """The target's decoder-layer count read from its config.json alone (no weights, no network), for checks
    that run before the target is loaded (`recipe check`); None when only loading it could tell (a Hub id)."""
    if target_id.startswith(BUILTIN_PREFIX):
        from pdraft.targets.builtin.cache import shipped_dir
        from pdraft.targets.builtin.converted import CONVERTED

        name = target_id[len(BUILTIN_PREFIX):]
        if name in CONVERTED:  # known before its first conversion
            return CONVERTED[name].num_layers
        folder = shipped_dir(name)
    else:
        folder = Path(target_id).expanduser()
    try:  # within the config's size limit (pdraft.readback)
        return int(parse_json(read_bytes(folder / "config.json", "config.json", MAX_CONFIG_BYTES), "config.json")
                   ["num_hidden_layers"])
    except Exception:  # noqa: BLE001 - unknown here; loading the target reports the real problem
        return None


def _check_config_file(cfg_path: Path, target_id: str) -> None:
    """The target's config.json through the one schema check, before transformers reads a field."""
    from pdraft.models.schema import check_target_config

    where = f"target {target_id!r}: config.json"
    data = parse_json(read_bytes(cfg_path, where, MAX_CONFIG_BYTES), where)  # size, then nesting (pdraft.readback)
    if not isinstance(data, dict):
        raise PdraftError(f"target {target_id!r}: config.json does not hold a JSON object")
    check_target_config(data, f"target {target_id!r}: config.json")


def _weight_headers(path: Path, target_id: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over the target's safetensors files (the index's shards, or every file), each
    header checked against its file's length."""
    from pdraft.models.tensorfile import index_shards, read_header, shapes_of

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:  # the weight index's one schema; shard names refused unless plain file names
            files = [path / n for n in index_shards(index)]
        except PdraftError as e:
            raise PdraftError(f"target {target_id!r}: {e.message}") from None
    else:
        files = sorted(path.glob("*.safetensors"))
    found: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            found.update(shapes_of(read_header(f)[0]))
        except PdraftError as e:
            raise PdraftError(f"target {target_id!r}: cannot load from {path} ({e.message})") from None
        except OSError as e:
            raise PdraftError(f"target {target_id!r}: cannot load from {path} ({f.name}: {e.strerror or e})") from None
    return found


def check_weights_cover(path: Path, config, target_id: str) -> None:
    """Refuse a target whose weight files do not hold every weight of the model its config describes, with
    the shapes it implies (transformers only warns about missing weights and leaves them random: a drafter
    folder given as the target would decode with a random Qwen3). The expected names and shapes come from
    the model built on the meta device (no memory) and are compared with the headers alone."""
    from transformers import AutoModelForCausalLM

    found = _weight_headers(path, target_id)
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError) as e:
        raise PdraftError(f"target {target_id!r}: config.json does not describe a causal LM ({type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    prefix = getattr(model, "base_model_prefix", "") + "."
    tied = bool(getattr(config.get_text_config() if hasattr(config, "get_text_config") else config,
                        "tie_word_embeddings", False))
    missing, wrong = [], []
    for name, shape in expected.items():
        have = found.get(name, found.get(name.removeprefix(prefix)))
        if have is None:
            if not (tied and name.endswith("lm_head.weight")):
                missing.append(name)
        elif have != shape:
            wrong.append(f"{name} {have} (the config implies {shape})")
    if missing:
        raise PdraftError(f"target {target_id!r}: its weights do not cover the model: {len(missing)} of "
                          f"{len(expected)} weights missing, e.g. {missing[0]}",
                          hint="is this folder a target model (not a drafter)?")
    if wrong:
        raise PdraftError(f"target {target_id!r}: weight {wrong[0]} ({len(wrong)} mismatched in all)")


def _derived_layer_ids(section, num_layers: int) -> list[int]:
    # Shallow targets: every allowed layer (0..L-2) when the recipe asks for more ids than that.
    return (check_layer_ids(section.layer_ids, num_layers, legacy_last=False) if section.layer_ids
            else default_layer_ids(num_layers, max(1, min(section.num_layer_ids, num_layers - 1))))


def read_target_config(path: Path, target_id: str):
    """A target folder's config through the one schema check, then transformers' AutoConfig (no weights read)."""
    from transformers import AutoConfig

    _check_config_file(path / "config.json", target_id)
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PdraftError(f"target {target_id!r}: unreadable config.json ({type(e).__name__}: {e})") from None


def check_tensor_parallel(config, n: int, target_id: str) -> None:
    """Refuse, in one line, a target that transformers cannot shard n ways: its attention or key/value heads do
    not divide by n (every process holds whole heads), or its model has no tensor-parallel plan."""
    if n <= 1:
        return
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
        if count % n:
            raise PdraftError(f"target.tensor_parallel {n} does not divide target {target_id!r}'s {name} ({count})",
                              hint="pick a tensor_parallel that divides the attention and key/value heads")
    if not getattr(text, "base_model_tp_plan", None):
        raise PdraftError(f"target {target_id!r} ({getattr(config, 'model_type', '?')}) has no tensor-parallel plan "
                          "in transformers", hint="set target.tensor_parallel to 1")


def default_runtime() -> Runtime:
    """The runtime of a recipe that leaves the `runtime` section out, for library calls that pass none."""
    from pdraft.recipe import RuntimeSection

    return make_runtime(RuntimeSection())


def inspect_target(section, runtime: Runtime | None = None, *, weights: bool = True, check_config=None) -> TargetInfo:
    """The target of a recipe `target` section without loading its weights: path, checked config, tokenizer,
    generation config and layer ids. `weights=False` also accepts a folder with no weight files (a 70B
    config.json alone, for `export-hidden --estimate`)."""
    from transformers import AutoTokenizer, GenerationConfig

    runtime = runtime or default_runtime()
    layout(section.tensor_parallel)  # a tensor_parallel that does not divide the processes: refused first
    path = resolve_target_path(section.id, section.revision, runtime)
    if weights and not any(path.glob("*.safetensors")):
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise PdraftError(f"target {section.id!r} offers only pickled weights (.bin/.pt); pdraft loads safetensors only "
                              "because unpickling can run arbitrary code")
        raise PdraftError(f"target {section.id!r} has no model.safetensors in {path}")
    config = read_target_config(path, section.id)
    if check_config is not None:  # what the caller cannot run, refused before a byte of the weights is read
        check_config(config, section.id)
    if weights:
        check_weights_cover(path, config, section.id)
    check_tensor_parallel(config, section.tensor_parallel, section.id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise PdraftError(f"target {section.id!r}: cannot load its tokenizer from {path} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    try:
        generation = GenerationConfig.from_pretrained(path) if (path / "generation_config.json").is_file() else None
    except (OSError, ValueError):
        generation = None
    return TargetInfo(id=section.id, path=path, config=config, tokenizer=tokenizer,
                      layer_ids=_derived_layer_ids(section, int(config.num_hidden_layers)), revision=section.revision,
                      runtime=runtime, generation_config=generation, tensor_parallel=section.tensor_parallel)


def load_target(section, runtime: Runtime | None = None, *, check_config=None) -> Target:
    """Load the target described by a recipe `target` section (pdraft.recipe.TargetSection: id, revision,
    layer_ids, num_layer_ids, tensor_parallel). Sharded, this joins the process group first. `check_config(config,
    target_id)` refuses, before any weight is read, a target the caller cannot run (decoding:
    pdraft.decode.backend.check_decodable)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # pdraft draws its own progress; transformers' bars would interleave

    runtime = runtime or default_runtime()
    tp = section.tensor_parallel
    lay = layout(tp)  # refuses a tensor_parallel that does not divide the processes
    info = inspect_target(section, runtime, check_config=check_config)
    kwargs: dict = {}
    if tp > 1:
        from transformers.distributed import DistributedConfig

        join_group(runtime.device, runtime.dist_timeout_s)
        # Replicated across the data-parallel groups (dp_replicate): transformers wraps the frozen target in
        # FSDP2 over a one-process shard group then, which holds every weight whole and never talks across groups
        # in a forward pass.
        kwargs["distributed_config"] = DistributedConfig(tp_size=tp, dp_replicate_size=lay.dp_size)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            info.path, config=info.config, dtype=runtime.dtype, attn_implementation=runtime.attn_implementation,
            use_safetensors=True, **kwargs)
    except (OSError, ValueError, SafetensorError) as e:  # SafetensorError: truncated or damaged weights
        raise PdraftError(f"target {section.id!r}: cannot load from {info.path} ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if tp == 1:
        model.to(runtime.device)
    model.eval()
    model.requires_grad_(False)
    return Target(id=section.id, path=info.path, config=model.config, tokenizer=info.tokenizer,
                  layer_ids=info.layer_ids, revision=section.revision, runtime=runtime,
                  generation_config=getattr(model, "generation_config", None), tensor_parallel=tp, model=model)
