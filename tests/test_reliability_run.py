"""Reliability, using a drafter: `decode`, `bench`, `calibrate-threshold` and `monitor` given drafters that are
missing, damaged (truncated or bit-flipped weights, malformed config) or made for another target, gamma out of
range, bad sampling values, empty, binary and malformed prompt files, a prompt longer than the target's
context, broken SPS tables and metrics streams: each fails with one line and exit code 2 and changes nothing
(contract in reliability_support.check)."""

import json
import re

import reliability_support
from pdraft.models.families import FAMILIES
from reliability_support import Case, bitflip, check, copy_tree, param, truncate, write

w = reliability_support.w  # the shared world, a module fixture


# ---- damaged drafters (copies in the case folder) --------------------------------------------------------------
def drafter_copy(w, t, damage):
    return copy_tree(w.dspark, t / "drafter", damage)


DRAFTER_DAMAGE = [
    ("drafter-missing", "a drafter folder that does not exist", lambda w, t: t / "nope", r"nope('? not found| does not exist)"),
    ("drafter-is-a-file", "a file where the drafter folder is expected",
     lambda w, t: write(t / "d.safetensors", "x"), r"d\.safetensors('? not found| does not exist)"),
    ("drafter-other-target", "a drafter made for another target (hidden 48 vs 32)",
     lambda w, t: w.dspark_other, r"drafter does not fit the target"),
    ("drafter-truncated", "truncated drafter weights",
     lambda w, t: drafter_copy(w, t, lambda f: truncate(f / "model.safetensors")), r"truncated or corrupted safetensors"),
    ("drafter-bit-flipped", "a bit-flipped drafter weight",
     lambda w, t: drafter_copy(w, t, lambda f: bitflip(f / "model.safetensors")), r"is corrupted: its tensor bytes"),
    ("drafter-no-weights", "a drafter folder without model.safetensors",
     lambda w, t: drafter_copy(w, t, lambda f: (f / "model.safetensors").unlink()), r"has no model\.safetensors"),
    ("drafter-config-malformed", "a drafter config.json that is not JSON",
     lambda w, t: drafter_copy(w, t, lambda f: write(f / "config.json", "{oops")), r"config\.json is not valid JSON"),
    ("drafter-config-binary", "a drafter config.json of binary bytes (unreadable)",
     lambda w, t: drafter_copy(w, t, lambda f: write(f / "config.json", b"\xff\xfe\x00\x81")), r"config\.json is not valid JSON"),
    ("drafter-config-not-a-drafter", "a config.json of a plain causal LM",
     lambda w, t: drafter_copy(w, t, lambda f: write(f / "config.json", (w.target / "config.json").read_text())),
     r"not a drafter of any family pdraft knows \(" + re.escape(FAMILIES.titles()) + r"\)"),  # every family named
]


# ---- hostile config.json and safetensors headers (issue 20: validate before allocating) -----------------------
def edit_config(**fields):
    """Set config.json fields ("pdraft.num_experts" reaches into the pdraft object)."""
    def damage(folder):
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in fields.items():
            node, *rest = key.split("__")
            if rest:
                cfg[node][rest[0]] = value
            else:
                cfg[key] = value
        write(folder / "config.json", json.dumps(cfg))
    return damage


