"""Triton entry point of 'recommend_chain': a thin adapter over phoenix.stub.services."""

from phoenix.stub.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "recommend_chain"
