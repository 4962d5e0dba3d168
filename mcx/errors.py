"""One error root. Every error carries a hint; only the CLI turns errors into exit codes."""

from __future__ import annotations


class McxError(Exception):
    """Root of every error mcx raises on purpose.

    ``exit_code`` 2 means bad input (spec, CLI argument, data file, run ID): nothing was written.
    ``exit_code`` 1 means the work itself failed (smoke check, divergence, regression).
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if not self.hint:
            return self.message
        sep = " " if self.message.rstrip().endswith((";", ".", ":", ",", "?", "!")) else "; "
        return f"{self.message.rstrip()}{sep}{self.hint}"


class InputError(McxError):
    """Bad input from the user: exit code 2, nothing written."""

    exit_code = 2


class SpecError(InputError):
    """One or more problems in an experiment spec, each with its TOML path."""

    def __init__(self, problems: list[tuple[str, str]], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"  {path}: {msg}" if path else f"  {msg}" for path, msg in problems]
        n = len(problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''}{where}:\n" + "\n".join(lines))


class DataError(InputError):
    """A dataset, tokenizer or corpus that cannot be used as given."""


class RunIdError(InputError):
    """An unknown or malformed run ID."""


class BudgetError(McxError):
    """The plan costs more GPU-hours than the spec's budget allows without confirmation."""

    exit_code = 2


class EnvironmentProblem(McxError):
    """Something the machine lacks (a package, a GPU, a service)."""

    exit_code = 2


class TrainingFailed(McxError):
    """The worker ran and failed: a smoke check, divergence, or a crash."""

    exit_code = 1
