"""llama.cpp as a serving engine (`--engine llamacpp`, issue 58): the engine CPU users run, serving pdraft's
drafters as GGUF files (`pdraft export --format gguf`, pdraft.hub.gguf) beside the target's own GGUF.

The build and the server process are pdraft.engines.llamacpp's; here is what the bench and check-serving ask of
them. One server per (drafter, gamma), plus one for the target alone, the speedup's reference; one slot
(`-np 1`), so requests run one after another and each one's verify steps are read from the log.

Draft length: llama.cpp clamps `--spec-draft-n-max` to the trained block with a warning
(common/speculative.cpp, common_speculative_impl_draft_dflash: block_size − 1 for DFlash and DFlash2, whose
first block slot is the bonus token; block_size for an anchor-first DSpark); pdraft refuses a gamma above it
in one line instead (max_draft), so a row never reports a gamma the engine did not run."""

from __future__ import annotations

import shlex
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pdraft.decode.greedy_audit import audit_scores
from pdraft.engines.llamacpp import (DSPARK_SPEC_TYPE, NAME, VERSION, LlamaServer, Served, ServerSpec, convert_target,
                                     spec_type)
from pdraft.errors import PdraftError
from pdraft.hub.export import export
from pdraft.hub.gguf import DRAFTER_NAME
from pdraft.metrics import RoundRecord, summarize_engine
from pdraft.policies import FULL
from pdraft.serving.api import Engine

# The largest top-2 logit gap llama.cpp's own numerics may flip. Measured (tests/engines/llamacpp_tie_drift.py, on
# the float32 SmolLM2 GGUF, 10 and 15 bench prompts, batches of 3 and 15 tokens against one-token steps): a batched
# evaluation moved the top-2 gap by at most 0.0093 (median 0.002); the bound is about twice that, for prompts and
# targets not measured, and far below what a wrong token shows (a corrupted output's gap is whole logits).
NEAR_TIE_GAP = 0.02
TOP_SCORES = 8  # the target alone's top log-probabilities read per token (its audit's scores)


def max_draft(kind: str, block_size: int | None, sample_from_anchor: bool = False) -> int | None:
    """The longest draft llama.cpp runs for this drafter (common/speculative.cpp: n_draft_max); None for a chain
    drafter (EAGLE-3: no block, llama.cpp drafts --spec-draft-n-max)."""
    if block_size is None:
        return None
    return block_size if spec_type(kind) == DSPARK_SPEC_TYPE and sample_from_anchor else block_size - 1


def check_gamma(kind: str, gamma: int, block_size: int | None, sample_from_anchor: bool = False) -> None:
    """One line where llama.cpp would clamp `gamma` (it warns and drafts fewer: common/speculative.cpp)."""
    top = max_draft(kind, block_size, sample_from_anchor)
    if top is not None and gamma > top:
        raise PdraftError(f"gamma {gamma} is above what llama.cpp drafts for this {kind} drafter ({top}: block size "
                          f"{block_size}{'' if top == block_size else ' less the bonus slot'}); it would clamp it "
                          f"to {top} (common/speculative.cpp)", hint=f"use gamma <= {top}")


def served_records(served: list[Served]) -> list[RoundRecord]:
    """pdraft's RoundRecords of llama.cpp's requests: the first token (from the prefill) as a target-only record,
    one record per verify step (gamma = l = drafted, a = accepted, committed = a + 1 up to what the output holds),
    one per token no step accounts for (a step with nothing drafted, or every step of the target alone)."""
    records, rnd = [], 0
    for request, s in enumerate(served):
        if not s.tokens:
            continue
        records.append(RoundRecord(request, rnd, 0, 0, 0, 1))
        rnd += 1
        left = len(s.tokens) - 1
        for accepted, drafted in s.steps:
            if left <= 0:
                break
            committed = min(accepted + 1, left)
            records.append(RoundRecord(request, rnd, drafted, drafted, accepted, committed))
            rnd, left = rnd + 1, left - committed
        for _ in range(left):
            records.append(RoundRecord(request, rnd, 0, 0, 0, 1))
            rnd += 1
    return records


