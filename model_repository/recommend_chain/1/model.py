"""Triton entry point of 'recommend_chain': a thin adapter over phoenix.serving.services."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "recommend_chain"
