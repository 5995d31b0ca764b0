"""The user-error types: every error caused by user input is a `UsageError` (CLI: one line, exit 2).

`CheckpointError` is the user error of files that hold weights or train
state (an HF directory, a GGUF file, an orbax checkpoint): a missing path, a
malformed file, a tree that does not match.  Anything else that escapes the
CLI is an internal error and keeps its traceback.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Bad user input (config, paths, datasets, command line); one line naming it and the fix."""


class CheckpointError(UsageError):
    """A model file or train-state checkpoint that cannot be loaded or saved; one line."""
