"""export layouts checked against the config fields and weight names the engines read (pdraft/hub/ENGINES.md
cites the reading file of each), the serve commands, the SGLang calibration/cost-table files, the refusals,
and that the zero-Markov conversion of a DeepSpec-convention DFlash decodes exactly like the original."""

import json

import pytest
import torch
from safetensors import safe_open

from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from pdraft.hub import export
from pdraft.models import load_drafter
from test_hub_support import write_family
import test_models_support
from test_models_support import MASK, tiny_drafter

target = test_models_support.target  # tiny_target(), a module fixture

torch.set_num_threads(1)
QWEN3_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "max_position_embeddings", "vocab_size", "hidden_act", "attention_bias",
                "rope_parameters", "num_hidden_layers")


def weights(folder):
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def backbone_ok(cfg: dict, w: dict, layers: int, hidden: int):
    """Names vLLM's DFlashQwen3Model / SGLang's DFlashDraftModel load (q/k/v and gate/up are stacked by their
    weight mappers from exactly these names); no `model.` prefix, no embedding or LM head (shared from the target)."""
    assert cfg["model_type"] == "qwen3" and all(f in cfg for f in QWEN3_FIELDS)
    assert cfg["layer_types"] == ["full_attention"] * layers  # non-causal drafter layers in vLLM
    m = len(cfg.get("target_layer_ids") or cfg["dflash_config"]["target_layer_ids"])
    assert w["fc.weight"] == (hidden, m * hidden) and w["hidden_norm.weight"] == (hidden,)
    assert w["norm.weight"] == (hidden,)
    for i in range(layers):
        for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            assert f"layers.{i}.self_attn.{n}.weight" in w
        for n in ("gate_proj", "up_proj", "down_proj"):
            assert f"layers.{i}.mlp.{n}.weight" in w
        assert f"layers.{i}.input_layernorm.weight" in w and f"layers.{i}.post_attention_layernorm.weight" in w
    assert not any(k.startswith(("model.", "embed_tokens", "lm_head")) for k in w)


def test_dspark_to_vllm(tmp_path, target):
    write_family(tmp_path / "d", "pdraft-dspark", target)
    got = export(tmp_path / "d", "vllm", tmp_path / "out")
    cfg, w = json.loads((got.path / "config.json").read_text()), weights(got.path)
    backbone_ok(cfg, w, 2, 32)
    # vllm/model_executor/models/qwen3_dspark.py: Qwen3DSparkModel, config.markov_rank, confidence_head(_with_markov)
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["markov_rank"] == 8
    assert cfg["markov_head_type"] == "vanilla" and cfg["enable_confidence_head"] is True
    assert cfg["confidence_head_with_markov"] is True and cfg["sample_from_anchor"] is True
    # eagle3_utils.get_eagle3_aux_layers_from_config: top-level target_layer_ids (+1 there, = pdraft's ids)
    assert cfg["target_layer_ids"] == load_drafter(tmp_path / "d").config.target_layer_ids
    assert cfg["mask_token_id"] == MASK and cfg["block_size"] == 4
    assert w["markov_head.markov_w1.weight"] == (97, 8) and w["markov_head.markov_w2.weight"] == (97, 8)
    assert w["confidence_head.proj.weight"] == (1, 32 + 8) and w["confidence_head.proj.bias"] == (1,)
    assert got.command == ("vllm serve Qwen/Qwen3-4B --speculative-config '{\"method\": \"dspark\", \"model\": \""
                           f"{got.path}\", \"num_speculative_tokens\": 4}}'")
    assert "recipe.resolved.yaml" in got.files


def test_zlab_dflash_to_vllm_and_zlab(tmp_path, target):
    write_family(tmp_path / "d", "zlab-dflash", target)
    for fmt in ("vllm", "zlab-dflash", "sglang"):
        got = export(tmp_path / "d", fmt, tmp_path / f"out-{fmt}", target="Qwen/Qwen3-8B")
        cfg, w = json.loads((got.path / "config.json").read_text()), weights(got.path)
        backbone_ok(cfg, w, 2, 32)
        # vLLM qwen3_dflash.py / SGLang dflash_utils.parse_dflash_draft_config: dflash_config + top-level block_size
        assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
        assert cfg["dflash_config"]["mask_token_id"] == MASK and cfg["dflash_config"]["target_layer_ids"]
        assert "auto_map" not in cfg and not any(k.startswith("markov") for k in w)
        sglang = ("python -m sglang.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm "
                  f"DFLASH --speculative-draft-model-path {got.path}")
        vllm = ("vllm serve Qwen/Qwen3-8B --speculative-config '{\"method\": \"dflash\", \"model\": \""
                f"{got.path}\", \"num_speculative_tokens\": 3}}'")  # 1 + N query slots, N = block_size - 1
        assert got.command == {"vllm": vllm, "sglang": sglang, "zlab-dflash": f"{vllm}\n{sglang}"}[fmt]


