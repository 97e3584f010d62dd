"""calibrate-threshold's cost table measured in vLLM for real (`--engine vllm`, pdraft.serving.vllm.sps_profiler):
vLLM's CPU build, serving the embedded target alone with prefix caching, returns one positive step time per B
asked, after checking inside the worker that every timed request found its whole context in the prefix cache (a
miss fails the run: vllm_worker.py _sps); the metadata names vLLM, its version and torch, and the context rounded
to the CPU build's 128-token cache blocks. The venv is found through VLLM_VENV (else .venv-vllm); under CI=true a
missing venv fails the test instead of skipping it."""

import pytest

from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.serving.vllm import sps_profiler
from pdraft.targets.loader import load_target
from test_regenerate_vllm import vllm_python

RECIPE = "recipes/quickstart.yaml"


def test_vllm_measures_the_cost_table_over_cached_contexts(monkeypatch):
    python = vllm_python()
    monkeypatch.setenv("VLLM_VENV", str(python.parent.parent))
    r = load_recipe(RECIPE, ["runtime.device=cpu"])
    target = load_target(r.target, make_runtime(r.runtime))
    points = [1, 3, 8, 24]
    seconds, meta = sps_profiler(r, target, points, context=150, requests=4, repeats=2)
    assert len(seconds) == len(points) and all(0 < s < 60 for s in seconds)
    assert meta["measured_in"]["engine"] == "vllm" and meta["measured_in"]["version"]
    assert meta["context_tokens"] == 128 and meta["device"] is None and meta["torch_version"]
    assert meta["llm_args"]["enable_prefix_caching"] is True


def test_a_context_the_cache_did_not_keep_fails_instead_of_timing_its_prefill(monkeypatch):
    """A KV cache of 9 blocks cannot keep 8 contexts of one block each beside a step's new tokens: the evicted
    contexts are prefilled again, and the profile says so rather than time it."""
    from pdraft.errors import PdraftError

    python = vllm_python()
    monkeypatch.setenv("VLLM_VENV", str(python.parent.parent))
    r = load_recipe(RECIPE, ["runtime.device=cpu", "data.vllm_args={num_gpu_blocks_override: 9}"])
    target = load_target(r.target, make_runtime(r.runtime))
    with pytest.raises(PdraftError, match="cached tokens, not the 128-token contexts"):
        sps_profiler(r, target, [1, 8, 64, 256], context=128, requests=8, repeats=1)
