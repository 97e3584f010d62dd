"""The `pdraft` command: wires the thin command files into one typer app, grouped by lifecycle stage, and
turns every user error, and every file-system error (OSError), into one line on stderr with exit code 2
(`--debug` or PDRAFT_DEBUG=1 shows the traceback).
Commands arrive here as their features are built; none is a placeholder."""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated

from pdraft.threads import apply_wait_policy  # noqa: E402  (imports no torch)

apply_wait_policy()  # before torch is imported anywhere: a bounded spin (pdraft.threads)

import typer  # noqa: E402

from pdraft import __version__  # noqa: E402
from pdraft.cli import recipe as recipe_cmd  # noqa: E402
from pdraft.cli.bench import bench  # noqa: E402
from pdraft.cli.calibrate import calibrate_threshold  # noqa: E402
from pdraft.cli.check_serving import check_serving  # noqa: E402
from pdraft.cli.decode import decode  # noqa: E402
from pdraft.cli.env import env  # noqa: E402
from pdraft.cli.export_hidden import export_hidden  # noqa: E402
from pdraft.cli.hub import export, pull, push  # noqa: E402
from pdraft.cli.monitor import monitor  # noqa: E402
from pdraft.cli.quickstart import quickstart  # noqa: E402
from pdraft.cli.target import app as target_app  # noqa: E402
from pdraft.cli.train import train  # noqa: E402
from pdraft.errors import EXIT_USER_ERROR, PdraftError  # noqa: E402
from pdraft.models.families import FAMILIES  # noqa: E402

SETUP, TRAIN, CALIBRATE, RUN, SHARE = "1. Set up", "2. Train", "3. Calibrate", "4. Decode and measure", "5. Share"

app = typer.Typer(
    name="pdraft",
    help=f"Parallel-draft speculative decoding: from a target model to a trained, calibrated "
         f"{FAMILIES.titles(lambda f: f.drafting == 'parallel', last='or')} drafter (one pass drafts the whole block), "
         f"measured against {FAMILIES.titles(lambda f: f.drafting == 'autoregressive', last='or')} (a chain: one "
         f"drafter pass per drafted token).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"pdraft {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks for errors.")] = False,
) -> None:
    if debug:  # never switch off what PDRAFT_DEBUG switched on
        _state["debug"] = True


app.command("quickstart", rich_help_panel=SETUP)(quickstart)
app.add_typer(recipe_cmd.app, name="recipe", rich_help_panel=SETUP)
app.add_typer(target_app, name="target", rich_help_panel=SETUP, help="Build and evaluate the embedded target.")
app.command("env", rich_help_panel=SETUP)(env)
app.command("export-hidden", rich_help_panel=TRAIN)(export_hidden)
app.command("train", rich_help_panel=TRAIN)(train)
app.command("calibrate-threshold", rich_help_panel=CALIBRATE)(calibrate_threshold)
app.command("decode", rich_help_panel=RUN)(decode)
app.command("bench", rich_help_panel=RUN)(bench)
app.command("monitor", rich_help_panel=RUN)(monitor)
app.command("pull", rich_help_panel=SHARE)(pull)
app.command("push", rich_help_panel=SHARE)(push)
app.command("export", rich_help_panel=SHARE)(export)
app.command("check-serving", rich_help_panel=SHARE)(check_serving)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Returns the exit code (0; 2 for user and usage errors; 1 for bugs).

    Typer runs in standalone mode so that its own usage errors keep their usual output and exit code 2
    (typer vendors its own Click, so its exception types are not importable as `click.*`)."""
    args = list(sys.argv[1:] if argv is None else argv)
    _state["debug"] = "--debug" in args or os.environ.get("PDRAFT_DEBUG", "") not in ("", "0")
    try:
        app(args=args, prog_name="pdraft", standalone_mode=True)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except PdraftError as e:
        if _state["debug"]:
            raise
        for line in getattr(e, "problems", None) or [e.one_line()]:
            sys.stderr.write(f"error: {line}\n")
        return EXIT_USER_ERROR
    except OSError as e:
        # The file system said no (full, read-only, permissions, a file where a folder belongs): the user's
        # machine, not a bug, so one line naming the path. --debug or PDRAFT_DEBUG=1 still shows the traceback.
        if _state["debug"]:
            raise
        sys.stderr.write(f"error: {os_error_line(e)}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return 0


_OS_HINTS = {
    errno.ENOSPC: "free some space, or write elsewhere",
    errno.EDQUOT: "free some space, or write elsewhere",
    errno.EACCES: "check that path's permissions, or choose another location",
    errno.EPERM: "check that path's permissions, or choose another location",
    errno.EROFS: "the file system is read-only: choose a writable location",
    errno.ENOENT: "check that the path exists",
    errno.ENOTDIR: "a file stands where a folder is expected: move it or choose another path",
    errno.EISDIR: "a folder stands where a file is expected: choose a file path",
    errno.EEXIST: "something already exists there: move it or choose another path",
    errno.ENAMETOOLONG: "use a shorter path",
}


def os_error_line(e: OSError) -> str:
    """One line for a file-system error: what failed, on which path(s), and what to do."""
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    what = e.strerror or type(e).__name__
    hint = _OS_HINTS.get(e.errno, "check the path, or rerun with --debug for the traceback")
    return " ".join(f"{what}{': ' + where if where else ''} ({hint})".split())


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
