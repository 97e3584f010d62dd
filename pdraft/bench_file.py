"""The bench report on disk (`bench.json`), as read back: its schema tag and `BenchReport`, the figures the
model card shows (pdraft.hub.card) and that push and pull check in a copied report (pdraft.hub.companions). A
leaf like pdraft.calibration_files: sharing reads a bench report without importing the bench that writes it
(pdraft.bench.report), which itself runs the decoder."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from pdraft.models.family import MAX_GAMMA
from pdraft.readback import FileKind, Schema

SCHEMA = "pdraft.bench/1"
_Share = Annotated[float, Field(ge=0, le=1)]


class _RunSummary(Schema):
    tau: Annotated[float, Field(ge=0, le=MAX_GAMMA + 1)] | None
    token_acceptance: _Share | None = None


class _Run(Schema):
    domain: str
    drafter: str
    kind: str
    gamma: int = Field(ge=0, le=MAX_GAMMA)  # 0: the target alone
    summary: _RunSummary
    speedup: Annotated[float, Field(gt=0, le=1e6)] | None = None
    temperature: Annotated[float, Field(ge=0, le=5)] | None = None  # absent in reports from before temperatures


class BenchReport(Schema):
    """What a bench.json read back must hold (the model card reads it when it is pushed; pull checks a copied
    one): pdraft's schema tag and the measured runs, each figure typed, in range and finite."""

    schema_: Literal["pdraft.bench/1"] = Field(alias="schema")
    runs: list[_Run] = Field(max_length=1_000_000)
    machine: dict[str, Any] | None = None


BENCH_REPORT = FileKind("bench report", 256 << 20, BenchReport)


__all__ = ["SCHEMA", "BenchReport", "BENCH_REPORT"]
