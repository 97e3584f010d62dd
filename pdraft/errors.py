"""The one user-error type. Anything a user can cause (a bad recipe, a missing file, an unknown target, a
wrong argument) raises `PdraftError`; the CLI prints its message as one line on stderr and exits with code 2.
Programming errors stay ordinary exceptions and show a traceback. `check_number` is the one-line refusal of a
run setting that is not a finite number in its range (decode settings, verification policies)."""

from __future__ import annotations

import math

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


def check_number(name: str, value, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, integer: bool = False) -> None:
    """One clean line for a value that is not a finite number in its range (nan compares false to everything,
    so it would slip through a plain `<` check)."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise PdraftError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if not math.isfinite(value):
        raise PdraftError(f"{name} must be a finite number, got {value}")
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
        if high is None:
            rule = f"{'>' if low_open else '>='} {low}"
        elif low is None:
            rule = f"<= {high}"
        else:
            rule = f"in {'(' if low_open else '['}{low}, {high}]"
        raise PdraftError(f"{name} must be {rule}, got {value}")
