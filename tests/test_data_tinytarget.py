"""A tiny random Qwen3 target with a byte-level BPE tokenizer and a Qwen3-like chat template, built in a
temporary folder; shared by the data, cache and export-hidden tests (imported as `test_data_tinytarget`)."""

from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3-like: the generation prompt gets an empty thinking block when enable_thinking is false.
CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and loop.last %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
SENTENCES = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Write a function that sorts a list of numbers.",
    "A robe takes 2 bolts of blue fiber and half that much white fiber.",
    "<think>\n\n</think>\n\n assistant user system",
    "for i in range(10):\n    print(i * i)\n",
]


def make_tokenizer(folder: Path, chat_template: bool = True):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIALS[1:])
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def make_tiny_target(folder: Path, hidden: int = 32, layers: int = 4, seed: int = 0, chat_template: bool = True,
                     norm_scale: float = 1.0) -> Path:
    """`norm_scale` multiplies the final norm's weight: a random target's next-token distributions are nearly
    uniform, so any drafter matches it already; sharpened (e.g. 12) they are peaked, something to learn."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(folder, chat_template)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg)
    if norm_scale != 1.0:
        with torch.no_grad():
            model.model.norm.weight.mul_(norm_scale)
    model.save_pretrained(folder)
    return folder


def test_tiny_target_round_trips(tmp_path):
    from transformers import AutoTokenizer

    folder = make_tiny_target(tmp_path / "t")
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template == CHAT_TEMPLATE
    ids = tok("def add(a, b):", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "def add(a, b):"


def write_chat_jsonl(path: Path, n: int = 30) -> Path:
    """n prompt/response records of varied lengths in DeepSpec's layout plus a response."""
    import json

    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            body = "def add(a, b):\n    return a + b\n" * (1 + i % 4)
            f.write(json.dumps({"turns": [f"Write a function number {i}"], "response": body}) + "\n")
    return path
