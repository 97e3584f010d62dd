"""Everything `pdraft decode` needs before the engine runs, as plain library functions: loading the target
and its tokenizer, loading and attaching a drafter, reading prompts (text, a prompt file, raw token ids) and
turning text into token ids through the target's chat template (thinking disabled unless asked; `raw` skips
the template for plain continuation)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pdraft.errors import PdraftError


def load_target(name_or_path: str, dtype: torch.dtype = torch.float32):
    """(model, tokenizer or None) from a local folder or a Hub id, eval mode. The tokenizer is optional:
    raw token-id prompts decode without one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype)
    except (OSError, ValueError) as e:
        raise PdraftError(f"cannot load target {name_or_path!r}: {str(e).splitlines()[0]}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError):
        tokenizer = None
    return model.eval(), tokenizer


def load_attached_drafter(path: str | Path, target):
    try:
        from pdraft.models import load_drafter
    except ImportError:
        raise PdraftError("this pdraft build has no drafter loader (pdraft.models.load_drafter)",
                          hint="use --no-draft to decode with the target alone") from None
    drafter = load_drafter(path, target.config)
    drafter.attach_target(target)
    return drafter.eval()


def eos_ids(target, tokenizer) -> list[int]:
    ids: set[int] = set()
    for source in (getattr(target, "generation_config", None), target.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)


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


def read_prompt_file(path: str | Path) -> list[str]:
    """One prompt per non-empty line, or JSON lines with a "prompt" field (.jsonl)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PdraftError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                row = json.loads(line)
                prompts.append(str(row["prompt"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise PdraftError(f"{path}:{n}: expected a JSON object with a \"prompt\" field") from None
        else:
            prompts.append(line)
    if not prompts:
        raise PdraftError(f"prompt file {path} holds no prompt")
    return prompts


def encode(tokenizer, texts: list[str], *, raw: bool = False, enable_thinking: bool = False) -> list[list[int]]:
    """Token ids of each prompt: through the chat template when the tokenizer has one and not `raw`."""
    if tokenizer is None:
        raise PdraftError("the target has no tokenizer: give token ids with --prompt-ids")
    out = []
    for text in texts:
        if not raw and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                add_generation_prompt=True, enable_thinking=enable_thinking)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        out.append([int(i) for i in ids])
    return out
