"""`pdraft env`: what the shared runtime resolves to on this machine (device, dtype, threads, versions,
cache folder), the CPU class and which fast paths run here and why the others do not (issue 56), and optionally
the facts of a target (layers, hidden size, the layer ids its drafter reads)."""

from __future__ import annotations

import platform
from typing import Annotated

import typer
from rich.table import Table

from pdraft.cli.common import JsonOpt, RecipeArg, SetOpt, out, print_json, recipe_from


def env(
    recipe: RecipeArg = None,
    set_: SetOpt = None,
    load_target: Annotated[bool, typer.Option("--target", help="Also load the recipe's target and show its layers.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Show the runtime every command will use, and optionally the target.

    Example: pdraft env recipes/quickstart.yaml --target
    """
    import torch
    import transformers

    from pdraft import __version__
    from pdraft.paths import cache_dir
    from pdraft.runtime import cpu_class, cpu_has_bf16, make_runtime

    r = recipe_from(recipe, set_)
    rt = make_runtime(r.runtime)
    info = {
        "pdraft": __version__, "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "machine": f"{platform.system()} {platform.machine()}",
        "device": str(rt.device), "dtype": str(rt.dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
        "attn_implementation": rt.attn_implementation, "offline": rt.offline,
        "cache_dir": str(cache_dir(rt.cache_dir)), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu_class": cpu_class(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_units": cpu_has_bf16(), "fast_paths": fast_paths(),
    }
    if load_target:
        from pdraft.targets.loader import load_target as load

        t = load(r.target, rt)
        info["target"] = {"id": t.id, "path": str(t.path), "num_layers": t.num_layers, "hidden_size": t.hidden_size,
                          "vocab_size": t.vocab_size, "max_context": t.max_context, "layer_ids": t.layer_ids,
                          "parameters": sum(p.numel() for p in t.model.parameters())}
    if json_:
        print_json(info)
        return
    table = Table(show_header=False, box=None)
    for key, value in info.items():
        if isinstance(value, dict):
            for k, v in value.items():
                table.add_row(f"{key}.{k}", str(v))
        else:
            table.add_row(key, str(value))
    out.print(table)


def fast_paths() -> dict[str, str]:
    """Each CPU fast path: whether it runs here and why (one line each; never raises)."""
    import torch

    from pdraft import gemm
    from pdraft.kernels import cc, cpu_bf16, cpu_loss, cpu_walks

    bf16 = cpu_bf16.kernels()
    return {
        "compiled_loops_level": f"{cc.march()} ({cc.MARCH_ENV}; {cc.ENV}={'0' if cc.disabled() else '1'})",
        "sequential_walks": cpu_walks.status(),
        "training_loss_rows": cpu_loss.status(),
        "bf16_loops": cpu_bf16.status(),
        "amx_tiles": ("granted: products of up to 32 rows on one thread" if bf16.amx else "not on this CPU or kernel")
        if bf16 is not None else "needs the bf16 loops",
        "onednn_packed_products": "available (timed against MKL per shape)" if gemm.onednn_available()
        else "not in this torch build: MKL only",
        "mkl": "available" if torch.backends.mkl.is_available() else "not in this torch build",
    }

