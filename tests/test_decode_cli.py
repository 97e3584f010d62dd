"""`pdraft decode` end to end on a tiny saved target: streaming text, JSON output, target-only and drafted
runs giving the same greedy tokens, and the user errors (one line, exit code 2 as pdraft.cli.main maps
PdraftError) for a prompt longer than the context, an empty prompt, gamma out of range and a drafter built
for another target. Library-level error tests cover the same cases through generate()."""

import json

import pytest

from pdraft.cli.decode import decode
from doubles import DoubleConfig, RandomDrafter, tiny_target
from pdraft.decode.engine import generate
from pdraft.errors import PdraftError
from reliability_support import invoke_command

CHARS = "abcdefghijklmnopqrstuvwxyz .,!?"


def save_tiny(path, vocab=40, layers=3, context=64):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_target(vocab, 32, num_layers=layers, context=context)
    model.config.eos_token_id = vocab - 1
    model.save_pretrained(path)
    vocab_map = {c: i for i, c in enumerate(CHARS)}
    vocab_map["[UNK]"], vocab_map["</s>"] = len(CHARS), vocab - 1
    tok = Tokenizer(models.WordLevel(vocab_map, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="</s>").save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    save_tiny(path)
    return path


def run(args):
    """Invoke `decode` as pdraft.cli.main does: PdraftError -> one line and exit code 2."""
    return invoke_command("decode", decode, args)


def test_no_draft_streams_text_and_stats(target_dir):
    code, out, _ = run(["--target", str(target_dir), "--prompt", "hello world", "--raw", "--no-draft",
                        "--max-new-tokens", "12"])
    assert code == 0
    assert "round statistics" in out and "accepted length tau" in out and "TPOT" in out
    # what ran, as bench's footer says it: threads measured on the run's own work (runtime.threads: auto)
    runtime = next(line for line in out.splitlines() if line.strip().startswith("runtime"))
    assert "thread(s) (measured: probe 1 thread(s)" in runtime or "thread(s) (default" in runtime, runtime


def test_decode_says_which_prompt_form_it_used(target_dir, builtin_test_target):
    _, _, err = run(["--target", str(target_dir), "--prompt", "hello", "--raw", "--no-draft", "--max-new-tokens", "2"])
    assert "prompt form: raw text, continued as written (--raw)" in err
    _, _, err = run(["--target", str(target_dir), "--prompt", "hello", "--no-draft", "--max-new-tokens", "2"])
    assert "prompt form: raw text (the target's tokenizer has no chat template)" in err
    target = ["--target", str(builtin_test_target), "--no-draft", "--max-new-tokens", "2", "--prompt", "def f(x):"]
    _, _, err = run(target)
    assert "prompt form: a user turn in the target's chat template" in err
    _, _, err = run(target + ["--set", "decode.chat_template=false"])
    assert "prompt form: raw text, continued as written (decode.chat_template: false)" in err
    code, out, err = run(target + ["--json"])
    assert code == 0 and "prompt form" not in out + err


def test_json_output_matches_library(target_dir):
    code, out, _ = run(["--target", str(target_dir), "--prompt-ids", "1,2,3;4,5", "--no-draft",
                        "--max-new-tokens", "6", "--json"])
    assert code == 0
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["prompt_ids"] for r in rows] == [[1, 2, 3], [4, 5]]
    model = tiny_target(40, 32, num_layers=3, context=64)
    ref = generate(model, None, [[1, 2, 3], [4, 5]], max_new_tokens=6, eos_token_ids=[39])
    assert [r["output_ids"] for r in rows] == ref.output_ids
    assert all(r["rounds"] and {"drafted", "verified", "accepted"} <= set(r["rounds"][0]) for r in rows)


