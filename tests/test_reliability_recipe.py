"""Reliability, recipes and usage: every command that reads a recipe, given each kind of broken recipe (malformed
YAML, unknown keys, wrong types, out-of-range values, a missing file, a folder or binary bytes where the file
should be, bad --set overrides), and every command given an unknown option or a malformed value, fails with
one line and exit code 2 and changes nothing (contract in reliability_support.check)."""

from pathlib import Path

import reliability_support
from reliability_support import Case, check, param, write

w = reliability_support.w  # the shared world, a module fixture


# 9 lists of 9 aliases over 8 levels: a few hundred bytes that expand into 9**8 = 43 million values.
ALIAS_BOMB = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))

# Each command that reads a recipe, as argv built around the recipe path R.
RECIPE_COMMANDS = {
    "recipe check": lambda w, r: ["recipe", "check", str(r)],
    "recipe show": lambda w, r: ["recipe", "show", str(r)],
    "env": lambda w, r: ["env", str(r), "--target"],
    "export-hidden": lambda w, r: ["export-hidden", str(r)],
    "train": lambda w, r: ["train", str(r)],
    "calibrate-threshold": lambda w, r: ["calibrate-threshold", str(r), "--drafter", str(w.dspark)],
    "decode": lambda w, r: ["decode", "--recipe", str(r), "--drafter", str(w.dspark), "--prompt", "def f"],
    "bench": lambda w, r: ["bench", str(r), "--drafter", str(w.dspark)],
    "quickstart": lambda w, r: ["quickstart", str(r)],
}

# (name, what the user did, recipe file maker (world, tmp) -> path, extra argv, expected error)
RECIPE_FAULTS = [
    ("malformed-yaml", "malformed YAML (an unclosed list)",
     lambda w, t: write(t / "r.yaml", "train:\n  steps: [1, 2\n"), [], r"r\.yaml:\d+: malformed YAML"),
    ("unknown-key", "an unknown key (train.stepz)",
     lambda w, t: w.recipe_with(t, train={"stepz": 3}), [], r"train\.stepz: unknown key; did you mean 'train\.steps'"),
    ("unknown-section", "an unknown section (trainer:)",
     lambda w, t: w.recipe_with(t, trainer={"steps": 3}), [], r"trainer: unknown key"),
    ("wrong-type", "a wrong type (train.steps: many)",
     lambda w, t: w.recipe_with(t, train={"steps": "many"}), [], r"train\.steps: expected a valid integer, found 'many'"),
    ("wrong-type-section", "a section that is not a mapping (decode: 7)",
     lambda w, t: w.recipe_with(t, decode=7), [], r"decode: expected a mapping"),
    ("out-of-range", "an out-of-range value (train.lr: 5.0)",
     lambda w, t: w.recipe_with(t, train={"lr": 5.0}), [], r"train\.lr: expected a value less than or equal to 1"),
    ("gamma-out-of-range", "gamma out of range in the recipe (decode.gamma: 0)",
     lambda w, t: w.recipe_with(t, decode={"gamma": 0}), [], r"decode\.gamma: expected a value greater than or equal to 1"),
    ("not-a-mapping", "a YAML list instead of a mapping",
     lambda w, t: write(t / "r.yaml", "- train\n- decode\n"), [], r"expected a mapping of sections, found a list"),
    ("missing-file", "a recipe path that does not exist",
     lambda w, t: t / "nope.yaml", [], r"nope\.yaml: recipe file not found"),
    ("folder-not-file", "a folder where the recipe file is expected (unreadable)",
     lambda w, t: (t / "dir.yaml").mkdir() or t / "dir.yaml", [], r"dir\.yaml: is a folder, expected a YAML recipe file"),
    ("binary-file", "binary bytes / invalid UTF-8 in the recipe file (unreadable)",
     lambda w, t: write(t / "r.yaml", b"\xff\xfe\x00\x81binary"), [], r"r\.yaml: cannot read the recipe"),
    ("set-wrong-type", "--set train.steps=abc",
     lambda w, t: w.recipe, ["--set", "train.steps=abc"], r"--set train\.steps=abc: train\.steps: expected a valid integer"),
    ("set-unknown-key", "--set train.nope=1",
     lambda w, t: w.recipe, ["--set", "train.nope=1"], r"--set train\.nope=1: train\.nope: unknown key"),
    ("set-no-equals", "--set without KEY=VALUE",
     lambda w, t: w.recipe, ["--set", "train.steps"], r"--set train\.steps: expected KEY=VALUE"),
    # Hostile YAML: refused by the parsing limits before anything is built (issue 20, validate before allocating).
    ("alias-bomb", "a YAML alias bomb (9 lists of 9 aliases, 8 levels: 43 million values)",
     lambda w, t: write(t / "r.yaml", ALIAS_BOMB), [], r"more than 100000 values once aliases are expanded"),
    ("deep-nesting", "a value nested 5000 levels deep",
     lambda w, t: write(t / "r.yaml", "train:\n  steps: " + "[" * 5000 + "]" * 5000 + "\n"), [],
     r"nested deeper than 32 levels"),
    ("list-as-key", "a list used as a mapping key",
     lambda w, t: write(t / "r.yaml", "? [train, steps]\n: 3\n"), [], r"a mapping key must be a plain name, found a list"),
    ("huge-integer", "a 5000-digit integer",
     lambda w, t: write(t / "r.yaml", w.recipe.read_text().replace("  steps: 2\n", "  steps: " + "9" * 5000 + "\n")),
     [], r"an integer of 5000 digits"),
    ("endless-file", "/dev/zero as the recipe (endless bytes)",
     lambda w, t: Path("/dev/zero"), [], r"/dev/zero: larger than 1 MiB"),
    ("huge-file", "a 2 MB recipe (comment lines)",
     lambda w, t: write(t / "r.yaml", w.recipe.read_text() + "# padding\n" * 200_000), [], r"r\.yaml: larger than 1 MiB"),
    ("set-infinite", "--set train.alpha_ce=inf (would train non-finite weights)",
     lambda w, t: w.recipe, ["--set", "train.alpha_ce=inf"], r"train\.alpha_ce: expected a finite number"),
    ("set-nan", "--set decode.temperature=.nan",
     lambda w, t: w.recipe, ["--set", "decode.temperature=.nan"], r"decode\.temperature: expected a finite number"),
    ("seed-past-64-bits", "runtime.seed: 2**64 (torch seeds take 64 bits)",
     lambda w, t: w.recipe_with(t, runtime={"seed": 2**64}), [], r"runtime\.seed: expected a value less than or equal to 9223372036854775807"),
    ("set-huge-integer", "--set with a 30-digit integer",
     lambda w, t: w.recipe, ["--set", "train.steps=" + "9" * 30], r"--set train\.steps=9+: value refused: line 1: an integer of 30 digits"),
]


