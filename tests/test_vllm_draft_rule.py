"""vLLM's drafter rows draw their drafts by the same rule as pdraft's (decode.draft_sample_method, vLLM's
speculative_config draft_sample_method), asked for only where the bench samples; checked without the engine."""

from pathlib import Path

import pytest

from pdraft.recipe import load_recipe
from pdraft.serving import vllm


@pytest.mark.parametrize("sets,want", [
    ([], None),  # greedy bench: vLLM's default is left alone
    (["bench.temperature=1.0"], "probabilistic"),
    (["bench.temperatures=[0, 1]"], "probabilistic"),
    (["bench.temperatures=[0, 1]", "decode.draft_sample_method=greedy"], "greedy"),
    (["bench.temperature=0", "decode.draft_sample_method=greedy"], None),
])
def test_the_rule_follows_the_recipe_where_the_bench_samples(sets, want):
    recipe = load_recipe(Path("recipes/quickstart.yaml"), overrides=sets)
    assert vllm.draft_rule(recipe) == want


def test_the_engine_is_asked_for_the_rule(monkeypatch, tmp_path):
    asked = []

    class Worker:
        version = "test"

        def __init__(self, settings, log, vocab, **kwargs):
            asked.append(settings.llm_args.get("speculative_config"))

        def __enter__(self):
            return self

    import pdraft.engines.vllm_driver as vllm_engine

    monkeypatch.setattr(vllm_engine, "VllmWorker", Worker)
    for rule in (None, "greedy", "probabilistic"):
        c = vllm.VllmContender("vLLM d", "dflash", "python", {"model": "t"}, 10, tmp_path, tmp_path, "dflash", 8,
                               draft_sample_method=rule)
        assert c.prepare([4]) is None
        assert asked[-1].get("draft_sample_method") == rule and asked[-1]["num_speculative_tokens"] == 4
