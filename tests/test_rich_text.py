"""Every string pdraft prints through rich is printed as it is (issue 45, class 6; the rule is pdraft/rich_text.py's
docstring): the scanner reads the package with `ast` and refuses a Console made outside pdraft/rich_text.py (one
that would read markup in a run label, a path or a model's output), `Text.from_markup` outside it, a progress
column that reads markup, and a rich call handed an f-string that writes markup around interpolated values (the
values would not be escaped: use `styled`). Each is also planted in a small source, which the scanner must find."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pdraft"
HOME = "pdraft/rich_text.py"
MARKUP_TAG = re.compile(r"\[/?(bold|dim|italic|underline|reverse|strike|link|red|green|yellow|blue|magenta|cyan|white)?[\] =]")
RICH_CALLS = {"print", "rule", "log", "add_row", "add_column", "update"}


def _name(func) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def unescaped(files) -> list[str]:
    found = []
    for rel, text in files:
        if rel == HOME:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            if name == "Console":
                found.append(f"{rel}:{node.lineno}: a Console made outside {HOME} (use rich_text.console)")
            elif name == "from_markup":
                found.append(f"{rel}:{node.lineno}: Text.from_markup outside {HOME} (use rich_text.styled)")
            elif name == "TextColumn":
                markup = next((k.value for k in node.keywords if k.arg == "markup"), None)
                if not (isinstance(markup, ast.Constant) and markup.value is False):
                    found.append(f"{rel}:{node.lineno}: TextColumn reads markup (pass markup=False, style=...)")
            elif name in RICH_CALLS:
                for arg in node.args:
                    if isinstance(arg, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in arg.values):
                        literal = "".join(v.value for v in arg.values if isinstance(v, ast.Constant))
                        if MARKUP_TAG.search(literal):
                            found.append(f"{rel}:{node.lineno}: markup around f-string values (use rich_text.styled)")
    return found


def sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).as_posix(), path.read_text()


def test_every_rich_string_is_printed_as_it_is():
    found = unescaped(sources())
    assert not found, "\n".join(found)


PLANTED = {
    "console": "from rich.console import Console\nc = Console()\n",
    "from_markup": "from rich.text import Text\nt = Text.from_markup(x)\n",
    "text-column": "from rich.progress import TextColumn\nc = TextColumn('[bold]{task.description}')\n",
    "f-string-markup": "def f(out, path):\n    out.print(f'[green]ok[/green] {path}')\n",
    "f-string-rule": "def f(c, name):\n    c.rule(f'[bold]{name}')\n",
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_scanner_finds_each_planted_construct(name):
    assert unescaped([("pdraft/planted.py", PLANTED[name])]), name


def test_the_scanner_passes_styled_and_plain_values():
    clean = ("from pdraft.rich_text import styled\ndef f(out, path, n):\n"
             "    out.print(styled('[green]ok[/green] {}', path))\n    out.print(f'{n} rows, list [1, 2]')\n")
    assert not unescaped([("pdraft/planted.py", clean)])


def test_consoles_read_no_markup_and_styled_escapes():
    from pdraft.cli.common import err, out
    from pdraft.rich_text import styled

    assert out._markup is False and err._markup is False
    assert styled("[bold]{}[/bold]", "[/] [red]x").plain == "[/] [red]x"
