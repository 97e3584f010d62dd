"""The prompt encoding decode uses, and training sequences with their loss mask."""

import pytest
from transformers import AutoTokenizer

from pdraft.data.prompts import Conversation
from pdraft.data.templates import build_sequence, build_sequences, encode_prompt, prompt_text
from pdraft.errors import PdraftError
from test_data_tinytarget import make_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    make_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def raw_tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rawtok")
    make_tokenizer(folder, chat_template=False)
    return AutoTokenizer.from_pretrained(folder)


def test_prompt_uses_template_with_thinking_off(tok):
    text = prompt_text(tok, "Write a function")
    assert text == "<|im_start|>user\nWrite a function<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tok.decode(encode_prompt(tok, "Write a function")) == text
    assert "<think>" not in prompt_text(tok, "Write a function", enable_thinking=True)


def test_raw_text_without_template(tok, raw_tok):
    assert tok.decode(encode_prompt(tok, "Write a function", chat_template=False)) == "Write a function"
    assert raw_tok.decode(encode_prompt(raw_tok, "Write a function")) == "Write a function"


def test_loss_mask_covers_response_and_end_of_turn(tok):
    seq = build_sequence(tok, Conversation(["Write a function"], "def add(a, b):"), max_length=256)
    prompt_len = len(encode_prompt(tok, "Write a function"))
    assert seq.input_ids[:prompt_len] == encode_prompt(tok, "Write a function")
    assert seq.loss_mask == [0] * prompt_len + [1] * (len(seq) - prompt_len)
    # The response ends with the end-of-turn token decode stops at, without the template's trailing newline.
    assert tok.decode(seq.input_ids[prompt_len:]) == "def add(a, b):<|im_end|>"


def test_truncation_and_exact_response_ids(tok):
    full = build_sequence(tok, Conversation(["Write a function"], "def add(a, b):\n    return a + b\n"), 256)
    cut = build_sequence(tok, Conversation(["Write a function"], "def add(a, b):\n    return a + b\n"), 20)
    assert cut.input_ids == full.input_ids[:20] and cut.loss_mask == full.loss_mask[:20]
    exact = build_sequence(tok, Conversation(["Write a function"], "ignored", response_ids=[5, 6, 7]), 256)
    assert exact.input_ids[-3:] == [5, 6, 7] and exact.loss_mask[-4:] == [0, 1, 1, 1]


def test_plain_text_counts_every_token_and_empty_data_fails(tok):
    seq = build_sequence(tok, Conversation(["The quick brown fox"]), 256)
    assert tok.decode(seq.input_ids) == "The quick brown fox" and all(seq.loss_mask)
    long_prompt = Conversation(["Write a function " * 40], "x")
    seqs, dropped = build_sequences(tok, [long_prompt, Conversation(["The quick brown fox"])], 16)
    assert dropped == 1 and len(seqs) == 1
    with pytest.raises(PdraftError, match="no usable training sequence"):
        build_sequences(tok, [long_prompt], 16)
