"""Adding a verification policy with a setting of its own is one module plus one `PolicySpec` line in the registry
(issue 43): a fresh interpreter reads pdraft/policies/__init__.py with one line added to POLICIES, naming a test-only
policy (its module written here) and its Knob, and nothing else edited. The recipe then has the key, the ranges
are refused in the recipe, the settings and the flag, `pdraft decode` has the flag, and the value given by the
recipe or by the flag reaches the VerifyConfig the policy is built with.

The registry is read at import time (the recipe's `decode` section and the CLI's flags are built from it), so the
line goes in before anything imports it: in a subprocess, not by patching this process's modules."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pdraft

TESTS = Path(__file__).resolve().parent

# The one registration line: the policy's entry and its Knob (recipe key decode.margin_ms, 0..100 ms, default 5).
LINE = ('    PolicySpec("margin", "the test margin", "a test-only policy", "margin_policy:MarginPolicy", '
        'knobs=(Knob("margin_ms", "margin_s", "test margin (seconds)", 5.0, 0.0, 100.0, "Test-only margin.", '
        'per=1000),)),')

# The policy's module: full verification that records the VerifyConfig each run builds it with.
POLICY_MODULE = '''
from pdraft.policies.full import FullPolicy

SEEN = []


class MarginPolicy(FullPolicy):
    def __init__(self, config):
        super().__init__(config)
        SEEN.append(dict(config.knobs))
'''

CHECK = '''
import importlib.util
import json
import sys
from pathlib import Path

import pdraft

assert "pdraft.policies" not in sys.modules
registry = Path(pdraft.__file__).parent / "policies" / "__init__.py"
source = registry.read_text()
anchor = "\\n)\\nNAMES = "  # the end of POLICIES
assert source.count(anchor) == 1
spec = importlib.util.spec_from_file_location("pdraft.policies", registry,
                                              submodule_search_locations=[str(registry.parent)])
module = importlib.util.module_from_spec(spec)
sys.modules["pdraft.policies"] = pdraft.policies = module
exec(compile(source.replace(anchor, "\\n" + sys.argv[1] + anchor), str(registry), "exec"), module.__dict__)

from pdraft.decode.settings import DecodeSettings
from pdraft.errors import PdraftError
from pdraft.policies.base import VerifyConfig
from pdraft.recipe import load_recipe


def refusal(attempt):
    try:
        attempt()
    except PdraftError as e:
        return e.one_line()
    return None


found = {}
recipe = load_recipe(None, ["decode.verify=margin", "decode.margin_ms=7"])
found["recipe"] = [load_recipe(None, []).decode.margin_ms, recipe.decode.margin_ms]
found["from_recipe"] = DecodeSettings.from_recipe(recipe, "decode").verify_config().knobs
found["refused"] = {
    "recipe": refusal(lambda: load_recipe(None, ["decode.margin_ms=101"])),
    "settings": refusal(lambda: DecodeSettings(verify="margin", knobs={"margin_s": 0.2})),
    "verify_config": refusal(lambda: VerifyConfig(mode="margin", knobs={"margin_s": -0.001})),
}

from test_decode_cli import run, save_tiny
from doubles import tiny_target
from pdraft.models import build_drafter, save_drafter
import margin_policy

work = Path(sys.argv[2])
save_tiny(work / "target")
drafter = build_drafter("dspark", tiny_target(40, 32, num_layers=3, context=64).config, seed=0, mask_token_id=38,
                        num_hidden_layers=1, block_size=8, markov_rank=8)
save_drafter(drafter, work / "d")
base = ["--target", str(work / "target"), "--drafter", str(work / "d"), "--prompt-ids", "1,2,3", "--max-new-tokens",
        "4", "--json"]
found["help"] = run(["--help"])[1]
found["cli"] = {"flag": run(base + ["--verify", "margin", "--margin-ms", "7"])[0], "seen": margin_policy.SEEN,
                "out of range": run(base + ["--verify", "margin", "--margin-ms", "101"]),
                "other policy": run(base + ["--verify", "threshold", "--margin-ms", "3"])}
print(json.dumps(found))
'''


def test_a_policy_with_its_own_knob_is_one_module_and_one_registry_line(tmp_path):
    (tmp_path / "margin_policy.py").write_text(POLICY_MODULE)
    (tmp_path / "check.py").write_text(CHECK)
    path = os.pathsep.join([str(tmp_path), str(TESTS), str(Path(pdraft.__file__).resolve().parents[1])])
    done = subprocess.run([sys.executable, str(tmp_path / "check.py"), LINE, str(tmp_path)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # its recipe key, with the Knob's default, and the value reaching the policy's VerifyConfig in the setting's unit
    assert found["recipe"] == [5.0, 7.0]
    assert found["from_recipe"] == {"margin_s": 0.007}
    # its one range, refused by the recipe, the settings and VerifyConfig
    refused = found["refused"]
    assert "decode.margin_ms" in refused["recipe"] and "100" in refused["recipe"], refused
    assert refused["settings"].startswith("test margin (seconds) must be in [0.0, 0.1]"), refused
    assert refused["verify_config"].startswith("test margin (seconds) must be in [0.0, 0.1]"), refused
    # its flag on `pdraft decode`, which reaches the VerifyConfig the policy is built with
    assert "--margin-ms" in found["help"] and "Test-only margin. (margin)" in found["help"]
    cli = found["cli"]
    assert cli["flag"] == 0 and cli["seen"] and all(seen == {"margin_s": 0.007} for seen in cli["seen"]), cli
    code, _, msg = cli["out of range"]
    assert code == 2 and msg.startswith("--margin-ms 101.0: expected a value less than or equal to 100"), msg
    code, _, msg = cli["other policy"]
    assert code == 2 and "--margin-ms 3 is a setting of the margin policy, but this run verifies with threshold" in msg