@dataclass
class LlamaCppContender:
    """One bench row run by llama.cpp: the target GGUF alone (`drafter_gguf` None) or with a drafter GGUF."""

    label: str
    kind: str
    target_gguf: Path
    log_dir: Path
    drafter_gguf: Path | None = None
    block_size: int | None = None  # None: a chain drafter, no block (max_draft)
    sample_from_anchor: bool = False
    max_gamma: int | None = None
    path: str | None = None
    has_confidence: bool = False
    verify: object = None
    engine: str = NAME
    tree: tuple[int, int] | None = None
    chain: str | None = None
    context: int = 2048
    threads: int = 1
    # check-serving's replay: also serve the target alone and hold every greedy output with the drafter to it
    # (the engine's own losslessness); each prompt where they part is one line of engine_info["problems"]
    against_target: bool = False
    _servers: dict = field(default_factory=dict, repr=False)  # gamma -> a started LlamaServer; -1: the target alone

    @property
    def baseline(self) -> bool:
        return self.drafter_gguf is None

    def refusal(self, policy: str) -> str | None:
        if policy == FULL:
            return None
        return f"llama.cpp verifies the full draft here: pdraft's {policy} policy has no llama.cpp counterpart"

    def prepare(self, gammas) -> str | None:
        """Start one server per gamma (one for the target alone); one line, every server stopped, on a refusal."""
        try:
            for gamma in [0] if self.baseline else list(gammas):
                if not self.baseline:
                    check_gamma(self.kind, gamma, self.block_size, self.sample_from_anchor)
                spec = ServerSpec(self.target_gguf, self.drafter_gguf, None if self.baseline else self.kind, gamma,
                                  self.context, self.threads)
                log = self.log_dir / f"llamacpp-{_slug(self.label)}-g{gamma}.log"
                self._servers[gamma] = LlamaServer(spec, log).__enter__()
            if self.against_target and not self.baseline:
                spec = ServerSpec(self.target_gguf, context=self.context, threads=self.threads)
                log = self.log_dir / f"llamacpp-{_slug(self.label)}-target-alone.log"
                self._servers[-1] = LlamaServer(spec, log).__enter__()
        except PdraftError as e:
            self.close()
            return f"llama.cpp refuses {self.label}: {e.message}"
        return None

    def run(self, work, stream=None):
        from pdraft.bench.contenders import Decoded
        from pdraft.streams import request_seeds

        server = self._servers.get(0 if self.baseline else work.gamma)
        if server is None:
            raise PdraftError(f"{self.label}: no llama-server started for gamma {work.gamma}")
        d = work.decode
        t = d.sampling.temperature
        seeds = request_seeds(d.seed, 0, len(work.prompts))
        start = time.perf_counter()
        served = [server.complete(p, d.max_new_tokens, temperature=t, seed=seeds[i], top_k=d.sampling.top_k or 0,
                                  top_p=d.sampling.top_p or 1.0) for i, p in enumerate(work.prompts)]
        wall = time.perf_counter() - start
        records = served_records(served)
        if stream is not None:
            for r in records:
                stream.write_round(r)
        times = [(s.seconds, len(s.tokens) - 1) for s in served if len(s.tokens) > 1]
        info = {"name": NAME, "version": VERSION, "argv": server.spec.argv(server.binary, server.port)[1:],
                "drafted": sum(s.drafted for s in served), "accepted": sum(s.accepted for s in served)}
        if -1 in self._servers and t == 0:  # Engine contract: engine_info["problems"] joins check-serving's
            info["problems"], info["near_ties"] = self._hold_to_target(work, served)
            info["target_alone_equal"] = len(served) - len(info["problems"]) - len(info["near_ties"])
        return Decoded(records, [s.tokens for s in served], [s.finish_reason for s in served],
                       backend=f"llama.cpp {VERSION}", summary=summarize_engine(records, times, wall),
                       engine_info=info)

    def _hold_to_target(self, work, served: list[Served]) -> tuple[list[str], list[str]]:
        """The target alone's greedy outputs on the same prompts, each token with its top log-probabilities; where
        a prompt's drafted output parts from it, the divergence is audited against the target alone's own scores
        there (pdraft.decode.greedy_audit.audit_scores, bound NEAR_TIE_GAP): (problems, near-ties), a line each."""
        alone, problems, ties = self._servers[-1], [], []
        for i, (p, s) in enumerate(zip(work.prompts, served)):
            ref = alone.complete(p, work.decode.max_new_tokens, n_probs=TOP_SCORES)
            k = next((k for k, (x, y) in enumerate(zip(ref.tokens, s.tokens)) if x != y),
                     None if ref.tokens == s.tokens else min(len(ref.tokens), len(s.tokens)))
            if k is None:
                continue
            pick = lambda xs: xs[k] if k < len(xs) else None  # noqa: E731
            d = audit_scores(i, k, pick(s.tokens), pick(ref.tokens), pick(ref.top) or [], NEAR_TIE_GAP)
            where = f"prompt {i} (gamma {work.gamma}): llama.cpp's greedy output with the drafter parts from its " \
                    f"target alone at {d.line()}"
            (ties if d.rounding else problems).append(where if d.rounding else f"llama.cpp is not lossless here: {where}")
        return problems, ties

    def close(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80]


