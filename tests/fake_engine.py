"""A test-double serving engine, written as adding SGLang would be: one module holding one Engine
(pdraft.serving.api), which a test registers in pdraft.serving.ENGINES as the one line of its registration.
Nothing of vLLM is borrowed: it serves pdraft.hub.export's `sglang` layout and reads SGLang's serve command for
its speculative config. Its contenders are pdraft's own loop reported under the engine name "fake" (its outputs are
pdraft's, token for token); the bench's refuses to start its second drafter and policies other than full, and
the serving check's replay can be skewed (SKEW) to report rounds pdraft did not run. tests/test_bench_engines.py
runs the bench through it, tests/test_serving_check_engine.py check-serving, tests/test_calibrate_cli.py
calibrate-threshold's `--engine` (its sps_profiler)."""

import json
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from pdraft.bench.contenders import Decoded, LoopContender
from pdraft.serving.api import Engine

NAME = "fake"
SKEW = {"rounds": False}  # the replay reports one more token accepted in each request's first round
SERVED: list[dict] = []  # what each replay contender was asked to serve, newest last


@dataclass
class FakeEngineContender(LoopContender):
    """pdraft's loop, reported as another engine's; refuses policies other than full, as vLLM does here."""

    engine: str = NAME
    refuse_start: bool = False
    skew: bool = False

    def refusal(self, policy):
        return None if policy == "full" else f"fake verifies full blocks only, not {policy}"

    def prepare(self, gammas):
        return f"fake refuses {self.label}" if self.refuse_start else None

    def run(self, work, stream=None) -> Decoded:
        d = super().run(work, stream)
        d.engine_info = {"name": NAME, "version": "0", "speculative_config": {"num_speculative_tokens": work.gamma}}
        if self.skew:
            firsts = {}
            for i, r in enumerate(d.records):
                if r.gamma > 0 and r.accepted < r.gamma:
                    firsts.setdefault(r.request, i)
            for i in firsts.values():
                d.records[i] = replace(d.records[i], accepted=d.records[i].accepted + 1)
        return d


def contenders(recipe, target, drafters, *, scratch=None, warn=lambda _: None):
    out = [FakeEngineContender("fake target alone", "target", lambda p: None, target_model=target.model)]
    for i, c in enumerate(drafters):
        out.append(FakeEngineContender(f"fake {c.label}", c.kind, c.make, c.max_gamma, c.path, c.has_confidence,
                                       target_model=target.model, refuse_start=i == 1))
    return out, [("fake nothing", "fake nothing: not exported (a test line)")]


def speculative_config(command: str) -> dict:
    """SGLang's flags in pdraft's words: the method, and the drafts per step (EAGLE-3's --speculative-num-steps;
    DFlash's block_size - 1, read from the config.json SGLang loads)."""
    argv = shlex.split(command.splitlines()[0])
    flag = lambda name: argv[argv.index(name) + 1] if name in argv else None  # noqa: E731
    model = flag("--speculative-draft-model-path")
    steps = flag("--speculative-num-steps")
    drafts = int(steps) if steps else json.loads((Path(model) / "config.json").read_text())["block_size"] - 1
    return {"method": flag("--speculative-algorithm").lower(), "draft_model_path": model,
            "num_speculative_tokens": drafts}


def served_config(spec: dict, export_dir: Path, num_speculative: int) -> dict:
    return {**spec, "draft_model_path": str(export_dir), "num_speculative_tokens": num_speculative}


def replay_contender(recipe, served, ours, export_dir, spec, gamma, *, vocab_size, dtype, context, scratch):
    SERVED.append({"target": str(served), "export": str(export_dir), "method": spec["method"], "gamma": gamma,
                   "dtype": dtype, "context": context})
    return FakeEngineContender(f"fake {ours.label}", ours.kind, ours.make, ours.max_gamma, ours.path,
                               ours.has_confidence, target_model=ours.target_model, skew=SKEW["rounds"])


def sps_profiler(recipe, target, points, *, context, requests, repeats):
    """calibrate-threshold's cost table "measured" in the fake engine: a made-up step time of 10 ms + 1 ms per
    token (so a test can tell the table from pdraft's own measurement), each call recorded in PROFILED."""
    PROFILED.append({"target": target.id, "points": list(points), "context": context, "requests": requests,
                     "repeats": repeats})
    return [0.010 + 0.001 * b for b in points], {
        "measured_in": {"engine": NAME, "version": "0"}, "measured": "a made-up step time", "device": None,
        "context_tokens": context}


PROFILED: list[dict] = []  # each sps_profiler call, newest last
ENGINE = Engine(NAME, "Fake", "sglang", contenders, speculative_config, served_config, replay_contender,
                sps_profiler=sps_profiler, cause_notes={"layer-ids": "fake reads them in tests/fake_engine.py"})
