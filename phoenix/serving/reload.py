"""Loading served models again with changed parameters, on a running server, through the
model load API (the server runs with --model-control-mode=explicit; with an admin key when
the load API is restricted).

A corpus switch (``switch_corpus``) moves every model that reads the corpus
(``contracts.CORPUS_READERS``: the retriever searches it, the feed policy dates posts from
it), so the age filter dates the posts the retriever finds. The new value lasts as long as
the server: a model loaded later from the repository reads its config's corpus again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Optional

from phoenix.serving.admin_key import admin_headers
from phoenix.serving.contracts import CORPUS_FILE, CORPUS_READERS
from phoenix.serving.inprocess import server_model_config, server_parameters


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
