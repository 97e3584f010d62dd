"""The CLI contract: lifecycle groups in --help, --version, one-line user errors with exit code 2 and no
traceback (a traceback with --debug), and nothing written by a failing check."""

import subprocess
import sys

from pdraft import __version__
from pdraft.cli.main import main


def run(capsys, *args):
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def test_help_lists_groups(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert "Set up" in out and "recipe" in out and "env" in out


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"pdraft {__version__}"


def test_recipe_check_reports_each_problem_and_writes_nothing(capsys, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("train:\n  stpes: 1\n  batch_size: x\ndecode:\n  top_p: 2\n")
    before = sorted(tmp_path.iterdir())
    code, out, err = run(capsys, "recipe", "check", str(p))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 3
    assert all(line.startswith(f"error: {p}:") for line in lines)
    assert "Traceback" not in err
    assert sorted(tmp_path.iterdir()) == before


def test_recipe_check_ok_and_show(capsys):
    assert run(capsys, "recipe", "check")[0] == 0
    code, out, _ = run(capsys, "recipe", "show", "--set", "decode.gamma=8")
    assert code == 0 and "gamma: 8" in out


def test_usage_error_exits_2(capsys):
    code, _, err = run(capsys, "recipe", "nosuchcommand")
    assert code == 2 and "No such command" in err


def test_console_script_one_line_error_and_debug_traceback(tmp_path):
    missing = tmp_path / "none.yaml"
    cmd = [sys.executable, "-m", "pdraft.cli.main", "recipe", "check", str(missing)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: {missing}: recipe file not found"
    res = subprocess.run(cmd[:3] + ["--debug"] + cmd[3:], capture_output=True, text=True)
    assert res.returncode != 0 and "Traceback" in res.stderr


def test_env_json(capsys):
    import json

    from pdraft.runtime import cpu_has_bf16

    code, out, _ = run(capsys, "env", "--json")
    info = json.loads(out)
    # runtime.dtype auto: bf16 on a CPU with bf16 units, else float32 (pdraft.runtime.resolve_dtype)
    assert code == 0 and info["device"] == "cpu" and info["dtype"] == ("bfloat16" if cpu_has_bf16() else "float32")


def test_tables_written_to_a_log_get_a_wide_console(monkeypatch):
    """Off a terminal rich would squeeze bench and calibrate tables into 80 columns of truncated cells."""
    import io

    from pdraft.cli.common import LOG_WIDTH, _width

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("COLUMNS", raising=False)
    assert _width(io.StringIO()) == LOG_WIDTH and LOG_WIDTH >= 150
    assert _width(Tty()) is None  # a terminal reports its own width
    monkeypatch.setenv("COLUMNS", "100")
    assert _width(io.StringIO()) is None  # rich honours COLUMNS itself
