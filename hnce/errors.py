"""The one base class of errors a user can fix: bad input, a bad setting, a missing file.

It lives in the package root, below every layer, so that each of them (encoders, mining,
cluster, pipeline) can raise it. The ``hnce`` entry point prints such an error as one line naming the file (and line)
and exits with status 2; any other exception is a bug of ours and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """A mistake in what the user gave us; the message names the file, line or setting."""
