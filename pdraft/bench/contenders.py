"""What a bench compares, as objects: one protocol, `Contender`, that the gamma sweep (pdraft.bench.sweep) and the
serving sweep (pdraft.bench.serving) drive without asking what a contender is. A contender runs a `Workload` (a
set of requests at a concurrency, a sampling temperature, a gamma and a verification policy) and returns a
`Decoded` (per-round records, outputs, finish reasons, timings); it says whether it is a `baseline` (drafts
nothing: a speedup reference) and which `engine` runs it ("" = this process; speedups count against the
baselines of the same engine only, so a serving engine is compared with itself without speculation).

Implementations: `LoopContender` (pdraft's own loop, pdraft.decode.engine.generate: the target alone, a drafter
checkpoint, the n-gram baseline) and `GenerateContender` (transformers' `generate()`, pdraft.bench.hf_generate)
here; a serving engine's in its own module (pdraft.serving). Adding an engine is one module with a class
that satisfies this protocol and one pdraft.serving.api.Engine naming it, registered in pdraft.serving.ENGINES.

A workload's `concurrency` None runs the requests in static batches of `decode.batch_size` (the gamma sweep:
each batch one call, rounds renumbered across batches); an integer C keeps C requests in flight (the serving
sweep: pdraft's loop batches continuously, generate() runs static padded batches of C).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pdraft.metrics import RoundRecord, Summary, join_batches, summarize
from pdraft.policies.base import VerifyConfig
from pdraft.decode.settings import DecodeSettings

TARGET_LABEL = "target alone"
ENGINE_NOTE = ("{engines} rows: the engine's own figures (tau and acceptance from its per-request speculative metrics, "
               "TPOT from its first and last token times, total tokens/s over the wall time of the whole set, prefills "
               "inside); their speedups count against the same engine without speculation")


@dataclass
class Workload:
    """One run's requests and settings: what every contender is handed, whoever decodes it."""

    prompts: list[list[int]]  # token ids, through the chat template
    decode: DecodeSettings  # sampling, token budget, stream seed (request i draws from (seed, i)), batch size
    gamma: int  # 0 for a baseline
    verify: VerifyConfig  # the verification policy with its files (DecodeSettings.build_verify)
    concurrency: int | None = None  # None: static batches of decode.batch_size; C: C requests in flight
    eos_token_ids: Sequence[int] = ()
    pad_token_id: int = 0  # left padding of generate()'s batches


@dataclass
class Decoded:
    """What a contender returns for one workload. `summary` is summarize(records) unless the contender measured
    its timings elsewhere (a serving engine's own clock: pdraft.metrics.summarize_engine)."""

    records: list[RoundRecord]
    outputs: list[list[int]]
    finish_reasons: list[str]  # one per request: "eos" | "length" | ...
    backend: str = ""  # pdraft.decode.backend's name; "" where it does not apply
    compile_s: float = 0.0  # compiling during the run, kept out of its timings
    refills: int = 0  # slots taken by a request after another left them (continuous batching)
    summary: Summary | None = None
    engine_info: dict | None = None  # a serving engine's name, version and speculative config
    prefills_timed: bool = False  # continuous batching timed the refills' prefills apart (RoundRecord.prefill_s)

    def __post_init__(self):
        if self.summary is None:
            self.summary = summarize(self.records)


@runtime_checkable
class Contender(Protocol):
    """The one contract of a bench contender (module docstring)."""

    label: str  # the row's name, e.g. "dspark/final (dspark)"
    kind: str  # what bench.json records: "target", "generate", "ngram", a family's kind
    engine: str  # "" = this process; else the serving engine that runs it ("vllm")
    max_gamma: int | None  # the longest draft; None for a baseline
    path: str | None  # the drafter folder, if any
    has_confidence: bool
    verify: VerifyConfig | None  # this drafter's own policy (its calibration and cost table); None = the sweep's
    tree: tuple[int, int] | None  # (nodes, width): it verifies a tree per round (DecodeSettings.tree); None = a chain
    chain: str | None  # a tree contender: the label of the same drafter verifying a chain, its comparison

    @property
    def baseline(self) -> bool:
        """Drafts nothing: a speedup reference."""
        ...

    def refusal(self, policy: str) -> str | None:
        """Why verification policy `policy` cannot run here (one line), or None."""
        ...

    def prepare(self, gammas: Sequence[int]) -> str | None:
        """Get ready to run at `gammas` (a serving engine starts here, before anything is timed); one line saying
        why this contender cannot run at all, or None."""
        ...

    def run(self, work: Workload, stream=None) -> Decoded:
        """Decode `work`; `stream` (pdraft.bench.stream.MetricsStream) receives every round as it happens."""
        ...

    def close(self) -> None:
        """Release what `prepare` started."""
        ...


class InProcess:
    """What the contenders running in this process share: every policy may run (pdraft.bench.sweep.
    policy_applies decides with the drafter's heads), nothing to start or stop."""

    def refusal(self, policy: str) -> str | None:
        return None

    def prepare(self, gammas: Sequence[int]) -> str | None:
        return None

    def close(self) -> None:
        pass


