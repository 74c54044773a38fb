"""Triton entry point of 'candidate_tower': a thin adapter over phoenix.stub.services."""

from phoenix.stub.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "candidate_tower"
