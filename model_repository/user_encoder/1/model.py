"""Triton entry point of the 'user_encoder' model: a thin adapter over phoenix.serving.services."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "user_encoder"
