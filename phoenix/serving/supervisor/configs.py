"""What the supervisor reads from model configs: stubs, instances, ensemble steps, reloads."""

from __future__ import annotations

import copy
from collections.abc import Mapping

RESTART_PARAMETER = "phoenix_supervisor_restart"


def has_stubs(config: Mapping) -> bool:
    """Python-backend models run in stubs; ensembles and other backends do not."""
    return config.get("backend") == "python"


def expected_instances(config: Mapping) -> set[str]:
    """Instance names Triton gives a model's instances: '<group name>_<index>'."""
    names = set()
    for index, group in enumerate(config.get("instance_group") or []):
        group_name = group.get("name") or f"{config['name']}_{index}"
        names.update(f"{group_name}_{i}" for i in range(int(group.get("count", 1))))
    return names


def composing_models(config: Mapping) -> set[str]:
    """The models an ensemble's steps call (empty for other models)."""
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    return {step["model_name"] for step in steps if step.get("model_name")}


def with_restart_marker(config: Mapping, marker: str) -> dict:
    """A copy of `config` with the restart marker parameter set to `marker`.

    A load request whose config differs from the loaded one makes Triton load a new copy of
    the model (and start a new stub); an unchanged config would be a no-op.
    """
    override = copy.deepcopy(dict(config))
    parameters = dict(override.get("parameters") or {})
    parameters[RESTART_PARAMETER] = {"string_value": marker}
    override["parameters"] = parameters
    return override
