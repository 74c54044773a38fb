"""Triton entry point of 'feed_policy': a thin adapter over phoenix.serving.services."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "feed_policy"
