"""tiny-stdlib through llama.cpp's converter (issue 58): its own BPE vocabulary is in no hash table of the converter,
so pdraft names its pre-tokenizer (pdraft.engines.llamacpp.pre_tokenizer_name: GPT-2's byte-level split, llama.cpp's
"gpt-2"). The proof is llama.cpp's tokenization: the converted GGUF, served by the pinned llama-server, tokenizes
mixed texts (code, indentation, digit runs, contractions, unicode, emoji, trailing whitespace) exactly as the
tokenizer itself does. The negative control names another pre-tokenizer (llama-bpe: Llama 3's split, digits in
threes) for the same vocabulary and must differ. Skips without the build or sentencepiece, fails instead under
PDRAFT_REQUIRE_LLAMACPP=1."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from pdraft.errors import PdraftError
from pdraft.engines.llamacpp import pre_tokenizer_name

TEXTS = [
    "def add(a, b):\n    return a + b\n\n\nclass Stack:\n\tpass\n",
    "for i in range(333333):\n        x = 3.14 * i  # 12345678 and 3..3\n",
    "I've been 'told he's there, 'RE you sure? We'Ve a'lL   trailing   \n \n\n",
    "нещо на Български, 我想在apple工作1314151天, 🚀 (normal) 😶\u200d🌫️ ✅ 🦙🦙",
    "import os\nprint(os.path.join('a', \"b\"))\r\n    \n",
]


def _need(what: str):
    if os.environ.get("PDRAFT_REQUIRE_LLAMACPP", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"PDRAFT_REQUIRE_LLAMACPP=1: {what}")
    pytest.skip(what)


def test_a_gpt2_byte_level_tokenizer_is_named_and_another_is_not(tmp_path):
    def tok(pre, normalizer=None, model=None):
        (tmp_path / "tokenizer.json").write_text(json.dumps(
            {"pre_tokenizer": pre, "normalizer": normalizer, "model": model or {"type": "BPE"}}))
        return pre_tokenizer_name(tmp_path)

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    assert tok(byte_level) == "gpt-2"
    assert tok({**byte_level, "add_prefix_space": True}) is None
    assert tok({**byte_level, "use_regex": False}) is None
    assert tok({"type": "Sequence", "pretokenizers": [byte_level]}) is None
    assert tok(byte_level, normalizer={"type": "NFC"}) is None
    assert tok(byte_level, model={"type": "BPE", "byte_fallback": True}) is None
    assert pre_tokenizer_name(tmp_path / "absent") is None


def _tiny_stdlib() -> Path:
    from pdraft.targets.builtin import cache

    try:  # materialised on first use, as every quickstart test does
        return cache.resolve("tiny-stdlib", progress=False)
    except PdraftError as e:
        _need(e.message)


@pytest.mark.slow
def test_llamacpp_tokenizes_tiny_stdlib_as_its_tokenizer_does(tmp_path):
    from pdraft.children import run_bounded
    from pdraft.engines.llamacpp import _NAMED_PRE, convert_target
    from pdraft.engines.llamacpp import LlamaServer, ServerSpec, converter, server_binary

    try:
        server_binary()
    except PdraftError as e:
        _need(e.message)
    if importlib.util.find_spec("sentencepiece") is None:
        _need("llama.cpp's converter needs sentencepiece: pip install -e '.[llamacpp]'")
    from transformers import AutoTokenizer

    target = _tiny_stdlib()
    assert pre_tokenizer_name(target) == "gpt-2"
    tok = AutoTokenizer.from_pretrained(target)
    want = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    gguf = convert_target(target, tmp_path / "tiny-f32.gguf")
    with LlamaServer(ServerSpec(gguf, context=512), tmp_path / "server.log") as server:
        got = [server.tokenize(t) for t in TEXTS]
    for text, a, b in zip(TEXTS, want, got):
        assert b == a, f"llama.cpp tokenizes {text!r} otherwise"
    # negative control: the same vocabulary under Llama 3's split (llama-bpe) tokenizes the digit runs otherwise
    wrong = tmp_path / "tiny-llama-bpe.gguf"
    done = run_bounded([sys.executable, "-c", _NAMED_PRE, str(converter()), "llama-bpe", str(target), "--outfile",
                        str(wrong), "--outtype", "f32"], timeout_s=600, max_bytes=1 << 16)
    assert done.returncode == 0, done.stderr[-500:]
    with LlamaServer(ServerSpec(wrong, context=512), tmp_path / "server-wrong.log") as server:
        assert [server.tokenize(t) for t in TEXTS] != want
