"""Reliability, hostile input, second round (issue 33): names pdraft writes that are symbolic or hard links to a
user's file (locks, `latest`, the metrics log, `final/`, cache and bench files, calibration sidecars, metrics
streams, --out folders); outputs over inputs (`train --fresh` with drafter.init_from inside the run folder, a
cache or bench report written into a drafter folder, a metrics stream over the prompt file, a user's file inside
an owned `final/`); unbounded counts (bench.repeats 10**9 and the other counts of the recipe); a metrics stream
another process keeps appending to (`monitor --once` returns); numbers and files without bounds (a prompt's
seed of 2**64 or 10**30, runtime.device cuda:<20 digits>, /dev/zero as a prompt set, one 60 MB line of nested
brackets). Each fails with one line and exit code 2 and changes nothing (contract in reliability_support.check);
two tests besides show the negative proof the issue asks for: the user's file behind a symlinked lock keeps its
bytes, and a case's refusal is not a refusal of everything (the same input without the hostile part runs)."""

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

import reliability_support
from reliability_support import Case, check, copy_tree, param, run_cli, write

w = reliability_support.w  # the shared world, a module fixture

USER_BYTES = b"the user's own weights, never to be overwritten\n"


def user_file(t: Path) -> Path:
    return write(t / "elsewhere" / "model.safetensors", USER_BYTES)


def linked(path: Path, target: Path, hard: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(path):
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    (os.link if hard else os.symlink)(target, path)
    return path


def run_copy(w, t, name=None, target=None, hard=False):
    """A copy of the world's training run in the case folder, with `name` in it made a link to `target`."""
    run = copy_tree(w.run_dir, t / "run")
    if name is not None:
        linked(run / name, target(t) if callable(target) else target, hard)
    return run


def train_in(run_maker, *extra):
    return lambda w, t: ["train", str(w.recipe), "--set", f"train.output_dir={run_maker(w, t)}",
                         "--set", "train.steps=4", *extra]


def cache_copy(w, t, name=None, target=None, hard=False):
    cache = copy_tree(w.cache, t / "cache")
    if name is not None:
        linked(cache / name, target(t), hard)
    return cache


def export_in(cache_maker, *extra):
    return lambda w, t: ["export-hidden", str(w.recipe), "--set", f"data.cache_dir={cache_maker(w, t)}", *extra]


def bench_args(w, t, *extra, out=None):
    return ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(out or t / "bench"), *extra]


def decode_args(w, t, *extra):
    return ["decode", "--recipe", str(w.recipe), "--drafter", str(w.dspark), *extra]


def drafter_copy(w, t, name="drafter"):
    return copy_tree(w.dspark, t / name)


