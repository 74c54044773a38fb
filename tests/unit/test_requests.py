"""Typed requests, their checks and padded batches follow the contracts, input by input."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from phoenix.engine import ranking_inputs
from phoenix.ops import request_code
from phoenix.schema import contracts, served
from phoenix.schema import requests as requests_module
from phoenix.schema.batches import batch_type, empty_batch, pad_batch
from phoenix.schema.contracts import LIMITS
from phoenix.schema.request_types import REQUEST_TYPES, RankerRequest
from phoenix.schema.requests import InputError, parse, parse_all
from phoenix.schema.spec import ARTIFACT_WIDTHS, LENGTH_LIMITS

CONFIG = SimpleNamespace(num_actions=4, emb_size=8, product_surface_vocab_size=5)
SERVED = [c for c in served.CONTRACTS.values() if not c.is_ensemble]


def test_every_served_model_has_a_typed_request():
    assert sorted(REQUEST_TYPES) == sorted(c.name for c in SERVED)


def test_the_committed_request_types_are_what_the_contracts_give(tmp_path):
    """phoenix/schema/request_types.py is written from the contracts (`make configs`)."""
    assert request_code.main(["--check"]) == 0
    stale = tmp_path / "request_types.py"
    stale.write_text(request_code.request_types_code().replace("top_k: np.ndarray", "top_k: int"))
    assert request_code.main(["--check", "--out", str(stale)]) == 1
    assert request_code.main(["--out", str(stale)]) == 0
    assert stale.read_text() == request_code.REQUEST_TYPES_FILE.read_text()


@pytest.mark.parametrize("model", sorted(REQUEST_TYPES))
def test_typed_fields_are_the_contract_inputs(model):
    request_type, contract = REQUEST_TYPES[model], served.contract(model)
    fields = dataclasses.fields(request_type)
    assert tuple(f.name for f in fields) == contract.input_names
    for field in fields:
        optional = contract.input(field.name).optional
        has_default = field.default is not dataclasses.MISSING
        assert has_default == optional, f"{model}.{field.name}: optional={optional}"
        assert not has_default or field.default is None
    assert batch_type(contract)._fields == (*contract.input_names, "sent")


def test_the_ranking_engine_reads_only_ranker_inputs():
    names = set(contracts.RANKER.input_names)
    assert set(ranking_inputs.HASHED_IDS) <= names
    assert set(ranking_inputs.FEATURES) <= names
    assert contracts.RANKER.input("candidate_post_age_seconds").optional  # read via `sent`


def fill(spec) -> float:
    """A value every check accepts: the lower bound when there is one."""
    return 0 if spec.values.low is None else spec.values.low


def shape_of(spec, rows=2, length=3) -> tuple[int, ...]:
    sizes = {symbol: length for symbol in LENGTH_LIMITS}
    sizes.update({s: getattr(CONFIG, f) for s, f in ARTIFACT_WIDTHS.items()})
    return (rows, *(axis if isinstance(axis, int) else sizes[axis] for axis in spec.axes))


def good_arrays(contract) -> dict[str, np.ndarray]:
    return {s.name: np.full(shape_of(s), fill(s), s.dtype) for s in contract.inputs}


def check(model, arrays):
    return parse(REQUEST_TYPES[model], arrays, CONFIG)


def specs_where(predicate):
    return [
        pytest.param(c.name, s, id=f"{c.name}.{s.name}")
        for c in SERVED
        for s in c.inputs
        if predicate(s)
    ]


@pytest.mark.parametrize("model", sorted(REQUEST_TYPES))
def test_a_request_at_the_bounds_is_accepted(model):
    request = check(model, good_arrays(served.contract(model)))
    assert request.rows == 2


@pytest.mark.parametrize("model, spec", specs_where(lambda s: s.values.low is not None))
def test_values_below_the_lower_bound_are_refused_naming_the_input(model, spec):
    arrays = good_arrays(served.contract(model))
    arrays[spec.name] = np.full(shape_of(spec), spec.values.low - 1, spec.dtype)
    with pytest.raises(InputError, match=f"input '{spec.name}': {spec.values.what} must"):
        check(model, arrays)


@pytest.mark.parametrize("model, spec", specs_where(lambda s: np.issubdtype(s.dtype, np.floating)))
def test_nan_is_refused_in_every_float_input(model, spec):
    arrays = good_arrays(served.contract(model))
    arrays[spec.name] = np.full(shape_of(spec), np.nan, spec.dtype)
    with pytest.raises(InputError, match=f"input '{spec.name}': contains NaN or infinite"):
        check(model, arrays)


@pytest.mark.parametrize("model, spec", specs_where(lambda s: s.length is not None))
def test_lengths_over_the_limit_are_refused(model, spec):
    contract = served.contract(model)
    limit = getattr(LIMITS, LENGTH_LIMITS[spec.length])
    arrays = {
        s.name: np.full(
            shape_of(s, length=limit + 1 if s.length == spec.length else 3), fill(s), s.dtype
        )
        for s in contract.inputs
    }
    with pytest.raises(InputError, match=f"at most {limit} allowed"):
        check(model, arrays)


@pytest.mark.parametrize(
    "model, spec",
    specs_where(lambda s: any(a in ARTIFACT_WIDTHS for a in s.axes)),
)
def test_artifact_widths_are_checked(model, spec):
    arrays = good_arrays(served.contract(model))
    shape = list(shape_of(spec))
    shape[-1] += 1
    arrays[spec.name] = np.full(shape, fill(spec), spec.dtype)
    with pytest.raises(InputError, match=f"input '{spec.name}': expected {shape[-1] - 1} "):
        check(model, arrays)


def test_inputs_sharing_a_length_must_agree_and_share_rows():
    arrays = good_arrays(contracts.RANKER)
    arrays["candidate_author_ids"] = np.ones((2, 4), np.int64)
    with pytest.raises(InputError, match="candidate inputs must have the same length"):
        check("ranker", arrays)
    arrays = good_arrays(contracts.RANKER)
    arrays["history_actions"] = np.zeros((3, 3, 4), np.float32)
    with pytest.raises(InputError, match="the request has 2"):
        check("ranker", arrays)


def test_dimensions_are_checked_for_in_process_callers():
    arrays = good_arrays(contracts.RETRIEVER)
    arrays["top_k"] = np.ones(2, np.int32)  # [R] instead of [R, 1]
    with pytest.raises(InputError, match=r"input 'top_k': expected shape \[R, 1\]"):
        check("retriever", arrays)


def test_empty_batch_has_the_padded_shape_of_every_input():
    batch = empty_batch(contracts.RANKER, 4, {"L": 6, "C": 16, "A": 4})
    assert batch.user_id.shape == (4,)
    assert batch.history_actions.shape == (4, 6, 4)
    assert batch.candidate_retrieval_scores.shape == (4, 16)
    assert set(batch.sent) == {s.name for s in contracts.RANKER.inputs if s.optional}
    assert not any(mask.any() for mask in batch.sent.values())


def test_pad_batch_stacks_rows_in_request_order():
    one = good_arrays(contracts.RANKER)
    one["candidate_post_ids"] = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    other = {k: v[:1, :2] if v.ndim > 1 and k.startswith("candidate") else v[:1]
             for k, v in good_arrays(contracts.RANKER).items()}  # fmt: skip
    other["candidate_post_ids"] = np.array([[7, 8]], np.int64)
    requests = [parse(RankerRequest, arrays, CONFIG) for arrays in (one, other)]
    batch = pad_batch(requests, 4, {"L": 5, "C": 4, "A": 4})
    np.testing.assert_array_equal(
        batch.candidate_post_ids, [[1, 2, 3, 0], [4, 5, 6, 0], [7, 8, 0, 0], [0, 0, 0, 0]]
    )
    assert batch.history_post_ids.shape == (4, 5)


def bad_variants(contract) -> list[dict[str, np.ndarray]]:
    """One request per way an input can be refused (a value under or over its bounds, NaN, a
    wrong rank), and two with two faults at once: a value and a rank, and, where the contract
    has them, a value in one input and an artifact width in a later one."""
    variants = []
    for spec in contract.inputs:

        def changed(array, name=spec.name):
            arrays = good_arrays(contract)
            arrays[name] = array
            variants.append(arrays)

        if spec.values.low is not None:
            changed(np.full(shape_of(spec), spec.values.low - 1, spec.dtype))
        if isinstance(spec.values.high, int | float):
            changed(np.full(shape_of(spec), spec.values.high + 1, spec.dtype))
        if np.issubdtype(spec.dtype, np.floating):
            changed(np.full(shape_of(spec), np.nan, spec.dtype))
        changed(np.full(shape_of(spec)[:1], fill(spec), spec.dtype))  # rank 1
    two_faults = good_arrays(contract)
    first, last = contract.inputs[0], contract.inputs[-1]
    two_faults[first.name] = np.full(shape_of(first), -1, first.dtype)
    two_faults[last.name] = np.full(shape_of(last)[:1], fill(last), last.dtype)
    variants.append(two_faults)
    # a bad value before a bad artifact width: parse names the value (inputs in turn)
    valued = [i for i, s in enumerate(contract.inputs) if s.values.low is not None]
    widths = [i for i, s in enumerate(contract.inputs) if set(s.axes) & set(ARTIFACT_WIDTHS)]
    later = [(v, w) for v in valued for w in widths if w > v]
    if later:
        value_spec, width_spec = (contract.inputs[i] for i in later[0])
        value_then_width = good_arrays(contract)
        value_then_width[value_spec.name] = np.full(
            shape_of(value_spec), value_spec.values.low - 1, value_spec.dtype
        )
        wide = list(shape_of(width_spec))
        wide[-1] += 1
        value_then_width[width_spec.name] = np.full(wide, fill(width_spec), width_spec.dtype)
        variants.append(value_then_width)
    return variants


def outcome(item) -> tuple:
    if isinstance(item, InputError):
        return ("refused", str(item), item.input)
    return ("accepted", {name: array.tolist() for name, array in item.arrays().items()})


@pytest.mark.parametrize("model", sorted(REQUEST_TYPES))
def test_parse_all_answers_each_request_as_parse_does(model):
    """Values checked together, then one by one where they fail: every request of a batch
    mixing good and bad ones gets what parse alone gives it, the same message."""
    contract = served.contract(model)
    bad = bad_variants(contract)
    batch = [good_arrays(contract)] + [x for arrays in bad for x in (arrays, good_arrays(contract))]
    alone = []
    for arrays in batch:
        try:
            alone.append(outcome(check(model, arrays)))
        except InputError as error:
            alone.append(outcome(error))
    together = [outcome(item) for item in parse_all(REQUEST_TYPES[model], batch, CONFIG)]
    assert together == alone
    refused = sum(1 for item in together if item[0] == "refused")
    assert refused == len(bad), f"{refused} refused of {len(bad)} bad requests"


def test_parse_all_of_good_requests_checks_their_values_together(monkeypatch):
    """The common case: a batch of good requests costs one value check an input."""
    seen = []
    real = requests_module.check_values
    monkeypatch.setattr(
        requests_module, "check_values", lambda c, *a: seen.append(c.name) or real(c, *a)
    )
    batch = [good_arrays(contracts.RANKER) for _ in range(16)]
    parsed = parse_all(RankerRequest, batch, CONFIG)
    assert all(isinstance(p, RankerRequest) for p in parsed)
    assert sorted(seen) == sorted(s.name for s in contracts.RANKER.inputs)
