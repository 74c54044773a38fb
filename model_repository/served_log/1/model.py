"""Triton entry point of 'served_log': a thin adapter over phoenix.stub.services."""

from phoenix.stub.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "served_log"
