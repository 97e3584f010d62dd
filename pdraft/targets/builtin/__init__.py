"""The embedded default target, `builtin:tiny-stdlib`: a small transformers Qwen3 causal LM that pdraft trains
itself from text every Python installation has (the standard library's code and its English reference
prose), so the whole lifecycle runs for real where no weights can be downloaded. Its weights ship in the
package and are materialised into the cache on first use; `builtin:tiny-stdlib-test` is a seconds-long build
of the same code path for tests. The held-out code and prose prompt sets ship beside it.

    folder = resolve("tiny-stdlib")                      # HF folder: AutoModelForCausalLM.from_pretrained(folder)
    prompts = prompt_set_path("code")                    # DeepSpec JSONL: {"turns": [...]} per line
"""

from __future__ import annotations

from pdraft.targets.builtin.builder import build, evaluate
from pdraft.targets.builtin.cache import resolve, shipped_dir, target_dir, verify
from pdraft.targets.builtin.prompt_sets import PROMPT_SETS, PROMPT_SPLITS, PROMPTS_DIR, prompt_set_path
from pdraft.targets.builtin.tokenizer import mask_token_id

__all__ = [
    "PROMPTS_DIR", "PROMPT_SETS", "PROMPT_SPLITS", "build", "evaluate", "mask_token_id", "prompt_set_path", "resolve",
    "shipped_dir", "target_dir", "verify",
]
