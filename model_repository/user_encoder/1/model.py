"""Triton entry point of 'user_encoder': a thin adapter over phoenix.stub.services."""

from phoenix.stub.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "user_encoder"
