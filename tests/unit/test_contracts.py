"""The served models' contracts (phoenix.schema.contracts) are consistent in themselves."""

import numpy as np
import pytest

from phoenix.schema import spec
from phoenix.schema.contracts import RANKER
from phoenix.schema.recommend import RECOMMEND
from phoenix.schema.served import contract


def test_ensemble_steps_only_use_the_step_models_tensors():
    produced = set(RECOMMEND.input_names)
    for step in RECOMMEND.steps:
        step_contract = contract(step.model)
        assert set(step.input_map) <= set(step_contract.input_names)
        assert set(step_contract.required_inputs) <= set(step.input_map)
        assert set(step.input_map.values()) <= produced  # fed by earlier steps or the request
        assert set(step.output_map) <= set(step_contract.output_names)
        produced |= set(step.output_map.values())
    assert set(RECOMMEND.output_names) <= produced


def test_batch_buckets_reach_max_batch_size():
    assert RANKER.batch_buckets == (1, 2, 4, 8)
    assert contract("user_encoder").batch_buckets == (1, 2, 4, 8, 16)
    assert spec.powers_of_two_up_to(12) == (1, 2, 4, 8, 12)
    assert spec.powers_of_two_up_to(1) == (1,)


def test_tensor_spec_names_its_dtypes_the_triton_way():
    spec = RANKER.input("history_actions")
    assert (spec.dtype, spec.triton_dtype, spec.config_dtype) == (
        np.dtype(np.float32),
        "FP32",
        "TYPE_FP32",
    )
    assert spec.ndim == 3 and spec.ragged and not spec.optional
    with pytest.raises(KeyError, match="no served model"):
        contract("nope")
