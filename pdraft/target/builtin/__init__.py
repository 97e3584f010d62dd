"""The embedded default target, `builtin:tiny-stdlib`: a small transformers Qwen3 causal LM that pdraft trains
itself from text every Python installation has (the standard library's code and its English reference
prose), so the whole lifecycle runs for real where no weights can be downloaded. Its weights ship in the
package and are materialised into the cache on first use; `builtin:tiny-stdlib-test` is a seconds-long build
of the same code path for tests. The held-out code and prose prompt sets ship beside it.

    folder = resolve("tiny-stdlib")                      # HF folder: AutoModelForCausalLM.from_pretrained(folder)
    prompts = prompt_set_path("code")                    # DeepSpec JSONL: {"turns": [...]} per line
"""

from __future__ import annotations

from pathlib import Path

from pdraft.errors import PdraftError
from pdraft.target.builtin.builder import build, evaluate
from pdraft.target.builtin.cache import resolve, shipped_dir, target_dir, verify
from pdraft.target.builtin.tokenizer import mask_token_id

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
PROMPT_SETS = ("code", "prose")
PROMPT_SPLITS = ("heldout", "train")

__all__ = [
    "PROMPTS_DIR", "PROMPT_SETS", "PROMPT_SPLITS", "build", "evaluate", "mask_token_id", "prompt_set_path", "resolve",
    "shipped_dir", "target_dir", "verify",
]


def prompt_set_path(name: str, split: str = "heldout") -> Path:
    """A shipped prompt set, one `{"turns": [prompt]}` JSON object per line: `code` (function signatures with
    their docstrings, to be continued) or `prose` (first sentences of passages). `split="heldout"` (bench,
    calibration) comes from text the target never trained on; `split="train"` (drafter training, up to 2000
    prompts) from its training text, so the two never overlap."""
    if name not in PROMPT_SETS:
        raise PdraftError(f"unknown builtin prompt set {name!r}", hint="known prompt sets: " + ", ".join(PROMPT_SETS))
    if split not in PROMPT_SPLITS:
        raise PdraftError(f"unknown prompt split {split!r}", hint="use " + " or ".join(PROMPT_SPLITS))
    path = PROMPTS_DIR / (f"{name}.jsonl" if split == "heldout" else f"{name}-train.jsonl")
    if not path.is_file():
        raise PdraftError(f"the builtin prompt set {path} is missing from this installation",
                          hint="regenerate it with `pdraft target build tiny-stdlib --prompts-out "
                               f"{PROMPTS_DIR}`")
    return path
