"""Host arrays handed to Triton through DLPack capsules made here, over numpy's own memory.

Why not numpy's or JAX's capsules (docs/serving.md, "numpy 2 and DLPack"):
- the Triton 2.51 stub renames a capsule it consumes to "used_dlpack", not the "used_dltensor"
  the DLPack protocol names, so numpy's capsule destructor takes it for unconsumed, fails to
  read it and the stub dies (seen once);
- JAX's host buffers are safe but dear: one batched ``device_put`` of a batch's outputs, then
  JAX's own ``__dlpack__``, cost 75-78 us an output on 2 cores here and 93 us of a ranker
  stub's profiled time an output on an H200 machine (a third of its time a request), against
  16 us for the capsule made here (``python -m phoenix.serving.host_dlpack`` prints both).

A ``HostBuffer`` keeps its C-ordered array alive until the consumer calls the capsule's
deleter (the stub does when its tensor goes), or, for a capsule nobody consumed, until the
capsule itself goes. Its destructor tells the two apart by the capsule's name: still
"dltensor" means unconsumed. The two C callbacks are made once and never freed (a callback
freed at interpreter shutdown while a consumer still holds a tensor would crash the process).
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

CAPSULE_NAME = b"dltensor"
CPU_DEVICE = 1  # kDLCPU
# DLPack type codes by numpy kind (kDLInt, kDLUInt, kDLFloat); bool is served as int8 here
TYPE_CODES = {"i": 0, "u": 1, "f": 2}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # NULL: C order
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", Deleter),
]

# What each live managed tensor needs kept: {its address: (struct, shape array, numpy array)}
_alive: dict[int, tuple] = {}


def _release(address: int) -> None:
    try:
        _alive.pop(address, None)
    except Exception:  # at interpreter shutdown the dict may be gone already
        pass


@Deleter
def _deleter(managed):
    _release(ctypes.addressof(managed.contents))


# The capsule destructor gets the dying capsule as a raw pointer: a py_object argument would
# take a reference to an object being freed.
_python = ctypes.PyDLL(None)
_capsule_is_valid = _python.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_pointer = _python.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_capsule_new = _python.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    if _capsule_is_valid(capsule, CAPSULE_NAME):  # never consumed: nobody else will delete
        _release(_capsule_pointer(capsule, CAPSULE_NAME))


_DESTRUCTOR = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value
for _callback in (_deleter, _capsule_destructor):  # never freed, not even at shutdown
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_callback))


class HostBuffer:
    """A host array as a DLPack producer (``__dlpack__``, ``__dlpack_device__``)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        array = np.require(array, requirements="C")  # ascontiguousarray makes 0-d 1-d
        if array.dtype.kind not in TYPE_CODES:
            raise TypeError(f"HostBuffer: no DLPack type for {array.dtype}")
        self.array = array

    def __dlpack_device__(self) -> tuple[int, int]:
        return (CPU_DEVICE, 0)

    def __dlpack__(self, stream=None, **_):
        array = self.array
        managed = DLManagedTensor()
        shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
        tensor = managed.dl_tensor
        tensor.data = array.ctypes.data
        tensor.device = DLDevice(CPU_DEVICE, 0)
        tensor.ndim = array.ndim
        tensor.dtype = DLDataType(TYPE_CODES[array.dtype.kind], array.dtype.itemsize * 8, 1)
        tensor.shape = shape
        managed.deleter = _deleter
        address = ctypes.addressof(managed)
        _alive[address] = (managed, shape, array)
        return _capsule_new(address, CAPSULE_NAME, _DESTRUCTOR)


def host_buffers(arrays) -> list[HostBuffer]:
    """``HostBuffer`` of each (array, dtype) pair, cast to its dtype."""
    return [HostBuffer(np.asarray(array, dtype=dtype)) for array, dtype in arrays]


def live_count() -> int:
    """Managed tensors made here and not yet released (for tests)."""
    return len(_alive)


def jax_host_buffers(arrays) -> list:
    """The way outputs left the stubs before (for the comparison): each (array, dtype) as a
    host JAX buffer, the whole list in one batched ``device_put`` (``enable_x64`` keeps int64
    ids int64)."""
    import jax

    typed = [np.asarray(array, dtype=dtype) for array, dtype in arrays]
    with jax.enable_x64(True):
        return jax.device_put(typed, jax.devices("cpu")[0])


def compare_with_jax(rounds: int = 200) -> dict[str, float]:
    """Microseconds an output for a ranker-like batch (16 requests x 5 outputs) made into
    capsules here and through JAX's host buffers, timed in turns."""

    rng = np.random.default_rng(0)
    outputs = []
    for _ in range(16):
        outputs += [
            (rng.integers(0, 64, (1, 64)), np.int32),
            (rng.random((1, 64)), np.float32),
            (rng.random((1, 64, 19)), np.float32),
            (rng.integers(0, 2**62, (1, 64)), np.int64),
            (rng.integers(0, 2**62, (1, 64)), np.int64),
        ]
    ways = {
        "host_dlpack": lambda: [b.__dlpack__() for b in host_buffers(outputs)],
        "jax": lambda: [b.__dlpack__() for b in jax_host_buffers(outputs)],
    }
    best = {}
    for _ in range(3):
        for name, way in ways.items():
            way()
            started = time.perf_counter()
            for _ in range(rounds):
                way()
            each = (time.perf_counter() - started) / rounds / len(outputs) * 1e6
            best[name] = min(best.get(name, each), each)
    return best


if __name__ == "__main__":
    for name, us in compare_with_jax().items():
        print(f"{name:<12} {us:6.1f} us an output (best of 3 passes)")
