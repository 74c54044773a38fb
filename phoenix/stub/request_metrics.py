"""The served models' own counters on Triton's ``/metrics`` page (custom metrics of the Python
backend, ``pb_utils.MetricFamily``, Triton 2.51).

Triton counts every request the Python backend executed as a success in
``nv_inference_request_success``, the refused and the failed ones too; only these counters
tell them apart:

    phoenix_requests_refused_total{model, input}   answered INVALID_ARG, by the input at fault
                                                   ("(request)": no single input is)
    phoenix_requests_failed_total{model}           answered INTERNAL (a batch that failed)

what each served model and artifact version answered (``ServedMetrics``, each family for the
models whose contract has the output it counts):

    phoenix_requests_served_total{model, version}     answered with outputs
    phoenix_candidates_served_total{model, version}   posts returned (ranked_post_ids, post_ids)
    phoenix_in_network_served_total{model, version}   of those, posts from the in-network source
                                                      (in_network; share = this / candidates)
    phoenix_policy_dropped_total{model, version, filter}
                                                      candidates each feed filter dropped
                                                      (filtered_counts)

(these four are sent at most once a second, FLUSH_INTERVAL_S, and when the instance ends: each
send is a round trip to the server),

and, for a model following a corpus store (``CorpusMetrics``; a corpus file has none):

    phoenix_corpus_generation{model}                  the store generation it serves
    phoenix_corpus_lag_seconds{model}                 how long a newer generation has waited
                                                      (0: it serves the newest it has seen)
    phoenix_corpus_skipped_generations{model}         generations it refused to load (a torn
                                                      copy, another tower's vectors)

and, for a model with a prefix cache (``PrefixCacheMetrics``: the ranker, the chain's ranker
stage; none when it is off), sent as ServedMetrics sends its counts:

    phoenix_prefix_cache_hits_total{model, version}   rows whose prefix the cache held
    phoenix_prefix_cache_misses_total{model, version} rows whose prefix was computed
    phoenix_prefix_cache_evictions_total{model, version, reason}
                                                      entries dropped: budget (least recently
                                                      used out), expired, version
    phoenix_prefix_cache_bytes{model, version}        bytes it holds

Each model instance (one stub process) creates its families once, at the end of
``initialize``, and its own series: every series also carries ``stub`` (the stub's process
id), so queries sum over it (``sum by (model, ...)``). Why not one series shared by the
instances of a model: Triton 2.51 hands instances that ask for the same labels the same
series, and frees it when the first of them unloads, while the others still count into it. A
reload under traffic (new instances beside the old, then the old unloaded) then corrupted the
server's heap ("corrupted double-linked list", signal 6; tests/integration/test_faults.py's
corpus swap under load). Every series exists from the start, at 0, so that a rate sees the
first refusal. Without MetricFamily support (another Triton, metrics off, tests) the metrics
do nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from phoenix.feed_policy import FILTERS

logger = logging.getLogger("phoenix.stub")

REFUSED = "phoenix_requests_refused_total"
FAILED = "phoenix_requests_failed_total"
# The `input` label of a refusal that no single input is to blame for (rows that disagree,
# too many rows, unknown inputs).
WHOLE_REQUEST = "(request)"
STUB = "stub"  # the label of the stub process counting a series (see above)
VERSION = "version"  # the label of the artifacts' version a series counts for


def own_series(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` plus this stub process's own label, so no other instance shares the series."""
    return {**labels, STUB: str(os.getpid())}


def family_maker(pb: Any) -> Optional[Callable[[str, str, str], Any]]:
    """``make(name, description, kind)`` of this Triton's metric families (kind: "COUNTER" or
    "GAUGE"); None when it has no custom metrics."""
    family_type = getattr(pb, "MetricFamily", None)
    if family_type is None:
        return None

    def make(name: str, description: str, kind: str) -> Any:
        return family_type(name=name, description=description, kind=getattr(family_type, kind))

    return make


