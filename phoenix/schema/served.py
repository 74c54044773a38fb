"""Every served model's contract by name: the seven stage models and recommend's chain and
ensemble. Configs, the model reference and the clients look models up here.
"""

from __future__ import annotations

from phoenix.schema.contracts import CORPUS_FILE, STAGE_MODELS
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN
from phoenix.schema.spec import ModelContract

CONTRACTS: dict[str, ModelContract] = {
    c.name: c for c in (*STAGE_MODELS, RECOMMEND_CHAIN, RECOMMEND)
}

# The models that read the corpus (they declare corpus_file): a corpus switch moves them all.
CORPUS_READERS = tuple(n for n, c in CONTRACTS.items() if CORPUS_FILE.name in c.parameter_names)
# Of those, the ones that open it over artifacts of the production family only: the user state
# looks the histories' semantic IDs up (over the original family's it reads no corpus).
PRODUCTION_CORPUS_READERS = ("user_state",)


def contract(model: str) -> ModelContract:
    """The contract of a served model by name."""
    try:
        return CONTRACTS[model]
    except KeyError:
        raise KeyError(f"no served model {model!r}; the models are {sorted(CONTRACTS)}") from None
