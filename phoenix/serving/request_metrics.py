"""The served models' own counters on Triton's ``/metrics`` page (custom metrics of the Python
backend, ``pb_utils.MetricFamily``, Triton 2.51).

Triton counts every request the Python backend executed as a success in
``nv_inference_request_success``, the refused and the failed ones too; only these counters
tell them apart:

    phoenix_requests_refused_total{model, input}   answered INVALID_ARG, by the input at fault
                                                   ("(request)": no single input is)
    phoenix_requests_failed_total{model}           answered INTERNAL (a batch that failed)

and what each served model and artifact version answered (``ServedMetrics``):

    phoenix_requests_served_total{model, version}    answered with outputs
    phoenix_candidates_served_total{model, version}  posts returned (models that return posts)

Each model instance (one stub process) creates its families once, at the end of
``initialize``, and its own series: every series also carries ``stub`` (the stub's process
id), so queries sum over it (``sum by (model, ...)``). Why not one series shared by the
instances of a model: Triton 2.51 hands instances that ask for the same labels the same
series, and frees it when the first of them unloads, while the others still count into it. A
reload under traffic (new instances beside the old, then the old unloaded) then corrupted the
server's heap ("corrupted double-linked list", signal 6; tests/integration/test_faults.py's
corpus swap under load). Every series exists from the start, at 0, so that a rate sees the
first refusal. Without MetricFamily support (another Triton, metrics off, tests) the counters
do nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, Optional

logger = logging.getLogger("phoenix.serving")

REFUSED = "phoenix_requests_refused_total"
FAILED = "phoenix_requests_failed_total"
# The `input` label of a refusal that no single input is to blame for (rows that disagree,
# too many rows, unknown inputs).
WHOLE_REQUEST = "(request)"
STUB = "stub"  # the label of the stub process counting a series (see above)


def own_series(labels: dict[str, str]) -> dict[str, str]:
    """``labels`` plus this stub process's own label, so no other instance shares the series."""
    return {**labels, STUB: str(os.getpid())}


class RequestMetrics:
    """The refused and failed counters of one model instance."""

    def __init__(self, pb: Any, model: str, inputs: Sequence[str]):
        self._families: list[Any] = []
        self._refused: dict[str, Any] = {}
        self._failed: Optional[Any] = None
        family_type = getattr(pb, "MetricFamily", None)
        if family_type is None:
            logger.warning("%s: this Triton has no custom metrics; refusals go uncounted", model)
            return
        try:
            refused = family_type(
                name=REFUSED,
                description="Requests answered INVALID_ARG, by model and the input at fault",
                kind=family_type.COUNTER,
            )
            failed = family_type(
                name=FAILED,
                description="Requests answered INTERNAL (their batch failed), by model",
                kind=family_type.COUNTER,
            )
            self._families = [refused, failed]  # Triton: a family must outlive its metrics
            self._refused = {
                name: refused.Metric(labels=own_series({"model": model, "input": name}))
                for name in (*inputs, WHOLE_REQUEST)
            }
            self._failed = failed.Metric(labels=own_series({"model": model}))
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
# The outputs holding a model's posts, first found wins; id 0 is padding (served_log's rows).
CANDIDATE_OUTPUTS = ("ranked_post_ids", "post_ids")


def candidate_output(outputs: Sequence[str]) -> Optional[str]:
    """The output whose ids count as the model's candidates; None: the model returns none."""
    return next((name for name in CANDIDATE_OUTPUTS if name in outputs), None)


def candidate_count(result: dict) -> int:
    """Posts (non-zero ids) in one answer of a model with a candidate output."""
    import numpy as np

    name = candidate_output(list(result))
    return int(np.count_nonzero(result[name])) if name is not None else 0


class ServedMetrics:
    """Requests answered and candidates returned by one model instance, labelled with the
    model's served name (a rollout's ``ranker__next`` has its own series) and the version of
    the artifacts it serves."""

    def __init__(self, pb: Any, model: str, version: str, outputs: Sequence[str]):
        self._families: list[Any] = []
        self._served: Optional[Any] = None
        self._candidates: Optional[Any] = None
        family_type = getattr(pb, "MetricFamily", None)
        if family_type is None:
            return
        labels = own_series({"model": model, "version": version})
        try:
            served = family_type(
                name=SERVED,
                description="Requests answered with outputs, by model and artifact version",
                kind=family_type.COUNTER,
            )
            self._families = [served]
            self._served = served.Metric(labels=labels)
            if candidate_output(outputs) is not None:
                candidates = family_type(
                    name=CANDIDATES,
                    description="Posts returned in answers, by model and artifact version",
                    kind=family_type.COUNTER,
                )
                self._families.append(candidates)
                self._candidates = candidates.Metric(labels=labels)
        except Exception as error:  # metrics off: serve without them
            logger.warning("%s: no served-request metrics (%s)", model, error)
            self.close()

    def count(self, result: dict) -> None:
        """One request answered with ``result`` ({output: array})."""
        if self._served is not None:
            self._served.increment(1)
        if self._candidates is not None:
            self._candidates.increment(candidate_count(result))

    def close(self) -> None:
        self._served = self._candidates = None
        self._families = []
