"""Sharing drafters: `pull` (a folder, the Hugging Face cache or a Hub download, checked and validated, never
pickle and never repository code), `push` (one Hub commit with weights, config, recipe, calibration, cost table,
bench report and a generated model card) and `export` (the layouts vLLM, SGLang and z-lab load, with the exact
serve command). File-name safety lives in files.py, the model card in card.py."""

from pdraft.hub.export import Exported, export
from pdraft.hub.pull import PulledDrafter, pull
from pdraft.hub.push import Pushed, push

__all__ = ["pull", "PulledDrafter", "push", "Pushed", "export", "Exported"]
