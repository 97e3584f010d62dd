"""Serving engines a bench can run its contenders in (`pdraft bench --engine NAME`, `bench.engine`), beside
pdraft's own loop: each is one module whose `contenders(...)` returns objects of the bench contender protocol
(pdraft.bench.contenders.Contender), registered here by name. Adding an engine (SGLang, when it installs here)
is one such module and one line in ENGINES."""

from __future__ import annotations

from collections.abc import Callable

from pdraft.errors import PdraftError

# name -> "module:function" building that engine's contenders (imported only when the engine is asked for).
ENGINES: dict[str, str] = {
    "vllm": "pdraft.bench.engines.vllm:contenders",
}


def engine_factory(name: str) -> Callable:
    """The contender factory of engine `name`, or a one-line error naming the registered ones."""
    import importlib

    if name not in ENGINES:
        raise PdraftError(f"unknown serving engine {name!r}: use one of {', '.join(sorted(ENGINES))}")
    module, function = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), function)
