"""Training and export on several real processes (torchrun with Gloo on CPUs, ports on 127.0.0.1 only):
DDP and FSDP2 on 2 processes follow the 1-process run with the same global batch, one rank SIGKILLed
mid-run resumes on another number of processes and ends where the uninterrupted run ends, a 1-process
checkpoint resumes on 2, and a 2-process export (with regeneration), interrupted and finished by 1 process,
gives the single-process cache. Each launch trains a tiny drafter for a few steps on a tiny target."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pdraft.cache.export_hidden import export_hidden
from pdraft.recipe import load_recipe
from pdraft.runtime import make_runtime
from pdraft.targets.loader import load_target
from pdraft import run_folder as ck
from test_data_tinytarget import make_tiny_target, write_chat_jsonl

ROOT = Path(__file__).resolve().parents[1]
STEPS, CHECKPOINT_AT = 6, 3
# Float tolerance between world sizes: the same sums in another order (module docstring of
# pdraft.train.distributed); a wrong slot, seed or averaging gives differences of order 1e-2 and more.
ATOL = 2e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout)


def recipe_file(root: Path, name: str, **train) -> Path:
    body = {
        "output_dir": str(root / "out"),
        "target": {"id": str(root / "target"), "num_layer_ids": 2},
        "data": {"source": str(root / "d.jsonl"), "shard_tokens": 256, "cache_dir": str(root / "cache")},
        "drafter": {"kind": "dspark", "num_layers": 2, "block_size": 4, "markov_rank": 8, "mask_token_id": 0},
        "train": {"output_dir": str(root / name), "steps": STEPS, "batch_size": 2, "grad_accum": 1, "lr": 3e-3,
                  "warmup_steps": 1, "num_anchors": 4, "checkpoint_every": CHECKPOINT_AT, "eval_every": STEPS,
                  "log_every": 1, "keep_checkpoints": 4, **train},
        "runtime": {"threads": 1},
    }
    path = root / f"{name}.yaml"
    path.write_text(json.dumps(body))
    return path


def in_process(path: Path, overrides=(), **kw):
    """Train in this (single) process, as `pdraft train` without torchrun."""
    from pdraft.train.loop import train, training_source

    r = load_recipe(path, list(overrides))
    target = load_target(r.target, make_runtime(r.runtime))
    return train(r, target, training_source(r, target), run_dir=Path(r.train.output_dir), **kw)


def losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows if "loss" in row]


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=ATOL, msg=key)


def assert_same_curve(a: Path, b: Path) -> None:
    la, lb = losses(a), losses(b)
    assert [s for s, _ in la] == [s for s, _ in lb] == list(range(1, STEPS + 1))
    for (step, x), (_, y) in zip(la, lb):
        assert abs(x - y) <= 1e-4 * max(1.0, abs(x)), (step, x, y)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny sharpened target, its hidden-state cache, and the reference: one process, grad_accum 2,
    batch_size 2 (a global batch of 4 sequences, what 2 processes x grad_accum 1 read)."""
    root = tmp_path_factory.mktemp("dist")
    make_tiny_target(root / "target", norm_scale=12.0)
    write_chat_jsonl(root / "d.jsonl", 24)
    ref = recipe_file(root, "reference", grad_accum=2)
    r = load_recipe(ref)
    export_hidden(r, load_target(r.target, make_runtime(r.runtime)))
    in_process(ref)
    return root


