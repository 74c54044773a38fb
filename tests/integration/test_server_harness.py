"""The harness against a REAL tritonserver serving a throwaway Python-backend model."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from harness.polling import wait_until
from phoenix.ops.triton_server import TritonServer, TritonServerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ADD_ONE_CONFIG = """\
name: "add_one"
backend: "python"
max_batch_size: 16
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# The backend hands execute() the requests the batcher grouped; it does not stack them for us.
# Tensors go through DLPack (the project's own adapter, phoenix.stub.triton_adapter): under
# numpy 2 the 2.51 stub's as_numpy()/Tensor(ndarray) corrupt them.
ADD_ONE_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils

from phoenix.stub.host_dlpack import HostBuffer
from phoenix.stub.triton_adapter import input_array


class TritonPythonModel:
    def initialize(self, args):
        self.max_requests_seen = 0

    def execute(self, requests):
        self.max_requests_seen = max(self.max_requests_seen, len(requests))
        inputs = [input_array(pb_utils.get_input_tensor_by_name(r, "INPUT0")) for r in requests]
        outputs = np.concatenate(inputs, axis=0) + np.float32(1)
        splits = np.cumsum([len(x) for x in inputs])[:-1]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor.from_dlpack("OUTPUT0", HostBuffer(part.astype(np.float32)))
                ]
            )
            for part in np.split(outputs, splits)
        ]

    def finalize(self):
        print(f"add_one: largest batch was {self.max_requests_seen} requests", flush=True)
"""


def write_add_one_repository(root: Path, model_source: str = ADD_ONE_MODEL) -> Path:
    """A model repository with the single add_one model; returns its path."""
    model_dir = root / "add_one"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(ADD_ONE_CONFIG)
    (model_dir / "1" / "model.py").write_text(model_source)
    return root


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    repo = write_add_one_repository(root / "model_repository")
    server = TritonServer(repo, log_path=root / "tritonserver.log", ready_timeout=120)
    with server:
        print(f"toy server ready after {server.ready_after_s:.2f} s at {server.http_url}")
        yield server


def http_add_one(url: str, values: np.ndarray) -> np.ndarray:
    with httpclient.InferenceServerClient(url=url) as client:
        tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values, binary_data=True)
        result = client.infer("add_one", [tensor])
        return result.as_numpy("OUTPUT0")


def grpc_add_one(url: str, values: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url=url) as client:
        tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
        tensor.set_data_from_numpy(values)
        return client.infer("add_one", [tensor]).as_numpy("OUTPUT0")


def test_addresses_are_loopback_and_distinct(toy_server):
    ports = {toy_server.http_port, toy_server.grpc_port, toy_server.metrics_port}
    assert len(ports) == 3 and 0 not in ports
    assert toy_server.http_url.startswith("127.0.0.1:")
    assert toy_server.grpc_url.startswith("127.0.0.1:")
    assert toy_server.metrics_url.startswith("http://127.0.0.1:")


def test_http_inference(toy_server):
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(http_add_one(toy_server.http_url, values), values + 1)


def test_grpc_inference(toy_server):
    values = np.array([[-1.5, 0.0, 2.5, 7.0]], dtype=np.float32)
    np.testing.assert_array_equal(grpc_add_one(toy_server.grpc_url, values), values + 1)


def model_metric(metrics_url: str, name: str, model: str = "add_one") -> float:
    """Value of a Prometheus counter such as nv_inference_request_success for one model."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        metrics = response.read().decode()
    for line in metrics.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {model} not in the metrics page")


def settled_metric(metrics_url: str, name: str, at_least: float, seconds: float = 10.0) -> float:
    """The counter once it reaches ``at_least`` (or after ``seconds``): Triton counts a request
    after the backend has sent its response, so a client can hold the answer a moment before
    the metrics page shows it."""
    wait_until(lambda: model_metric(metrics_url, name) >= at_least, seconds)
    return model_metric(metrics_url, name)


def test_concurrent_requests_are_batched_and_split_back(toy_server):
    url = toy_server.metrics_url
    executions_before = model_metric(url, "nv_inference_exec_count")
    succeeded_before = model_metric(url, "nv_inference_request_success")
    requests = [np.full((1, 5), i, dtype=np.float32) for i in range(24)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda x: http_add_one(toy_server.http_url, x), requests))
    for values, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result, values + 1)
    # every request counted first, so that the executions read are all of theirs
    succeeded = settled_metric(
        url, "nv_inference_request_success", succeeded_before + len(requests)
    )
    assert succeeded == succeeded_before + len(requests)
    executions = model_metric(url, "nv_inference_exec_count")
    assert 0 < executions - executions_before < len(requests)  # the batcher grouped some


