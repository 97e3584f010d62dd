"""The embedded target's tokenizer: byte-level BPE trained with `tokenizers` on the training corpus only,
with Qwen3's special tokens (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) plus a reserved mask token
for parallel drafting, and a ChatML-like chat template. Saved as `tokenizer.json` + `tokenizer_config.json`
so `AutoTokenizer.from_pretrained(folder)` loads it like a real Qwen3 tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.models.schema import MAX_CONFIG_BYTES
from pdraft.paths import atomic_write_text, write_files_with
from pdraft.readback import parse_json, read_bytes

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
# Fixed order, so the special ids are 0..3 in every build.
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, MASK]

# ChatML like Qwen3's. `enable_thinking` (and any other template kwarg) is accepted and ignored: this target
# never thinks. A generation prompt opens the assistant turn, which the model learned continues the user text.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train byte-level BPE over `texts` (in order). Returns a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, folder: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json (with the chat template and the mask token id)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
    )
    hf.chat_template = CHAT_TEMPLATE
    write_files_with(folder, lambda tmp: hf.save_pretrained(str(tmp)))  # never through a link at a name
    pin_tokenizer_config(folder, tok.token_to_id(MASK), CHAT_TEMPLATE)


def pin_tokenizer_config(folder: Path, mask_id: int, chat_template: str, drop=(), **fields) -> None:
    """Finish a saved tokenizer_config.json the way every builtin target's is: the mask id beside the token
    string (the drafter needs it without loading the tokenizer), the chat template in the config as the single
    copy, the class name every transformers release resolves (5.x also accepts its own "TokenizersBackend"),
    then `fields` set and the keys in `drop` removed."""
    cfg_path = folder / "tokenizer_config.json"
    cfg = parse_json(read_bytes(cfg_path, "tokenizer_config.json", MAX_CONFIG_BYTES), str(cfg_path))  # just saved
    cfg["mask_token_id"] = mask_id
    cfg["chat_template"] = chat_template
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.update(fields)
    for key in drop:
        cfg.pop(key, None)
    atomic_write_text(cfg_path, json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # save_pretrained may also write a chat_template.jinja; the config copy is the single source.
    (folder / "chat_template.jinja").unlink(missing_ok=True)


def mask_token_id(tokenizer) -> int:
    """The id of the token a parallel drafter fills unknown positions with.

    Uses the tokenizer's declared mask token, falling back to `<|mask|>` in the vocabulary."""
    tid = getattr(tokenizer, "mask_token_id", None)
    if tid is None and hasattr(tokenizer, "convert_tokens_to_ids"):
        tid = tokenizer.convert_tokens_to_ids(MASK)
        if tid == getattr(tokenizer, "unk_token_id", None):
            tid = None
    if tid is None:
        raise PdraftError(
            "the tokenizer has no mask token",
            hint="set `mask_token` in tokenizer_config.json or give the drafter's mask token id explicitly",
        )
    return int(tid)
