"""Steps wired by their input and output maps: an ensemble's, or the stages of recommend's
chain (read the user's state, encode the user, retrieve, rank, apply the policy, log).

The wiring is written once, in the contracts (``RECOMMEND.steps``, ``RECOMMEND_CHAIN.stages``):
``recommend_chain``'s service runs its stages with ``step_inputs`` and ``store_outputs``; the
clients, the load test and the benchmarks run the stages one served model at a time
(``run_until``, ``next_step_inputs``) to show or time what one stage answers, and the
in-process references run an ensemble's steps (``run_ensemble``) as Triton runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from phoenix.schema.contracts import PRODUCTION_STATE_NAMES, RETRIEVAL_PREFIX, USER_STATE
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN
from phoenix.schema.spec import EnsembleStep, ModelContract

Arrays = dict[str, np.ndarray]
# run_model(model, one input dict per request) -> one output dict per request
RunModel = Callable[[str, Sequence[Mapping[str, np.ndarray]]], Sequence[Mapping[str, np.ndarray]]]


def step_inputs(step: EnsembleStep, tensors: Mapping[str, np.ndarray]) -> Arrays:
    """The step model's inputs from the ensemble's tensors (absent optional ones left out)."""
    return {name: tensors[source] for name, source in step.input_map.items() if source in tensors}


def store_outputs(step: EnsembleStep, outputs: Mapping[str, np.ndarray], tensors: Arrays) -> None:
    """Put the step model's outputs into the ensemble's tensors under their mapped names."""
    for name, target in step.output_map.items():
        if name in outputs:  # a reference's chain makes no request id
            tensors[target] = outputs[name]


def passed_on_history(request: Mapping[str, np.ndarray]) -> Arrays:
    """What the ``user_state`` step answers for a request that carries its own history: that
    history as both the ranking and the retrieval history (an optional input it left out as
    zeros: dwell 0 reads as none) and no served posts; no store is read. Callers that run the
    later steps by hand start from it, so the history still reaches them. (What the step adds
    for the production family is its own: ``stub.services.production_state``.)"""
    rows, length = np.shape(request["history_post_ids"])
    outputs = {}
    for spec in USER_STATE.outputs:
        if spec.name in PRODUCTION_STATE_NAMES:
            continue
        source = spec.name.removeprefix(RETRIEVAL_PREFIX)
        if source in request:
            outputs[spec.name] = np.asarray(request[source], spec.dtype)
        else:  # dwell seconds (L wide) or served posts (none)
            outputs[spec.name] = np.zeros((rows, length if spec.length == "L" else 0), spec.dtype)
    return outputs


def run_ensemble(
    run_model: RunModel, requests: Sequence[Mapping[str, np.ndarray]], ensemble=RECOMMEND
) -> list[Arrays]:
    """Every step for all requests at once (one ``run_model`` call per step), like the
    batcher would batch them; returns each request's ensemble outputs (those its steps made)."""
    tensors = [dict(request) for request in requests]
    for step in ensemble.steps:
        results = run_model(step.model, [step_inputs(step, t) for t in tensors])
        for t, outputs in zip(tensors, results, strict=True):
            store_outputs(step, outputs, t)
    return [{name: t[name] for name in ensemble.output_names if name in t} for t in tensors]


def next_step_inputs(
    request: Mapping[str, np.ndarray],
    done: Mapping[str, Mapping[str, np.ndarray]],
    model: str,
    chain: ModelContract = RECOMMEND_CHAIN,
) -> Arrays:
    """The inputs of the stage running ``model``, given the recommend request and the outputs
    of the stages already ``done`` ({model: outputs}), e.g. the retriever after user_encoder."""
    tensors = dict(request)
    for stage in chain.stages:
        if stage.model in done:
            store_outputs(stage, done[stage.model], tensors)
    return step_inputs(chain.step(model), tensors)


def run_until(
    run_model: RunModel,
    request: Mapping[str, np.ndarray],
    model: str,
    chain: ModelContract = RECOMMEND_CHAIN,
) -> Arrays:
    """The outputs of the stage running ``model`` for one request, the stages before it run as
    the chain wires them, one ``run_model`` call each (e.g. the served models by name): the
    ranking before the feed policy (``model="ranker"``)."""
    tensors = dict(request)
    for stage in chain.stages:
        (outputs,) = run_model(stage.model, [step_inputs(stage, tensors)])
        if stage.model == model:
            return dict(outputs)
        store_outputs(stage, outputs, tensors)
    raise KeyError(f"{chain.name} has no stage running {model!r}")
