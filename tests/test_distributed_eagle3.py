"""EAGLE-3 trains under torchrun like the other families (real processes, Gloo on CPUs): DDP and FSDP2 on 2
processes follow the 1-process run with the same global batch, the draft vocabulary (d2t/t2d buffers, chosen
from the training responses on every rank) included, and a rank SIGKILLed under FSDP2 leaves a checkpoint that
1 process resumes to where the uninterrupted run ends. The harness is tests/test_distributed.py's."""

import json
from pathlib import Path

import pytest

from pdraft.cache.export_hidden import export_hidden
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from test_data_tinytarget import make_tiny_target, write_chat_jsonl
from test_distributed import (CHECKPOINT_AT, KILL_RANK1, STEPS, assert_same_curve, assert_same_weights, in_process,
                              torchrun)


def eagle3_recipe(root: Path, name: str, **train) -> Path:
    body = {
        "output_dir": str(root / "out"),
        "target": {"id": str(root / "target"), "num_layer_ids": 2},
        "data": {"source": str(root / "d.jsonl"), "shard_tokens": 256, "cache_dir": str(root / "cache")},
        "drafter": {"kind": "eagle3", "draft_vocab_size": 100, "ttt_steps": 3},
        "train": {"output_dir": str(root / name), "steps": STEPS, "batch_size": 2, "grad_accum": 1, "lr": 3e-3,
                  "warmup_steps": 1, "num_anchors": 4, "checkpoint_every": CHECKPOINT_AT, "eval_every": STEPS,
                  "log_every": 1, "keep_checkpoints": 4, **train},
        # float32, pinned: under runtime.dtype auto a CPU with bf16 units trains under bf16 autocast, where FSDP2's
        # reduce-scatter (fp32 sums in another order) flips bf16 casts of the weights and the 2-process run parts
        # from the 1-process one by 3e-5 after these steps (DDP stays exact); tests/test_distributed.py runs FSDP2
        # under the bf16 default on the parallel families.
        "runtime": {"threads": 1, "dtype": "float32"},
    }
    path = root / f"{name}.yaml"
    path.write_text(json.dumps(body))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny sharpened target, its cache and the 1-process reference (grad_accum 2 x batch 2: the global batch
    2 processes x grad_accum 1 read)."""
    root = tmp_path_factory.mktemp("dist-eagle3")
    make_tiny_target(root / "target", norm_scale=12.0)
    write_chat_jsonl(root / "d.jsonl", 24)
    ref = eagle3_recipe(root, "reference", grad_accum=2)
    r = load_recipe(ref)
    export_hidden(r, load_target(r.target, make_runtime(r.runtime)))
    in_process(ref)
    return root


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_match_one(world, strategy):
    path = eagle3_recipe(world, strategy)
    res = torchrun(2, ["-m", "pdraft", "train", str(path), "--set", f"train.distributed={strategy}"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert_same_curve(world / "reference", world / strategy)
    assert_same_weights(world / "reference" / "final", world / strategy / "final")


def test_a_rank_sigkilled_under_fsdp_resumes_on_one_process_where_uninterrupted_ends(world):
    path = eagle3_recipe(world, "killed", distributed="fsdp")
    script = world / "kill_rank1.py"
    script.write_text(KILL_RANK1.format(recipe=str(path), kill_at=CHECKPOINT_AT + 1))
    res = torchrun(2, [str(script)])
    assert "exitcode: -9) local_rank: 1" in res.stderr, res.stderr[-4000:]  # died of the SIGKILL, not a bug
    report = in_process(path, ["train.distributed=none"])
    assert report.resumed_from == CHECKPOINT_AT and report.steps == STEPS
    assert_same_curve(world / "reference", world / "killed")
    assert_same_weights(world / "reference" / "final", world / "killed" / "final")
