"""The served models' own counters on Triton's ``/metrics`` page (custom metrics of the Python
backend, ``pb_utils.MetricFamily``, Triton 2.51).

Triton counts every request the Python backend executed as a success in
``nv_inference_request_success``, the refused and the failed ones too; only these counters
tell them apart:

    phoenix_requests_refused_total{model, input}   answered INVALID_ARG, by the input at fault
                                                   ("(request)": no single input is)
    phoenix_requests_failed_total{model}           answered INTERNAL (a batch that failed)

Each model instance (one stub process) creates its families once, at ``initialize``; Triton
shares a series between the instances of a model, so they add up. Every series exists from
the start, at 0, so that a rate sees the first refusal. Without MetricFamily support (another
Triton, metrics off, tests) the counters do nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Optional

logger = logging.getLogger("phoenix.serving")

REFUSED = "phoenix_requests_refused_total"
FAILED = "phoenix_requests_failed_total"
# The `input` label of a refusal that no single input is to blame for (rows that disagree,
# too many rows, unknown inputs).
WHOLE_REQUEST = "(request)"


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
                name: refused.Metric(labels={"model": model, "input": name})
                for name in (*inputs, WHOLE_REQUEST)
            }
            self._failed = failed.Metric(labels={"model": model})
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
