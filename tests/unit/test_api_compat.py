"""Every public name of the original modules (tests/data/API.md) exists here with
the same parameters, so code written for the original runs after an import change."""

import dataclasses
import importlib
import inspect
import re

import pytest

from tests.conftest import reference_file

# Read at import, since it makes the parameters: a missing file is a collection error.
API = reference_file("API.md")
ITEM = re.compile(r"^- (def|class) (\w+)(.*)$")
METHOD = re.compile(r"^\s+- \.(\w+)")


def split_names(text: str) -> list[str]:
    """Parameter names of 'a: int = 1, b, *, c=None' (brackets respected)."""
    names, depth, current = [], 0, ""
    for char in text + ",":
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            token, current = current.strip(), ""
            if token and token != "*":
                names.append(re.split(r"[:=]", token)[0].strip())
        else:
            current += char
    return names


def documented_names(rest: str) -> list[str]:
    """Fields after ': ' for '(dataclass)'/'(NamedTuple)', else the bracketed parameters."""
    if rest.startswith(("(dataclass)", "(NamedTuple)")):
        return split_names(rest.split(":", 1)[1]) if ":" in rest else []
    if not rest.startswith("("):
        return []
    depth = 0
    for end, char in enumerate(rest):
        depth += char in "([{"
        depth -= char in ")]}"
        if depth == 0:
            return split_names(rest[1:end])
    raise ValueError(f"unbalanced brackets in {rest!r}")


def documented_entries():
    """(module, kind, name, names, methods) from API.md's '## module' sections."""
    entries, module = [], None
    for line in API.read_text().splitlines():
        if heading := re.match(r"^## (\w+)$", line):
            module = heading.group(1)
        elif module and (item := ITEM.match(line)):
            kind, name, rest = item.groups()
            entries.append([module, kind, name, documented_names(rest), []])
        elif module and entries and (method := METHOD.match(line)):
            entries[-1][4].append(method.group(1))
    return [tuple(e) for e in entries]


ENTRIES = documented_entries()


def accepted_names(obj) -> set[str]:
    """Constructor keywords, dataclass fields and NamedTuple fields of a class."""
    names = set(getattr(obj, "_fields", ()))
    if dataclasses.is_dataclass(obj):
        names |= {f.name for f in dataclasses.fields(obj)}
    try:
        names |= set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        pass
    return names


def test_api_md_was_parsed():
    assert len(ENTRIES) == 49  # every "- def"/"- class" line of API.md
    assert sum(len(e[4]) for e in ENTRIES) > 20


@pytest.mark.parametrize(
    "module, kind, name, names, methods", ENTRIES, ids=[f"{e[0]}.{e[2]}" for e in ENTRIES]
)
def test_public_name_exists_with_same_parameters(module, kind, name, names, methods):
    mod = importlib.import_module(f"phoenix.{module}")
    assert hasattr(mod, name), f"phoenix.{module} lacks {name}"
    obj = getattr(mod, name)
    if kind == "def":
        assert list(inspect.signature(obj).parameters) == names
        return
    missing = [n for n in names if n not in accepted_names(obj)]
    assert not missing, f"{name} lacks {missing}"
    absent = [m for m in methods if not hasattr(obj, m)]
    assert not absent, f"{name} lacks methods {absent}"
