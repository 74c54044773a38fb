"""Outputs handed to Triton as DLPack capsules: made over numpy's memory against JAX's.

    python -m bench.bench_host_dlpack

Times, in turns, the two ways a stub's outputs became DLPack capsules: ``HostBuffer``
(phoenix/stub/host_dlpack.py, the way now) and host JAX buffers made by one batched
``device_put`` of the batch's outputs, then JAX's ``__dlpack__`` (the way before
2026-11-27), for a ranker-like batch of 16 requests x 5 outputs. Prints microseconds an output.
"""

from __future__ import annotations

import time

import numpy as np

from phoenix.stub.host_dlpack import host_buffers
from phoenix.util.command_line import command_parser


def jax_host_buffers(arrays) -> list:
    """Each (array, dtype) as a host JAX buffer, the list in one batched ``device_put``
    (``enable_x64`` keeps int64 ids int64): the stubs' way before."""
    import jax

    typed = [np.asarray(array, dtype=dtype) for array, dtype in arrays]
    with jax.enable_x64(True):
        return jax.device_put(typed, jax.devices("cpu")[0])


def ranker_like_outputs(requests: int = 16) -> list:
    rng = np.random.default_rng(0)
    outputs = []
    for _ in range(requests):
        outputs += [
            (rng.integers(0, 64, (1, 64)), np.int32),
            (rng.random((1, 64)), np.float32),
            (rng.random((1, 64, 19)), np.float32),
            (rng.integers(0, 2**62, (1, 64)), np.int64),
            (rng.integers(0, 2**62, (1, 64)), np.int64),
        ]
    return outputs


def compare(rounds: int, passes: int = 3) -> dict[str, float]:
    """Best microseconds an output of each way over ``passes`` passes in turns."""
    outputs = ranker_like_outputs()
    ways = {
        "host_dlpack": lambda: [b.__dlpack__() for b in host_buffers(outputs)],
        "jax": lambda: [b.__dlpack__() for b in jax_host_buffers(outputs)],
    }
    best: dict[str, float] = {}
    for _ in range(passes):
        for name, way in ways.items():
            way()
            started = time.perf_counter()
            for _ in range(rounds):
                way()
            each = (time.perf_counter() - started) / rounds / len(outputs) * 1e6
            best[name] = min(best.get(name, each), each)
    return best


def main(argv=None) -> int:
    parser = command_parser("python -m bench.bench_host_dlpack", __doc__)
    parser.add_argument("--rounds", type=int, default=200, help="batches a pass (%(default)s)")
    args = parser.parse_args(argv)
    best = compare(args.rounds)
    for name, us in best.items():
        print(f"{name:<12} {us:6.1f} us an output (best of 3 passes)")
    print(f"host_dlpack / jax: {best['host_dlpack'] / best['jax']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
