"""Triton entry point of 'user_state': a thin adapter over phoenix.serving.services."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "user_state"
