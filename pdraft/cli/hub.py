"""`pdraft pull`, `pdraft push` and `pdraft export`: thin commands over pdraft.hub. They parse, call the library
and print a short human view or JSON (--json); every user mistake arrives as a PdraftError, which main.py turns
into one line on stderr. The token is never an option (it would land in shell history): it comes from HF_TOKEN
or `hf auth login`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdraft.cli.common import JsonOpt, out, print_json
from pdraft.hub.export import FORMATS
from pdraft.models.families import FAMILIES
from pdraft.rich_text import styled


def pull(
    source: Annotated[str, typer.Argument(help="Hub repository id (owner/name) or a local drafter folder.", metavar="REPO_ID_OR_PATH")],
    revision: Annotated[str | None, typer.Option("--revision", help="Branch, tag or commit of a Hub repository.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Install a validated copy here (new or empty folder); default: use the cache/folder in place.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Fetch a drafter, check and validate it, and make it usable by decode/bench/calibrate.

    Examples:
      pdraft pull deepseek-ai/dspark_qwen3_4b_block7 --out drafters/dspark-4b
      pdraft pull z-lab/Qwen3-8B-DFlash-b16 --revision main
      HF_HUB_OFFLINE=1 pdraft pull deepseek-ai/dflash_qwen3_4b_block7   # from the cache only
    """
    from pdraft.hub import pull as do_pull

    got = do_pull(source, revision=revision, out=out_dir)
    if json_out:
        print_json(got.to_dict())
        return
    cfg = got.config
    out.print(styled("[bold]{}[/] drafter ready at {}", got.family, got.path))
    block = (f"block size {cfg.block_size} ({cfg.block_convention} convention, up to gamma {cfg.num_gamma})"
             if FAMILIES.of(cfg).drafting == "parallel" else f"a chain of one pass per draft, up to gamma {cfg.num_gamma}")
    out.print(f"  {block}, {cfg.num_hidden_layers} layers, target layers {cfg.target_layer_ids}")
    if got.ignored:
        out.print(f"  not fetched (code, pickle or other files): {', '.join(got.ignored)}")
    out.print(f"  next: pdraft decode --drafter {got.path} --prompt 'Hello'")


def push(
    drafter_dir: Annotated[Path, typer.Argument(help="Drafter folder (config.json + model.safetensors).", metavar="DRAFTER_DIR")],
    repo_id: Annotated[str, typer.Argument(help="Hub repository to create or update (owner/name).", metavar="REPO_ID")],
    private: Annotated[bool, typer.Option("--private", help="Create the repository as private.")] = False,
    revision: Annotated[str | None, typer.Option("--revision", help="Branch to commit to (created if missing).")] = None,
    bench_report: Annotated[Path | None, typer.Option("--bench-report", help="bench.json written by `pdraft bench` (in its own folder) to upload and quote in the model card.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Upload weights, config, recipe, calibration, cost table, bench report and a model card in ONE commit.

    Only files pdraft itself wrote are uploaded, checked by content against the list it keeps of them
    (.pdraft-files); a drafter written by an older pdraft: make a checked copy with `pdraft pull DIR --out NEW`.
    The token comes from HF_TOKEN or `hf auth login` and is never printed.

    Examples:
      pdraft push runs/pdraft-run/dspark you/qwen3-4b-dspark
      pdraft push runs/pdraft-run/dspark you/qwen3-4b-dspark --private --revision v2
      pdraft push runs/pdraft-run/dspark/final you/qwen3-4b-dspark --bench-report runs/pdraft-run/bench/bench.json
    """
    from pdraft.hub import push as do_push

    got = do_push(drafter_dir, repo_id, private=private, revision=revision, bench_report=bench_report)
    if json_out:
        print_json(got.to_dict())
        return
    out.print(styled("pushed {} files to [bold]{}[/] in one commit: {}", len(got.files), got.repo_id, got.url or got.commit))
    out.print(f"  {', '.join(got.files)}")


def export(
    drafter_dir: Annotated[Path, typer.Argument(help="Drafter folder to convert.", metavar="DRAFTER_DIR")],
    fmt: Annotated[str, typer.Option("--format", help=f"Layout to write: {', '.join(FORMATS)}.", show_default=False)],
    out_dir: Annotated[Path, typer.Option("--out", help="New or empty folder for the engine's layout.", show_default=False)],
    target: Annotated[str | None, typer.Option("--target", help="Target model for the printed serve command (default: the recipe's, when a Hub id).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Then run check-serving on the written folder in the registered serving engine that loads --format (pdraft check-serving --engine): it must serve it as the drafter decodes.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write the layout vLLM, SGLang or z-lab loads, and print the exact serve command.

    Conversions that would change the drafter's behaviour are refused with the reason.

    Examples:
      pdraft export runs/pdraft-run/dspark --format vllm --out serve/dspark-vllm
      pdraft export runs/pdraft-run/dspark --format sglang --out serve/dspark-sglang
      pdraft export drafters/zlab-b16 --format zlab-dflash --out serve/zlab
      pdraft export runs/pdraft-run/dflash2 --format vllm --out serve/dflash2-vllm
    """
    from pdraft.errors import PdraftError
    from pdraft.hub import export as do_export

    if check:  # an engine that serves `fmt` (pdraft.serving.ENGINES)
        from pdraft.serving import ENGINES, engines_serving

        servers = engines_serving(fmt)
        if not servers or json_out:
            titles = " or ".join(e.title for e in ENGINES.values())
            formats = " or ".join(dict.fromkeys(f"--format {e.export_format}" for e in ENGINES.values()))
            raise PdraftError(f"--check serves the export in {titles}: give it with {formats} and without --json",
                              hint="or run pdraft check-serving DRAFTER --export OUT afterwards")
    got = do_export(drafter_dir, fmt, out_dir, target=target)
    if json_out:
        print_json(got.to_dict())
        return
    out.print(f"wrote {got.fmt} layout to {got.path}: {', '.join(got.files)}")
    for note in got.notes:
        out.print(f"  note: {note}")
    out.print("serve it with:")
    out.print(got.command, markup=False)
    if check:
        from pdraft.cli.check_serving import check_serving

        check_serving(drafter_dir, engine=servers[0].name, export_dir=got.path, recipe=None, set_=None, target=None,
                      num_prompts=2, max_new_tokens=32, num_speculative_tokens=None, replay=None, json_out=False)
