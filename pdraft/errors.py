"""The one user-error type. Anything a user can cause (a bad recipe, a missing file, an unknown target, a
wrong argument) raises `PdraftError`; the CLI prints its message as one line on stderr and exits with code 2.
Programming errors stay ordinary exceptions and show a traceback."""

from __future__ import annotations

EXIT_USER_ERROR = 2


class PdraftError(Exception):
    """A mistake the user can fix. The message is shown alone, on one line, without a traceback."""

    def __init__(self, message: str, *, hint: str | None = None):
        # Collapse newlines so the message always prints as one line.
        self.message = " ".join(str(message).split())
        self.hint = " ".join(hint.split()) if hint else None
        super().__init__(self.message)

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class RecipeError(PdraftError):
    """A recipe problem; `problems` holds one line per problem (file:line: key path: expected, found)."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))
