"""The contract of a serving engine: everything `pdraft bench --engine NAME`, `pdraft check-serving --engine
NAME` (with `pdraft export --check`) and `pdraft calibrate-threshold --engine NAME` need of one engine, declared
in one place. Each engine module holds one Engine, pdraft.serving registers it by name in ENGINES, and the bench,
the serving check, calibration and the CLI ask that registry; none of them imports an engine module. Its
contenders implement pdraft.bench.contenders.Contender."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Engine:
    name: str  # --engine NAME, bench.engine
    title: str  # how messages name it ("vLLM")
    export_format: str  # the pdraft.hub.export format it serves (pdraft/hub/ENGINES.md)
    contenders: Callable
    """The bench's: (recipe, target, drafters, *, scratch=None, warn) -> (contenders, [(label, one line)] for each
    drafter it cannot serve); `drafters` are pdraft's own contenders (label, kind, path)."""
    speculative_config: Callable[[str], dict]
    """The serve command pdraft.hub.export printed for `export_format` -> its speculative config, holding at least
    `method` and `num_speculative_tokens` (what check-serving holds against the trained block)."""
    served_config: Callable
    """(that config, the export folder served, num_speculative_tokens) -> the config the engine is asked for."""
    replay_contender: Callable
    """check-serving's: (recipe, served target folder, ours, export folder, speculative config, gamma, *,
    vocab_size, dtype, context, scratch) -> a contender serving the export greedily at gamma, beside `ours`
    (pdraft's contender of the drafter); its `prepare([gamma])` says in one line when the engine refuses it, and
    its Decoded's engine_info["problems"], where present, are check-serving problems of the engine's own (llama.cpp:
    its greedy output with the drafter against its target alone).
    `context`: the longest prompt plus its new tokens; `scratch`: where its logs go."""
    sps_profiler: Callable | None = None
    """calibrate-threshold's `--engine` (calibrate.sps_engine): (recipe, target, points, *, context, requests,
    repeats) -> (the median seconds of one engine step holding B new tokens in total, for each B of `points`;
    what the cost table's metadata records of the measurement: at least `measured_in` ({"engine", "version"}),
    `measured` (what one step was), `device` (None: the CPU pdraft runs on) and `context_tokens`). None: this
    engine cannot measure the table (pdraft.serving.sps_profiler refuses it in one line)."""
    budget_end_undrafted: bool = False
    """The engine drafts nothing for a request's last budgeted token (llama.cpp: tools/server/server-context.cpp,
    get_n_draft_max caps a draft at the remaining budget less one), so check-serving's replay lets it count one
    round fewer than pdraft's capped last round (pdraft.serving.check.compare_rounds)."""
    stop_draft_unaccepted: bool = False
    """The engine never counts a drafted end-of-generation token as accepted unless it is the draft's last token: it
    takes it as the step's own token (llama.cpp: common/sampling.cpp:704), where pdraft counts every draft its target
    agrees with, up to and past the stop token. check-serving counts a request's stop round as the engine does
    (pdraft.serving.check.stop_round)."""
    near_tie_gap: float = 0.0
    """The largest top-2 logit gap the engine's own numerics may flip (its batched verify against its one-token
    steps), measured (llama.cpp: tests/engines/llamacpp_tie_drift.py); check-serving audits a greedy divergence
    with it as the least bound (pdraft.decode.greedy_audit), so a flip below it is a near-tie that ends that
    prompt's comparison and anything above it fails. 0: unmeasured, only pdraft's own rounding counts."""
    cause_notes: dict[str, str] = field(default_factory=dict)
    """check-serving cause (pdraft.serving.check.CAUSES) -> where this engine's loader reads it, cited after the
    cause's text."""
