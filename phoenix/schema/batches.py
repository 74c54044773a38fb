"""Padded batches of typed requests, generated from the contracts as the requests are.

A batch stacks the rows of several checked requests of one model into one array per input,
named as the contract names the input, so that a field keeps one name from the wire to the
engine:

- an input of one value per row (``[R, 1]``, e.g. ``user_id``) becomes ``[B]``;
- an input with a length axis (history ``L``, candidates ``C``) is right-padded with zeros to
  the width the caller asks for; a longer one is cut from the front, so a history keeps its
  newest items;
- an optional input a request left out is zeros, and ``sent[name]`` ([B] bool) says which rows
  carried it;
- rows beyond the requests' are zeros (padding up to a compiled batch size).

Zero is padding everywhere: post and author id 0 are never real (the contracts refuse
candidate id 0), so engines mask padding by id.

Shape glossary
  B  rows of the batch   W  a length axis padded to its width   R  rows of one request
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

import numpy as np

from phoenix.schema.spec import ARTIFACT_WIDTHS, ModelContract, TensorSpec

_BATCH_TYPES: dict[str, type] = {}


def batch_type(contract: ModelContract) -> type:
    """The batch namedtuple of a model: one field per input, then ``sent`` (a pytree JAX can
    trace, so engines take it whole). One type per model, made on first use."""
    if contract.name not in _BATCH_TYPES:
        name = "".join(part.title() for part in contract.name.split("_")) + "Batch"
        fields = (*contract.input_names, "sent")
        _BATCH_TYPES[contract.name] = collections.namedtuple(name, fields)
    return _BATCH_TYPES[contract.name]


def stack_padded(parts: Sequence[np.ndarray], width: int, rows: int) -> np.ndarray:
    """Every request's rows ``[R_i, L_i, ...]`` in one zero-padded array ``[rows, width, ...]``.

    Items beyond ``width`` are cut from the front, so a history keeps its newest items.
    """
    first = parts[0]
    out = np.zeros((rows, width) + first.shape[2:], first.dtype)
    return place(out, row_spans([part.shape[0] for part in parts]), parts, padded=True)


def stack_rows(parts: Sequence[np.ndarray], rows: int) -> np.ndarray:
    """Every request's rows ``[R_i, ...]`` in one array ``[rows, ...]``, zero rows after."""
    first = parts[0]
    out = np.zeros((rows,) + first.shape[1:], first.dtype)
    return place(out, row_spans([part.shape[0] for part in parts]), parts)


def row_spans(counts: Sequence[int]) -> list[tuple[int, int]]:
    """(first, past the last) batch row of each part of ``counts`` rows, stacked in order."""
    spans, start = [], 0
    for count in counts:
        spans.append((start, start + count))
        start += count
    return spans


def place(out: np.ndarray, spans, parts, padded: bool = False) -> np.ndarray:
    """Each part in its rows of ``out`` (a None part leaves its rows zero); ``padded``: axis 1
    is a length axis, items beyond ``out``'s width cut from the front (the newest kept)."""
    width = out.shape[1] if padded else None
    for (start, stop), part in zip(spans, parts):
        if part is None:
            continue
        if padded:
            part = part[:, max(0, part.shape[1] - width) :]
            out[start:stop, : part.shape[1]] = part
        else:
            out[start:stop] = part
    return out


def is_scalar(spec: TensorSpec) -> bool:
    """One value per row (``[R, 1]``): batched as ``[B]``."""
    return spec.axes == (1,)


def absent_shape(spec: TensorSpec, widths: Mapping[str, int]) -> tuple[int, ...]:
    """The axes after the batch and length axes of an input no request of a batch carried:
    fixed sizes, and the artifact widths from ``widths``."""
    axes = spec.axes[1:] if spec.length is not None else spec.axes
    return tuple(axis if isinstance(axis, int) else widths[axis] for axis in axes)


def carried_length(request, symbol: str) -> int:
    """The request's length of ``symbol``, 0 when no carried input has that axis."""
    try:
        return request.length(symbol)
    except KeyError:
        return 0


def pad_batch(requests: Sequence, rows: int, widths: Mapping[str, int]):
    """The rows of ``requests`` (checked typed requests of one model) in one batch of ``rows``.

    ``widths`` gives the padded width of length symbols ("L": history_seq_len, "C": the
    candidate bucket) and the artifact widths ("A", "D") an input no request carried needs; a
    length symbol it leaves out is padded to the longest request. An optional input a request
    left out stays zeros in its rows (nothing is made in its place).
    """
    contract = requests[0].contract
    spans = row_spans([r.rows for r in requests])
    fields, sent = {}, {}
    for spec in contract.inputs:
        carried = [getattr(r, spec.name) for r in requests]
        if spec.optional:
            sent_rows = [None if array is None else True for array in carried]
            sent[spec.name] = place(np.zeros(rows, bool), spans, sent_rows)
        fields[spec.name] = stack_input(spec, requests, carried, spans, rows, widths)
    return batch_type(contract)(**fields, sent=sent)


def stack_input(spec: TensorSpec, requests, carried, spans, rows: int, widths) -> np.ndarray:
    """One input of every request in ``[B]`` (one value a row), ``[B, W, ...]`` (a length
    axis, cut from the front past W) or ``[B, ...]``; zeros where a request carried none."""
    present = next((array for array in carried if array is not None), None)
    dtype = spec.dtype if present is None else present.dtype
    if is_scalar(spec):
        values = [None if array is None else array[:, 0] for array in carried]
        return place(np.zeros(rows, dtype), spans, values)  # [B]
    if spec.length is None:
        rest = absent_shape(spec, widths) if present is None else present.shape[1:]
        return place(np.zeros((rows, *rest), dtype), spans, carried)  # [B, ...]
    width = widths.get(spec.length)
    if width is None:
        width = max(
            carried_length(r, spec.length) if array is None else array.shape[1]
            for r, array in zip(requests, carried)
        )
    rest = absent_shape(spec, widths) if present is None else present.shape[2:]
    out = np.zeros((rows, width, *rest), dtype)  # [B, W, ...]
    return place(out, spans, carried, padded=True)


def empty_batch(contract: ModelContract, rows: int, widths: Mapping[str, int]):
    """An all-padding batch of the given shape, nothing sent (what warm-up compiles from)."""
    fields = {}
    for spec in contract.inputs:
        shape = [rows]
        if not is_scalar(spec):
            shape += [axis if isinstance(axis, int) else widths[axis] for axis in spec.axes]
        fields[spec.name] = np.zeros(shape, spec.dtype)
    sent = {spec.name: np.zeros(rows, bool) for spec in contract.inputs if spec.optional}
    return batch_type(contract)(**fields, sent=sent)


def artifact_widths(config) -> dict[str, int]:
    """{"A": num_actions, "D": emb_size} of an artifact config."""
    return {symbol: getattr(config, field) for symbol, field in ARTIFACT_WIDTHS.items()}