LINK = r"is a symbolic link \(to .*\); pdraft never writes through a link"
CASES = [
    # ---- 1. no write through a link --------------------------------------------------------------------------
    Case("train", "lock-symlink-to-user-file", "the run folder's .pdraft.lock a symbolic link to a user's file",
         train_in(lambda w, t: run_copy(w, t, ".pdraft.lock", user_file)), r"train: its lock .*\.pdraft\.lock " + LINK),
    Case("train", "lock-hard-link-to-user-file", "the run folder's .pdraft.lock a hard link to a user's file",
         train_in(lambda w, t: run_copy(w, t, ".pdraft.lock", user_file, hard=True)),
         r"train: its lock .*\.pdraft\.lock is a hard link \(2 names\)"),
    Case("train", "latest-symlink", "the run folder's `latest` a symbolic link to a user's file",
         train_in(lambda w, t: run_copy(w, t, "latest", user_file)), r"its latest .*/latest " + LINK),
    Case("train", "metrics-log-symlink", "the run folder's metrics.jsonl a symbolic link to a user's file",
         train_in(lambda w, t: run_copy(w, t, "metrics.jsonl", user_file)), r"its metrics log .*metrics\.jsonl " + LINK),
    Case("train", "metrics-log-hard-link", "the run folder's metrics.jsonl a hard link to a user's file",
         train_in(lambda w, t: run_copy(w, t, "metrics.jsonl", user_file, hard=True)), r"metrics\.jsonl is a hard link"),
    Case("train", "final-symlink-to-user-folder", "the run folder's final/ a symbolic link to a user's folder",
         train_in(lambda w, t: run_copy(w, t, "final", lambda t: user_file(t).parent)), r"its final/ .*/final " + LINK),
    Case("train", "checkpoint-temporary-symlink", "a run folder's .tmp_step_3 a symbolic link to a user's folder",
         train_in(lambda w, t: run_copy(w, t, ".tmp_step_3", lambda t: user_file(t).parent)), r"\.tmp_step_3 " + LINK),
    Case("train", "run-folder-symlink", "train.output_dir itself a symbolic link to a user's folder",
         lambda w, t: ["train", str(w.recipe), "--set",
                       f"train.output_dir={linked(t / 'run', user_file(t).parent)}"], r"train\.output_dir .*/run " + LINK),
    Case("export-hidden", "lock-symlink-to-user-file", "the cache's .pdraft.lock a symbolic link to a user's file",
         export_in(lambda w, t: cache_copy(w, t, ".pdraft.lock", user_file)), r"its lock .*\.pdraft\.lock " + LINK),
    Case("export-hidden", "manifest-symlink", "the cache's manifest.json a symbolic link to a user's file",
         export_in(lambda w, t: cache_copy(w, t, "manifest.json", user_file)), r"its manifest\.json .* " + LINK),
    Case("export-hidden", "recipe-symlink", "the cache's recipe.resolved.yaml a symbolic link to a user's file",
         export_in(lambda w, t: cache_copy(w, t, "recipe.resolved.yaml", user_file)), r"its recipe\.resolved\.yaml .* " + LINK),
    Case("export-hidden", "shard-symlink", "a cache shard a symbolic link to a user's file",
         export_in(lambda w, t: cache_copy(w, t, "shard-00000.safetensors", user_file)), r"shard-00000\.safetensors .* " + LINK),
    Case("bench", "report-symlink", "--out holding bench.json as a symbolic link to a user's file",
         lambda w, t: bench_args(w, t, out=linked(t / "bench" / "bench.json", user_file(t)).parent),
         r"its bench\.json .* " + LINK),
    Case("bench", "plot-symlink", "--out holding tau_speedup.png as a symbolic link to a user's file",
         lambda w, t: bench_args(w, t, out=linked(t / "bench" / "tau_speedup.png", user_file(t)).parent),
         r"its tau_speedup\.png .* " + LINK),
    Case("bench", "out-symlink", "--out a symbolic link to a user's folder",
         lambda w, t: bench_args(w, t, out=linked(t / "bench", user_file(t).parent)), r"bench: --out .* " + LINK),
    Case("bench", "metrics-symlink", "--metrics a symbolic link to a user's file",
         lambda w, t: bench_args(w, t, "--metrics", str(linked(t / "m.jsonl", user_file(t)))), r"--metrics .* " + LINK),
    Case("calibrate-threshold", "sidecar-symlink", "the drafter's confidence_sts.json a symbolic link to a user's file",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter",
                       str(linked(drafter_copy(w, t) / "confidence_sts.json", user_file(t)).parent)],
         r"its confidence_sts\.json .* " + LINK),
    Case("calibrate-threshold", "figures-folder-symlink", "--out whose calibration/ is a symbolic link to a user's folder",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dspark), "--out",
                       str(linked(t / "cal" / "calibration", user_file(t).parent).parent)],
         r"its figures folder .*/calibration " + LINK),
    Case("decode", "metrics-symlink", "--metrics a symbolic link to a user's file",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--metrics", str(linked(t / "m.jsonl", user_file(t)))),
         r"decode: --metrics .* " + LINK),
    Case("decode", "metrics-hard-link", "--metrics a hard link to a user's file",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--metrics", str(linked(t / "m.jsonl", user_file(t), hard=True))),
         r"--metrics .* is a hard link \(2 names\)"),
    Case("export", "out-symlink", "--out a symbolic link to an empty folder",
         lambda w, t: ["export", str(w.dspark), "--format", "vllm", "--out",
                       str(linked(t / "out", (t / "empty").mkdir() or t / "empty"))], r"--out .*/out " + LINK),
    Case("pull", "out-symlink", "--out a symbolic link to an empty folder",
         lambda w, t: ["pull", str(w.dspark), "--out", str(linked(t / "out", (t / "empty").mkdir() or t / "empty"))],
         r"--out .*/out " + LINK),

    # ---- 2. outputs never overlap inputs ---------------------------------------------------------------------
    Case("train", "fresh-init-from-final", "--fresh with drafter.init_from the run folder's own final/",
         lambda w, t: ["train", str(w.recipe), "--fresh", "--set", f"train.output_dir={run_copy(w, t)}",
                       "--set", f"drafter.init_from={t / 'run' / 'final'}"],
         r"train: its final/ .*/run/final is the same path as drafter\.init_from .*/run/final, which it reads"),
    Case("train", "init-from-a-checkpoint", "drafter.init_from a checkpoint of the run folder (pruning deletes it)",
         lambda w, t: ["train", str(w.recipe), "--fresh", "--set", f"train.output_dir={run_copy(w, t)}",
                       "--set", f"drafter.init_from={t / 'run' / 'step_2'}"],
         r"its step_2/ .* is the same path as drafter\.init_from"),
    Case("train", "run-folder-inside-init-from", "train.output_dir inside the drafter.init_from folder",
         lambda w, t: ["train", str(w.recipe), "--set", f"drafter.init_from={drafter_copy(w, t)}",
                       "--set", f"train.output_dir={t / 'drafter' / 'run'}"],
         r"its lock .* lies inside drafter\.init_from"),
    Case("train", "run-folder-is-a-drafter", "train.output_dir naming a drafter folder",
         lambda w, t: ["train", str(w.recipe), "--set", f"train.output_dir={drafter_copy(w, t)}"],
         r"train\.output_dir .* already holds config\.json, the file of a model, not of a run folder"),
    Case("train", "fresh-user-file-in-final", "--fresh with a user's notes.txt inside the owned final/",
         train_in(lambda w, t: (write(run_copy(w, t) / "final" / "notes.txt", "mine"), t / "run")[1], "--fresh"),
         r"--fresh refused: .* holds entries pdraft did not write there \(final/notes\.txt\); nothing was deleted"),
    Case("train", "resume-user-file-in-final", "resuming replaces final/ while it holds a user's notes.txt",
         train_in(lambda w, t: (write(run_copy(w, t) / "final" / "notes.txt", "mine"), t / "run")[1]),
         r"final holds files pdraft did not write there \(notes\.txt\); refusing to replace it"),
    Case("export-hidden", "cache-dir-is-a-drafter", "data.cache_dir naming a drafter folder",
         export_in(lambda w, t: drafter_copy(w, t)),
         r"data\.cache_dir .* already holds config\.json, the file of a model, not of a hidden-state cache"),
    Case("export-hidden", "cache-dir-is-the-target", "data.cache_dir naming the target model's folder",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", f"data.cache_dir={w.target}"],
         r"export-hidden: its lock .*/target/\.pdraft\.lock lies inside target\.id .*/target, which it reads"),
    Case("export-hidden", "regenerate-over-the-data", "data.source the regenerated.jsonl the export writes",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", f"data.cache_dir={t / 'cache'}",
                       "--set", f"data.source={write(t / 'cache' / 'regenerated.jsonl', w.data.read_text())}",
                       "--set", "data.regenerate=true"],
         r"its regenerated\.jsonl .* is the same path as data\.source"),
    Case("bench", "out-is-the-drafter", "--out naming the drafter folder it benches",
         lambda w, t: bench_args(w, t, out=w.dspark), r"bench: its bench\.json .* lies inside drafter .*dspark, which it reads"),
    Case("bench", "out-inside-the-drafter", "--out a sub-folder of the drafter folder it benches",
         lambda w, t: ["bench", str(w.recipe), "--drafter", str(drafter_copy(w, t)), "--out", str(t / "drafter" / "b")],
         r"lies inside drafter .*/drafter, which it reads"),
    Case("bench", "out-is-a-cache", "--out naming a hidden-state cache",
         lambda w, t: bench_args(w, t, out=copy_tree(w.cache, t / "cache")),
         r"--out .* already holds manifest\.json, the file of a hidden-state cache, not of a bench report"),
    Case("bench", "metrics-over-the-recipe", "--metrics naming the recipe file",
         lambda w, t: bench_args(w, t, "--metrics", str(w.recipe)), r"--metrics .* is the same path as the recipe"),
    Case("bench", "metrics-over-a-prompt-set", "--metrics naming the prompt set",
         lambda w, t: bench_args(w, t, "--prompt-set", str(w.data), "--metrics", str(w.data)),
         r"--metrics .* is the same path as the prompt set"),
    Case("decode", "metrics-over-the-prompt-file", "--metrics naming the prompt file",
         lambda w, t: decode_args(w, t, "--prompt-file", str(w.data), "--metrics", str(w.data)),
         r"decode: --metrics .* is the same path as --prompt-file"),
    Case("decode", "metrics-inside-the-drafter", "--metrics inside the drafter folder",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--metrics", str(w.dspark / "m.jsonl")),
         r"--metrics .* lies inside --drafter"),
    Case("calibrate-threshold", "prompts-are-a-sidecar", "calibrate.prompts naming the confidence_sts.json it writes",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter",
                       str(write(drafter_copy(w, t) / "confidence_sts.json", w.data.read_text()).parent),
                       "--set", f"calibrate.prompts={t / 'drafter' / 'confidence_sts.json'}"],
         r"its confidence_sts\.json .* is the same path as calibrate\.prompts"),
    Case("calibrate-threshold", "recipe-is-its-resolved-copy", "the recipe is the calibration/recipe.resolved.yaml it writes",
         lambda w, t: ["calibrate-threshold",
                       str(write(t / "cal" / "calibration" / "recipe.resolved.yaml", w.recipe.read_text())),
                       "--drafter", str(w.dspark), "--out", str(t / "cal")],
         r"its calibration/recipe\.resolved\.yaml .* is the same path as the recipe"),
    Case("export", "out-inside-the-drafter", "--out inside the drafter folder",
         lambda w, t: ["export", str(drafter_copy(w, t)), "--format", "vllm", "--out", str(t / "drafter" / "vllm")],
         r"export: --out .* lies inside the drafter"),
    Case("pull", "out-inside-the-source", "--out inside the local folder pulled",
         lambda w, t: ["pull", str(drafter_copy(w, t)), "--out", str(t / "drafter" / "copy")],
         r"pull: --out .* lies inside the source folder"),

    # ---- 3. bounded counts ------------------------------------------------------------------------------------
    Case("bench", "repeats-1e9", "--repeats 1000000000", lambda w, t: bench_args(w, t, "--repeats", "1000000000"),
         r"bench\.repeats: expected a value less than or equal to 1000, found 1000000000"),
    Case("bench", "num-prompts-1e9", "--num-prompts 1000000000", lambda w, t: bench_args(w, t, "--num-prompts", "1000000000"),
         r"bench\.num_prompts: expected a value less than or equal to 1000000"),
    Case("bench", "max-new-tokens-1e9", "--max-new-tokens 1000000000",
         lambda w, t: bench_args(w, t, "--max-new-tokens", "1000000000"), r"bench\.max_new_tokens: expected a value less"),
    Case("decode", "max-new-tokens-1e9", "--max-new-tokens 1000000000",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--max-new-tokens", "1000000000"),
         r"--max-new-tokens 1000000000: expected a value less than or equal to 131072"),
    Case("decode", "top-k-1e12", "--top-k 10**12",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--top-k", str(10**12)), r"--top-k 1000000000000: expected a value less"),
    Case("train", "steps-1e12", "train.steps 10**12",
         lambda w, t: ["train", str(w.recipe), "--set", f"train.steps={10**12}", "--set", f"train.output_dir={t / 'run'}"],
         r"train\.steps: expected a value less than or equal to 100000000"),
    Case("calibrate-threshold", "sps-batch-1e9", "calibrate.sps_max_batch_tokens 10**9 (profiled one by one)",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "cal"),
                       "--set", "calibrate.sps_max_batch_tokens=1000000000"], r"calibrate\.sps_max_batch_tokens: expected a value less"),
    Case("calibrate-threshold", "sps-repeats-1e9", "calibrate.sps_repeats 10**9",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "cal"),
                       "--set", "calibrate.sps_repeats=1000000000"], r"calibrate\.sps_repeats: expected a value less"),
    Case("export-hidden", "regenerate-tokens-1e9", "data.regenerate_max_new_tokens 10**9",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", "data.regenerate_max_new_tokens=1000000000",
                       "--set", f"data.cache_dir={t / 'cache'}"], r"data\.regenerate_max_new_tokens: expected a value less"),

    # ---- 4. numbers and files without bounds --------------------------------------------------------------------
    Case("decode", "prompt-seed-2-64", 'a prompt file whose "seed" is 2**64',
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.jsonl", '{"turns": ["x"], "seed": %d}\n' % 2**64))),
         r'p\.jsonl:1: "seed" must be an integer in 0\.\.9223372036854775807'),
    Case("decode", "prompt-seed-1e30", 'a prompt file whose "seed" is 10**30',
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.jsonl", '{"turns": ["x"], "seed": %d}\n' % 10**30))),
         r'"seed" must be an integer in 0\.\.\d+ \(2\*\*63 - 1\), found 10{30}'),
    Case("bench", "prompt-seed-2-64", 'a prompt set whose "seed" is 2**64',
         lambda w, t: bench_args(w, t, "--prompt-set", str(write(t / "p.jsonl", '{"turns": ["x"], "seed": %d}\n' % 2**64))),
         r'"seed" must be an integer in 0\.\.'),
    Case("decode", "device-20-digits", "runtime.device cuda:<20 digits>",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--set", "runtime.device=cuda:99999999999999999999"),
         r"runtime\.device: expected .*pattern.*found 'cuda:9+'"),
    Case("train", "device-20-digits-in-the-recipe", "runtime.device cuda:<20 digits> in the recipe file",
         lambda w, t: ["train", str(w.recipe_with(t, runtime={"device": "cuda:99999999999999999999"})),
                       "--set", f"train.output_dir={t / 'run'}"], r"r\.yaml:\d+: runtime\.device: expected .*pattern"),
    Case("bench", "prompt-set-dev-zero", "--prompt-set /dev/zero",
         lambda w, t: bench_args(w, t, "--prompt-set", "/dev/zero"), r"prompt file /dev/zero is not a regular file"),
    Case("decode", "prompt-file-dev-zero", "--prompt-file /dev/zero",
         lambda w, t: decode_args(w, t, "--prompt-file", "/dev/zero"), r"prompt file /dev/zero is not a regular file"),
    Case("export-hidden", "data-dev-zero", "data.source /dev/zero",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", "data.source=/dev/zero",
                       "--set", f"data.cache_dir={t / 'cache'}"], r"prompt file /dev/zero is not a regular file"),
    Case("bench", "prompt-set-60MB-nested", "a prompt set of one 60 MB line of nested brackets",
         lambda w, t: bench_args(w, t, "--prompt-set", str(write(t / "p.jsonl", "[" * (60 << 20) + "\n"))),
         r"p\.jsonl:1: invalid JSON \(nested too deeply\)"),
    Case("export-hidden", "data-60MB-nested", "a prompt file of one 60 MB line of nested brackets",
         lambda w, t: ["export-hidden", str(w.recipe), "--set", f"data.source={write(t / 'p.jsonl', '[' * (60 << 20))}",
                       "--set", f"data.cache_dir={t / 'cache'}"], r"p\.jsonl:1: invalid JSON \(nested too deeply\)"),
    Case("decode", "prompt-file-70MB-line", "a JSONL prompt file of one 70 MB line",
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.jsonl", "x" * (70 << 20)))),
         r"p\.jsonl:1: a line longer than 64 MiB"),
]


