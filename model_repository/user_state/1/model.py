"""Triton entry point of 'user_state': a thin adapter over phoenix.stub.services."""

from phoenix.stub.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "user_state"
