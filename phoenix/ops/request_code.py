"""The typed request classes of the served models, written as code from their contracts.

``phoenix/schema/request_types.py`` holds one frozen dataclass per served model that has a
service (ensembles have none): a field per input, in contract order, so a reader (and grep)
finds ``RankerRequest.history_post_ids``. This module writes that file; a unit test fails when
the committed file differs from what it writes, and ``make configs`` rewrites it.

    python -m phoenix.ops.request_code            # rewrite phoenix/schema/request_types.py
    python -m phoenix.ops.request_code --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from phoenix.schema import contracts, recommend
from phoenix.schema.served import CONTRACTS
from phoenix.schema.spec import ModelContract, TensorSpec
from phoenix.util.command_line import command_parser

REQUEST_TYPES_FILE = Path(__file__).resolve().parents[1] / "schema" / "request_types.py"

HEADER = '''"""Typed requests, one frozen dataclass per served model with a service (fields: its
contract's inputs). Written by ``python -m phoenix.ops.request_code``: do not edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

'''


def class_name(model: str) -> str:
    """ "ranker" -> "RankerRequest"."""
    return "".join(part.title() for part in model.split("_")) + "Request"


def contract_names() -> dict[str, tuple[str, str]]:
    """{model: (module, constant)} of every contract constant in the schema's modules."""
    found = {}
    for module in (contracts, recommend):
        for constant, value in vars(module).items():
            if isinstance(value, ModelContract) and constant.isupper():
                found[value.name] = (module.__name__, constant)
    return found


def shape_comment(spec: TensorSpec) -> str:
    axes = ", ".join(["R", *(str(a) for a in spec.axes)])
    return f"[{axes}] {spec.dtype.name}"


def class_code(contract: ModelContract, constant: str) -> str:
    lines = [
        "@dataclass(frozen=True, kw_only=True)",
        f"class {class_name(contract.name)}(TypedRequest):",
        f'    """``{contract.name}``\'s request."""',
        "",
        f"    contract: ClassVar[ModelContract] = {constant}",
        f"    checks: ClassVar[ContractChecks] = ContractChecks.of({constant})",
        "",
    ]
    for spec in contract.inputs:
        if spec.optional:
            declaration = f"    {spec.name}: Optional[np.ndarray] = None"
        else:
            declaration = f"    {spec.name}: np.ndarray"
        lines.append(f"{declaration}  # {shape_comment(spec)}")
    return "\n".join(lines)


def request_types_code() -> str:
    """The text of ``phoenix/schema/request_types.py``."""
    where = contract_names()
    served = [c for c in CONTRACTS.values() if not c.is_ensemble]
    imports: dict[str, list[str]] = {}
    for c in served:
        module, constant = where[c.name]
        imports.setdefault(module, []).append(constant)
    parts = [HEADER]
    for module, constants in sorted(imports.items()):
        names = "".join(f"    {name},\n" for name in sorted(constants))
        parts.append(f"from {module} import (\n{names})\n")
    parts.append("from phoenix.schema.requests import ContractChecks, TypedRequest\n")
    parts.append("from phoenix.schema.spec import ModelContract\n")
    for c in served:
        parts.append("\n\n" + class_code(c, where[c.name][1]) + "\n")
    entries = "\n".join(f"    {where[c.name][1]}.name: {class_name(c.name)}," for c in served)
    parts.append(
        "\n\n# {model: its request type}, every served model with a service.\n"
        f"REQUEST_TYPES: dict[str, type[TypedRequest]] = {{\n{entries}\n}}\n"
    )
    return "".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = command_parser("python -m phoenix.ops.request_code", __doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    parser.add_argument("--out", type=Path, default=REQUEST_TYPES_FILE, help="the file written")
    args = parser.parse_args(argv)
    wanted = request_types_code()
    current = args.out.read_text() if args.out.exists() else ""
    if args.check:
        if current != wanted:
            print(f"{args.out} is out of date: run `python -m phoenix.ops.request_code`")
            return 1
        return 0
    if current != wanted:
        args.out.write_text(wanted)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
