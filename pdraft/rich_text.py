"""The one rule for text pdraft prints through rich (issue 45, class 6): pdraft's consoles never read markup in a
plain string, so a run label, a file name, a prompt or a model's output holding `[bold]` or `[/]` prints as it
is (it crashed `monitor` and mangled decoded text). pdraft's own styling is written as a template whose values
are escaped: `styled("[yellow]warning:[/yellow] {}", message)`. Every Console pdraft makes comes from
`console()`; tests/test_rich_text.py walks the package for a Console made elsewhere, a markup template filled by
an f-string, and a progress column that reads markup."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text


def console(**kwargs) -> Console:
    """A rich Console that reads no markup in plain strings (styles come through `styled` or Text)."""
    return Console(markup=False, **kwargs)


def styled(template: str, *values: object) -> Text:
    """`template` (rich markup written by pdraft, `{}` for each value) with every value escaped, so a value's
    brackets print as they are."""
    return Text.from_markup(template.format(*(escape(str(v)) for v in values)))


__all__ = ["console", "styled"]
