"""The dependency floors in pyproject.toml admit only versions whose API pdraft calls: the target runner passes
the KV cache to the model as `cache=`, a keyword Qwen3's forward takes from transformers 5.24.0 on. Checked
against the wheels: 5.23.0 and earlier name it `past_key_values`, so `cache=` lands in **kwargs unused and a
verify pass fails (tests/test_decode_greedy.py: "output with shape [5, 2, 2, 1] doesn't match the broadcast
shape [5, 2, 2, 13]" under 5.23.0)."""

import inspect
import re
import tomllib
from pathlib import Path

import transformers
from packaging.requirements import Requirement
from packaging.version import Version
from transformers import Qwen3ForCausalLM

ROOT = Path(__file__).resolve().parents[1]
LAST_WITHOUT_CACHE_KEYWORD = Version("5.23.0")


def transformers_floor() -> Version:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    req = next(Requirement(d) for d in deps if Requirement(d).name == "transformers")
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"pyproject.toml gives transformers no lower bound: {req}"
    return max(floors)


def test_transformers_floor_has_the_cache_keyword():
    assert transformers_floor() > LAST_WITHOUT_CACHE_KEYWORD
    assert "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters  # the API the runner calls
    assert Version(transformers.__version__) >= transformers_floor()


def test_the_runner_calls_the_model_with_cache():
    """If the runner stops passing `cache=`, the floor above may be lowered again (and this test updated)."""
    source = (ROOT / "pdraft" / "decode" / "target_runner.py").read_text()
    assert re.search(r"^\s+cache=self\.cache,$", source, re.M)
