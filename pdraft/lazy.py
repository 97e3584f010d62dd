"""Objects named "package.module:attr" and imported on first use. The registries (drafter families in
pdraft.models.families, verification policies in pdraft.policies) are read by torch-free code such as
the recipe, so they name their torch-side implementation instead of importing it; `load` imports it when a
drafter is built or a policy chosen. tests/test_import_graph.py counts such a name as an import."""

from __future__ import annotations

import importlib
from typing import Any


def load(path: str) -> Any:
    """The object `path` ("pdraft.models.dspark.model:DSparkDrafter") names."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"{path!r} is not a 'package.module:attr' name")
    return getattr(importlib.import_module(module), attr)
