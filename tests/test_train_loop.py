"""`pdraft train` on a tiny target: training lowers the loss and raises the implied acceptance, both drafter
kinds and online mode run, and a SIGKILLed run resumes to the same parameters as an uninterrupted one."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pdraft.cache.export_hidden import export_hidden
from pdraft.errors import PdraftError
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from pdraft import run_folder as ck
from test_data_tinytarget import make_tiny_target, write_chat_jsonl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    # A random target is nearly uniform, which any drafter matches already; sharpen its final norm so its
    # next-token distributions are peaked and a drafter has something to learn. (Its predictions have
    # nothing to do with the data, so the learning test trains on TV alone: CE on the data's tokens would
    # pull the drafter away from this target.)
    target = make_tiny_target(root / "t", norm_scale=12.0)
    data = write_chat_jsonl(root / "d.jsonl", 40)
    return root, target, data


def recipe_file(root: Path, target: Path, data: Path, name: str, **train) -> Path:
    body = {
        "output_dir": str(root / "run"),
        "target": {"id": str(target), "num_layer_ids": 2},
        "data": {"source": str(data), "shard_tokens": 512, "cache_dir": str(root / "cache")},
        "drafter": {"kind": "dspark", "num_layers": 1, "block_size": 4, "markov_rank": 8, "mask_token_id": 0},
        "train": {"output_dir": str(root / name), "steps": 12, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2,
                  "num_anchors": 4, "checkpoint_every": 4, "eval_every": 6, "log_every": 2, **train},
        "runtime": {"threads": 1},
    }
    path = root / f"{name}.yaml"
    path.write_text(json.dumps(body))
    return path


def setup(path, overrides=()):
    from pdraft.train.loop import training_source

    r = load_recipe(path, list(overrides))
    target = load_target(r.target, make_runtime(r.runtime))
    if not (Path(r.data.cache_dir) / "manifest.json").exists():
        export_hidden(r, target)
    return r, target, training_source(r, target)


def weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def test_training_lowers_loss_and_raises_implied_acceptance(env):
    from pdraft.train.loop import train

    root, target, data = env
    r, t, source = setup(recipe_file(root, target, data, "learn", steps=60, eval_every=60, lr=1e-2,
                                        alpha_ce=0.0), ["train.num_anchors=16"])
    report = train(r, t, source, run_dir=Path(r.train.output_dir))
    rows = [json.loads(line) for line in (Path(r.train.output_dir) / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    accept = [row["accept"] for row in rows if "accept" in row]
    assert losses[-1] < losses[0]
    assert accept[-1] > accept[0] + 0.05
    assert report.validation["tau_est"] > 1.0
    assert (report.final_dir / "config.json").exists() and (report.final_dir / "recipe.resolved.yaml").exists()


@pytest.mark.parametrize("kind,extra", [("dflash", []), ("dspark", ["drafter.sequential_head=rnn"]),
                                         ("dspark", ["train.online=true"])])
def test_kinds_and_online_mode_train(env, kind, extra):
    from pdraft.train.loop import train

    root, target, data = env
    name = f"{kind}-{len(extra)}-{'-'.join(e.split('=')[0] for e in extra)}"
    r, t, source = setup(recipe_file(root, target, data, name, steps=3), [f"drafter.kind={kind}", *extra])
    report = train(r, t, source, run_dir=Path(r.train.output_dir))
    assert report.steps == 3 and source.online == ("train.online=true" in extra)
    cfg = json.loads((report.final_dir / "config.json").read_text())
    assert cfg["architectures"]


def test_bf16_runtime_on_a_cpu_trains_under_autocast_over_fp32_weights(env, monkeypatch):
    """runtime.dtype bfloat16 on a CPU (what `auto` resolves to on CPUs with bf16 units): the drafter's forward
    runs under bf16 autocast, the losses stay finite, and the saved weights are fp32 master weights."""
    from pdraft.models.dspark.model import DSparkDrafter
    from pdraft.train import loop

    seen = []
    forward_train, forward = DSparkDrafter.forward_train, loop.TrainForward.forward

    def inner(self, *args, **kwargs):
        seen.append(("autocast", torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return forward_train(self, *args, **kwargs)

    def outer(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        seen.append(("hidden", out[0].hidden.dtype))
        return out

    monkeypatch.setattr(DSparkDrafter, "forward_train", inner)
    monkeypatch.setattr(loop.TrainForward, "forward", outer)
    root, target, data = env
    r, t, source = setup(recipe_file(root, target, data, "bf16", steps=3), ["runtime.dtype=bfloat16"])
    report = loop.train(r, t, source, run_dir=Path(r.train.output_dir))
    assert report.steps == 3
    assert ("autocast", True, torch.bfloat16) in seen and ("hidden", torch.float32) in seen  # bf16 in, fp32 out
    rows = [json.loads(line) for line in (Path(r.train.output_dir) / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in rows if "loss" in row)
    assert {v.dtype for v in weights(report.final_dir).values()} == {torch.float32}


def test_cpu_bf16_units_are_read_from_the_cpu_flags():
    from pdraft.runtime import cpu_has_bf16, resolve_dtype

    assert cpu_has_bf16("flags : fpu avx2 avx512f avx512_bf16")
    assert cpu_has_bf16("flags : fpu amx_bf16 amx_tile")
    assert not cpu_has_bf16("flags : fpu avx2 fma avx512f")
    expected = torch.bfloat16 if cpu_has_bf16() else torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) == expected


KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_train_loop import setup
    from pdraft.train.loop import train
    r, t, source = setup({recipe!r})
    def progress(step, total, stats):
        if step == {kill_at}:
            os.kill(os.getpid(), signal.SIGKILL)
    train(r, t, source, run_dir=Path(r.train.output_dir), progress=progress)
""")


def test_sigkill_then_resume_equals_uninterrupted(env):
    from pdraft.train.loop import train

    root, target, data = env
    straight = recipe_file(root, target, data, "straight")
    r, t, source = setup(straight)
    train(r, t, source, run_dir=Path(r.train.output_dir))

    killed = recipe_file(root, target, data, "killed")
    script = KILLER.format(tests=str(ROOT / "tests"), recipe=str(killed), kill_at=7)
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == -9, res.stderr[-2000:]
    run_dir = root / "killed"
    assert ck.latest_checkpoint(run_dir).name == "step_4"
    r2, t2, source2 = setup(killed)
    report = train(r2, t2, source2, run_dir=run_dir)
    assert report.resumed_from == 4 and report.steps == 12
    a, b = weights(root / "straight" / "final"), weights(run_dir / "final")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=key)
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)  # rows of the killed run past its checkpoint were dropped


def test_run_folder_of_another_kind_is_refused(env):
    from pdraft.train.loop import train

    root, target, data = env
    path = recipe_file(root, target, data, "kind-switch", steps=2, checkpoint_every=1)
    r, t, source = setup(path)
    train(r, t, source, run_dir=Path(r.train.output_dir), stop_after=1)
    r2, t2, source2 = setup(path, ["drafter.kind=dflash"])
    with pytest.raises(PdraftError, match="holds a dspark run"):
        train(r2, t2, source2, run_dir=Path(r2.train.output_dir))
