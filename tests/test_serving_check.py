"""`pdraft check-serving`'s export check (pdraft.serving.check) on purpose-broken exports: a z-lab DFlash and
an EAGLE-3 on a tiny random target are exported for vLLM, then each export is broken in one way a user report
describes (a layer offset, a mask token, num_speculative_tokens beyond the block, a layout flag, a dtype or a
quantization the drafter would inherit, a vocabulary mapping, a weight, the served target's chat template); every
one is caught and named by its cause, and the correct export passes (negative controls). No engine runs here:
the replay in vLLM is tests/test_serving_check_vllm.py's."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from pdraft.hub.export import export
from pdraft.serving import get_engine
from pdraft.serving.check import CAUSES, cause_of, cause_texts, check_serving, compare_rounds
from pdraft.models import build_drafter, save_drafter
from pdraft.recipe import load_recipe
from test_data_tinytarget import make_tiny_target


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("serving-check")
    folder = make_tiny_target(root / "target", hidden=32, layers=4)
    model = AutoModelForCausalLM.from_pretrained(folder).float()
    drafters = {
        "dflash": build_drafter("dflash", model.config, seed=0, mask_token_id=3, num_hidden_layers=1, block_size=5,
                                block_convention="zlab"),
        "eagle3": build_drafter("eagle3", model.config, seed=0, draft_vocab_size=40, ttt_steps=4),
    }
    for kind, d in drafters.items():
        save_drafter(d, root / kind)
        export(root / kind, "vllm", root / f"{kind}-export", target=str(folder))
    recipe = root / "recipe.yaml"
    recipe.write_text(json.dumps({"name": "check", "output_dir": str(root / "run"), "target": {"id": str(folder)},
                                  "runtime": {"threads": 1, "device": "cpu"}}))
    return {"root": root, "target": folder, "recipe": load_recipe(recipe)}


def broken(world, kind: str, name: str) -> Path:
    """A copy of the correct export to break."""
    out = world["root"] / f"{kind}-{name}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(world["root"] / f"{kind}-export", out)
    return out


def edit_config(folder: Path, change) -> None:
    data = json.loads((folder / "config.json").read_text())
    change(data)
    (folder / "config.json").write_text(json.dumps(data, indent=2))


def edit_weights(folder: Path, change) -> None:
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors")


def check(world, kind, export_dir=None, **kw):
    return check_serving(world["root"] / kind, export_dir=export_dir, recipe=world["recipe"], replay=False, **kw)


def test_the_correct_exports_pass(world):
    for kind in ("dflash", "eagle3"):
        report = check(world, kind, world["root"] / f"{kind}-export")
        assert report.ok and report.findings == [], [f.line() for f in report.findings]
        method = {"dflash": "dflash", "eagle3": "eagle3"}[kind]
        assert report.speculative_config["method"] == method
    assert check(world, "dflash").speculative_config["num_speculative_tokens"] == 4  # block 5, the anchor is not drafted


def _offset_layers(d):  # pdraft's numbering written where vLLM reads its own, one above (vLLM #42704)
    d["dflash_config"]["target_layer_ids"] = [i + 1 for i in d["dflash_config"]["target_layer_ids"]]


def _eagle_offset(d):
    ids = d["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in ids]


BREAKS = {  # (kind, name): (how it is broken, the cause it must be named by)
    ("dflash", "layer-offset"): (lambda f: edit_config(f, _offset_layers), "layer-ids"),
    ("eagle3", "layer-offset"): (lambda f: edit_config(f, _eagle_offset), "layer-ids"),
    ("dflash", "mask-token"): (lambda f: edit_config(f, lambda d: d["dflash_config"].update(mask_token_id=0)),
                               "mask-token"),
    ("dflash", "block-size"): (lambda f: edit_config(f, lambda d: d.update(block_size=16)), "block-size"),
    ("dflash", "layout"): (lambda f: edit_config(f, lambda d: d.update(architectures=["Qwen3DSparkModel"])),
                           "layout"),
    ("dflash", "dtype"): (lambda f: edit_weights(f, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()})),
                          "dtype"),
    ("eagle3", "quantization"): (lambda f: edit_config(f, lambda d: d.update(
        quantization_config={"quant_method": "compressed-tensors", "format": "pack-quantized"})), "dtype"),
    ("eagle3", "vocab"): (lambda f: edit_weights(f, lambda t: t.update(d2t=t["d2t"] + 1)), "vocab"),
    ("dflash", "weights"): (lambda f: edit_weights(f, lambda t: t.update({"fc.weight": t["fc.weight"] * 0.5})), "weights"),
}


@pytest.mark.parametrize("kind,name", sorted(BREAKS))
def test_each_broken_export_is_caught_and_named(world, kind, name):
    brk, cause = BREAKS[(kind, name)]
    folder = broken(world, kind, name)
    brk(folder)
    report = check(world, kind, folder)
    assert not report.ok
    assert report.causes() == [cause], [f.line() for f in report.findings]
    assert cause in CAUSES and not report.replayed  # failed before any engine started


def test_serving_more_drafts_than_the_block_is_named(world):
    report = check(world, "dflash", num_speculative=5)  # block 5: 4 drafts after the anchor
    assert report.causes() == ["block-size"] and "exceeds the 4 drafts" in report.findings[0].detail
    assert check(world, "dflash", num_speculative=4).ok


def test_a_served_target_with_another_chat_template_is_named(world):
    served = world["root"] / "other-target"
    shutil.rmtree(served, ignore_errors=True)
    shutil.copytree(world["target"], served)
    cfg = json.loads((served / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (served / "tokenizer_config.json").write_text(json.dumps(cfg))
    (served / "chat_template.jinja").unlink(missing_ok=True)
    report = check(world, "dflash", served_target=served)
    assert report.causes() == ["chat-template"]


def test_cause_names_of_config_keys():
    assert cause_of("dflash_config.target_layer_ids") == "layer-ids"
    assert cause_of("eagle_config.eagle_aux_hidden_state_layer_ids") == "layer-ids"
    assert cause_of("torch_dtype") == "dtype" and cause_of("quantization_config.quant_method") == "dtype"
    assert cause_of("rms_norm_eps") == "config"


def test_compare_rounds_agrees_and_names_differences():
    ours = [{"output_ids": [1, 2, 3, 4], "finish_reason": "length", "accepted": [1, 0, 2]}]
    same = [{"output_ids": [1, 2, 3, 4], "finish_reason": "length", "accepted": [1, 0, 3]}]  # last round: trimmed
    problems, stats = compare_rounds(ours, same)
    assert problems == [] and stats["rounds_compared"] == 2 and stats["rounds_equal"] == 2
    assert stats["tau_pdraft"] == pytest.approx(2.0) and stats["tau_engine"] == pytest.approx(1 + 4 / 3)
    other = [{"output_ids": [1, 2, 3, 4], "finish_reason": "length", "accepted": [0, 0, 2]}]
    problems, _ = compare_rounds(ours, other)
    assert problems and "first at drafting round 1: pdraft accepted 1, the engine 0" in problems[0]
    problems, _ = compare_rounds(ours, [{"output_ids": [1, 2, 9], "accepted": []}])
    assert problems == ["prompt 0: the engine's output differs from pdraft's at token 2"]


def test_an_engine_that_drafts_nothing_for_the_last_budgeted_token_may_count_one_round_fewer():
    ours = [{"output_ids": [1, 2, 3, 4, 5], "finish_reason": "length", "accepted": [1, 0, 1]}]
    short = [{"output_ids": [1, 2, 3, 4, 5], "finish_reason": "length", "accepted": [1, 0]}]  # llama.cpp's last step
    assert compare_rounds(ours, short)[0] == ["prompt 0: pdraft drafted 3 rounds, the engine verified 2 steps"]
    problems, stats = compare_rounds(ours, short, budget_end_undrafted=True)
    assert problems == [] and stats["pdraft_rounds"] == stats["engine_rounds"] == 2
    wrong = [{"output_ids": [1, 2, 3, 4, 5], "finish_reason": "length", "accepted": [0, 0]}]
    assert compare_rounds(ours, wrong, budget_end_undrafted=True)[0]  # the rounds it keeps are still compared
    eos = [{**ours[0], "finish_reason": "eos"}]
    assert compare_rounds(eos, short, budget_end_undrafted=True)[0]  # only a request that ran out of budget


@pytest.mark.parametrize("gap, tie", [(0.001, True), (1.0, False)])
def test_a_divergence_is_a_near_tie_only_below_the_engines_gap(gap, tie):
    """The rule (pdraft.decode.greedy_audit, with llama.cpp's near_tie_gap as the bound): the engine's output parts
    from pdraft's at token 5, where the reference's two candidates are `gap` apart. A near-tie ends the prompt's
    comparison there (the one round that verified only earlier tokens is still compared); a wider gap fails."""
    from pdraft.decode.greedy_audit import audit_scores

    bound = get_engine("llamacpp").near_tie_gap
    assert 0 < bound < 1.0  # measured, and below what a wrong token shows
    ours = [{"output_ids": [1, 2, 3, 4, 5, 6, 7, 8], "finish_reason": "length", "accepted": [1, 1, 1],
             "drafted": [2, 2, 2]}]
    theirs = [{"output_ids": [1, 2, 3, 4, 5, 9, 7, 8], "finish_reason": "length", "accepted": [1, 1, 0],
               "drafted": [2, 2, 2]}]
    d = audit_scores(0, 5, 9, 6, [(6, -0.5), (9, -0.5 - gap), (4, -3.0)], bound)
    problems, stats = compare_rounds(ours, theirs, audited={0: d})
    assert d.rounding is tie
    if tie:
        assert problems == [] and len(stats["near_ties"]) == 1 and "token 5: 9 against 6" in stats["near_ties"][0]
        assert stats["rounds_compared"] == stats["rounds_equal"] == 1
    else:
        assert stats["near_ties"] == [] and len(problems) == 1 and "not a near-tie" in problems[0]
    # a near-tie does not hide a wrong round before it
    wrong = [{**theirs[0], "accepted": [0, 1, 0]}]
    assert tie is False or compare_rounds(ours, wrong, audited={0: d})[0]
    # unaudited, a divergence fails as before
    assert compare_rounds(ours, theirs)[0] == ["prompt 0: the engine's output differs from pdraft's at token 5"]


def test_the_vllm_engine_declares_what_the_check_asks_of_vllm(world, tmp_path):
    """What check-serving asks of vLLM through its Engine (pdraft.serving.vllm.ENGINE): the causes cite vLLM's
    loader files, the speculative config asked for serves the given folder, and the replay's contender is greedy,
    unseeded, in the given dtype, with room for at least 256 tokens."""
    vllm = get_engine("vllm")
    assert vllm.export_format == "vllm" and set(cause_texts("vllm")) == set(CAUSES)
    assert cause_texts("vllm")["layer-ids"] == ("target layer ids or their offset convention (vLLM adds 1 to the ids "
                                                "it reads: vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py)")
    assert cause_texts("vllm")["mask-token"] == ("mask token id (vllm/model_executor/models/qwen3_dflash.py reads "
                                                 "dflash_config.mask_token_id)")
    spec = {"method": "dflash", "model": "/fresh", "num_speculative_tokens": 4}
    assert vllm.served_config(spec, Path("/given"), 3) == {"method": "dflash", "model": "/given",
                                                           "num_speculative_tokens": 3}
    ours = SimpleNamespace(label="d (dflash)", kind="dflash", path="/d")
    c = vllm.replay_contender(world["recipe"], Path("/t"), ours, Path("/given"), spec, 3, vocab_size=64,
                              dtype="float32", context=40, scratch=tmp_path)
    assert (c.label, c.kind, c.method, c.max_gamma, c.export_dir, c.path, c.seeded) == (
        "vLLM d (dflash)", "dflash", "dflash", 3, Path("/given"), "/d", False)
    assert (c.args["model"], c.args["dtype"], c.args["max_model_len"]) == ("/t", "float32", 256)


def test_a_drafted_stop_token_counts_as_the_engine_counts_it():
    """llama.cpp never accepts a drafted end-of-generation token but at its draft's last position (it becomes the
    step's own token: common/sampling.cpp:704), where pdraft counts every draft its target agrees with, past the stop
    token too. The quickstart DSpark's one differing round was this: pdraft accepted 5 of 20 drafts, the 4th the
    stop token, llama.cpp 3. stop_round counts the stop round as the engine does; other rounds stay compared."""
    from pdraft.serving.check import stop_round

    # first token from the prefill, a round of a=1 (2 tokens), then a round of 20 drafts whose 4th is the stop (2):
    # the output ends there, 3 drafts and the stop token committed
    ours = [{"output_ids": [9, 5, 6, 7, 8, 4, 2], "finish_reason": "eos", "accepted": [1, 5],
             "drafted": [20, 20], "verified": [20, 20]}]
    assert stop_round(ours[0]) == [1, 3]
    engine = [{"output_ids": [9, 5, 6, 7, 8, 4, 2], "finish_reason": "eos", "accepted": [1, 3]}]
    assert compare_rounds(ours, engine)[0]  # counted as pdraft counts, they differ
    problems, stats = compare_rounds(ours, engine, stop_draft_unaccepted=True)
    assert problems == [] and stats["rounds_equal"] == 2 and stats["tau_pdraft"] == stats["tau_engine"]
    wrong = [{**engine[0], "accepted": [0, 3]}]
    assert compare_rounds(ours, wrong, stop_draft_unaccepted=True)[0]  # the earlier round is still held
    # the stop token at the last verified draft is accepted by the engine too; a stop from the target's own token
    # (c = a + 1) or a length stop is left alone
    assert stop_round({**ours[0], "output_ids": [9, 5, 6, 7, 8, 4, 2], "verified": [20, 4]}) == [1, 4]
    assert stop_round({**ours[0], "accepted": [1, 3]}) == [1, 3]
    assert stop_round({"output_ids": [1, 2], "accepted": [4]}) == [4]  # no draft lengths: as it is
