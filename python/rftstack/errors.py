"""Errors a user can cause: one sentence naming the problem and the fix, and an exit code."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or machine, not a bug: printed as one line, no traceback."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
