"""Triton entry point of the 'candidate_tower' model: a thin adapter over phoenix.serving.services."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "candidate_tower"