# ---- monitor --once while another process keeps appending -------------------------------------------------------
_APPENDERS: list[tuple[threading.Event, Path]] = []
INITIAL_LINES = 14  # JSON lists of 300,000 zeros (600 KB): more than one 8 MB read of the follower, parsed in ~20 ms each
APPEND_BYTES_PER_S = 2 << 20  # malformed 2-byte lines: more than monitor parses per second (about 0.2-1 MB/s)


def growing_stream(w, t):
    """A stream of malformed lines, outside the case folder (it must change), that a writer thread starts appending
    to the moment monitor first reads it (the file's access time changes; relatime, the default, records it) at
    APPEND_BYTES_PER_S of short lines (16 MB of them at once), faster than a reader parses them. The file starts
    larger than one read of the follower (8 MB), so a monitor that followed the growth would read slice after
    slice of short lines, each taking long enough for the writer to add more, and never reach the end;
    `monitor --once` must return with what the file held when it started: exactly INITIAL_LINES malformed lines.
    The case runs monitor in a subprocess, so the writer runs beside it, and one that never returns is killed
    after reliability_support.HANG_S and counted as a hang. The fixture below stops the writer after the case;
    it stops by itself after 60 s (136 MB)."""
    folder = Path(tempfile.mkdtemp(prefix="pdraft-growing-"))
    path = write(folder / "m.jsonl", ("[" + "0," * 300_000 + "0]\n") * INITIAL_LINES)
    stop = threading.Event()
    _APPENDERS.append((stop, folder))
    unread = os.stat(path).st_atime_ns

    def append():
        while os.stat(path).st_atime_ns == unread and not stop.wait(0.002):
            pass  # monitor has not read the file yet (where atime is not kept, nothing is appended: a weaker case)
        block = "y\n" * (APPEND_BYTES_PER_S // 100 // 2)
        with open(path, "a") as f:
            f.write("y\n" * (8 << 20))  # at once: a follower's next read is a whole 8 MB slice of short lines
            f.flush()
            for _ in range(6000):  # 60 s at most
                if stop.wait(0.01):
                    return
                f.write(block)
                f.flush()

    threading.Thread(target=append, daemon=True).start()
    return ["monitor", str(path), "--once"]


CASES += [
    Case("monitor", "once-while-appended", "--once on a stream another process keeps appending to",
         growing_stream, rf"m\.jsonl: no readable round in the metrics stream, {INITIAL_LINES} malformed line\(s\) "
         r"\(last: not a JSON object\)", subprocess=True),
]


@pytest.fixture(autouse=True)
def _stop_appenders():
    yield
    while _APPENDERS:
        stop, folder = _APPENDERS.pop()
        stop.set()
        shutil.rmtree(folder, ignore_errors=True)


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)


