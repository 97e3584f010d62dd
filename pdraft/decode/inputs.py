"""Everything `pdraft decode` needs around the engine, as plain library functions: loading and attaching a
drafter, reading prompts (text, a prompt file, raw token ids), turning text into token ids through the
target's chat template exactly as training did (thinking disabled unless asked; `raw` skips the template for
plain continuation), and printing the output as it streams (TextStream). The target itself is loaded by the
shared loader, pdraft.targets.loader."""

from __future__ import annotations

from pathlib import Path

import torch

from pdraft.data.prompts import load_prompts
from pdraft.data.templates import encode_prompt
from pdraft.errors import PdraftError
from pdraft.io_plan import Input, Output, check_io, input_if_local
from pdraft.paths import check_input_file
from pdraft.readback import read_text

MAX_PROMPT_FILE_BYTES = 64 << 20  # a plain-text prompt file is read whole; JSONL files are read line by line


def check_decode_io(recipe, drafter: str | Path | None, prompt_file: str | Path | None,
                    sps_table: str | Path | None, metrics: str | Path | None) -> None:
    """Refuse, before anything is loaded, a metrics stream over what decode reads (the drafter folder, the
    prompt file, the cost table, the recipe, a local target), or one that is a link (pdraft.io_plan)."""
    if metrics is None:
        return
    inputs = ([Input("--drafter", Path(drafter))] if drafter is not None else [])
    inputs += input_if_local("--prompt-file", prompt_file) + input_if_local("--sps-table", sps_table)
    inputs += input_if_local("decode.sps_table", recipe.decode.sps_table) + input_if_local("the recipe", recipe.source)
    inputs += input_if_local("target.id", recipe.target.id)
    check_io("decode", inputs, [Output("--metrics", Path(metrics), "append")])


def load_attached_drafter(path: str | Path, target):
    try:
        from pdraft.models import load_drafter
    except ImportError:
        raise PdraftError("this pdraft build has no drafter loader (pdraft.models.load_drafter)",
                          hint="use --no-draft to decode with the target alone") from None
    from pdraft.models.layers import prepare_products

    # On the target's device (a lent H200 found bench's drafter left on the CPU against a CUDA target) and in its
    # dtype, as the serving engines run a drafter (vLLM gives the draft model the target's dtype) and as
    # calibration always measured it: a float32 drafter beside a bfloat16 target paid float32 products in every
    # pass of bench and decode (issue 38: a DFlash block pass 1.03 -> 0.82 ms on an AMX CPU).
    param = next(target.parameters())
    drafter = load_drafter(path, target.config, device=param.device,
                           dtype=param.dtype if param.dtype.is_floating_point else torch.float32)
    drafter.attach_target(target)
    prepare_products(drafter)  # measured before any timed round, not inside the first
    return drafter.eval()


class TextStream:
    """Prints a growing token sequence as text: each `add` prints what the decoded text gained past the text
    of the previous call. The whole sequence is decoded each time (byte-level tokens may merge across
    rounds), once per call."""

    def __init__(self, decode, write):
        self.decode, self.write = decode, write
        self.tokens: list[int] = []
        self.text = decode(self.tokens)

    def add(self, tokens) -> None:
        self.tokens.extend(tokens)
        text = self.decode(self.tokens)
        self.write(text[len(self.text):])
        self.text = text


def parse_prompt_ids(text: str) -> list[list[int]]:
    """'12,7,99' -> [[12, 7, 99]]; several prompts are separated by ';'."""
    prompts = []
    for part in text.split(";"):
        try:
            ids = [int(t) for t in part.replace(" ", "").split(",") if t]
        except ValueError:
            raise PdraftError(f"--prompt-ids must be comma-separated integers, got {part!r}") from None
        prompts.append(ids)
    return prompts


def read_prompt_file(path: str | Path) -> tuple[list[str], list[int | None]]:
    """(prompts, their own seeds) of a file: DeepSpec-layout JSONL (`{"turns": [...]}`, first turn; an optional
    `"seed"` field) or any other form pdraft.data.prompts reads, or else one prompt per non-empty line of plain
    text (no seeds)."""
    path = Path(path)
    if path.suffix in (".jsonl", ".json", ".parquet"):
        records = load_prompts(str(path))
        return [r.prompt for r in records], [r.seed for r in records]
    if path.is_dir():
        raise PdraftError(f"cannot read prompt file {path}: it is a folder")
    if path.exists():  # /dev/zero never ends and a huge file would be read whole: both refused before reading
        check_input_file(path, "prompt file", MAX_PROMPT_FILE_BYTES)
    lines = read_text(path, "prompt file", MAX_PROMPT_FILE_BYTES).splitlines()  # the size checked as it is opened
    prompts = [line for line in lines if line.strip()]
    if not prompts:
        raise PdraftError(f"prompt file {path} holds no prompt")
    return prompts, [None] * len(prompts)


def longest_token_chars(tokenizer) -> int:
    """The longest vocabulary entry, in characters of its stored form (for byte-level BPE one character per
    byte, so at least the characters of any text it decodes to): no token covers more characters than this."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return max((len(t) for t in vocab), default=1) or 1


def encode(tokenizer, texts: list[str], *, raw: bool = False, enable_thinking: bool = False,
           context: int | None = None) -> list[list[int]]:
    """Token ids of each prompt, built exactly as training built its contexts (pdraft.data.templates). With the
    target's `context` (tokens), a prompt is measured in characters first: one longer than context x the
    longest token's characters cannot fit, and is refused before the tokenizer spends memory on it (a 20 MB
    prompt took 4 GB before the token-count check)."""
    if tokenizer is None:
        raise PdraftError("the target has no tokenizer: give token ids with --prompt-ids")
    if context is not None and texts:
        limit = context * longest_token_chars(tokenizer)
        for i, text in enumerate(texts):
            if len(text) > limit:
                raise PdraftError(f"prompt {i} has {len(text):,} characters: more than the target's context of "
                                  f"{context:,} tokens can hold (at most {limit:,} characters with this tokenizer)",
                                  hint="shorten the prompt")
    ids = [encode_prompt(tokenizer, text, chat_template=not raw, enable_thinking=enable_thinking) for text in texts]
    for text, row in zip(texts, ids):
        if not row:
            raise PdraftError(f"prompt {text[:40]!r} encodes to no tokens")
    return ids
