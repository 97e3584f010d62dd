"""Does the embedded target write code when asked to? Greedy continuations of held-out code prompts, in both
prompt forms (the raw text, and the text wrapped in the chat template), and the share of them that fall into a
loop. Small targets loop under greedy decoding, and a looping target inflates every acceptance figure measured
on it (a drafter predicts a loop easily), so this is reported beside top-1.

A continuation *loops* when some stretch of it repeats with a period p of 1 to 21 tokens for at least
max(3p, 12) tokens: the same 4-gram three times in a row (p = 4), a repeated line of up to 21 tokens three
times, or one token twelve times. Periods above 21 cannot repeat three times in 64 tokens.

    share = loop_share(model, tokenizer, prompts, chat_template=False)     # {"loops": 0.12, "prompts": 100, ...}
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_PERIOD = 21
MIN_RUN = 12


def has_loop(ids: Sequence[int], max_period: int = MAX_PERIOD, min_run: int = MIN_RUN) -> bool:
    """Whether `ids` holds a stretch that repeats with period p (1 <= p <= max_period) over at least
    max(3p, min_run) tokens, i.e. its unit three times in a row."""
    n = len(ids)
    for p in range(1, max_period + 1):
        need = max(3 * p, min_run)
        if need > n:
            break
        run = 0  # tokens t with ids[t] == ids[t + p], consecutively, ending here
        for t in range(n - p):
            run = run + 1 if ids[t] == ids[t + p] else 0
            if run + p >= need:
                return True
    return False


def encode(tokenizer, text: str, chat_template: bool) -> list[int]:
    """The prompt's ids as `pdraft decode` feeds them (pdraft.data.templates.encode_prompt, which pdraft.targets
    may not import: pdraft.data imports pdraft.targets; tests/test_target_quality.py checks the two agree)."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def greedy_continuations(model, tokenizer, prompts: Sequence[str], chat_template: bool,
                         max_new_tokens: int = 64) -> list[list[int]]:
    """Greedy continuations (target alone, KV-cached, one prompt at a time so no padding enters), cut at the
    first end-of-sequence token. The prompt is encoded exactly as `pdraft decode` encodes it."""
    import torch

    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    out = []
    model.eval()
    with torch.no_grad():
        for text in prompts:
            ids = torch.tensor([encode(tokenizer, text, chat_template)])  # [1, prompt]
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=sorted(eos),
                                 pad_token_id=tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
            cut = next((i for i, t in enumerate(gen) if t in eos), len(gen))
            out.append(gen[:cut])
    return out


def loop_share(model, tokenizer, prompts: Sequence[str], chat_template: bool, max_new_tokens: int = 64) -> dict:
    """The share of greedy continuations that loop, with the mean continuation length (a target that stops at
    once never loops: the length shows it) and the first continuation as text."""
    conts = greedy_continuations(model, tokenizer, prompts, chat_template, max_new_tokens)
    loops = sum(has_loop(c) for c in conts)
    return {
        "prompts": len(conts),
        "loops": round(loops / max(1, len(conts)), 4),
        "mean_tokens": round(sum(map(len, conts)) / max(1, len(conts)), 1),
        "first": tokenizer.decode(conts[0], skip_special_tokens=True) if conts else "",
    }
