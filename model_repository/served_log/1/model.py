"""Triton entry point of 'served_log': a thin adapter over phoenix.serving.services."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = "served_log"
