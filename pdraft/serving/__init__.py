"""Serving engines beside pdraft's own loop: the bench's engine contenders (`pdraft bench --engine NAME`,
`bench.engine`) and the serving check (`pdraft check-serving`, pdraft.serving.check). Each engine is one module
whose `contenders(recipe, target, drafters)` returns objects of the bench contender protocol
(pdraft.bench.contenders.Contender), registered here by name; adding SGLang, when it installs here, is one such
module and one line in ENGINES. This package sits above pdraft.bench (whose contracts it implements) and
pdraft.hub (whose export it serves); the bench receives an engine's contender factory from its caller."""

from __future__ import annotations

from collections.abc import Callable

from pdraft.errors import PdraftError
from pdraft.serving import vllm

ENGINES: dict[str, Callable] = {
    vllm.ENGINE: vllm.contenders,
}


def engine_factory(name: str) -> Callable:
    """The contender factory of engine `name`, or a one-line error naming the registered ones."""
    if name not in ENGINES:
        raise PdraftError(f"unknown serving engine {name!r}: use one of {', '.join(sorted(ENGINES))}")
    return ENGINES[name]
