"""`pdraft check-serving` for real: vLLM's CPU build serves a z-lab DFlash export on the embedded target and the
replay agrees with pdraft's loop token for token and round for round (the engine's tau printed beside
pdraft's); `--export` pointing at a folder whose layer ids are offset fails at the export check with that cause
named, before any engine starts. The drafter is untrained (this proves the plumbing; the trained drafters are
checked in .ci/run, tests/engines/vllm_check.sh). The venv is found through VLLM_VENV (else .venv-vllm); under
CI=true a missing venv fails the test instead of skipping it."""

import json
import shutil

import pytest

from reliability_support import run_cli
from test_regenerate_vllm import vllm_python

RECIPE = "recipes/quickstart.yaml"


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    from transformers import AutoConfig

    from pdraft.models import build_drafter, save_drafter
    from pdraft.recipe import load_recipe
    from pdraft.runtime import make_runtime
    from pdraft.targets.loader import inspect_target

    python = vllm_python()
    root = tmp_path_factory.mktemp("check-serving")
    r = load_recipe(RECIPE)
    target = inspect_target(r.target, make_runtime(r.runtime), weights=False)
    d = build_drafter("dflash", AutoConfig.from_pretrained(target.path), seed=0, mask_token_id=0, num_hidden_layers=1,
                      block_size=4, block_convention="zlab", target_layer_ids=[0, 1, 2])
    save_drafter(d, root / "dflash")
    return root, python


def test_vllm_serves_the_export_as_pdraft_decodes(drafter, monkeypatch):
    root, python = drafter
    monkeypatch.setenv("VLLM_VENV", str(python.parent.parent))
    res = run_cli(["check-serving", str(root / "dflash"), "--engine", "vllm", "--recipe", RECIPE,
                   "--num-prompts", "1", "--max-new-tokens", "12", "--json"])
    assert res.code == 0, res.out[-3000:] + res.err[-3000:]
    report = json.loads(res.out)
    assert report["ok"] and report["replayed"] and report["findings"] == []
    stats = report["stats"]
    assert stats["prompts"] == 2 and stats["rounds_compared"] > 0 and stats["rounds_equal"] == stats["rounds_compared"]
    assert stats["tau_engine"] is not None and stats["tau_pdraft"] is not None
    assert report["engine_info"]["name"] == "vllm" and report["engine_info"]["speculative_config"]["method"] == "dflash"


def test_a_broken_export_fails_with_its_cause_before_serving(drafter):
    root, _ = drafter
    from pdraft.hub.export import export

    out = root / "broken"
    shutil.rmtree(out, ignore_errors=True)
    export(root / "dflash", "vllm", out)
    data = json.loads((out / "config.json").read_text())
    data["dflash_config"]["target_layer_ids"] = [1, 2, 3]  # vLLM's numbering written over pdraft's
    (out / "config.json").write_text(json.dumps(data))
    res = run_cli(["check-serving", str(root / "dflash"), "--export", str(out), "--recipe", RECIPE])
    assert res.code == 1, res.out + res.err
    assert "cause layer-ids" in res.out and "not served" in res.out


def test_the_kv_reservation_is_sized_from_the_targets_weights(tmp_path):
    """vLLM's CPU build fails at start when gpu_memory_utilization leaves the KV cache nothing after the weights
    (a float32 SmolLM2 asked -0.61 GiB of KV at the old fixed 0.05): the share holds three times the weight files
    plus 1 GiB, within 0.05..0.9."""
    import os

    from pdraft.serving.vllm import MAX_MEMORY_SHARE, MIN_MEMORY_SHARE, llm_args, memory_share

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert memory_share(str(tmp_path)) == round(max(MIN_MEMORY_SHARE, min(MAX_MEMORY_SHARE, (1 << 30) / total)), 3)
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(total // 10)  # a sparse file: its size is what counts
    share = memory_share(str(tmp_path))
    assert share == pytest.approx(min(MAX_MEMORY_SHARE, (3 * (total // 10) + (1 << 30)) / total), abs=1e-3)
    assert llm_args(str(tmp_path))["gpu_memory_utilization"] == share
    assert llm_args(str(tmp_path), gpu_memory_utilization=0.2)["gpu_memory_utilization"] == 0.2  # a given value wins
