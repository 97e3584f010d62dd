"""The embedded target's shipped prompt sets (`builtin:code`, `builtin:prose` and their `-train` splits), in
DeepSpec's JSONL layout, and where they lie: a leaf, so that the builder and the data loaders find them without
importing the package that builds the target."""

from __future__ import annotations

from pathlib import Path

from pdraft.errors import PdraftError

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
PROMPT_SETS = ("code", "prose")
PROMPT_SPLITS = ("heldout", "train")


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
