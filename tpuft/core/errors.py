"""Errors a user can act on. The CLI catches :class:`TpuftError` once and prints it without a traceback."""

from __future__ import annotations


class TpuftError(Exception):
    """A failure with a message meant for the user; ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n{self.hint}"


class UsageError(TpuftError):
    """Bad input from the command line or a config file: exit code 2, nothing has been changed."""

    exit_code = 2


class ConfigError(UsageError):
    """One or more problems in tpuft.yaml or a recipe, each already located as ``file:line: key: problem``."""

    def __init__(self, problems: list[str], *, source: str | None = None) -> None:
        self.problems = problems
        head = f"{len(problems)} problem(s) in {source}:" if source else f"{len(problems)} config problem(s):"
        super().__init__("\n".join([head, *("  " + p for p in problems)]))


class WorkerFailure(TpuftError):
    """A command failed on one or more workers; the fleet has already stopped the others."""


class Interrupted(TpuftError):
    """Ctrl-C (or SIGTERM) while workers ran: every worker process has been stopped."""

    exit_code = 130
