"""How a pretrained target behaves on benchmark prompts, per domain, as `pdraft target eval` reports it for a
converted builtin target (SmolLM2): the prompts come from DeepSpec-layout JSONL files (HumanEval, MBPP, GSM8K,
MATH-500 and MT-Bench in `../shared/datasets`), each rendered with the target's chat template.

Per domain it measures:
- `prompt_loss`, `prompt_top1`: the target's next-token loss (nats/token) and top-1 accuracy on the rendered
  prompts themselves, teacher-forced: held-out text the model never trained on;
- `answer_top1_prob`: the mean probability of the top token along the target's own greedy answer, the
  peakedness a drafter exploits (a flat target leaves a drafter nothing to predict);
- `answer_loops`, `answer_tokens`: the share of greedy answers that loop (quality.has_loop) and their length;
- `mask_max_prob`: the largest probability the mask token gets anywhere (prompt or answer): a mask token the
  target could generate would be a real token to the drafter.

    report = evaluate_prompt_sets(model, tokenizer, {"code": [humaneval, mbpp]}, per_file=4, mask_id=16)
"""

from __future__ import annotations

import json
from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.readback import read_bytes
from pdraft.targets.builtin.quality import encode, greedy_continuations, has_loop

# domain -> the shared datasets' files it pools (`../shared/datasets/<file>`)
DOMAINS = {
    "code": ("humaneval.jsonl", "mbpp.jsonl"),
    "math": ("gsm8k.jsonl", "math500.jsonl"),
    "chat": ("mt-bench.jsonl",),
}
MAX_PROMPT_FILE = 64 << 20


def first_turns(path: Path, n: int) -> list[str]:
    """The first user turn of the first `n` records of a DeepSpec JSONL prompt file."""
    text = read_bytes(path, "prompt file", MAX_PROMPT_FILE).decode("utf-8")
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if len(out) == n:
            break
        if not line.strip():
            continue
        try:
            turns = json.loads(line)["turns"]
            out.append(str(turns[0]))
        except (ValueError, KeyError, IndexError, TypeError):
            raise PdraftError(f"{path}:{i}: not a DeepSpec prompt record ({{\"turns\": [...]}})") from None
    return out


def domain_files(datasets: Path) -> dict[str, list[Path]]:
    """The shared datasets' files per domain; a missing folder or file is one line."""
    if not datasets.is_dir():
        raise PdraftError(f"no prompt-set folder at {datasets}",
                          hint="pass --datasets with the folder holding humaneval.jsonl, mbpp.jsonl, gsm8k.jsonl, "
                               "math500.jsonl and mt-bench.jsonl")
    files = {d: [datasets / f for f in names] for d, names in DOMAINS.items()}
    missing = [str(p) for ps in files.values() for p in ps if not p.is_file()]
    if missing:
        raise PdraftError(f"prompt set(s) missing: {', '.join(missing)}")
    return files


def evaluate_prompt_sets(model, tokenizer, files: dict[str, list[Path]], per_file: int, mask_id: int | None,
                         max_new_tokens: int = 64) -> dict:
    """The per-domain figures above, over the first `per_file` prompts of each file."""
    import torch

    report = {}
    model.eval()
    for domain, paths in files.items():
        prompts = [p for path in paths for p in first_turns(path, per_file)]
        answers = greedy_continuations(model, tokenizer, prompts, chat_template=True, max_new_tokens=max_new_tokens)
        loss_sum = correct = n_prompt = 0.0
        top1_sum = n_answer = 0.0
        mask_max = 0.0
        with torch.no_grad():
            for text, answer in zip(prompts, answers):
                prompt_ids = encode(tokenizer, text, chat_template=True)
                ids = torch.tensor([prompt_ids + answer])  # [1, prompt + answer]
                logits = model(input_ids=ids).logits[0].float()  # [seq, vocab]
                probs = torch.softmax(logits, -1)
                target = ids[0, 1:]
                p_pred = logits[: len(prompt_ids) - 1]  # predicting prompt tokens 1..P-1
                loss_sum += torch.nn.functional.cross_entropy(p_pred, target[: len(prompt_ids) - 1],
                                                              reduction="sum").item()
                correct += (p_pred.argmax(-1) == target[: len(prompt_ids) - 1]).sum().item()
                n_prompt += len(prompt_ids) - 1
                a_probs = probs[len(prompt_ids) - 1: -1]  # [answer, vocab], predicting the answer's tokens
                top1_sum += a_probs.max(-1).values.sum().item()
                n_answer += a_probs.shape[0]
                if mask_id is not None:
                    mask_max = max(mask_max, probs[:, mask_id].max().item())
        report[domain] = {
            "prompts": len(prompts),
            "prompt_tokens": int(n_prompt),
            "prompt_loss": round(loss_sum / max(1, n_prompt), 4),
            "prompt_top1": round(correct / max(1, n_prompt), 4),
            "answer_tokens": round(n_answer / max(1, len(prompts)), 1),
            "answer_top1_prob": round(top1_sum / max(1, n_answer), 4),
            "answer_loops": round(sum(map(has_loop, answers)) / max(1, len(answers)), 4),
            "mask_max_prob": float(f"{mask_max:.3g}") if mask_id is not None else None,
            "first_answer": tokenizer.decode(answers[0], skip_special_tokens=True) if answers else "",
        }
    return report
