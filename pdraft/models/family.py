"""What a drafter family is to the rest of pdraft. Each family writes one `FamilySpec` in its own folder
(pdraft/models/<kind>/family.py) and registers it with one line in pdraft/models/families.py; every command
asks the spec, never the family's name: its config class and model class, the checkpoint layouts it reads and
writes, the recipe fields it adds and their cross-checks, how a recipe's drafter section becomes its config,
its training loss defaults, its engine export plan, whether it can have a confidence head and
which recipe key gives it one, and what the quickstart changes to compare it with the others. The drafter
itself answers the rest through its model class (pdraft.models.api.Drafter: initialisation, training terms,
proposing, its own training term and the metrics that term logs) and its config (sizes, `has_confidence`,
model-card lines).

Torch-free by design: the recipe (check, show, explain) reads every spec without importing torch, so a spec
names its model class ("pdraft.models.dspark.model:DSparkDrafter") and pdraft.lazy imports it when a drafter
is built. MAX_GAMMA, the gamma ceiling every family and every command shares, is written here once, and so is
`Limit`, the one range of a drafter setting that both the recipe key and the config.json field take."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from pdraft.errors import PdraftError
from pdraft.lazy import load

# The longest draft block any drafter has, so the largest gamma anything drafts, verifies or sweeps (recipe
# ranges, drafter configs, decode settings, the n-gram baseline, bench); tests/test_one_rule.py keeps it single.
MAX_GAMMA = 32

RecipeFields = Mapping[str, tuple[Any, Any]]  # recipe key -> (annotation, pydantic FieldInfo)


@dataclass(frozen=True)
class Limit:
    """The one range of a drafter setting: the recipe key that sets it (`recipe_field`) and the config.json field
    that records it (`schema_entry`, for pdraft.models.schema) take the same bounds, so a drafter the recipe
    refuses to build is never loaded from a config either (issue 33: selector_top_k was capped at 1,024 by one
    and 4,096 by the other). `off` is the value config.json writes for "not set" (0: a dense MLP, no head),
    which the file may hold besides the range; the recipe says "not set" with null or its own default."""

    low: int | float
    high: int | float
    off: int | None = None

    def recipe_field(self, default: Any, description: str) -> Any:
        return Field(default, description=description, ge=self.low, le=self.high)

    def schema_entry(self, kind: str = "int") -> tuple:
        return (kind, self.low, self.high, self.off)


@dataclass(frozen=True)
class LlamaCpp:
    """How llama.cpp serves a family (issue 58): its `--spec-type` (common/speculative.cpp, the type-name table)
    and the `general.architecture` its converter writes for the family's checkpoints (convert_hf_to_gguf.py),
    None where pdraft does not write the family's GGUF yet (pdraft export --format gguf refuses it)."""

    spec_type: str
    architecture: str | None = None
    # where architecture is None: why pdraft does not write it yet, what llama.cpp's converter or loader would
    # misread, citing the pinned tree's line (pdraft export --format gguf says it in one line)
    unwritten: str = ""
    source: str = "zlab-dflash"  # the pdraft export format the converter reads (pdraft.hub.export.export_gguf)
    # (config.json of that export, the drafter's config) -> what the converter must read instead, where they differ
    prepare: Callable[[dict, Any], dict] | None = None
    # the drafter's config -> [(GGUF key, the value it must hold, why: the loader line that reads it)], read back
    written: Callable[[Any], list] | None = None


@dataclass(frozen=True)
class FamilySpec:
    kind: str  # `drafter.kind` in a recipe, `pdraft.kind` in config.json
    title: str  # as people write it: tables, the model card, messages
    summary: str  # what the family adds, for the recipe's `drafter.kind` description
    config: type  # its typed config (a dataclass that round-trips through to_dict / from_dict)
    model: str  # "module:Class" of its model (pdraft.models.api.Drafter), imported when a drafter is built
    layouts: tuple  # the pdraft.models.formats.Layout(s) its checkpoints are read from and written in
    default_layout: Callable[[Any], str]  # config -> the layout name save_drafter writes by default
    plan: Callable[[Any, str, str], Any]  # (config, export format, engine name) -> pdraft.models.formats.EnginePlan
    drafting: str = "parallel"  # "parallel" (one pass per block) or "autoregressive" (one pass per draft)
    drafter_fields: RecipeFields = field(default_factory=dict)  # recipe `drafter.*` keys it adds
    train_fields: RecipeFields = field(default_factory=dict)  # recipe `train.*` keys it adds (its loss weights)
    # (drafter section) -> None: cross-checks of its recipe keys, raising ValueError with a whole sentence; it
    # may set a key the family fixes (DFlash2's block convention), so the resolved recipe says what is built.
    recipe_check: Callable[[Any], None] | None = None
    # (drafter section) -> the config fields it sets (the parallel families start from models.dflash.config.recipe_fields);
    # the target's sizes, its layer ids and the mask token are added by pdraft.models.build.build_from_recipe.
    config_fields: Callable[[Any], dict] = lambda section: {}
    loss_defaults: Mapping[str, float] = field(default_factory=dict)  # train loss weights a null key takes
    confidence_field: str | None = None  # the `drafter.*` key that gives it a confidence head; None: never
    quickstart: Callable[[Any], list[str]] = lambda section: []  # overrides that make it comparable side by side
    default: bool = False  # the family a recipe trains when it names none (exactly one is)
    llamacpp: LlamaCpp | None = None  # how llama.cpp serves it (pdraft.serving.llamacpp); None: it does not

    def model_class(self) -> type:
        return load(self.model)

    def has_confidence(self, section) -> bool:
        """Whether a drafter built from this recipe `drafter` section has a confidence head."""
        return self.confidence_field is not None and bool(getattr(section, self.confidence_field))


class Registry:
    """The registered families, in registration order (the order of recipe fields, listings and the quickstart)."""

    def __init__(self, specs: Iterable[FamilySpec]):
        self._specs: dict[str, FamilySpec] = {}
        for spec in specs:
            if spec.kind in self._specs:
                raise ValueError(f"drafter family {spec.kind!r} is registered twice")
            self._specs[spec.kind] = spec

    def __iter__(self):
        return iter(self._specs.values())

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._specs)

    @property
    def default(self) -> FamilySpec:
        (spec,) = [spec for spec in self if spec.default]
        return spec

    def get(self, kind: str) -> FamilySpec:
        if kind in self._specs:
            return self._specs[kind]
        raise PdraftError(f"unknown drafter kind {kind!r}: expected one of {self.kinds}")

    def of(self, config) -> FamilySpec:
        """The family of a drafter config (anything with a registered `kind`)."""
        return self.get(config.kind)

    @property
    def layouts(self) -> tuple:
        """Every family's checkpoint layouts, each once, in registration order."""
        seen: dict[str, Any] = {}
        for spec in self:
            for layout in spec.layouts:
                seen.setdefault(layout.name, layout)
        return tuple(seen.values())

    def titles(self, where: Callable[[FamilySpec], bool] = lambda spec: True, last: str = "and") -> str:
        """'DFlash, DSpark and DFlash2' (the titles of the families `where` selects, `last` before the last one),
        for descriptions."""
        names = [spec.title for spec in self if where(spec)]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


__all__ = ["MAX_GAMMA", "Limit", "FamilySpec", "Registry", "RecipeFields", "LlamaCpp"]