class RequestMetrics:
    """The refused and failed counters of one model instance."""

    def __init__(self, pb: Any, model: str, version: str, inputs: Sequence[str]):
        self._families: list[Any] = []
        self._refused: dict[str, Any] = {}
        self._failed: Optional[Any] = None
        make = family_maker(pb)
        if make is None:
            logger.warning("%s: this Triton has no custom metrics; refusals go uncounted", model)
            return
        try:
            refused = make(
                REFUSED, "Requests answered INVALID_ARG, by model and the input at fault", "COUNTER"
            )
            failed = make(
                FAILED, "Requests answered INTERNAL (their batch failed), by model", "COUNTER"
            )
            self._families = [refused, failed]  # Triton: a family must outlive its metrics
            labels = {"model": model, VERSION: version}
            self._refused = {
                name: refused.Metric(labels=own_series({**labels, "input": name}))
                for name in (*inputs, WHOLE_REQUEST)
            }
            self._failed = failed.Metric(labels=own_series(labels))
        except Exception as error:  # metrics off (--allow-metrics=false): serve without them
            logger.warning("%s: no custom metrics (%s); refusals go uncounted", model, error)
            self.close()

    def count_refused(self, input_name: Optional[str]) -> None:
        """One request answered INVALID_ARG because of ``input_name`` (None: the whole request)."""
        metric = self._refused.get(input_name or WHOLE_REQUEST, self._refused.get(WHOLE_REQUEST))
        if metric is not None:
            metric.increment(1)

    def count_failed(self) -> None:
        """One request answered INTERNAL."""
        if self._failed is not None:
            self._failed.increment(1)

    def close(self) -> None:
        """Drop the metrics, then their families (the order Triton requires)."""
        self._refused = {}
        self._failed = None
        self._families = []


# ----------------------------------------------------------------------------------------
# What each model version served (docs/rollout.md: two versions serve side by side during a
# rollout, and the dashboard tells their traffic apart)
# ----------------------------------------------------------------------------------------

SERVED = "phoenix_requests_served_total"
CANDIDATES = "phoenix_candidates_served_total"
IN_NETWORK = "phoenix_in_network_served_total"
DROPPED = "phoenix_policy_dropped_total"
# The outputs holding a model's posts, first found wins; id 0 is padding (served_log's rows).
CANDIDATE_OUTPUTS = ("ranked_post_ids", "post_ids")
IN_NETWORK_OUTPUT = "in_network"  # per returned post: 1 from the in-network source (0: padding)
DROPPED_OUTPUT = "filtered_counts"  # [rows, filters] in phoenix.feed_policy.FILTERS order


# ServedMetrics and PrefixCacheMetrics send their counts at most this often (seconds): each
# send is a round trip. METRICS_INTERVAL_ENV overrides it (0: after every batch, as the tests
# that count a served model's cache hits run their server).
FLUSH_INTERVAL_S = 1.0
METRICS_INTERVAL_ENV = "PHOENIX_METRICS_INTERVAL_S"


def flush_interval() -> float:
    """Seconds between two sends of a stub's counts: $PHOENIX_METRICS_INTERVAL_S, else
    FLUSH_INTERVAL_S."""
    text = os.environ.get(METRICS_INTERVAL_ENV, "").strip()
    if not text:
        return FLUSH_INTERVAL_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"${METRICS_INTERVAL_ENV} must be seconds >= 0, got {text!r}")
    return seconds


def nonzero(results: Sequence[dict], output: str) -> int:
    """The nonzero entries of ``output`` across ``results`` (0 is padding)."""
    return sum(int(np.count_nonzero(r[output])) for r in results)


def candidate_output(outputs: Sequence[str]) -> Optional[str]:
    """The output whose ids count as the model's candidates; None: the model returns none."""
    return next((name for name in CANDIDATE_OUTPUTS if name in outputs), None)