def edit_header(change):
    """Rewrite model.safetensors' JSON header with `change(header)` applied, the tensor bytes untouched."""
    def damage(folder):
        path = folder / "model.safetensors"
        blob = path.read_bytes()
        n = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + n])
        change(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(len(text).to_bytes(8, "little") + text + blob[8 + n:])
    return damage


def swap_offsets(header):
    seen = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        key = (entry["dtype"], tuple(entry["shape"]))
        if key in seen and entry["data_offsets"] != header[seen[key]]["data_offsets"]:
            other = header[seen[key]]
            entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
            return
        seen[key] = name
    raise AssertionError("no two tensors of one shape to swap")


def retype(header):
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    header[name]["dtype"] = "I32"  # same byte length: only a checksum of the header can tell


def sparse_pad(path, size=256 << 20):
    with open(path, "r+b") as f:
        f.truncate(size)  # a sparse hole: no disk used, but a reader that trusts the file would read it all


DRAFTER_DAMAGE += [
    ("config-block-size-string", "config.json block_size \"4\" (a string)",
     lambda w, t: drafter_copy(w, t, edit_config(block_size="4")), r"config\.json: block_size is '4', expected a whole number"),
    ("config-pdraft-string", "config.json with a string where the pdraft object belongs",
     lambda w, t: drafter_copy(w, t, edit_config(pdraft="dspark")), r"config\.json: pdraft is 'dspark', expected a JSON object"),
    ("config-vocab-1e9", "config.json vocab_size 10**9",
     lambda w, t: drafter_copy(w, t, edit_config(vocab_size=10**9)), r"vocab_size is 1000000000, expected a value in 1\.\.4\.19\d*e\+06"),
    ("config-intermediate-1.5M", "config.json intermediate_size 1500000",
     lambda w, t: drafter_copy(w, t, edit_config(intermediate_size=1_500_000)), r"intermediate_size is 1500000, expected a value in"),
    ("config-million-experts", "config.json pdraft.num_experts 1000000",
     lambda w, t: drafter_copy(w, t, edit_config(pdraft__num_experts=1_000_000)), r"pdraft\.num_experts is 1000000, expected a value in 0\.\.256"),
    ("config-100k-target-layers", "config.json num_target_layers 100000",
     lambda w, t: drafter_copy(w, t, edit_config(num_target_layers=100_000)), r"num_target_layers is 100000, expected a value in 1\.\.1024"),
    ("config-rank-bool", "config.json markov_rank true",
     lambda w, t: drafter_copy(w, t, edit_config(markov_rank=True)), r"markov_rank is True, expected a whole number"),
    ("config-hidden-negative", "config.json hidden_size -32",
     lambda w, t: drafter_copy(w, t, edit_config(hidden_size=-32)), r"hidden_size is -32, expected a value in 8\.\.65536"),
    ("config-kind-unknown", "config.json pdraft.kind medusa",
     lambda w, t: drafter_copy(w, t, edit_config(pdraft__kind="medusa")), r"pdraft\.kind is 'medusa', expected one of dflash, dspark"),
    ("config-layer-types-numbers", "config.json layer_types [1]",
     lambda w, t: drafter_copy(w, t, edit_config(layer_types=[1])), r"layer_types must be a list of text"),
    ("header-offsets-swapped", "two tensors' byte offsets swapped in the safetensors header",
     lambda w, t: drafter_copy(w, t, edit_header(swap_offsets)), r"its header .* does not match the checksum"),
    ("header-dtype-edited", "a tensor's dtype edited in the header (F32 to I32, same length)",
     lambda w, t: drafter_copy(w, t, edit_header(retype)), r"its header .* does not match the checksum"),
    ("header-length-huge", "a header length of 2**40 bytes",
     lambda w, t: drafter_copy(w, t, lambda f: write(f / "model.safetensors", (1 << 40).to_bytes(8, "little") + b"{}")),
     r"header length 1099511627776 does not fit"),
    ("header-shape-inflated", "a tensor's shape inflated in the header (more bytes than its offsets give)",
     lambda w, t: drafter_copy(w, t, edit_header(lambda h: h["fc.weight"].update(shape=[1 << 20, 1 << 20]))),
     r"tensor 'fc\.weight': F32 x \[1048576, 1048576\] does not take"),
    ("weights-sparse-256MB", "weights padded to 256 MB with a sparse hole (must not be read whole)",
     lambda w, t: drafter_copy(w, t, lambda f: sparse_pad(f / "model.safetensors")), r"the header describes \d+ bytes of tensors, the file holds"),
]


def decode_args(w, t, *extra, drafter=None):
    return ["decode", "--recipe", str(w.recipe), "--drafter", str(drafter or w.dspark), *extra]


def _drafter_cases(command):
    out = []
    for name, what, make, expect in DRAFTER_DAMAGE:
        if command == "decode":
            argv = (lambda make: lambda w, t: decode_args(w, t, "--prompt", "def f", drafter=make(w, t)))(make)
        elif command == "bench":
            argv = (lambda make: lambda w, t: ["bench", str(w.recipe), "--drafter", str(make(w, t)),
                                               "--out", str(t / "bench")])(make)
        else:
            argv = (lambda make: lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(make(w, t)),
                                               "--out", str(t / "cal")])(make)
        if command == "calibrate-threshold" and name == "drafter-is-a-file":
            expect = r"not a drafter checkpoint"
        if command == "calibrate-threshold" and name == "drafter-missing":
            expect = r"nope is not a drafter checkpoint"
        out.append(Case(command, name, what, argv, expect, subprocess=(command == "decode" and name == "drafter-bit-flipped")))
    return out