@dataclass
class LoopContender(InProcess):
    """pdraft's own loop: the target alone (`make` returns None), a drafter checkpoint or the n-gram baseline."""

    label: str
    kind: str
    make: Callable[[list[list[int]]], object | None]  # the prompts of one generate() call -> drafter (None: target)
    max_gamma: int | None = None  # None for the target alone
    path: str | None = None
    has_confidence: bool = False
    verify: VerifyConfig | None = None
    target_model: object = field(default=None, repr=False)  # the loaded target it decodes with
    engine: str = ""
    tree: tuple[int, int] | None = None
    chain: str | None = None
    dtype: str = ""  # "" = the run's dtype; else the dtype of its own copy of the target (no identity is promised)
    drafter: object = field(default=None, repr=False)  # the loaded drafter checkpoint (None: a baseline, n-gram)

    @property
    def baseline(self) -> bool:
        return self.max_gamma is None

    def as_tree(self, nodes: int, width: int) -> LoopContender:
        """The same drafter verifying a tree of `nodes` nodes, `width` per node, labelled beside its chain."""
        return dataclasses.replace(self, label=f"{self.label} tree {nodes}x{width}", tree=(nodes, width),
                                   chain=self.label)

    def run(self, work: Workload, stream=None) -> Decoded:
        from pdraft.decode.engine import generate
        from pdraft.streams import request_seeds

        settings = work.decode.replace(gamma=work.gamma or None, tree=self.tree)
        on_round = None if stream is None else lambda event: _write_rounds(stream, event)
        if work.concurrency is not None:  # continuous batching over C slots, one call
            result = generate(self.target_model, self.make(work.prompts), work.prompts, settings,
                              verify=work.verify, eos_token_ids=work.eos_token_ids,
                              seeds=request_seeds(work.decode.seed, 0, len(work.prompts)),
                              concurrency=work.concurrency, on_round=on_round)
            return Decoded(result.records, result.output_ids, list(result.finish_reasons), result.backend,
                           result.compile_s, result.refills, result.summary(), prefills_timed=True)
        # Static batches, one call each; rounds and requests renumbered so they stay unique across batches
        # (metrics.summarize counts each round's time once per round number).
        batches: list[tuple[list[RoundRecord], int]] = []
        outputs: list[list[int]] = []
        reasons: list[str] = []
        backend, compile_s = "", 0.0
        batch = work.decode.batch_size
        for start in range(0, len(work.prompts), batch):
            chunk = [list(p) for p in work.prompts[start:start + batch]]
            result = generate(self.target_model, self.make(chunk), chunk, settings, verify=work.verify,
                              eos_token_ids=work.eos_token_ids,
                              seeds=request_seeds(work.decode.seed, start, len(chunk)), on_round=on_round)
            if stream is not None:
                stream.next_batch()
            batches.append((result.records, len(chunk)))
            outputs.extend(result.output_ids)
            reasons.extend(result.finish_reasons)
            backend, compile_s = result.backend, compile_s + result.compile_s
        return Decoded(join_batches(batches), outputs, reasons, backend, compile_s)


@dataclass
class GenerateContender(InProcess):
    """transformers' own generate() on the target (pdraft.bench.hf_generate): a second target-alone baseline,
    the loop users already run; static padded batches of `concurrency` (or the batch size)."""

    label: str
    kind: str = "generate"
    max_gamma: int | None = None
    path: str | None = None
    has_confidence: bool = False
    verify: VerifyConfig | None = None
    target_model: object = field(default=None, repr=False)
    engine: str = ""
    tree: tuple[int, int] | None = None
    chain: str | None = None
    # runtime.threads: "auto" measures generate()'s own thread count on a CPU (pdraft.threads.choose on a short
    # generate() of the run's first prompt) instead of inheriting the one measured on pdraft's loop: beside a busy
    # neighbour that loop runs best on one thread, where generate() is faster on two, and a baseline is timed at
    # its best, never at a setting that flatters the speedups.
    threads: int | str | None = None
    dtype: str = ""  # a copy of the target in another dtype than the run's (bench.float32_baseline); "" = the run's

    @property
    def baseline(self) -> bool:
        return True

    def run(self, work: Workload, stream=None) -> Decoded:
        import torch

        from pdraft.bench.hf_generate import measure_generate

        d = work.decode
        prior = torch.get_num_threads()
        chosen = self._own_threads(work)
        try:
            outputs, records = measure_generate(self.target_model, work.prompts,
                                                batch_size=work.concurrency or d.batch_size,
                                                max_new_tokens=d.max_new_tokens, eos_token_ids=work.eos_token_ids,
                                                pad_token_id=work.pad_token_id, sampling=d.sampling, seed=d.seed)
        finally:
            torch.set_num_threads(prior)
        if stream is not None:
            for r in records:
                stream.write_round(r)
        stops = set(work.eos_token_ids)
        reasons = ["eos" if o and o[-1] in stops else "length" for o in outputs]
        return Decoded(records, outputs, reasons, backend=f"transformers generate(), {chosen}" if chosen else "")

    def _own_threads(self, work: Workload) -> str:
        """Set generate()'s own threads for this run where `threads` is "auto" on a CPU; what was chosen, in words."""
        from pdraft import threads
        from pdraft.bench.hf_generate import generate_batch

        model = self.target_model
        if self.threads != "auto" or next(model.parameters()).device.type != "cpu" or not work.prompts:
            return ""
        batch = [list(p) for p in work.prompts[: work.concurrency or work.decode.batch_size]]

        def probe():
            generate_batch(model, batch, max_new_tokens=8, eos_token_ids=[], pad_token_id=work.pad_token_id)

        return threads.choose(probe, "auto", repeats=3).describe()


def _write_rounds(stream, event) -> None:
    """The metrics stream sees every round as it happens, so `pdraft monitor` follows a sweep live."""
    for r in event.records:
        stream.write_round(r)


def count_reasons(reasons: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for reason in reasons:
        out[reason] = out.get(reason, 0) + 1
    return out
