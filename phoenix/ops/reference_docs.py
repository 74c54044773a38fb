"""The model reference (docs/reference.md) and the README's model table, written from the
contracts, the deployment profiles and the stubs' metric families (that table:
``phoenix.ops.reference_metrics``) so they cannot drift.

Each generated block sits between ``<!-- reference:NAME:start -->`` and
``<!-- reference:NAME:end -->``: in docs/reference.md every served model (its inputs, outputs,
parameters, batch sizes), recommend's stages, the per-request limits and the metric families;
in README.md a one-line-per-model summary. A unit test fails when a block differs from what
this writes; ``make configs`` rewrites them.

    python -m phoenix.ops.reference_docs            # rewrite the blocks
    python -m phoenix.ops.reference_docs --check    # exit 1 when one is out of date
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from phoenix.ops.profiles import CPU, GPU, Profile
from phoenix.ops.reference_metrics import ReferenceDocError, metrics_block
from phoenix.schema.contracts import LIMITS
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN, stage_parameter
from phoenix.schema.served import CONTRACTS
from phoenix.schema.spec import (
    ARTIFACT_WIDTHS,
    LENGTH_LIMITS,
    ModelContract,
    Parameter,
    TensorSpec,
    Values,
)
from phoenix.util.doc_blocks import (
    generator_main,
    with_block,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DOC = REPO_ROOT / "docs" / "reference.md"
README = REPO_ROOT / "README.md"
REFERENCE_LINK = "docs/reference.md"  # from the README

# What each served model is for, in one line (the contracts say what it takes and answers).
ROLES = {
    "user_state": "reads a user's state from the user-state store (Redis) by user id: the "
    "ranking and retrieval histories, the posts already served, the newest posts of the "
    "authors they follow; or passes on the history a request carries; for the production "
    "family also the history items' context, the profile and the request's timezone and hour",
    "user_encoder": "the retrieval two-tower's user tower: a user's history to a unit-norm "
    "embedding",
    "candidate_tower": "the retrieval two-tower's candidate tower: posts (id, author) to "
    "unit-norm embeddings, what a corpus is built with; not a stage of recommend",
    "retriever": "the in-network posts, then the top_k posts of the corpus (a file, or a store "
    "searched with Faiss) nearest the user embedding, history and served posts excluded; each "
    "post dated by the corpus (for the production family also its semantic IDs)",
    "ranker": "the Grok-derived transformer with candidate isolation, or X's production ranker "
    "(an artifact of that family: docs/production.md): every action's probability per "
    "candidate, ranked by a weighted blend",
    "feed_policy": "the feed policy after the ranker (docs/policy.md): filters, a score over "
    "every action, author diversity, the out-of-network factor; numpy, on the host",
    "served_log": "the side effect of serving: the feed's posts marked served to the user and "
    "a request log entry per user row; answers a new request id",
    "recommend_chain": "every stage of recommend in one process, a batch at a time "
    "(docs/design/recommend-chain.md); `record` 0 answers without the side effect",
    "recommend": "what clients call: an ensemble of one step, `recommend_chain`, so that a "
    "rollout switches versions in one load (docs/rollout.md)",
}

# The symbolic axes of the contracts' tensors (``phoenix.schema.spec``).
AXES = {
    "R": "rows of a request: users, or posts for candidate_tower (the batch dimension)",
    "L": "history items, oldest first",
    "C": "candidates of one user row",
    "C'": "posts the feed policy kept (C' <= C); rows of a request padded with post id 0",
    "K": "posts the retriever returned: the in-network ones, then the top_k retrieved",
    "M": "in-network posts: the newest posts of the authors the user follows, newest first",
    "N": "posts excluded: seen (a request's filter) or already served (the user state's)",
    "E": "excluded authors",
    "D": "the artifact's `emb_size`",
    "A": "the artifact's `num_actions` (its `action_names`)",
}

# What each per-request limit caps (``Limits``).
LIMIT_MEANINGS = {
    "max_history_items": "history items of one user row (longer histories are refused; the "
    "model reads the newest `history_seq_len`)",
    "max_candidates": "candidates of one user row, and so posts retrieved or kept (the "
    "ranker's largest candidate bucket: no request needs a shape compiled on demand)",
    "max_top_k": "`top_k` of one user row",
    "max_rows": "rows of one request: users, or candidate_tower's posts",
    "max_filter_ids": "excluded authors, or seen posts, of one user row",
}

# ----------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------


def number(value: float) -> str:
    """1, 13.5, inf: a number as the docs write it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def shape(spec: TensorSpec) -> str:
    """The wire shape, batch dimension first: `[R, L, A]`."""
    return "[" + ", ".join(["R", *(str(axis) for axis in spec.axes)]) + "]"