def test_dspark_to_sglang_with_calibration(tmp_path, target):
    d = tmp_path / "d"
    write_family(d, "pdraft-dspark", target)
    (d / "calibration.json").write_text(json.dumps({"temperatures": [1.2, 1.0, 0.9, 1.1], "dataset": "x",
                                                    "num_samples": 9, "ece_before": [0.1] * 4,
                                                    "ece_after": [0.01] * 4, "auc_after": 0.8}))
    (d / "sps_table.json").write_text(json.dumps({"sample_batch_tokens": [1, 4], "sample_steps_per_sec": [9.0, 7.5],
                                                  "max_batch_tokens": 16, "device": "cpu"}))
    got = export(d, "sglang", tmp_path / "out")
    sts = json.loads((got.path / "sglang_sts.json").read_text())
    # SGLang dspark_sts.py DSparkStsCalibration / dspark_sps.py SpsCostTable fields, nothing else
    assert set(sts) == {"temperatures", "dataset", "num_samples", "ece_before", "ece_after"}
    assert sts["temperatures"] == [1.2, 1.0, 0.9, 1.1]
    sps = json.loads((got.path / "sglang_sps_table.json").read_text())
    assert sps == {"sample_batch_tokens": [1, 4], "sample_steps_per_sec": [9.0, 7.5], "max_batch_tokens": 16}
    # the confidence-driven verify mode is an environment variable (SGLang ragged_verify.py); static ignores STS/SPS
    assert got.command == ("SGLANG_RAGGED_VERIFY_MODE=compact python -m sglang.launch_server --model-path "
                           "Qwen/Qwen3-4B --speculative-algorithm DSPARK "
                           f"--speculative-draft-model-path {got.path} --speculative-dspark-block-size 4 "
                           f"--speculative-dspark-confidence-sts-path {got.path}/sglang_sts.json "
                           f"--speculative-dspark-sps-table-path {got.path}/sglang_sps_table.json")
    (d / "calibration.json").write_text(json.dumps({"temperatures": [1.0, 1.0]}))
    with pytest.raises(PdraftError, match="2 temperatures but SGLang applies one per drafted position"):
        export(d, "sglang", tmp_path / "out2")


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_gated_and_rnn_heads(tmp_path, target, head):
    from pdraft.models.checkpoint import save_drafter
    save_drafter(tiny_drafter("dspark", target, sequential_head=head), tmp_path / "d")
    with pytest.raises(PdraftError, match=f"only the vanilla Markov head.*'{head}'"):
        export(tmp_path / "d", "vllm", tmp_path / "v")
    got = export(tmp_path / "d", "sglang", tmp_path / "s")  # SGLang's dspark.py builds gated and RNN heads
    cfg, w = json.loads((got.path / "config.json").read_text()), weights(got.path)
    assert cfg["markov_head_type"] == head
    assert ("markov_head.gate_proj.weight" if head == "gated" else "markov_head.joint_proj.weight") in w


@pytest.mark.parametrize("family,kw,fmt,expect", [
    ("dflash", {"block_convention": "deepspec"}, "zlab-dflash", "block.* convention|shift by one position"),
    ("dspark", {}, "zlab-dflash", "DSpark drafter as z-lab"),
    ("dspark", {"num_experts": 4, "num_experts_per_tok": 2}, "vllm", "mixture-of-experts"),
    ("dflash", {"block_convention": "zlab", "denoise_steps": 3}, "sglang", "denoise_steps=3"),
    ("dspark", {}, "onnx", "unknown export format"),
])
def test_refusals(tmp_path, target, family, kw, fmt, expect):
    from pdraft.models.checkpoint import save_drafter
    save_drafter(tiny_drafter(family, target, **kw), tmp_path / "d")
    with pytest.raises(PdraftError, match=expect) as info:
        export(tmp_path / "d", fmt, tmp_path / "out")
    assert "\n" not in info.value.one_line() and not (tmp_path / "out").exists()


def test_deepspec_dflash_zero_markov_decodes_identically(tmp_path, target):
    """DeepSpec-convention DFlash -> Qwen3DSparkModel with a rank-1 zero Markov head: same drafts, same output."""
    write_family(tmp_path / "d", "deepspec-dflash", target)
    got = export(tmp_path / "d", "vllm", tmp_path / "out")
    cfg, w = json.loads((got.path / "config.json").read_text()), weights(got.path)
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["markov_rank"] == 1 and "pdraft" not in cfg
    assert cfg["enable_confidence_head"] is False and w["markov_head.markov_w2.weight"] == (97, 1)
    assert '"num_speculative_tokens": 4' in got.command and got.notes and "all-zero Markov head" in got.notes[0]
    a, b = load_drafter(tmp_path / "d"), load_drafter(got.path)
    a.attach_target(target)
    b.attach_target(target)
    prompts = [[5, 9, 11, 3, 7], [1, 2, 3, 4, 5, 6, 7, 8]]
    ra = generate(target, a, prompts, max_new_tokens=24)
    rb = generate(target, b, prompts, max_new_tokens=24)
    assert ra.output_ids == rb.output_ids
    assert [(r.gamma, r.verified, r.accepted) for r in ra.records] == [(r.gamma, r.verified, r.accepted)
                                                                       for r in rb.records]