# ---- negative proof -------------------------------------------------------------------------------------------
def test_symlinked_lock_leaves_the_users_file_unchanged(w, tmp_path, monkeypatch):
    """The lock case, with its proof spelled out: the file the link points at keeps its bytes, the link stays,
    and the same run folder without the link trains (the refusal is the link's, not the folder's)."""
    monkeypatch.chdir(tmp_path)
    target = user_file(tmp_path)
    run = run_copy(w, tmp_path, ".pdraft.lock", target)
    res = run_cli(["train", str(w.recipe), "--set", f"train.output_dir={run}", "--set", "train.steps=3"])
    assert res.code == 2 and "symbolic link" in res.error_lines[0], res.err[-2000:]
    assert target.read_bytes() == USER_BYTES and os.readlink(run / ".pdraft.lock") == str(target)
    (run / ".pdraft.lock").unlink()
    res = run_cli(["train", str(w.recipe), "--set", f"train.output_dir={run}", "--set", "train.steps=3"])
    assert res.code == 0, res.err[-2000:]
    assert target.read_bytes() == USER_BYTES and not os.path.lexists(run / ".pdraft.lock")


def test_monitor_once_reads_only_what_the_stream_held(w, tmp_path):
    """monitor --once counts the malformed lines the file held when it started, not those appended since."""
    path = write(tmp_path / "m.jsonl", "x\n" * INITIAL_LINES)
    stop = threading.Event()

    def append():
        with open(path, "a") as f:
            while not stop.wait(0.01):
                f.write("y\n" * 10_000)
                f.flush()

    thread = threading.Thread(target=append, daemon=True)
    try:
        from pdraft.bench.stream import StreamFollower

        start = path.stat().st_size
        follower = StreamFollower(path, until=start)
        thread.start()
        while path.stat().st_size < start + 200_000:  # the writer is well under way before the first read
            stop.wait(0.01)
        while True:
            follower.poll()
            if not follower.more:
                break
        assert follower.bad_lines == INITIAL_LINES and follower.offset == start
    finally:
        stop.set()
        thread.join()
