"""Derive a variant of a Triton model repository (GPU instances, no batching, other delays).

Model configs are protobuf text (`config.pbtxt`). We parse just enough of that format to know
where each field and its value start and end (nested messages, lists, strings and comments
included), then edit the text in place so everything we don't touch keeps its layout.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CONFIG_NAME = "config.pbtxt"
KIND_BY_DEVICE = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}
OPENERS = {"{": "}", "<": ">", "[": "]"}

_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<punct>[{}<>\[\]:,;])
  | (?P<word>[^\s{}<>\[\]:,;"'\#]+)
    """,
    re.VERBOSE,
)


class PbtxtError(ValueError):
    """The text is not protobuf text format we can parse."""


@dataclass(frozen=True)
class Token:
    kind: str  # "string", "punct" or "word"
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class Value:
    """A field's value: its text span, plus its fields (message) or items (list)."""

    start: int
    end: int
    fields: tuple[Field, ...] | None = None
    items: tuple[Value, ...] | None = None

    @property
    def is_message(self) -> bool:
        return self.fields is not None


@dataclass(frozen=True)
class Field:
    """`name: value` with the span from the name to the end of the value."""

    name: str
    start: int
    end: int
    value: Value


def tokenize(text: str) -> list[Token]:
    """Significant tokens of `text` (whitespace and # comments dropped)."""
    tokens = []
    position = 0
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        if match is None:
            line = text.count("\n", 0, position) + 1
            raise PbtxtError(f"unterminated string or bad character on line {line}")
        if match.lastgroup in ("string", "punct", "word"):
            tokens.append(Token(match.lastgroup, match.group(), match.start(), match.end()))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens, recording spans only."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0

    def peek(self) -> Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> Token:
        token = self.peek()
        if token is None:
            raise PbtxtError("unexpected end of text")
        self.index += 1
        return token

    def fail(self, token: Token, expected: str) -> PbtxtError:
        line = self.text.count("\n", 0, token.start) + 1
        return PbtxtError(f"expected {expected}, got {token.text!r} on line {line}")

    def fields(self, closer: str | None) -> tuple[Field, ...]:
        """Fields until `closer` (or the end of text when None); consumes the closer."""
        found = []
        while True:
            token = self.peek()
            if token is None:
                if closer is None:
                    return tuple(found)
                raise PbtxtError(f"missing {closer!r} at end of text")
            if token.kind == "punct" and token.text == closer:
                self.index += 1
                return tuple(found)
            if token.kind == "punct" and token.text in ",;":
                self.index += 1  # optional field separators
                continue
            found.append(self.field())

    def field(self) -> Field:
        name = self.take()
        if name.kind == "punct" and name.text == "[":  # extension name: [pkg.ext]
            parts = [self.take()]
            while parts[-1].text != "]":
                parts.append(self.take())
            name = Token("word", "[" + "".join(t.text for t in parts), name.start, parts[-1].end)
        elif name.kind != "word":
            raise self.fail(name, "a field name")
        colon = self.peek()
        if colon is not None and colon.text == ":" and colon.kind == "punct":
            self.index += 1
        value = self.value()
        return Field(name.text, name.start, value.end, value)

    def value(self) -> Value:
        token = self.take()
        if token.kind == "punct" and token.text in ("{", "<"):
            fields = self.fields(OPENERS[token.text])
            return Value(token.start, self.tokens[self.index - 1].end, fields=fields)
        if token.kind == "punct" and token.text == "[":
            return self.list_value(token)
        if token.kind == "string":
            end = token.end
            while (following := self.peek()) is not None and following.kind == "string":
                end = self.take().end  # adjacent strings concatenate
            return Value(token.start, end)
        if token.kind == "word":
            return Value(token.start, token.end)
        raise self.fail(token, "a value")

    def list_value(self, opener: Token) -> Value:
        items = []
        while True:
            token = self.peek()
            if token is None:
                raise PbtxtError("missing ']' at end of text")
            if token.kind == "punct" and token.text == "]":
                self.index += 1
                return Value(opener.start, token.end, items=tuple(items))
            if token.kind == "punct" and token.text == ",":
                self.index += 1
                continue
            items.append(self.value())


def parse_pbtxt(text: str) -> tuple[Field, ...]:
    """Top-level fields of a protobuf text message, with their spans."""
    return _Parser(text).fields(closer=None)


def find_fields(fields: Iterable[Field], name: str) -> list[Field]:
    """Direct children named `name`."""
    return [field for field in fields if field.name == name]


def messages_of(field: Field) -> list[Value]:
    """The message values of a field: itself (`f { }`) or the messages in a list (`f [{ }]`)."""
    if field.value.is_message:
        return [field.value]
    return [item for item in field.value.items or () if item.is_message]


@dataclass(frozen=True)
class Edit:
    start: int
    end: int
    replacement: str


def apply_edits(text: str, edits: Sequence[Edit]) -> str:
    """Apply non-overlapping edits (any order) to `text`."""
    ordered = sorted(edits, key=lambda edit: edit.start, reverse=True)
    for later, earlier in zip(ordered, ordered[1:], strict=False):
        if earlier.end > later.start:
            raise ValueError(f"overlapping edits: {earlier} and {later}")
    for edit in ordered:
        text = text[: edit.start] + edit.replacement + text[edit.end :]
    return text