def test_ddp_two_processes_match_one_and_only_rank0_prints(world):
    path = recipe_file(world, "ddp2")
    res = torchrun(2, ["-m", "pdraft", "train", str(path), "--set", "train.distributed=ddp"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("drafter written to") == 1, res.stdout
    assert_same_curve(world / "reference", world / "ddp2")
    assert_same_weights(world / "reference" / "final", world / "ddp2" / "final")
    state = json.loads((world / "ddp2" / f"step_{STEPS}" / ck.STATE_JSON).read_text())
    assert state["world_size"] == 2 and state["global_batch"] == 4


KILL_RANK1 = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import torch
    torch.set_num_threads(1)
    from test_distributed import in_process
    def progress(step, total, stats):
        if step == {kill_at} and os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
    in_process(Path({recipe!r}), progress=progress)
""")


def test_fsdp_rank_sigkilled_resumes_on_one_process_where_uninterrupted_ends(world):
    path = recipe_file(world, "fsdp2", distributed="fsdp")
    script = world / "kill_rank1.py"
    script.write_text(KILL_RANK1.format(recipe=str(path), kill_at=CHECKPOINT_AT + 1))
    res = torchrun(2, [str(script)])
    assert res.returncode != 0, "the run was meant to lose rank 1"
    assert "exitcode: -9) local_rank: 1" in res.stderr, res.stderr[-4000:]  # died of the SIGKILL, not a bug
    run = world / "fsdp2"
    assert ck.latest_checkpoint(run).name == f"step_{CHECKPOINT_AT}"
    # The FSDP checkpoint holds full tensors: the step-3 drafter of 2 sharded processes is the reference's.
    assert_same_weights(world / "reference" / f"step_{CHECKPOINT_AT}", run / f"step_{CHECKPOINT_AT}")
    # Resume on 1 process with the recipe's grad_accum 1: the checkpoint's global batch of 4 makes it 2.
    report = in_process(path, ["train.distributed=none"])
    assert report.resumed_from == CHECKPOINT_AT and report.steps == STEPS
    assert_same_curve(world / "reference", run)
    assert_same_weights(world / "reference" / "final", run / "final")


def test_one_process_checkpoint_resumes_on_two_with_console_script(world):
    path = recipe_file(world, "grow", grad_accum=2)
    in_process(path, stop_after=CHECKPOINT_AT)
    pdraft = Path(sys.executable).with_name("pdraft")
    res = torchrun(2, [str(pdraft), "train", str(path)])
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count(f"resumed from step {CHECKPOINT_AT}") == 1, res.stdout
    assert_same_curve(world / "reference", world / "grow")
    assert_same_weights(world / "reference" / "final", world / "grow" / "final")


KILL_EXPORT = textwrap.dedent("""
    import os, signal, sys
    import torch
    torch.set_num_threads(1)
    import pdraft.cache.writer as w
    write, count = w._write_shard, [0]
    def killing(*a, **k):
        count[0] += 1
        if os.environ["RANK"] == "1" and count[0] == 2:  # rank 1 dies at its second shard
            os.kill(os.getpid(), signal.SIGKILL)
        return write(*a, **k)
    w._write_shard = killing
    from pdraft.cli.main import run
    sys.argv = ["pdraft", *sys.argv[1:]]
    run()
""")


def test_two_process_export_with_regeneration_interrupted_then_finished_by_one_equals_single(world):
    from pdraft.cache import format as fmt
    from pdraft.cache.reader import HiddenCache
    from pdraft.data.regenerate import read_done

    # About 45 tokens a sequence, 256 a shard: 4 shards or more, so rank 1 dies at its second one.
    overrides = ["data.regenerate=true", "data.regenerate_max_new_tokens=24", "data.regenerate_batch_size=4"]
    path = recipe_file(world, "export")
    caches = {name: world / f"cache-{name}" for name in ("single", "split")}
    r = load_recipe(path, [*overrides, f"data.cache_dir={caches['single']}"])
    target = load_target(r.target, make_runtime(r.runtime))
    export_hidden(r, target)

    script = world / "kill_export.py"
    script.write_text(KILL_EXPORT)
    sets = [x for o in [*overrides, f"data.cache_dir={caches['split']}"] for x in ("--set", o)]
    res = torchrun(2, [str(script), "export-hidden", str(path), *sets])
    assert "exitcode: -9) local_rank: 1" in res.stderr, res.stderr[-4000:]
    split = caches["split"]
    assert not fmt.read_manifest(split)["complete"]
    assert list(split.glob("manifest.part-*.json")), "each process lists its own shards"
    assert not list(split.glob("regenerated.jsonl.part-*")), "the regeneration parts were merged"

    r2 = load_recipe(path, [*overrides, f"data.cache_dir={split}"])
    report = export_hidden(r2, target)  # one process finishes what two started
    assert report.result.shards_done_before >= 1 and fmt.read_manifest(split)["complete"]
    assert not list(split.glob("manifest.part-*.json"))
    a, b = fmt.read_manifest(caches["single"]), fmt.read_manifest(split)
    assert [e["sha256"] for e in a["shards"]] == [e["sha256"] for e in b["shards"]]  # byte-identical shards
    ca, cb = HiddenCache(caches["single"], target=target), HiddenCache(split, target=target)
    assert len(ca) == len(cb) == a["data"]["sequences"]
    for i in range(len(ca)):
        for key, value in ca[i].items():
            assert torch.equal(value, cb[i][key]), (i, key)
    ra, rb = read_done(caches["single"] / "regenerated.jsonl"), read_done(split / "regenerated.jsonl")
    assert ra == rb and len(ra) == 24
    assert len(a["shards"]) >= 4


def test_online_training_on_two_processes_matches_one(world):
    """train.online under torchrun: each process runs the target on its own slice of the global batch, and
    2 processes follow the 1-process online run with the same global batch (issue 18, item 4)."""
    ref = recipe_file(world, "online1", grad_accum=2, online=True)
    in_process(ref)
    path = recipe_file(world, "online2", online=True)
    res = torchrun(2, ["-m", "pdraft", "train", str(path), "--set", "train.distributed=ddp"])
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("drafter written to") == 1, res.stdout
    assert_same_curve(world / "online1", world / "online2")
    assert_same_weights(world / "online1" / "final", world / "online2" / "final")