def speculative_config(command: str) -> dict:
    """The speculative setting of the llama-server command pdraft.hub.gguf printed: its --spec-type as `method`
    and --spec-draft-n-max as `num_speculative_tokens`."""
    argv = shlex.split(command.splitlines()[0])
    if "--spec-type" not in argv or "--spec-draft-n-max" not in argv:
        raise PdraftError(f"pdraft export printed no llama.cpp speculative setting: {command}")
    return {"method": argv[argv.index("--spec-type") + 1],
            "num_speculative_tokens": int(argv[argv.index("--spec-draft-n-max") + 1])}


def served_config(spec: dict, export_dir: Path, num_speculative: int) -> dict:
    """What llama-server is asked for: the printed setting, serving `export_dir`'s GGUF at `num_speculative`."""
    return {**spec, "model": str(Path(export_dir) / DRAFTER_NAME), "num_speculative_tokens": num_speculative}


def target_gguf(target_dir: Path, scratch: Path) -> Path:
    """The target's float32 GGUF, converted by llama.cpp's converter into `scratch` (the full-precision reference;
    a GGUF target such as SmolLM2's Q4_1 is passed to LlamaCppContender directly)."""
    return convert_target(target_dir, Path(scratch) / "target-f32.gguf")


def _drafter_contender(label: str, kind: str, path: str | None, target: Path, scratch: Path, gguf_dir: Path,
                       **extra) -> LlamaCppContender:
    from pdraft.models.checkpoint import load_drafter

    from pdraft.models.families import FAMILIES

    cfg = load_drafter(Path(path)).config
    block = cfg.block_size if FAMILIES.get(kind).drafting == "parallel" else None
    anchor = block is not None and cfg.block_convention == "deepspec"
    return LlamaCppContender(label, kind, target, scratch, Path(gguf_dir) / DRAFTER_NAME, block, anchor,
                             max_draft(kind, block, anchor), path, **extra)


def contenders(recipe, target, drafters: list, *, scratch: Path | None = None,
               warn=lambda _: None) -> tuple[list[LlamaCppContender], list[tuple[str, str]]]:
    """The target alone in llama.cpp (its float32 GGUF) and every drafter that exports to GGUF: (contenders,
    (label, one line) for each drafter that does not). A target converted from a quantized GGUF (SmolLM2's Q4_1:
    pdraft.targets.builtin.converted.source_gguf) is also served from that file, as its users run it: the same
    rows again, labelled with the quantization, their speedups against that file's target alone (engine
    `llamacpp-Q4_1`, its own group in the sweep)."""
    from pdraft.targets.builtin.converted import source_gguf

    scratch = Path(scratch or tempfile.mkdtemp(prefix="pdraft-llamacpp-bench-"))
    target_dir = Path(target.path).resolve()
    targets = [("llama.cpp", NAME, target_gguf(target_dir, scratch))]
    if (quantized := source_gguf(target_dir)) is not None:
        quant = quantized.stem.rsplit(".", 1)[-1]  # SmolLM2-135M-Instruct.Q4_1 -> Q4_1
        targets.append((f"llama.cpp {quant}", f"{NAME}-{quant}", quantized))
    out = [LlamaCppContender(f"{name} target alone", "target", tgt, scratch, engine=engine)
           for name, engine, tgt in targets]
    refused = []
    for i, c in enumerate(drafters):
        try:
            exported = export(c.path, "gguf", scratch / f"export-{i}", target=str(target_dir))
        except PdraftError as e:
            refused.append((f"llama.cpp {c.label}", f"llama.cpp {c.label}: not exported ({e.message})"))
            continue
        out += [_drafter_contender(f"{name} {c.label}", c.kind, c.path, tgt, scratch, exported.path, engine=engine)
                for name, engine, tgt in targets]
    return out, refused


def replay_contender(recipe, served: Path, ours, export_dir: Path, spec: dict, gamma: int, *, vocab_size: int,
                     dtype: str, context: int, scratch: Path) -> LlamaCppContender:
    """check-serving's llama.cpp: the served target converted to a float32 GGUF (`dtype` is float32 on pdraft's
    side too), serving `export_dir`'s GGUF at `gamma`, greedy, with room for `context` tokens."""
    tgt = target_gguf(Path(served), scratch)
    return _drafter_contender(f"llama.cpp {ours.label}", ours.kind, ours.path, tgt, scratch, export_dir,
                              context=max(context, 256), against_target=True)


ENGINE = Engine(
    NAME, "llama.cpp", "gguf", contenders, speculative_config, served_config, replay_contender,
    budget_end_undrafted=True, stop_draft_unaccepted=True, near_tie_gap=NEAR_TIE_GAP,
    cause_notes={
        "layer-ids": "the converter writes dflash.target_layers = id + 1 (conversion/qwen.py) and the loop captures "
                     "each listed layer's input (common/speculative.cpp, llama_set_embeddings_layer_inp)",
        "mask-token": "conversion/qwen.py writes tokenizer.ggml.mask_token_id from dflash_config.mask_token_id; "
                      "common/speculative.cpp reads it with llama_vocab_mask",
    })
