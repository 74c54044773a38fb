"""The refusal of one request: ``InputError``, in a module of its own so that the Triton
adapter and its metrics can name it without importing the typed requests."""

from __future__ import annotations

from typing import Optional


class InputError(ValueError):
    """A request's inputs are invalid; the message says which input and why. ``input`` names
    the one input at fault when there is one (the adapter counts refusals by it), None when
    the request as a whole is wrong (rows that disagree, too many rows, unknown inputs)."""

    def __init__(self, message: str, input: Optional[str] = None):
        super().__init__(message)
        self.input = input