class ServedMetrics:
    """Requests answered, candidates returned, how many of those were in-network and what the
    feed filters dropped, by one model instance; labelled with the model's served name (a
    rollout's ``ranker__next`` has its own series) and the version of its artifacts."""

    def __init__(
        self,
        pb: Any,
        model: str,
        version: str,
        outputs: Sequence[str],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._clock = clock
        self._interval = flush_interval()
        self._flushed_at = -float("inf")  # the first batch is shown at once
        self._pending: dict[int, list] = {}  # id(metric) -> [metric, count not yet sent]
        self._families: list[Any] = []
        self._served: Optional[Any] = None
        self._candidates: Optional[Any] = None
        self._in_network: Optional[Any] = None
        self._dropped: list[Any] = []  # one per filter, in FILTERS order
        self._candidate_output = candidate_output(outputs)
        make = family_maker(pb)
        if make is None:
            return
        labels = own_series({"model": model, VERSION: version})
        try:
            self._served = self._counter(make, SERVED, "Requests answered with outputs", labels)
            if self._candidate_output is not None:
                self._candidates = self._counter(
                    make, CANDIDATES, "Posts returned in answers", labels
                )
            if IN_NETWORK_OUTPUT in outputs:
                self._in_network = self._counter(
                    make, IN_NETWORK, "Posts returned from the in-network source", labels
                )
            if DROPPED_OUTPUT in outputs:
                family = self._family(make, DROPPED, "Candidates dropped by each feed filter")
                self._dropped = [family.Metric(labels={**labels, "filter": f}) for f in FILTERS]
        except Exception as error:  # metrics off: serve without them
            logger.warning("%s: no served-request metrics (%s)", model, error)
            self.close()

    def _family(self, make, name: str, what: str) -> Any:
        family = make(name, f"{what}, by model and artifact version", "COUNTER")
        self._families.append(family)  # Triton: a family must outlive its metrics
        return family

    def _counter(self, make, name: str, what: str, labels: dict[str, str]) -> Any:
        return self._family(make, name, what).Metric(labels=labels)

    def count(self, results: Sequence[dict]) -> None:
        """Requests answered with ``results`` ({output: array} each), one batch of them.

        The counts are added up and sent at most once per FLUSH_INTERVAL_S (and when the
        instance ends): an increment is a round trip to the server, about 50 us of the stub's
        time on an idle machine and 0.7-1.2 ms under load, when it was a quarter of
        feed_policy's execute time (PHOENIX_STUB_PROFILE, bench_user_state at concurrency
        16, 2 cores, one increment per series and batch). /metrics lags by at most that."""
        if not results:
            return
        if self._served is not None:
            self._add(self._served, len(results))
        if self._candidates is not None and self._candidate_output is not None:
            self._add(self._candidates, nonzero(results, self._candidate_output))
        if self._in_network is not None:
            self._add(self._in_network, nonzero(results, IN_NETWORK_OUTPUT))
        if self._dropped:
            per_filter = sum(r[DROPPED_OUTPUT].reshape(-1, len(FILTERS)).sum(0) for r in results)
            for metric, dropped in zip(self._dropped, per_filter):
                self._add(metric, int(dropped))
        if self._clock() - self._flushed_at >= self._interval:
            self.flush()

    def _add(self, metric: Any, count: int) -> None:
        self._pending.setdefault(id(metric), [metric, 0])[1] += count

    def flush(self) -> None:
        """Send what was counted since the last flush."""
        for metric, count in self._pending.values():
            if count:
                metric.increment(count)
        self._pending.clear()
        self._flushed_at = self._clock()

    def close(self) -> None:
        self.flush()  # nothing counted is lost when the instance ends
        self._served = self._candidates = self._in_network = None
        self._dropped = []
        self._families = []


# ----------------------------------------------------------------------------------------
# The corpus store a model follows (phoenix.corpus_store.follow)
# ----------------------------------------------------------------------------------------

GENERATION = "phoenix_corpus_generation"
LAG = "phoenix_corpus_lag_seconds"
SKIPPED = "phoenix_corpus_skipped_generations"
CORPUS_GAUGES = (
    (GENERATION, "The corpus store generation the model serves", "generation"),
    (LAG, "Seconds a newer store generation has waited to be served (0: none)", "lag_seconds"),
    (SKIPPED, "Store generations the model refused to load, since it started", "skipped"),
)


# ----------------------------------------------------------------------------------------
# The prefix cache of a ranker (phoenix.engine.prefix_cache): the ranker's, the chain's
# ----------------------------------------------------------------------------------------

CACHE_HITS = "phoenix_prefix_cache_hits_total"
CACHE_MISSES = "phoenix_prefix_cache_misses_total"
CACHE_EVICTIONS = "phoenix_prefix_cache_evictions_total"
CACHE_BYTES = "phoenix_prefix_cache_bytes"
EVICTION_REASON = "reason"  # the label of an eviction: budget, expired, version
PREFIX_CACHE_METRICS = (CACHE_HITS, CACHE_MISSES, CACHE_EVICTIONS, CACHE_BYTES)


class PrefixCacheMetrics:
    """The prefix cache of one model instance: rows whose prefix was found (hits) or computed
    (misses), entries evicted by reason, bytes held; nothing for a model without one (or with
    it off). Sent at most once per FLUSH_INTERVAL_S, as ServedMetrics sends its counts, and
    when the instance ends."""

    def __init__(
        self,
        pb: Any,
        model: str,
        version: str,
        cache: Any,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._cache = cache  # a phoenix.engine.prefix_cache.PrefixCache, or None
        self._clock = clock
        self._interval = flush_interval()
        self._flushed_at = -float("inf")
        self._families: list[Any] = []
        self._counters: dict[str, Any] = {}  # "hits", "misses", "evicted:<reason>" -> metric
        self._sent: dict[str, int] = {}
        self._bytes: Optional[Any] = None
        self._bytes_shown: Optional[int] = None
        make = family_maker(pb)
        if make is None or cache is None:
            return
        labels = own_series({"model": model, VERSION: version})
        try:
            for key, name, what in (
                ("hits", CACHE_HITS, "Rows whose prefix the prefix cache held"),
                ("misses", CACHE_MISSES, "Rows whose prefix was computed"),
            ):
                self._counters[key] = self._family(make, name, what, "COUNTER").Metric(
                    labels=labels
                )
            evictions = self._family(
                make, CACHE_EVICTIONS, "Prefix cache entries dropped, by reason", "COUNTER"
            )
            for reason in cache.stats().evicted:
                self._counters[f"evicted:{reason}"] = evictions.Metric(
                    labels={**labels, EVICTION_REASON: reason}
                )
            self._bytes = self._family(
                make, CACHE_BYTES, "Bytes the prefix cache holds", "GAUGE"
            ).Metric(labels=labels)
        except Exception as error:  # metrics off: serve without them
            logger.warning("%s: no prefix cache metrics (%s)", model, error)
            self._counters, self._bytes, self._families = {}, None, []
            return
        self._sent = dict.fromkeys(self._counters, 0)
        self.update(force=True)  # every series from the start

    def _family(self, make, name: str, what: str, kind: str) -> Any:
        family = make(name, f"{what}, by model and artifact version", kind)
        self._families.append(family)  # Triton: a family must outlive its metrics
        return family

    def update(self, force: bool = False) -> None:
        """Send what changed since the last send, at most once per flush interval."""
        if self._bytes is None or self._cache is None:
            return
        if not force and self._clock() - self._flushed_at < self._interval:
            return
        stats = self._cache.stats()
        now = {"hits": stats.hits, "misses": stats.misses}
        now.update({f"evicted:{reason}": count for reason, count in stats.evicted.items()})
        for key, metric in self._counters.items():
            if now[key] > self._sent[key]:
                metric.increment(now[key] - self._sent[key])
                self._sent[key] = now[key]
        if stats.bytes != self._bytes_shown:
            self._bytes.set(float(stats.bytes))
            self._bytes_shown = stats.bytes
        self._flushed_at = self._clock()

    def close(self) -> None:
        self.update(force=True)  # nothing counted is lost when the instance ends
        self._counters = {}
        self._bytes = None
        self._families = []


# Every family of ours, and those only a server following a corpus store exports.
STORE_METRICS = tuple(name for name, _, _ in CORPUS_GAUGES)
OWN_METRICS = (
    REFUSED,
    FAILED,
    SERVED,
    CANDIDATES,
    IN_NETWORK,
    DROPPED,
    *STORE_METRICS,
    *PREFIX_CACHE_METRICS,
)


class CorpusMetrics:
    """Gauges of the corpus store one model instance follows, set after each batch from
    ``corpus.state()`` (``phoenix.stub.corpus.CorpusState``); nothing for a corpus without
    a ``state`` (a corpus file: it never changes while served)."""

    def __init__(self, pb: Any, model: str, version: str, corpus: Any):
        self._families: list[Any] = []
        self._gauges: list[tuple[Any, str]] = []  # (gauge, the CorpusState field it shows)
        self._shown: dict[int, float] = {}  # gauge index -> the value last set
        self._state = getattr(corpus, "state", None)
        make = family_maker(pb)
        if make is None or self._state is None:
            return
        try:
            for name, description, field in CORPUS_GAUGES:
                family = make(name, f"{description}, by model", "GAUGE")
                self._families.append(family)
                labels = own_series({"model": model, VERSION: version})
                self._gauges.append((family.Metric(labels=labels), field))
        except Exception as error:  # metrics off: serve without them
            logger.warning("%s: no corpus metrics (%s)", model, error)
            self.close()
        self.update()

    def update(self) -> None:
        """Set each gauge whose value changed (a set is a round trip to the server, as an
        increment is: ServedMetrics.count); the first update sets them all."""
        if not self._gauges or self._state is None:  # gauges are made only with a state
            return
        state = self._state()
        for index, (gauge, field) in enumerate(self._gauges):
            value = float(getattr(state, field))
            if self._shown.get(index) != value:
                gauge.set(value)
                self._shown[index] = value

    def close(self) -> None:
        self._gauges = []
        self._families = []