CASES = [c for cmd in ("decode", "bench", "calibrate-threshold") for c in _drafter_cases(cmd)]

LONG = "def f(x):\n    return x\n" * 200  # far more tokens than the target's 512 positions
CASES += [
    Case("decode", "gamma-zero", "--gamma 0", lambda w, t: decode_args(w, t, "--gamma", "0", "--prompt", "x"), r"gamma"),
    Case("decode", "gamma-above-drafter", "--gamma 9 for a drafter of block size 4",
         lambda w, t: decode_args(w, t, "--gamma", "9", "--prompt", "x"), r"gamma 9"),
    Case("decode", "gamma-negative", "--gamma -3", lambda w, t: decode_args(w, t, "--gamma", "-3", "--prompt", "x"), r"gamma"),
    Case("decode", "temperature-negative", "--temperature -1",
         lambda w, t: decode_args(w, t, "--temperature", "-1", "--prompt", "x"), r"temperature"),
    Case("decode", "top-p-zero", "--top-p 0", lambda w, t: decode_args(w, t, "--top-p", "0", "--prompt", "x"), r"top.p"),
    Case("decode", "top-k-negative", "--top-k -1", lambda w, t: decode_args(w, t, "--top-k", "-1", "--prompt", "x"), r"top.k"),
    Case("decode", "max-new-tokens-zero", "--max-new-tokens 0",
         lambda w, t: decode_args(w, t, "--max-new-tokens", "0", "--prompt", "x"), r"max.new.tokens"),
    Case("decode", "batch-size-zero", "--batch-size 0",
         lambda w, t: decode_args(w, t, "--batch-size", "0", "--prompt", "x"), r"--batch-size must be >= 1"),
    Case("decode", "threshold-above-one", "--threshold 2",
         lambda w, t: decode_args(w, t, "--threshold", "2", "--prompt", "x"), r"threshold"),
    Case("decode", "verify-unknown", "--verify sometimes",
         lambda w, t: decode_args(w, t, "--verify", "sometimes", "--prompt", "x"), r"sometimes"),
    Case("decode", "threshold-without-confidence-head", "--verify threshold with a DFlash drafter (no confidence head)",
         lambda w, t: decode_args(w, t, "--verify", "threshold", "--prompt", "x", drafter=w.dflash),
         r"has no confidence head: verification mode 'threshold' needs one \(a DSpark drafter\)"),
    Case("decode", "denoise-steps-mismatch", "--denoise-steps 3 for a drafter trained with 1",
         lambda w, t: decode_args(w, t, "--denoise-steps", "3", "--prompt", "x"), r"denoise"),
    Case("decode", "no-prompt", "no prompt at all", lambda w, t: decode_args(w, t), r"exactly one of --prompt"),
    Case("decode", "two-prompt-sources", "--prompt and --prompt-file together",
         lambda w, t: decode_args(w, t, "--prompt", "x", "--prompt-file", str(w.data)), r"exactly one of --prompt"),
    Case("decode", "no-drafter", "no --drafter and no --no-draft",
         lambda w, t: ["decode", "--recipe", str(w.recipe), "--prompt", "x"], r"no drafter"),
    Case("decode", "prompt-file-missing", "a prompt file that does not exist",
         lambda w, t: decode_args(w, t, "--prompt-file", str(t / "nope.txt")), r"nope\.txt"),
    Case("decode", "prompt-file-empty", "an empty prompt file",
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.txt", "\n\n"))), r"holds no prompt"),
    Case("decode", "prompt-file-empty-jsonl", "an empty JSONL prompt file",
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.jsonl", ""))), r"p\.jsonl"),
    Case("decode", "prompt-file-binary", "a prompt file of binary bytes / invalid UTF-8 (unreadable)",
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.txt", b"\xff\xfe\x00\x81"))), r"prompt file .*p\.txt is not UTF-8 text"),
    Case("decode", "prompt-file-folder", "a folder where the prompt file is expected (unreadable)",
         lambda w, t: decode_args(w, t, "--prompt-file", str((t / "p.txt").mkdir() or t / "p.txt")), r"cannot read prompt file"),
    Case("decode", "prompt-file-malformed-jsonl", "a JSONL prompt file with a malformed line",
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.jsonl", '{"turns": ["a"]}\n{oops\n'))),
         r"p\.jsonl:2: invalid JSON"),
    Case("decode", "prompt-longer-than-context", "a prompt longer than the target's context (512 positions)",
         lambda w, t: decode_args(w, t, "--prompt", LONG), r"context|512"),
    Case("decode", "prompt-file-20MB", "a 20 MB prompt (measured in characters before tokenising)",
         lambda w, t: decode_args(w, t, "--prompt-file", str(write(t / "p.txt", "def f(x): return x  " * 1_000_000))),
         r"characters: more than the target's context"),
    Case("decode", "prompt-ids-longer-than-context", "--prompt-ids longer than the target's context",
         lambda w, t: decode_args(w, t, "--prompt-ids", ",".join(["5"] * 600)), r"context|512"),
    Case("decode", "prompt-ids-malformed", "--prompt-ids 1,a,3",
         lambda w, t: decode_args(w, t, "--prompt-ids", "1,a,3"), r"comma-separated integers"),
    Case("decode", "prompt-ids-out-of-vocab", "--prompt-ids with an id beyond the vocabulary",
         lambda w, t: decode_args(w, t, "--prompt-ids", "1,99999"), r"99999|vocab"),
    Case("decode", "prompt-ids-empty", "--prompt-ids ''", lambda w, t: decode_args(w, t, "--prompt-ids", ","), r"empty|no token"),
    Case("decode", "target-mismatch", "--target another target than the drafter's",
         lambda w, t: decode_args(w, t, "--target", str(w.other_target), "--prompt", "x"), r"drafter does not fit the target"),
    Case("decode", "scheduler-missing", "--scheduler naming a missing SPS table",
         lambda w, t: decode_args(w, t, "--scheduler", str(t / "sps.json"), "--prompt", "x"), r"sps\.json"),
    Case("decode", "scheduler-malformed", "--scheduler naming a malformed SPS table",
         lambda w, t: decode_args(w, t, "--scheduler", str(write(t / "sps.json", "{oops")), "--prompt", "x"), r"sps\.json"),
    Case("decode", "scheduler-wrong-fields", "--scheduler naming JSON without the SGLang fields",
         lambda w, t: decode_args(w, t, "--scheduler", str(write(t / "sps.json", '{"a": 1}')), "--prompt", "x"),
         r"SPS table .*misses field 'sample_batch_tokens'"),
    Case("decode", "target-is-a-drafter", "--target naming a drafter folder with --no-draft (its weights do not cover a model)",
         lambda w, t: decode_args(w, t, "--target", str(w.dspark), "--no-draft", "--prompt-ids", "1,2,3"),
         r"its weights do not cover the model: \d+ of \d+ weights missing"),
    Case("decode", "metrics-is-a-folder", "--metrics naming a folder",
         lambda w, t: decode_args(w, t, "--metrics", str(t), "--prompt", "x"), r"metrics"),
]

# Numeric flags: nan, inf and values past their field's range are refused before anything loads (issue 20).
BIG = "9" * 25  # past 64 bits
CASES += [
    Case("decode", "temperature-nan", "--temperature nan",
         lambda w, t: decode_args(w, t, "--temperature", "nan", "--prompt", "x"), r"--temperature nan: expected a finite number"),
    Case("decode", "temperature-inf", "--temperature inf",
         lambda w, t: decode_args(w, t, "--temperature", "inf", "--prompt", "x"), r"--temperature inf: expected a finite number"),
    Case("decode", "top-p-nan", "--top-p nan",
         lambda w, t: decode_args(w, t, "--top-p", "nan", "--prompt", "x"), r"--top-p nan: expected a finite number"),
    Case("decode", "seed-past-64-bits", "--seed with 25 digits",
         lambda w, t: decode_args(w, t, "--seed", BIG, "--prompt", "x"), r"--seed 9+: expected a value less than or equal to 9223372036854775807"),
    Case("decode", "seed-2-64", "--seed 2**64 (one past what a torch generator takes)",
         lambda w, t: decode_args(w, t, "--seed", str(2**64), "--prompt", "x"), r"--seed 18446744073709551616: expected a value less"),
    Case("decode", "gamma-huge", "--gamma with 25 digits",
         lambda w, t: decode_args(w, t, "--gamma", BIG, "--prompt", "x"), r"--gamma 9+: expected a value less than or equal to 32"),
    Case("decode", "denoise-steps-huge", "--denoise-steps 1000000",
         lambda w, t: decode_args(w, t, "--denoise-steps", "1000000", "--prompt", "x"), r"--denoise-steps 1000000: expected a value less than or equal to 16"),
    Case("bench", "temperature-nan", "--temperature nan", lambda w, t: bench_args(w, t, "--temperature", "nan"),
         r"--temperature nan: expected a finite number, found nan"),
    Case("bench", "top-p-inf", "--top-p inf", lambda w, t: bench_args(w, t, "--top-p", "inf"),
         r"bench\.top_p: expected a finite number"),
    Case("bench", "seed-past-64-bits", "--seed 2**64", lambda w, t: bench_args(w, t, "--seed", str(2**64)),
         r"bench\.seed: expected a value less than or equal to 9223372036854775807"),
    Case("bench", "seed-huge", "--seed with 25 digits", lambda w, t: bench_args(w, t, "--seed", BIG),
         r"--set bench\.seed=9+: value refused: line 1: an integer of 25 digits"),
]


def bench_args(w, t, *extra):
    return ["bench", str(w.recipe), "--drafter", str(w.dspark), "--out", str(t / "bench"), *extra]


CASES += [
    Case("bench", "gamma-not-a-range", "--gamma abc", lambda w, t: bench_args(w, t, "--gamma", "abc"), r"cannot read gamma 'abc'"),
    Case("bench", "gamma-zero", "--gamma 0", lambda w, t: bench_args(w, t, "--gamma", "0"), r"gamma"),
    Case("bench", "gamma-above-drafter", "--gamma 5..9 for a drafter of block size 4 (none of the sweep draftable)",
         lambda w, t: bench_args(w, t, "--gamma", "5..9"), r"gamma 5 is beyond what drafter .*at most 4"),
    Case("bench", "gamma-reversed", "--gamma 8..2", lambda w, t: bench_args(w, t, "--gamma", "8..2"), r"gamma"),
    Case("bench", "num-prompts-zero", "--num-prompts 0", lambda w, t: bench_args(w, t, "--num-prompts", "0"),
         r"bench\.num_prompts: expected a value greater than or equal to 1, found 0"),
    Case("bench", "temperature-negative", "--temperature -1", lambda w, t: bench_args(w, t, "--temperature", "-1"),
         r"temperature"),
    Case("bench", "prompt-set-missing", "--prompt-set naming a missing file",
         lambda w, t: bench_args(w, t, "--prompt-set", str(t / "nope.jsonl")), r"nope\.jsonl"),
    Case("bench", "prompt-set-empty", "--prompt-set naming an empty file",
         lambda w, t: bench_args(w, t, "--prompt-set", str(write(t / "p.jsonl", ""))), r"p\.jsonl"),
    Case("bench", "prompt-set-malformed", "--prompt-set with a malformed line",
         lambda w, t: bench_args(w, t, "--prompt-set", str(write(t / "p.jsonl", '{"turns": ["a"]}\n{oops\n'))),
         r"p\.jsonl:2"),
    Case("bench", "prompt-set-binary", "--prompt-set of binary bytes (unreadable)",
         lambda w, t: bench_args(w, t, "--prompt-set", str(write(t / "p.jsonl", b"\xff\xfe\x00\x81\n"))), r"p\.jsonl"),
    Case("bench", "prompt-set-unknown-builtin", "--prompt-set builtin:poetry",
         lambda w, t: bench_args(w, t, "--prompt-set", "builtin:poetry"), r"builtin:poetry"),
    Case("bench", "target-mismatch", "--target another target than the drafter's",
         lambda w, t: bench_args(w, t, "--target", str(w.other_target)), r"drafter does not fit the target"),
    Case("bench", "prompt-longer-than-context", "a prompt set whose prompt exceeds the target's context",
         lambda w, t: bench_args(w, t, "--prompt-set", str(write(t / "p.jsonl", json.dumps({"turns": [LONG]}) + "\n"))),
         r"context|512"),
    Case("bench", "prompt-set-20MB-prompt", "a prompt set holding a 20 MB prompt",
         lambda w, t: bench_args(w, t, "--prompt-set",
                                 str(write(t / "p.jsonl", json.dumps({"turns": ["x = 1  " * 3_000_000]}) + "\n"))),
         r"characters: more than the target's context"),
]


def cal_args(w, t, *extra, recipe=None):
    return ["calibrate-threshold", str(recipe or w.recipe), "--drafter", str(w.dspark), "--out", str(t / "cal"), *extra]


CASES += [
    Case("calibrate-threshold", "no-confidence-head", "a DFlash drafter (no confidence head)",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dflash), "--out", str(t / "cal")],
         r"no confidence head"),
    Case("calibrate-threshold", "held-out-out-of-range", "--held-out 1.5",
         lambda w, t: cal_args(w, t, "--held-out", "1.5"), r"--held-out must be in \[0, 1\)"),
    Case("calibrate-threshold", "gamma-above-drafter", "calibrate.gamma 9 for a drafter of block size 4",
         lambda w, t: cal_args(w, t, "--set", "calibrate.gamma=9"), r"calibrate\.gamma 9 is out of range"),
    Case("calibrate-threshold", "prompts-missing", "calibrate.prompts naming a missing file",
         lambda w, t: cal_args(w, t, "--set", f"calibrate.prompts={t / 'nope.jsonl'}"), r"nope\.jsonl"),
    Case("calibrate-threshold", "prompts-empty", "calibrate.prompts naming an empty file",
         lambda w, t: cal_args(w, t, "--set", f"calibrate.prompts={write(t / 'p.jsonl', '')}"), r"p\.jsonl"),
    Case("calibrate-threshold", "prompts-malformed", "calibrate.prompts with a malformed line",
         lambda w, t: cal_args(w, t, "--set", f"calibrate.prompts={write(t / 'p.jsonl', '{oops' + chr(10))}"),
         r"p\.jsonl:1"),
    Case("calibrate-threshold", "too-few-samples", "calibrate.min_samples above what the prompts give",
         lambda w, t: cal_args(w, t, "--skip-sps", "--set", "calibrate.min_samples=100000"), r"too few calibration samples"),
    Case("calibrate-threshold", "out-is-a-file", "--out naming a file",
         lambda w, t: ["calibrate-threshold", str(w.recipe), "--drafter", str(w.dspark), "--out", str(write(t / "f", "x"))],
         r"--out .*/f is a file"),
    Case("calibrate-threshold", "target-mismatch", "a recipe whose target is not the drafter's",
         lambda w, t: cal_args(w, t, "--set", f"target.id={w.other_target}"), r"drafter does not fit the target"),
]


def stream(w, t, text):
    return write(t / "m.jsonl", text)


CASES += [
    Case("monitor", "stream-missing", "--once on a stream that does not exist",
         lambda w, t: ["monitor", str(t / "nope.jsonl"), "--once"], r"nope\.jsonl' not found"),
    Case("monitor", "window-malformed", "--window soon", lambda w, t: ["monitor", str(w.metrics), "--window", "soon"],
         r"--window 'soon'"),
    Case("monitor", "window-zero", "--window 0", lambda w, t: ["monitor", str(w.metrics), "--window", "0"], r"--window '0'"),
    Case("monitor", "refresh-zero", "--refresh 0", lambda w, t: ["monitor", str(w.metrics), "--refresh", "0"],
         r"--refresh must be > 0"),
    Case("monitor", "stream-is-a-folder", "a folder where the stream is expected (unreadable)",
         lambda w, t: ["monitor", str(t), "--once"], r"is a folder"),
    Case("monitor", "prometheus-port-out-of-range", "--prometheus-port 70000",
         lambda w, t: ["monitor", str(w.metrics), "--once", "--prometheus-port", "70000"], r"--prometheus-port must be in 0\.\.65535, got 70000"),
]
CASES += [
    Case("monitor", "refresh-nan", "--refresh nan", lambda w, t: ["monitor", str(w.metrics), "--once", "--refresh", "nan"],
         r"--refresh must be > 0 and at most 3600 seconds, got nan"),
    Case("monitor", "refresh-inf", "--refresh inf", lambda w, t: ["monitor", str(w.metrics), "--once", "--refresh", "inf"],
         r"--refresh must be > 0 and at most 3600 seconds, got inf"),
    Case("monitor", "window-huge", "--window of 25 digits (rounds)",
         lambda w, t: ["monitor", str(w.metrics), "--once", "--window", BIG], r"--window '9+': at most 10000000"),
]


def bad_rounds(change):
    """A stream holding the world's run header and its rounds, each round changed by `change(dict)` (which may
    return a replacement line): every round line is malformed, so `monitor --once` has nothing to show."""
    def make(w, t):
        lines = []
        for line in w.metrics.read_text().splitlines():
            row = json.loads(line)
            if row["type"] == "round":
                row = change(row) or row
            lines.append(row if isinstance(row, str) else json.dumps(row))
        return ["monitor", str(write(t / "m.jsonl", "\n".join(lines) + "\n")), "--once"]
    return make


def setting(key, value):
    return lambda row: row.update({key: value})


NO_ROUND = r"m\.jsonl: no readable round in the metrics stream, \d+ malformed line"
CASES += [
    Case("monitor", "stream-binary", "a stream of binary bytes",
         lambda w, t: ["monitor", str(write(t / "m.jsonl", bytes(range(256)) * 64 + b"\n\xff\xfe\n")), "--once"],
         r"m\.jsonl: no readable round .*last: not JSON"),
    Case("monitor", "accepted-1e12", "rounds with accepted: 1e12 (a float count)",
         bad_rounds(setting("accepted", 1e12)), NO_ROUND + r".*'accepted' is 1000000000000\.0"),
    Case("monitor", "accepted-huge-int", "rounds with accepted and verified 10**12",
         bad_rounds(lambda r: r.update(accepted=10**12, verified=10**12)), NO_ROUND + r".*inconsistent"),
    Case("monitor", "accepted-string", "rounds with accepted: \"3\" (a string)",
         bad_rounds(setting("accepted", "3")), NO_ROUND + r".*'accepted' is '3'"),
    Case("monitor", "accepted-fraction", "rounds with accepted: 2.5", bad_rounds(setting("accepted", 2.5)), NO_ROUND),
    Case("monitor", "accepted-negative", "rounds with accepted: -1", bad_rounds(setting("accepted", -1)), NO_ROUND),
    Case("monitor", "accepted-bool", "rounds with accepted: true", bad_rounds(setting("accepted", True)), NO_ROUND),
    Case("monitor", "gamma-huge", "rounds with gamma: 10**9", bad_rounds(setting("gamma", 10**9)), NO_ROUND + r".*inconsistent"),
    Case("monitor", "round-missing-field", "rounds without 'verified'", bad_rounds(lambda r: r.pop("verified") and None),
         NO_ROUND + r".*misses 'verified'"),
    Case("monitor", "time-string", "rounds whose time t is a string", bad_rounds(setting("t", "noon")), NO_ROUND + r".*time 'noon'"),
    Case("monitor", "draft-time-nan", "rounds whose draft_s is NaN", bad_rounds(setting("draft_s", float("nan"))), NO_ROUND),
    Case("monitor", "confidence-string", "rounds whose confidence is a string",
         bad_rounds(setting("confidence", "high")), NO_ROUND + r".*confidence"),
    Case("monitor", "lines-are-lists", "every round line a JSON list", bad_rounds(lambda r: json.dumps([r])), NO_ROUND + r".*not a JSON object"),
    Case("monitor", "deeply-nested-line", "a round line nested 100000 levels deep",
         bad_rounds(lambda r: "[" * 100_000 + "]" * 100_000), NO_ROUND),
    Case("monitor", "endless-line", "a 3 MB line with no newline",
         lambda w, t: ["monitor", str(write(t / "m.jsonl", "x" * (3 << 20))), "--once"], NO_ROUND + r".*longer than"),
    Case("monitor", "header-gamma-string", "a run header whose gamma is a string and rounds of another type",
         lambda w, t: ["monitor", str(write(t / "m.jsonl", '{"type": "run", "gamma": "four", "drafter": "d"}\n'
                                              '{"type": "round", "request": "0"}\n')), "--once"],
         NO_ROUND + r".*'request' is '0'"),
]


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
