"""The metric families' table of the model reference (docs/reference.md's ``metrics`` block),
written from the stubs' metric families and the contracts: what each series counts, its
labels and the served models that export it; and the reference generators' error.

phoenix.ops.reference_docs puts the block in the document.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from phoenix.feed_policy import FILTERS
from phoenix.schema.served import CONTRACTS, CORPUS_READERS, PRODUCTION_CORPUS_READERS
from phoenix.schema.spec import ModelContract
from phoenix.stub import request_metrics as metrics
from phoenix.util.doc_blocks import DocBlockError


class ReferenceDocError(DocBlockError):
    """A document lacks a block's markers, or the code has something the generator does not
    describe."""


# The metric families of the stubs (``phoenix.stub.request_metrics``): labels besides
# ``model``, ``version`` and ``stub``, and what a series counts. The corpus gauges' meanings
# are the module's own (``CORPUS_GAUGES``).
FAMILY_LABELS = {
    metrics.REFUSED: ("input",),
    metrics.DROPPED: ("filter",),
    metrics.CACHE_EVICTIONS: (metrics.EVICTION_REASON,),
}
COUNTER_MEANINGS = {
    metrics.REFUSED: "requests answered INVALID_ARG, by the input at fault "
    f"(`{metrics.WHOLE_REQUEST}`: no single input); every input's series exists from the start",
    metrics.FAILED: "requests answered INTERNAL (their batch failed)",
    metrics.SERVED: "requests answered with outputs",
    metrics.CANDIDATES: "posts returned (non-zero ids of "
    + " or ".join(f"`{name}`" for name in metrics.CANDIDATE_OUTPUTS)
    + ")",
    metrics.IN_NETWORK: "of those posts, the in-network ones "
    f"(`{metrics.IN_NETWORK_OUTPUT}` output; the share is this over "
    f"`{metrics.CANDIDATES}`)",
    metrics.DROPPED: f"candidates each feed filter dropped (`{metrics.DROPPED_OUTPUT}` output; "
    "each post under the first filter that drops it): "
    + ", ".join(f"`{name}`" for name in FILTERS),
    metrics.CACHE_HITS: "rows whose prefix (user and history) the prefix cache held: only the "
    "candidates were computed",
    metrics.CACHE_MISSES: "rows whose prefix was computed (and kept)",
    metrics.CACHE_EVICTIONS: "prefix cache entries dropped, by `reason`: `budget` (least "
    "recently used out), `expired` (time to live), `version`",
}
# Gauges of ours besides the corpus store's: their meaning.
GAUGE_MEANINGS = {metrics.CACHE_BYTES: "bytes the prefix cache holds"}


def exporters(family: str, contracts: Mapping[str, ModelContract]) -> list[str]:
    """The served models whose stubs export ``family`` (an ensemble runs no stub)."""
    stubs = {name: c for name, c in contracts.items() if not c.is_ensemble}
    if family in metrics.STORE_METRICS:
        return [name for name in stubs if name in CORPUS_READERS]
    if family in metrics.PREFIX_CACHE_METRICS:  # the models with a prefix cache parameter
        return [n for n, c in stubs.items() if any(is_prefix_cache(p.name) for p in c.parameters)]
    wanted: dict[str, Callable[[ModelContract], bool]] = {
        metrics.CANDIDATES: lambda c: metrics.candidate_output(c.output_names) is not None,
        metrics.IN_NETWORK: lambda c: metrics.IN_NETWORK_OUTPUT in c.output_names,
        metrics.DROPPED: lambda c: metrics.DROPPED_OUTPUT in c.output_names,
    }
    test = wanted.get(family, lambda c: True)
    return [name for name, c in stubs.items() if test(c)]


def exporter(family: str, model: str) -> str:
    """A model that exports ``family``, as the table names it."""
    if family in metrics.STORE_METRICS and model in PRODUCTION_CORPUS_READERS:
        return f"`{model}` (production family)"
    return f"`{model}`"


def is_prefix_cache(parameter: str) -> bool:
    """Whether ``parameter`` sizes a prefix cache (the ranker's, or the chain's ranker's)."""
    return parameter.rsplit(".", 1)[-1] == "prefix_cache_mib"


def metrics_block(contracts: Mapping[str, ModelContract] = CONTRACTS) -> str:
    gauges = {name: description for name, description, _ in metrics.CORPUS_GAUGES}
    lines = ["| family | kind | labels | what a series counts | exported by |"]
    lines.append("| --- | --- | --- | --- | --- |")
    everyone = [name for name, c in contracts.items() if not c.is_ensemble]
    for family in metrics.OWN_METRICS:
        if family in gauges:
            kind, meaning = "gauge", gauges[family][0].lower() + gauges[family][1:]
            meaning += " (a model serving a corpus store only)"
        elif family in GAUGE_MEANINGS:
            kind, meaning = "gauge", GAUGE_MEANINGS[family]
        elif family in COUNTER_MEANINGS:
            kind, meaning = "counter", COUNTER_MEANINGS[family]
        else:
            raise ReferenceDocError(f"metric family {family!r} has no meaning in the generator")
        labels = ", ".join(("model", "version", *FAMILY_LABELS.get(family, ()), metrics.STUB))
        models = exporters(family, contracts)
        by = "every stub" if models == everyone else ", ".join(exporter(family, m) for m in models)
        lines.append(f"| `{family}` | {kind} | {labels} | {meaning} | {by} |")
    return "\n".join(lines)