def test_metrics_count_successful_requests(toy_server):
    url = toy_server.metrics_url
    before = model_metric(url, "nv_inference_request_success")
    http_add_one(toy_server.http_url, np.zeros((1, 2), dtype=np.float32))
    assert settled_metric(url, "nv_inference_request_success", before + 1) == before + 1


@pytest.mark.serial  # a time bound a busy neighbour would blur
def test_server_stops_within_a_few_seconds(tmp_path, start_server):
    repo = write_add_one_repository(tmp_path / "repo")
    server = start_server(repo, exit_timeout_secs=2)
    assert server.is_ready()
    began = time.monotonic()
    server.stop(timeout=10)
    elapsed = time.monotonic() - began
    assert not server.is_running()
    assert elapsed < 8, f"stop() took {elapsed:.1f} s"
    assert "largest batch" in server.log_tail(200)  # finalize() ran: a clean shutdown


def test_a_killed_server_leaves_no_stub_shared_memory_or_folder_behind(tmp_path, start_server):
    """The Python backend removes an instance's shared-memory region when the instance
    unloads; a killed server cannot: kill() removes its regions by its prefix, and its
    temporary folders."""
    repo = write_add_one_repository(tmp_path / "repo")
    server = start_server(repo, log_path=tmp_path / "server.log")
    stubs = psutil.Process(server.pid).children()
    regions = server.shared_memory_regions()
    assert len(stubs) == len(regions) == 1, (stubs, regions)
    server.kill()
    assert not server.is_running()
    _, alive = psutil.wait_procs(stubs, timeout=5)
    assert not alive and not regions[0].exists()
    assert not server.stub_dir.exists() and not any(tmp_path.glob("server.stubs-*"))


def test_a_server_gone_at_its_exit_timeout_leaves_no_shared_memory_behind(tmp_path, start_server):
    """An instance that takes longer to finalize than the exit timeout allows is never
    unloaded: tritonserver exits without removing its region; stop() removes it."""
    slow_to_finalize = ADD_ONE_MODEL.replace(
        "    def finalize(self):\n",
        "    def finalize(self):\n        __import__('time').sleep(5)\n",
    )
    assert slow_to_finalize != ADD_ONE_MODEL
    repo = write_add_one_repository(tmp_path / "repo", slow_to_finalize)
    server = start_server(repo, exit_timeout_secs=1)
    regions = server.shared_memory_regions()
    assert len(regions) == 1
    server.stop(timeout=10)
    assert "Exit timeout expired" in server.log_tail(50)  # gone before the instance unloaded
    assert not regions[0].exists() and server.shared_memory_regions() == []


def test_wait_ready_reports_a_dying_server_with_its_log(tmp_path):
    broken = ADD_ONE_MODEL.replace(
        "self.max_requests_seen = 0", "raise RuntimeError('add_one cannot start')"
    )
    repo = write_add_one_repository(tmp_path / "repo", broken)
    server = TritonServer(repo, log_path=tmp_path / "server.log", ready_timeout=120)
    with pytest.raises(TritonServerError) as caught:
        with server:
            pass
    message = str(caught.value)
    assert "exited with code" in message
    assert "add_one cannot start" in message
    assert not server.is_running()


def test_wait_ready_times_out_with_a_clear_error(tmp_path):
    repo = write_add_one_repository(tmp_path / "repo")
    server = TritonServer(repo, log_path=tmp_path / "server.log").start()
    try:
        with pytest.raises(TritonServerError, match="not ready after 0 s"):
            server.wait_ready(timeout=0.01)
    finally:
        server.stop()


def test_missing_repository_is_reported_before_starting(tmp_path):
    with pytest.raises(TritonServerError, match="model repository not found"):
        TritonServer(tmp_path / "nope").start()


def test_start_server_passes_flags(tmp_path, start_server):
    repo = write_add_one_repository(tmp_path / "repo")
    server = start_server(repo, model_control_mode="explicit", load_model="*")
    assert "--model-control-mode=explicit" in server.last_command
    assert "--load-model=*" in server.last_command
    values = np.ones((1, 3), dtype=np.float32)
    np.testing.assert_array_equal(grpc_add_one(server.grpc_url, values), values + 1)
