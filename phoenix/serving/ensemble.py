"""The recommend chain (encode the user, retrieve, rank), run step by step as Triton runs it.

Triton runs the ``recommend`` ensemble on the server. The in-process references of the
clients, the serving benchmark and the load test need the same chain outside Triton; they all
run it from the ensemble's contract (``phoenix.serving.contracts.RECOMMEND``), whose steps the
config.pbtxt must repeat, so the chain is wired in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from phoenix.serving.contracts import (
    RECOMMEND,
    RETRIEVAL_PREFIX,
    USER_STATE,
    EnsembleStep,
    ModelContract,
)

Arrays = dict[str, np.ndarray]
# run_model(model, one input dict per request) -> one output dict per request
RunModel = Callable[[str, Sequence[Mapping[str, np.ndarray]]], Sequence[Mapping[str, np.ndarray]]]


def step_inputs(step: EnsembleStep, tensors: Mapping[str, np.ndarray]) -> Arrays:
    """The step model's inputs from the ensemble's tensors (absent optional ones left out)."""
    return {name: tensors[source] for name, source in step.input_map.items() if source in tensors}


def store_outputs(step: EnsembleStep, outputs: Mapping[str, np.ndarray], tensors: Arrays) -> None:
    """Put the step model's outputs into the ensemble's tensors under their mapped names."""
    for name, target in step.output_map.items():
        tensors[target] = outputs[name]


def passed_on_history(request: Mapping[str, np.ndarray]) -> Arrays:
    """What the ``user_state`` step answers for a request that carries its own history: that
    history as both the ranking and the retrieval history (an optional input it left out as
    zeros: dwell 0 reads as none) and no served posts; no store is read. Callers that run the
    later steps by hand start from it, so the history still reaches them."""
    rows, length = np.shape(request["history_post_ids"])
    outputs = {}
    for spec in USER_STATE.outputs:
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
    batcher would batch them; returns each request's ensemble outputs. Side-effect steps
    (served_log) are not run, so a reference run writes nothing to the user state: what they
    pass through (the feed) is passed on, what they make (the request id) is left out."""
    tensors = [dict(request) for request in requests]
    for step in ensemble.steps:
        if step.side_effect:
            for t in tensors:
                t.update(passed_through(step, t))
            continue
        results = run_model(step.model, [step_inputs(step, t) for t in tensors])
        for t, outputs in zip(tensors, results, strict=True):
            store_outputs(step, outputs, t)
    return [{name: t[name] for name in ensemble.output_names if name in t} for t in tensors]


def passed_through(step: EnsembleStep, tensors: Mapping[str, np.ndarray]) -> Arrays:
    """The outputs a step answers unchanged from its same-named inputs, under their ensemble
    names (served_log's feed)."""
    return {
        target: tensors[step.input_map[name]]
        for name, target in step.output_map.items()
        if step.input_map.get(name) in tensors
    }


def reference_steps(ensemble: ModelContract = RECOMMEND) -> tuple[EnsembleStep, ...]:
    """The steps an in-process reference runs: all but the side effects."""
    return tuple(step for step in ensemble.steps if not step.side_effect)


def next_step_inputs(
    request: Mapping[str, np.ndarray],
    done: Mapping[str, Mapping[str, np.ndarray]],
    model: str,
    ensemble: ModelContract = RECOMMEND,
) -> Arrays:
    """The inputs of the step running ``model``, given the ensemble request and the outputs
    of the steps already ``done`` ({model: outputs}), e.g. the retriever after user_encoder."""
    tensors = dict(request)
    for step in ensemble.steps:
        if step.model in done:
            store_outputs(step, done[step.model], tensors)
    return step_inputs(ensemble.step(model), tensors)


def run_until(
    run_model: RunModel,
    request: Mapping[str, np.ndarray],
    model: str,
    ensemble: ModelContract = RECOMMEND,
) -> Arrays:
    """The outputs of the step running ``model`` for one request, the steps before it run as
    the ensemble wires them: e.g. the ranking before the feed policy (``model="ranker"``)."""
    tensors = dict(request)
    for step in ensemble.steps:
        (outputs,) = run_model(step.model, [step_inputs(step, tensors)])
        if step.model == model:
            return dict(outputs)
        store_outputs(step, outputs, tensors)
    raise KeyError(f"{ensemble.name} has no step running {model!r}")