def test_cli_user_errors_are_one_line(target_dir):
    base = ["--target", str(target_dir), "--no-draft"]
    code, _, msg = run(base + ["--prompt-ids", ",".join(["1"] * 64)])
    assert code == 2 and "context is 64 tokens" in msg and "\n" not in msg
    code, _, msg = run(base + ["--prompt-ids", ""])
    assert code == 2 and "empty" in msg
    code, _, msg = run(base + ["--prompt", "x", "--prompt-ids", "1"])
    assert code == 2 and "exactly one" in msg
    code, _, msg = run(["--target", str(target_dir / "missing"), "--no-draft", "--prompt-ids", "1"])
    assert code == 2 and "not found" in msg
    code, _, msg = run(base + ["--prompt-ids", "1", "--scheduler", str(target_dir / "nope.json")])
    assert code == 2 and "SPS table" in msg
    code, _, msg = run(base + ["--prompt-ids", "1", "--verify", "scheduler", "--sps-table",
                               str(target_dir / "nope.json")])
    assert code == 2 and "SPS table" in msg and "old form" not in msg
    code, _, msg = run(base + ["--prompt-ids", "1", "--round-overhead-ms", "-1"])
    assert code == 2 and "--round-overhead-ms -1" in msg


def test_cli_with_drafter(target_dir, tmp_path):
    """With the real drafter loader (pdraft.models), drafted greedy output equals --no-draft's and bad gamma /
    foreign drafters fail cleanly; without it, --drafter gives a clear error instead of a traceback."""
    try:
        from pdraft.models import build_drafter, save_drafter
    except ImportError:
        code, _, msg = run(["--target", str(target_dir), "--drafter", str(tmp_path), "--prompt-ids", "1,2"])
        assert code == 2 and "no drafter loader" in msg
        return
    model = tiny_target(40, 32, num_layers=3, context=64)
    drafter = build_drafter("dspark", model.config, seed=0, mask_token_id=38, num_hidden_layers=1, block_size=8,
                            markov_rank=8)
    save_drafter(drafter, tmp_path / "d")
    base = ["--target", str(target_dir), "--prompt-ids", "1,2,3", "--max-new-tokens", "10", "--json"]
    _, plain, _ = run(base + ["--no-draft"])
    for extra in ([], ["--gamma", "3"], ["--verify", "threshold", "--threshold", "0.3"],
                  ["--verify", "estimator", "--round-overhead-ms", "2"], ["--gamma", "4", "--tree", "12x3"]):
        code, out, err = run(base + ["--drafter", str(tmp_path / "d"), *extra])
        assert code == 0 and json.loads(out)["output_ids"] == json.loads(plain)["output_ids"]
        assert "old form" not in err
    code, out, err = run(base + ["--drafter", str(tmp_path / "d"), "--threshold", "0.3"])  # the old form
    assert code == 0 and json.loads(out)["output_ids"] == json.loads(plain)["output_ids"]
    assert "--threshold without --verify is the old form of --verify threshold --threshold X" in err
    code, _, msg = run(base + ["--drafter", str(tmp_path / "d"), "--tree", "12x3", "--threshold", "0.3"])
    assert code == 2 and "\n" not in msg and "--verify threshold" in msg
    code, _, msg = run(base + ["--drafter", str(tmp_path / "d"), "--tree", "big"])
    assert code == 2 and "node budget" in msg
    stream = tmp_path / "m.jsonl"
    code, out, _ = run(base + ["--drafter", str(tmp_path / "d"), "--metrics", str(stream)])
    rows = [json.loads(line) for line in stream.read_text().splitlines()]
    assert code == 0 and rows[0]["type"] == "run" and rows[0]["gamma"] == 8
    rounds = [r for r in rows if r.get("type") != "run"]
    assert len(rounds) == len(json.loads(out)["rounds"])  # one stream row per round of the single request
    code, _, msg = run(base + ["--drafter", str(tmp_path / "d"), "--gamma", "9"])
    assert code == 2 and "gamma 9 is out of range" in msg
    other = tmp_path / "other"
    save_tiny(other, vocab=48)
    code, _, msg = run(["--target", str(other), "--drafter", str(tmp_path / "d"), "--prompt-ids", "1"])
    assert code == 2 and "\n" not in msg and "vocab" in msg