def _recipe_case(command: str, fault) -> Case:
    name, what, make, extra, expect = fault
    build = RECIPE_COMMANDS[command]
    return Case(command, f"recipe-{name}", f"recipe: {what}", lambda w, t: [*build(w, make(w, t)), *extra], expect,
                subprocess=(command == "train" and name == "malformed-yaml"))


# (command, name, what the user did, argv builder, expected text in typer's usage box)
USAGE = [
    ("recipe check", "unknown-option", "an unknown option", lambda w, t: ["recipe", "check", "--bogus"], r"No such option"),
    ("recipe show", "unknown-option", "an unknown option", lambda w, t: ["recipe", "show", "--bogus"], r"No such option"),
    ("recipe explain", "extra-argument", "two keys instead of one", lambda w, t: ["recipe", "explain", "a", "b"],
     r"unexpected extra argument"),
    ("env", "unknown-option", "an unknown option", lambda w, t: ["env", "--bogus"], r"No such option"),
    ("export-hidden", "unknown-option", "an unknown option", lambda w, t: ["export-hidden", "--bogus"], r"No such option"),
    ("train", "unknown-option", "an unknown option", lambda w, t: ["train", "--steps", "3"], r"No such option"),
    ("calibrate-threshold", "missing-drafter-option", "no --drafter",
     lambda w, t: ["calibrate-threshold", str(w.recipe)], r"Missing option '--drafter'"),
    ("calibrate-threshold", "held-out-not-a-number", "--held-out half",
     lambda w, t: ["calibrate-threshold", "--drafter", str(w.dspark), "--held-out", "half"], r"Invalid value for '--held-out'"),
    ("decode", "gamma-not-an-integer", "--gamma four", lambda w, t: ["decode", "--gamma", "four", "--prompt", "x"],
     r"Invalid value for '--gamma'"),
    ("bench", "num-prompts-not-an-integer", "--num-prompts many", lambda w, t: ["bench", "--num-prompts", "many"],
     r"Invalid value for '--num-prompts'"),
    ("monitor", "missing-path", "no stream path", lambda w, t: ["monitor"], r"Missing argument 'PATH'"),
    ("pull", "missing-source", "no repository or folder", lambda w, t: ["pull"], r"Missing argument"),
    ("push", "missing-repo-id", "no repository id", lambda w, t: ["push", str(w.dspark)], r"Missing argument 'REPO_ID'"),
    ("export", "missing-format", "no --format", lambda w, t: ["export", str(w.dspark), "--out", str(t / "o")],
     r"Missing option '--format'"),
    ("pdraft", "unknown-command", "a command that does not exist", lambda w, t: ["tarin"], r"No such command"),
    ("quickstart", "unknown-option", "an unknown option", lambda w, t: ["quickstart", "--bogus"], r"No such option"),
    ("target build", "unknown-option", "an unknown option", lambda w, t: ["target", "build", "--bogus"],
     r"No such option"),
]

CASES = [_recipe_case(cmd, fault) for cmd in RECIPE_COMMANDS for fault in RECIPE_FAULTS]
CASES += [Case("recipe explain", "unknown-key", "an unknown recipe key", lambda w, t: ["recipe", "explain", "train.nope"],
               r"train\.nope: no such recipe section or key; did you mean 'train\.online'")]
CASES += [Case(cmd, name, what, argv, expect, usage=True, subprocess=(cmd == "pdraft"))
          for cmd, name, what, argv, expect in USAGE]
CASES += [
    Case("quickstart", "unknown-kind", "--kinds with a drafter kind pdraft does not train",
         lambda w, t: ["quickstart", str(w.recipe), "--kinds", "medusa"], r"unknown drafter kind\(s\) \['medusa'\]"),
    Case("recipe check", "dflash2-not-servable", "drafter.kind dflash2 with 2 denoise steps (no engine serves it)",
         lambda w, t: ["recipe", "check", str(w.recipe), "--set", "drafter.kind=dflash2", "--set", "drafter.denoise_steps=2"],
         r"drafter\.denoise_steps: DFlash2 drafts in one backbone pass \(denoise_steps 1\), got 2"),
    Case("target build", "unknown-builtin", "an embedded target name that does not exist",
         lambda w, t: ["target", "build", "tiny-nope", "--out", str(t / "o")], r"unknown builtin target 'tiny-nope'"),
    Case("target eval", "unknown-builtin", "an embedded target name that does not exist",
         lambda w, t: ["target", "eval", "tiny-nope"], r"unknown builtin target 'tiny-nope'"),
]


@param(CASES)
def test_case(case, w, tmp_path, monkeypatch):
    check(case, w, tmp_path, monkeypatch)