def removal_span(text: str, field: Field) -> tuple[int, int]:
    """Span that removes `field`, its separator, and its lines when nothing else is on them."""
    start, end = field.start, field.end
    trailing = re.compile(r"[ \t]*[,;]?").match(text, end)
    end = trailing.end() if trailing else end
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end == -1 else line_end
    if not text[line_start:start].strip() and not text[end:line_end].strip():
        return line_start, min(line_end + 1, len(text))
    return start, end


def remove_fields(text: str, name: str) -> str:
    """Remove every top-level field `name` (e.g. the `dynamic_batching { ... }` block)."""
    doomed = find_fields(parse_pbtxt(text), name)
    return apply_edits(text, [Edit(*removal_span(text, field), "") for field in doomed])


def _insert_into_message(text: str, message: Value, field_text: str) -> Edit:
    """Edit that adds `field_text` as the first field of `message` (right after its brace)."""
    body = text[message.start + 1 : message.end - 1]
    if "\n" in body:
        indent = re.match(r"\s*", body.split("\n", 1)[1]).group().replace("\n", "")
        return Edit(message.start + 1, message.start + 1, f"\n{indent}{field_text}")
    return Edit(message.start + 1, message.start + 1, f" {field_text}")


def set_instance_kind(text: str, kind: str) -> str:
    """Set `kind` in every instance_group (adding one when the model has none).

    `gpus` lists are dropped when switching away from KIND_GPU, where Triton rejects them.
    """
    fields = parse_pbtxt(text)
    groups = find_fields(fields, "instance_group")
    if not groups:
        separator = "" if text.endswith("\n") or not text else "\n"
        return f"{text}{separator}instance_group [ {{ kind: {kind} }} ]\n"
    edits = []
    for group in groups:
        for message in messages_of(group):
            kinds = find_fields(message.fields, "kind")
            edits += [Edit(k.value.start, k.value.end, kind) for k in kinds]
            if not kinds:
                edits.append(_insert_into_message(text, message, f"kind: {kind}"))
            if kind != "KIND_GPU":
                gpus = find_fields(message.fields, "gpus")
                edits += [Edit(*removal_span(text, field), "") for field in gpus]
    return apply_edits(text, edits)


def set_max_queue_delay(text: str, microseconds: int) -> str:
    """Set max_queue_delay_microseconds in each dynamic_batching block (none: unchanged)."""
    if microseconds < 0:
        raise ValueError("max_queue_delay_microseconds must be >= 0")
    edits = []
    for block in find_fields(parse_pbtxt(text), "dynamic_batching"):
        if not block.value.is_message:
            continue
        delays = find_fields(block.value.fields, "max_queue_delay_microseconds")
        edits += [Edit(d.value.start, d.value.end, str(microseconds)) for d in delays]
        if not delays:
            line = f"max_queue_delay_microseconds: {microseconds}"
            edits.append(_insert_into_message(text, block.value, line))
    return apply_edits(text, edits)


def is_ensemble(text: str) -> bool:
    platforms = find_fields(parse_pbtxt(text), "platform")
    return any(text[p.value.start : p.value.end].strip('"') == "ensemble" for p in platforms)


def has_dynamic_batching(text: str) -> bool:
    return bool(find_fields(parse_pbtxt(text), "dynamic_batching"))


def instance_kind_for(device: str) -> str:
    try:
        return KIND_BY_DEVICE[device]
    except KeyError:
        raise ValueError(
            f"device must be one of {sorted(KIND_BY_DEVICE)}, got {device!r}"
        ) from None


def derive_config(
    text: str,
    device: str = "cpu",
    dynamic_batching: bool = True,
    max_queue_delay_us: int | None = None,
) -> str:
    """One model's config.pbtxt rewritten for `device`, batching and queue delay choices.

    Ensembles are returned unchanged: they have no instances of their own (Triton refuses an
    instance_group there) and their steps are batched by the composing models.
    """
    if is_ensemble(text):
        return text
    text = set_instance_kind(text, instance_kind_for(device))
    if not dynamic_batching:
        text = remove_fields(text, "dynamic_batching")
    elif max_queue_delay_us is not None:
        text = set_max_queue_delay(text, max_queue_delay_us)
    return text


def model_config_paths(repository: Path) -> list[Path]:
    """config.pbtxt of every model (one level below the repository root)."""
    return sorted(path for path in repository.glob(f"*/{CONFIG_NAME}") if path.is_file())


def derive_repository(
    source: str | Path,
    dest: str | Path,
    *,
    device: str = "cpu",
    dynamic_batching: bool = True,
    max_queue_delay_us: int | None = None,
) -> Path:
    """Copy `source` into `dest` (replaced) with every model's config derived; return `dest`."""
    source, dest = Path(source).resolve(), Path(dest).resolve()
    if not source.is_dir():
        raise FileNotFoundError(f"model repository not found: {source}")
    if dest == source or source in dest.parents:
        raise ValueError(f"destination {dest} must lie outside the source repository {source}")
    instance_kind_for(device)  # fail before touching anything
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for config in model_config_paths(dest):
        try:
            derived = derive_config(
                config.read_text(), device, dynamic_batching, max_queue_delay_us
            )
        except PbtxtError as error:
            raise PbtxtError(f"{config.relative_to(dest)}: {error}") from error
        config.write_text(derived)
    return dest