def _calibration_as_pdraft_writes_it(path, empty_positions=()):
    """A calibration file through calibrate/sts.py's own writer; `empty_positions` had no samples (null ECE)."""
    from pdraft.calibrate.sts import PositionMetrics, StsFit, calibration_dict, save_calibration

    def metrics(k, ece):
        empty = k in empty_positions
        return PositionMetrics(position=k + 1, samples=0 if empty else 40, reached=0 if empty else 30,
                               ece=None if empty else ece, auc=None, brier=None, mean_pred=None, mean_outcome=None)
    fit = StsFit([1.3, 1.1, 1.1, 1.1], [k not in empty_positions for k in range(4)])
    data = calibration_dict(fit, dataset="held-out", fit_rows=40, before=[metrics(k, 0.2) for k in range(4)],
                            after=[metrics(k, 0.05) for k in range(4)], extra={})
    return save_calibration(data, path)


@pytest.mark.parametrize("empty", [(), (3,), (1, 2, 3)])
def test_export_reads_every_calibration_pdraft_writes(tmp_path, target, empty):
    d = tmp_path / "d"
    write_family(d, "pdraft-dspark", target)
    cal = _calibration_as_pdraft_writes_it(d / "calibration.json", empty)
    assert (json.loads(cal.read_text())["ece_after"][3] is None) == (3 in empty)
    got = export(d, "sglang", tmp_path / "out")
    sts = json.loads((got.path / "sglang_sts.json").read_text())
    assert sts["temperatures"] == [1.3, 1.1, 1.1, 1.1]
    if empty:  # SGLang reads the ECE lists as list[float]: a list with a gap is left out, and the note says why
        assert "ece_after" not in sts and "ece_before" not in sts
        assert any("null ECE" in n for n in got.notes)
    else:
        assert sts["ece_after"] == [0.05] * 4
    assert all(isinstance(x, float) for k in ("ece_before", "ece_after") for x in sts.get(k, []))


def test_export_cli_never_tracebacks_on_a_calibration_with_an_empty_position(tmp_path, target):
    from typer.testing import CliRunner

    from pdraft.cli.main import app
    d = tmp_path / "d"
    write_family(d, "pdraft-dspark", target)
    _calibration_as_pdraft_writes_it(d / "calibration.json", (2, 3))
    res = CliRunner().invoke(app, ["export", str(d), "--format", "sglang", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    assert "SGLANG_RAGGED_VERIFY_MODE=compact" in res.output
    (d / "calibration.json").write_text(json.dumps({"temperatures": [None, 1.0, 1.0, 1.0]}))
    res = CliRunner().invoke(app, ["export", str(d), "--format", "sglang", "--out", str(tmp_path / "o2")])
    assert isinstance(res.exception, PdraftError)  # main() prints it as one `error:` line, never a traceback


def test_headless_dspark_is_served_in_static_mode(tmp_path, target):
    """No confidence head: SGLang's cap-accept/compact modes would build one and miss its weights."""
    from pdraft.models.checkpoint import save_drafter
    save_drafter(tiny_drafter("dspark", target, confidence_head=False, confidence_with_markov=False), tmp_path / "d")
    (tmp_path / "d" / "sps_table.json").write_text(json.dumps({"sample_batch_tokens": [1, 4],
                                                               "sample_steps_per_sec": [9.0, 7.5]}))
    got = export(tmp_path / "d", "sglang", tmp_path / "out", target="Qwen/Qwen3-4B")
    assert got.command.startswith("SGLANG_RAGGED_VERIFY_MODE=static python -m sglang.launch_server")
    assert "sts-path" not in got.command and "sps-table-path" not in got.command
    assert any("static verify mode" in n for n in got.notes)


def test_last_layer_drafter_is_refused_naming_the_layer(tmp_path, target):
    from pdraft.models.checkpoint import save_drafter
    save_drafter(tiny_drafter("dspark", target, target_layer_ids=[0, 3]), tmp_path / "d")
    with pytest.raises(PdraftError, match="target layer id 3 is the target's last decoder layer") as info:
        export(tmp_path / "d", "vllm", tmp_path / "out")
    assert "\n" not in info.value.one_line()


def test_local_and_builtin_targets_are_printed_as_folders(tmp_path, target, monkeypatch):
    from pdraft.hub.export import TARGET_PLACEHOLDER, recipe_target
    folder = tmp_path / "my-target"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert recipe_target({"target": {"id": str(folder)}}) == str(folder.resolve())
    assert recipe_target({"target": {"id": "Qwen/Qwen3-4B"}}) == "Qwen/Qwen3-4B"
    assert recipe_target({"target": {"id": str(tmp_path / "nowhere")}}) == TARGET_PLACEHOLDER
    monkeypatch.setenv("PDRAFT_CACHE_DIR", str(tmp_path / "cache"))
    assert recipe_target({"target": {"id": "builtin:tiny-stdlib"}}) == TARGET_PLACEHOLDER  # not built here
    from pdraft.targets.builtin.cache import target_dir
    built = target_dir("tiny-stdlib")
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    assert recipe_target({"target": {"id": "builtin:tiny-stdlib"}}) == str(built)
