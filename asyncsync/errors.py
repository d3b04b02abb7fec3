"""The error every command reports as one ``error:`` line and exit status 2."""

from __future__ import annotations


class InputError(Exception):
    """Input a command cannot use: a recipe, a trace, a log folder, a dataset's files, a
    checkpoint or a TLS set-up. The message names the file or key and the problem.

    The command line catches this one type, so it need not import the modules (torch
    among them) that define its subclasses before the command runs.
    """


class LoopWentOn(BaseException):
    """A worker loop asked for more after `RunStopped` told it the run was over: it caught
    the stop (a broad ``except Exception`` does) and went on. A `BaseException`, as
    `asyncio.CancelledError` is, so that the loop's own ``except Exception`` lets it
    through and its worker ends with it, instead of training on and asking a stopped
    server forever."""
