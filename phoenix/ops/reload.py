"""Loading served models again with changed parameters, on a running server, through the
model load API (the server runs with --model-control-mode=explicit; with an admin key when
the load API is restricted).

A corpus switch (``switch_corpus``) moves every model that reads the corpus
(``served.CORPUS_READERS``: the retriever searches it, the feed policy dates posts from
it, recommend's chain does both), so the age filter dates the posts the retriever finds. A
stage's parameters changed on its model by name (``reload_with_chains``: the feed policy's)
are changed in every chain running that stage too, so that recommend follows. The new values
last as long as the server: a model loaded later from the repository reads its config again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Optional

from phoenix.client.inprocess import server_model_config, server_parameters
from phoenix.ops.admin_key import admin_headers
from phoenix.schema.contracts import CORPUS_FILE
from phoenix.schema.recommend import stage_parameter
from phoenix.schema.served import CONTRACTS, CORPUS_READERS


def reload_model(
    client, protocol: str, model: str, changes: Mapping[str, str], admin_key: Optional[str]
) -> None:
    """Load ``model`` again with its served config's parameters ``changes`` ({name: text})
    set, the others as they are; the server must then report them and the model be ready."""
    config = server_model_config(client, protocol, model)
    parameters = config.setdefault("parameters", {})
    parameters.update({name: {"string_value": value} for name, value in changes.items()})
    client.load_model(model, headers=admin_headers(admin_key, protocol), config=json.dumps(config))
    served = server_parameters(client, protocol, model)
    wrong = {name: served.get(name) for name, value in changes.items() if served.get(name) != value}
    if wrong or not client.is_model_ready(model):
        raise RuntimeError(f"after the load {model} serves {wrong or 'nothing'}, not {changes}")


def chains_of(model: str) -> list[str]:
    """The chain models that run ``model`` as a stage (recommend_chain runs the policy)."""
    return [c.name for c in CONTRACTS.values() if any(s.model == model for s in c.stages)]


def reload_with_chains(
    client, protocol: str, model: str, changes: Mapping[str, str], admin_key: Optional[str]
) -> list[str]:
    """``reload_model`` of ``model``, then of every loaded chain running it as a stage, with
    the parameters that changed under the chain's names for them; returns the models loaded
    again. A chain that fails names the models already serving the change."""
    served = server_parameters(client, protocol, model)
    changed = {name: value for name, value in changes.items() if served.get(name) != value}
    try:
        reload_model(client, protocol, model, changes, admin_key)
    except Exception as error:
        raise RuntimeError(f"{error} (the server serves what it served)") from error
    done = [model]
    for chain in chains_of(model):
        if not client.is_model_ready(chain):
            continue
        renamed = {stage_parameter(model, name): value for name, value in changed.items()}
        try:
            reload_model(client, protocol, chain, renamed, admin_key)
        except Exception as error:
            raise RuntimeError(
                f"{', '.join(done)} now serve the change but reloading {chain} failed: {error}"
            ) from error
        done.append(chain)
    return done


def loaded_corpus_readers(client) -> list[str]:
    """The models reading the corpus that the server has loaded (explicit model control may
    load only some)."""
    return [model for model in CORPUS_READERS if client.is_model_ready(model)]


def switch_corpus(
    client, protocol: str, corpus_file: str, admin_key: Optional[str]
) -> Sequence[str]:
    """Every loaded model that reads the corpus reloaded onto ``corpus_file`` (a corpus file or
    store inside the artifact directory); returns their names. A failed load names the
    models already switched (they serve ``corpus_file``; the others what they served)."""
    models = loaded_corpus_readers(client)
    if not models:
        raise RuntimeError(f"the server has none of {list(CORPUS_READERS)} loaded")
    for done, model in enumerate(models):
        try:
            reload_model(client, protocol, model, {CORPUS_FILE.name: corpus_file}, admin_key)
        except Exception as error:
            if done == 0:
                raise RuntimeError(f"{error} (the server serves what it served)") from error
            switched = ", ".join(models[:done])
            raise RuntimeError(
                f"{switched} now serve {corpus_file!r} but reloading {model} failed: {error}"
            ) from error
    return models