def value_range(values: Values) -> str:
    """What an input's values must be, beyond its dtype ('' when nothing more)."""
    high = values.high
    high_text: Optional[str]
    if high == "surfaces":
        high_text = "the artifact's largest product surface"
    elif isinstance(high, str):
        raise ReferenceDocError(f"no description of the artifact limit {high!r}")
    else:
        high_text = None if high is None or math.isinf(high) else number(high)
    if values.low is None and high_text is None:
        return ""
    if high_text is None:
        assert values.low is not None  # the case above
        return f"{values.what} >= {number(values.low)}"
    return f"{values.what} in [{number(values.low or 0)}, {high_text}]"


def tensor_table(specs: Sequence[TensorSpec], inputs: bool) -> list[str]:
    if not specs:
        return []
    if not inputs:
        if not any(s.optional for s in specs):
            lines = ["| output | dtype | shape |", "| --- | --- | --- |"]
            return lines + [f"| `{s.name}` | {s.triton_dtype} | `{shape(s)}` |" for s in specs]
        lines = ["| output | dtype | shape | |", "| --- | --- | --- | --- |"]
        return lines + [
            f"| `{s.name}` | {s.triton_dtype} | `{shape(s)}` | "
            f"{'production family only' if s.optional else ''} |"
            for s in specs
        ]
    lines = ["| input | dtype | shape | | values |", "| --- | --- | --- | --- | --- |"]
    for s in specs:
        flags = ", ".join(f for f, on in (("optional", s.optional), ("ragged", s.ragged)) if on)
        lines.append(
            f"| `{s.name}` | {s.triton_dtype} | `{shape(s)}` | {flags} | {value_range(s.values)} |"
        )
    return lines


def default_text(parameter: Parameter) -> str:
    value = parameter.default
    if value is None:
        return "(the profile's)"
    if parameter.kind == "weights":
        return ", ".join(f"{name} {number(w)}" for name, w in value.items())
    if parameter.kind == "ints":
        return ",".join(str(v) for v in value)
    if parameter.kind == "text":
        return f'`"{value}"`'
    return number(value)


def bounds(parameter: Parameter) -> str:
    if math.isinf(parameter.low) and math.isinf(parameter.high):
        return ""
    return f"[{number(parameter.low)}, {number(parameter.high)}]"


def deployed_value(parameter: Parameter, value: Any) -> str:
    return default_text(dataclasses.replace(parameter, default=value))


def deployed(model: str, parameter: Parameter, profiles: Sequence[Profile]) -> str:
    """What the profiles set where they differ from the default ('' where none does)."""
    if parameter.name == "batch_buckets":
        return "the buckets above"
    cells = []
    for profile in profiles:
        values = profile.parameter_values(model)
        if parameter.name in values and values[parameter.name] != parameter.default:
            cells.append(f"{profile.name}: {deployed_value(parameter, values[parameter.name])}")
    return "; ".join(cells)


