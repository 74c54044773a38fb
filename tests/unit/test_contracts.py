"""Every model_repository/*/config.pbtxt says what its contract (phoenix.serving.contracts) says."""

from pathlib import Path

import numpy as np
import pytest

from phoenix.serving import contracts
from phoenix.serving.contracts import CONTRACTS, LIMITS, RANKER, RECOMMEND, contract
from phoenix.serving.repository import contract_mismatches, model_config_paths, read_config

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
CONFIGS = {path.parent.name: path for path in model_config_paths(REPOSITORY)}


def test_every_served_model_has_a_contract_and_a_config():
    assert set(CONFIGS) == set(CONTRACTS)


@pytest.mark.parametrize("model", sorted(CONTRACTS))
def test_config_agrees_with_its_contract(model):
    assert contract_mismatches(read_config(CONFIGS[model]), contract(model)) == []


def test_a_disagreeing_config_is_reported_field_by_field():
    config = read_config(CONFIGS["ranker"])
    config.max_batch_size = 16
    config.input[4].data_type = config.output[1].data_type  # history_product_surface: FP32
    config.input[3].dims[:] = [-1]  # history_actions loses its action axis
    config.input[5].optional = False  # history_dwell_seconds becomes required
    config.output.add(name="extra")
    config.parameters["candidate_buckets"].string_value = "16,64,256,512,2048"
    problems = contract_mismatches(config, RANKER)
    assert problems == [
        "max_batch_size 16, contract 8",
        "input 'history_actions': dims [-1], contract [-1, -1]",
        "input 'history_dwell_seconds': optional False, contract True",
        "input 'history_product_surface': data_type TYPE_FP32, contract TYPE_INT32",
        "output 'extra' is not in the contract",
        "parameter 'candidate_buckets' '16,64,256,512,2048', contract '16,64,256,512,1024'",
    ]


def test_a_rewired_ensemble_step_is_reported():
    config = read_config(CONFIGS["recommend"])
    config.ensemble_scheduling.step[2].input_map["candidate_post_ids"] = "history_post_ids"
    (problem,) = contract_mismatches(config, RECOMMEND)
    assert problem.startswith("ensemble steps")


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


def test_every_serving_profile_compiles_the_largest_allowed_request():
    """The largest candidate bucket of each deployment (CPU contract, GPU profile) is the
    request limit: a larger limit would compile new shapes while serving."""
    from phoenix.serving.repository import GPU_SERVING

    gpu = dict(GPU_SERVING["ranker"].parameters)["candidate_buckets"]
    for buckets in (RANKER.parameters["candidate_buckets"], gpu):
        assert int(buckets.split(",")[-1]) == LIMITS.max_candidates, buckets


def test_batch_buckets_reach_max_batch_size():
    assert RANKER.batch_buckets == (1, 2, 4, 8)
    assert contract("user_encoder").batch_buckets == (1, 2, 4, 8, 16)
    assert contracts.powers_of_two_up_to(12) == (1, 2, 4, 8, 12)
    assert contracts.powers_of_two_up_to(1) == (1,)


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


def test_engine_default_candidate_buckets_are_the_contracts():
    """Until the engine reads the contract, its default buckets must equal it."""
    from phoenix.engine import DEFAULT_CANDIDATE_BUCKETS

    assert tuple(DEFAULT_CANDIDATE_BUCKETS) == contracts.RANKER_CANDIDATE_BUCKETS
