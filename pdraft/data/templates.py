"""Prompt encoding shared by decode and training, the end-of-sequence ids both stop on, and training sequences
with their loss mask.

`encode_prompt` is the one place that turns a user turn into target token ids: the tokenizer's chat template
on the first user turn with the generation prompt appended and `enable_thinking=False` (Qwen3-style
templates read it; other templates ignore unknown variables), or the raw text when the tokenizer has no
template or the recipe turns it off. Decode must call it too, so the drafter trains on exactly the contexts
it will see.

A training sequence is the encoded prompt followed by the response; prompt positions have loss mask 0 and
response positions 1. The response is the template's rendering of the assistant turn (so end-of-turn tokens
are learned), tokenised on its own after the prompt, because at decode time the prompt is tokenised alone
and the rest are generated ids. A record without a response is plain text (language-model data such as the
embedded corpus): every token counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdraft.data.prompts import Conversation
from pdraft.errors import PdraftError


def eos_ids(target, tokenizer) -> list[int]:
    """Every end-of-sequence id the model's generation config, its config and its tokenizer name: decode and
    regeneration stop on the same set."""
    ids: set[int] = set()
    for source in (getattr(target, "generation_config", None), target.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return sorted(ids)


@dataclass
class TrainingSequence:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the drafter is trained to predict this token

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def prompt_text(tokenizer, user_turn: str, chat_template: bool = True, enable_thinking: bool = False) -> str | None:
    """The templated prompt text, or None when the raw text is used."""
    if not (chat_template and has_chat_template(tokenizer)):
        return None
    return tokenizer.apply_chat_template([{"role": "user", "content": user_turn}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=enable_thinking)


def encode_prompt(tokenizer, user_turn: str, chat_template: bool = True, enable_thinking: bool = False) -> list[int]:
    """Token ids the target is fed for a prompt, exactly as decode feeds them."""
    return _encode_rendered(tokenizer, user_turn, prompt_text(tokenizer, user_turn, chat_template, enable_thinking))


def _encode_rendered(tokenizer, user_turn: str, text: str | None) -> list[int]:
    """encode_prompt given the prompt_text already rendered."""
    if text is None:
        return _ids(tokenizer, user_turn, add_special_tokens=True)
    # The template already holds every special token (BOS included when the model wants one).
    return _ids(tokenizer, text, add_special_tokens=False)


def _special_strings(tokenizer) -> list[str]:
    specials = list(getattr(tokenizer, "all_special_tokens", []) or [])
    return [s for s in specials if s]


def _response_after(tokenizer, user_turn: str, response: str, prompt: str | None, enable_thinking: bool) -> str:
    """What follows the prompt (`prompt_text`, already rendered) in a finished conversation: the response plus
    the end-of-turn markup."""
    eos = getattr(tokenizer, "eos_token", None) or ""
    if prompt is None:
        return response + eos
    full = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_turn}, {"role": "assistant", "content": response}],
        tokenize=False, add_generation_prompt=False, enable_thinking=enable_thinking)
    if not full.startswith(prompt):
        # Templates that rewrite earlier turns (or drop the thinking block) give no clean split; fall back
        # to the generation prompt plus the response and the tokenizer's end-of-sequence token.
        return response + eos
    tail = full[len(prompt):]
    # Drop the newline a template prints after the end-of-turn token: decode stops at that token.
    stripped = tail.rstrip()
    if any(stripped.endswith(s) for s in _special_strings(tokenizer)):
        tail = stripped
    return tail


def build_sequence(tokenizer, record: Conversation, max_length: int, chat_template: bool = True,
                   enable_thinking: bool = False) -> TrainingSequence:
    """Prompt + response ids with the loss mask, truncated to `max_length` tokens."""
    if record.response is None and record.response_ids is None:
        ids = _ids(tokenizer, record.prompt, add_special_tokens=True)
        return TrainingSequence(ids[:max_length], [1] * min(len(ids), max_length))
    prompt = prompt_text(tokenizer, record.prompt, chat_template, enable_thinking)  # rendered once for both
    prompt_ids = _encode_rendered(tokenizer, record.prompt, prompt)
    if record.response_ids is not None:
        resp_ids = list(record.response_ids)
    else:
        tail = _response_after(tokenizer, record.prompt, record.response, prompt, enable_thinking)
        resp_ids = _ids(tokenizer, tail, add_special_tokens=False)
    ids = (prompt_ids + resp_ids)[:max_length]
    mask = ([0] * len(prompt_ids) + [1] * len(resp_ids))[:max_length]
    return TrainingSequence(ids, mask)


def build_sequences(tokenizer, records: list[Conversation], max_length: int, chat_template: bool = True,
                    enable_thinking: bool = False, min_loss_tokens: int = 1) -> tuple[list[TrainingSequence], int]:
    """Every record as a training sequence; those with fewer than `min_loss_tokens` loss tokens left after
    truncation (a prompt longer than max_length) are dropped. Returns (sequences, number dropped)."""
    sequences: list[TrainingSequence] = []
    dropped = 0
    for rec in records:
        seq = build_sequence(tokenizer, rec, max_length, chat_template, enable_thinking)
        if seq.num_loss_tokens < min_loss_tokens or len(seq) < 2:
            dropped += 1
            continue
        sequences.append(seq)
    if not sequences:
        raise PdraftError(f"no usable training sequence: all {len(records)} records are empty or have no response "
                          f"tokens within data.max_length={max_length}")
    return sequences, dropped
