"""One JSON value a line (the events of `phoenix-events`, the posts of `phoenix-ingest`): the
value of one line, or an error that points into that line."""

from __future__ import annotations

import json
from typing import Any


class JSONLineError(ValueError):
    """A line that is not JSON: what is wrong, and at which column of the line."""


def json_line(line: str) -> Any:
    """The JSON value of one line of a file (its line ending ignored); JSONLineError names
    the column of the line where it stops being JSON. json's own message counts lines and
    columns of the text it is given: a line read with its newline that leaves an object open
    would read "line 2 column 1", whatever line of the file it is."""
    text = line.rstrip("\r\n")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        where = f"at column {error.pos + 1}" if error.pos < len(text) else "at the end of the line"
        raise JSONLineError(f"{error.msg} {where}") from None