def parameter_table(model: str, contract: ModelContract, profiles: Sequence[Profile]) -> list[str]:
    if not contract.parameters:
        return []
    lines = [
        "| parameter | kind | default | range | deployed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in contract.parameters:
        lines.append(
            f"| `{p.name}` | {p.kind} | {default_text(p)} | {bounds(p)} | "
            f"{deployed(model, p, profiles)} |"
        )
    return lines


def chain_parameter_lines(contract: ModelContract) -> list[str]:
    """A chain's parameters are its stages': named, not repeated."""
    shared = [p.name for p in contract.parameters if "." not in p.name]
    own = {
        stage.model: [
            stage_parameter(stage.model, p.name)
            for p in CONTRACTS[stage.model].parameters
            if stage_parameter(stage.model, p.name) != p.name
        ]
        for stage in contract.stages
    }
    lines = [
        "Parameters: its stages', generated from the same profile entries as the stage "
        "models'. Shared by every stage, under their own names: "
        + ", ".join(f"`{name}`" for name in shared)
        + ". Each stage's others, as `<stage>.<parameter>`:",
        "",
    ]
    lines += [
        f"- [{model}](#{model}): " + ", ".join(f"`{name}`" for name in names)
        for model, names in own.items()
        if names
    ]
    return lines


def batch_line(model: str, contract: ModelContract, profiles: Sequence[Profile]) -> str:
    """Max batch size per profile, and the batch buckets where the model compiles them."""
    parts = []
    for profile in profiles:
        deployment = profile.models[model]
        text = f"{profile.name} {deployment.batch_size(model)}"
        if contract.compiles_batches:
            buckets = profile.parameter_values(model)["batch_buckets"]
            text += " (buckets " + ", ".join(str(b) for b in buckets) + ")"
        parts.append(text)
    return "Max batch size: " + "; ".join(parts) + "."


def model_section(model: str, profiles: Sequence[Profile]) -> list[str]:
    contract = CONTRACTS[model]
    if contract.is_ensemble:
        kind = "ensemble of " + ", ".join(f"`{step.model}`" for step in contract.steps)
        batch = f"Max batch size: {contract.max_batch_size} (Triton runs it; no stub)."
    else:
        kind = f"{contract.backend} backend"
        batch = batch_line(model, contract, profiles)
    lines = [f"### `{model}`", "", f"{role(model)[0].upper()}{role(model)[1:]}.", ""]
    lines += [f"{kind[0].upper()}{kind[1:]}. {batch}", ""]
    lines += tensor_table(contract.inputs, inputs=True) + [""]
    lines += tensor_table(contract.outputs, inputs=False) + [""]
    if contract.stages:
        lines += chain_parameter_lines(contract) + [""]
    elif contract.parameters:
        lines += parameter_table(model, contract, profiles) + [""]
    return lines


def role(model: str) -> str:
    try:
        return ROLES[model]
    except KeyError:
        raise ReferenceDocError(
            f"served model {model!r} has no role in phoenix/ops/reference_docs.py ROLES"
        ) from None


def check_axes(contracts: Mapping[str, ModelContract]) -> None:
    """Every symbol the contracts use is described here."""
    used = {
        axis
        for c in contracts.values()
        for s in (*c.inputs, *c.outputs)
        for axis in s.axes
        if isinstance(axis, str)
    }
    missing = sorted(used - set(AXES))
    if missing:
        raise ReferenceDocError(f"axes {missing} have no description in AXES")


def models_block(profiles: Sequence[Profile] = (CPU, GPU)) -> str:
    check_axes(CONTRACTS)
    lines = ["| axis | what it counts | limit |", "| --- | --- | --- |"]
    for symbol, what in AXES.items():
        if symbol in LENGTH_LIMITS:
            limit = f"`{LENGTH_LIMITS[symbol]}` ({getattr(LIMITS, LENGTH_LIMITS[symbol])})"
        elif symbol in ARTIFACT_WIDTHS:
            limit = "fixed by the artifact"
        else:
            limit = f"`max_rows` ({LIMITS.max_rows}), and the batch size"
        lines.append(f"| `{symbol}` | {what} | {limit} |")
    lines.append("")
    for model in CONTRACTS:
        lines += model_section(model, profiles)
    return "\n".join(lines).rstrip("\n")


def mapping(names: Mapping[str, str], arrow: str) -> str:
    """`name` where the name is the same on both sides, else `name` <- `tensor`."""
    return ", ".join(
        f"`{name}`" if name == other else f"`{name}` {arrow} `{other}`"
        for name, other in names.items()
    )


def stages_block(chain: ModelContract = RECOMMEND_CHAIN) -> str:
    lines = [
        "| # | stage | takes (its input <- the chain's tensor) | answers (its output -> the "
        "chain's tensor) |",
        "| --- | --- | --- | --- |",
    ]
    for index, stage in enumerate(chain.stages, 1):
        name = f"[`{stage.model}`](#{stage.model})"
        if stage.side_effect:
            name += " (side effect)"
        lines.append(
            f"| {index} | {name} | {mapping(stage.input_map, '<-')} | "
            f"{mapping(stage.output_map, '->')} |"
        )
    return "\n".join(lines)


def limits_block() -> str:
    lines = ["| limit | value | what it caps | axes |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(LIMITS):
        if field.name not in LIMIT_MEANINGS:
            raise ReferenceDocError(f"limit {field.name!r} has no meaning in LIMIT_MEANINGS")
        axes = ", ".join(f"`{s}`" for s, limit in LENGTH_LIMITS.items() if limit == field.name)
        value = getattr(LIMITS, field.name)
        lines.append(f"| `{field.name}` | {value:,} | {LIMIT_MEANINGS[field.name]} | {axes} |")
    return "\n".join(lines)


def readme_block(profiles: Sequence[Profile] = (CPU, GPU)) -> str:
    """The README's summary: one line per served model, and recommend's stages."""
    lines = [
        "| model | what it does | max batch " + " / ".join(p.name for p in profiles) + " |",
        "| --- | --- | --- |",
    ]
    for model, contract in CONTRACTS.items():
        sizes = " / ".join(
            str(p.models[model].batch_size(model))
            if model in p.models
            else str(contract.max_batch_size)
            for p in profiles
        )
        lines.append(f"| [`{model}`]({REFERENCE_LINK}#{model}) | {role(model)} | {sizes} |")
    stages = " -> ".join(f"`{s.model}`" for s in RECOMMEND_CHAIN.stages)
    steps = " -> ".join(f"`{s.model}`" for s in RECOMMEND.steps)
    lines += ["", f"`recommend` calls {steps}, which runs its stages in order: {stages}."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# The documents
# ----------------------------------------------------------------------------------------


def markers(name: str) -> tuple[str, str]:
    return f"<!-- reference:{name}:start -->", f"<!-- reference:{name}:end -->"


GENERATED_BY = (
    "Generated from the contracts by `python -m phoenix.ops.reference_docs` (`make configs`); "
    "a unit test fails when it is out of date."
)


def reference_blocks() -> dict[str, str]:
    return {
        "models": f"{GENERATED_BY}\n\n{models_block()}",
        "stages": stages_block(),
        "limits": limits_block(),
        "metrics": metrics_block(),
    }


def readme_blocks() -> dict[str, str]:
    return {"models": readme_block()}


def rewritten(path: Path, blocks: Mapping[str, str]) -> tuple[str, str]:
    """(the text of ``path``, the text with every block of ``blocks`` written)."""
    text = path.read_text()
    wanted = text
    for name, block in blocks.items():
        wanted = with_block(wanted, *markers(name), block, path)
    return text, wanted


ABOUT = (
    "Write the model reference (docs/reference.md) and the README's model table from the "
    "contracts, between their reference markers."
)
FILES = {"--reference": REFERENCE_DOC, "--readme": README}  # option: default path


def documents(args) -> list[tuple[Path, str, str]]:
    """The reference and the README: (path, its text, the text with its blocks written)."""
    return [
        (args.reference, *rewritten(args.reference, reference_blocks())),
        (args.readme, *rewritten(args.readme, readme_blocks())),
    ]


def main(argv: Optional[Sequence[str]] = None) -> int:
    return generator_main(
        argv, "phoenix.ops.reference_docs", ABOUT, FILES, documents, "the model reference"
    )


if __name__ == "__main__":
    sys.exit(main())
