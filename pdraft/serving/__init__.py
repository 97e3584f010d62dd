"""Serving engines beside pdraft's own loop: the bench's engine contenders (`pdraft bench --engine NAME`,
`bench.engine`), the serving check (`pdraft check-serving`, pdraft.serving.check) and the cost table measured in
the engine (`pdraft calibrate-threshold --engine NAME`). Each engine is one module holding one Engine
(pdraft.serving.api: its export format, its bench contenders, which implement pdraft.bench.contenders.Contender,
its replay contender and speculative config for the serving check, its SPS profiler, the loader files it reads),
registered here by name; adding SGLang, when it installs here, is one such module and one line in ENGINES. This
package sits above pdraft.bench (whose contracts it implements) and pdraft.hub (whose export it serves); the bench
receives an engine's contender factory from its caller, and calibration its SPS profiler."""

from __future__ import annotations

from collections.abc import Callable

from pdraft.errors import PdraftError
from pdraft.serving import llamacpp, vllm
from pdraft.serving.api import Engine

ENGINES: dict[str, Engine] = {
    vllm.ENGINE.name: vllm.ENGINE,
    llamacpp.ENGINE.name: llamacpp.ENGINE,
}


def get_engine(name: str) -> Engine:
    """Engine `name`, or a one-line error naming the registered ones."""
    if name not in ENGINES:
        raise PdraftError(f"unknown serving engine {name!r}: use one of {', '.join(sorted(ENGINES))}")
    return ENGINES[name]


def engine_factory(name: str) -> Callable:
    """The bench's contender factory of engine `name` (Engine.contenders)."""
    return get_engine(name).contenders


def sps_profiler(name: str) -> Callable:
    """The cost-table profiler of engine `name` (Engine.sps_profiler), or a one-line error naming the engine."""
    engine = get_engine(name)
    if engine.sps_profiler is None:
        raise PdraftError(f"{engine.title} ({name}) cannot measure the scheduler's cost table: it has no SPS profiler",
                          hint="drop --engine (calibrate.sps_engine) to measure it with pdraft's own verifier")
    return engine.sps_profiler


def engines_serving(fmt: str) -> list[Engine]:
    """The registered engines that serve pdraft.hub.export's format `fmt`, in registration order."""
    return [e for e in ENGINES.values() if e.export_format == fmt]