def test_recipe_tree_decodes_the_target_greedy_output(target_dir, tmp_path):
    """`decode.tree` in a recipe, overridden by `--set decode.tree=8x2`: the rounds verify 8-node trees (their
    shapes in the metrics stream), the greedy output is the target's alone; `--tree` wins over both; a malformed
    value and a tree with a policy that shortens the block are one line each."""
    from pdraft.models import build_drafter, save_drafter

    model = tiny_target(40, 32, num_layers=3, context=64)
    save_drafter(build_drafter("dspark", model.config, seed=0, mask_token_id=38, num_hidden_layers=1, block_size=8,
                               markov_rank=8), tmp_path / "d")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("decode:\n  tree: 12x3\n")
    base = ["--target", str(target_dir), "--prompt-ids", "1,2,3", "--max-new-tokens", "12", "--json",
            "--recipe", str(recipe)]
    _, plain, _ = run(base + ["--no-draft"])  # the recipe's tree does not reach the target alone
    drafted = base + ["--drafter", str(tmp_path / "d"), "--gamma", "4"]
    for extra, nodes in ((["--set", "decode.tree=8x2"], 8), (["--set", "decode.tree=8x2", "--tree", "6x2"], 6)):
        stream = tmp_path / f"m{nodes}.jsonl"
        code, out, err = run(drafted + extra + ["--metrics", str(stream)])
        assert code == 0, err
        assert json.loads(out)["output_ids"] == json.loads(plain)["output_ids"]
        rows = [json.loads(line) for line in stream.read_text().splitlines()]
        shapes = [r["tree"] for r in rows if r.get("type") == "round" and r["gamma"]]  # drafting rounds (not prefill)
        assert shapes and all(s is not None and len(s) == 4 and sum(s) <= nodes for s in shapes), shapes
        assert any(sum(s) > 4 for s in shapes)  # more nodes than the chain's 4: a tree ran
    code, _, msg = run(drafted + ["--set", "decode.tree=8x9"])
    assert code == 2 and "decode.tree: width must be in [1, 8], got 9" in msg and "\n" not in msg
    code, _, msg = run(drafted + ["--set", "decode.verify=estimator"])
    assert code == 2 and "cannot run with --verify estimator (decode.verify)" in msg and "\n" not in msg


# --- the same errors through the library -----------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return tiny_target(64, 32, num_layers=3, context=32)


def test_library_errors(model):
    drafter = RandomDrafter(DoubleConfig(64, 32, [0, 2], block_size=8))
    with pytest.raises(PdraftError, match="context is 32 tokens"):
        generate(model, drafter, [list(range(32))])
    with pytest.raises(PdraftError, match="prompt 1 is empty"):
        generate(model, drafter, [[1], []])
    with pytest.raises(PdraftError, match="no prompts"):
        generate(model, drafter, [])
    for gamma in (0, 9):
        with pytest.raises(PdraftError, match=f"gamma {gamma} is out of range: this drafter drafts 1..8"):
            generate(model, drafter, [[1, 2]], gamma=gamma)
    for bad, match in [(DoubleConfig(50, 32, [0, 2]), "vocabulary 50"),
                       (DoubleConfig(64, 48, [0, 2]), "hidden size 48"),
                       (DoubleConfig(64, 32, [0, 3]), "layer id 3 is out of range")]:
        with pytest.raises(PdraftError, match="drafter does not fit the target: .*" + match):
            generate(model, RandomDrafter(bad), [[1, 2]])
    with pytest.raises(PdraftError, match="trained with 1 denoise step.*decoded with 1"):
        generate(model, drafter, [[1, 2]], denoise_steps=3)
    no_conf = RandomDrafter(DoubleConfig(64, 32, [0, 2], has_confidence=False))
    from pdraft.policies.base import VerifyConfig
    with pytest.raises(PdraftError, match="confidence head"):
        generate(model, no_conf, [[1, 2]], verify=VerifyConfig(mode="threshold", knobs={"threshold": 0.5}))
    with pytest.raises(PdraftError, match="outside the target vocabulary"):
        generate(model, drafter, [[1, 99]])
