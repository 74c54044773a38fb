"""Host arrays handed to Triton through DLPack capsules made here, over numpy's own memory.

Why not numpy's or JAX's capsules (docs/serving.md, "numpy 2 and DLPack"):
- the Triton 2.51 stub renames a capsule it consumes to "used_dlpack", not the "used_dltensor"
  the DLPack protocol names, so numpy's capsule destructor takes it for unconsumed, fails to
  read it and the stub dies (seen once);
- JAX's host buffers are safe but dear: one batched ``device_put`` of a batch's outputs, then
  JAX's own ``__dlpack__``, cost 75-78 us an output on 2 cores here (93 us of ``device_put``
  alone an output in a ranker stub profiled under cProfile on an H200 machine), against 16 us
  for the capsule made here (``python -m bench.bench_host_dlpack`` times both).

A ``HostBuffer`` keeps its C-ordered array alive until the consumer calls the capsule's
deleter (the stub does when its tensor goes), or, for a capsule nobody consumed, until the
capsule itself goes. Its destructor tells the two apart by the capsule's name: still
"dltensor" means unconsumed. (A capsule dropped while a Python error is pending, as by a
consumer that refuses it with a Python exception, stays in ``_alive``: the destructor's calls
fail then. The Triton stub refuses with C++ errors, before it renames.) The two C callbacks
and the name are made once and never freed (a callback freed at interpreter shutdown while a
consumer still holds a tensor would crash the process).
"""

from __future__ import annotations

import ctypes

import numpy as np

# Every capsule keeps a pointer to this name: a buffer never freed, not even at shutdown.
_NAME_BUFFER = ctypes.create_string_buffer(b"dltensor")
_NAME_ADDRESS = ctypes.addressof(_NAME_BUFFER)
CAPSULE_NAME = _NAME_BUFFER.value
CPU_DEVICE = 1  # kDLCPU
# DLPack (type code, bits) of the dtypes made into capsules (kDLInt 0, kDLUInt 1, kDLFloat 2),
# in native byte order; others (bool, float128, complex, strings) are refused.
TYPE_CODES = {
    np.dtype(name): (code, np.dtype(name).itemsize * 8)
    for code, names in ((0, "int8 int16 int32 int64"), (1, "uint8 uint16 uint32 uint64"),
                        (2, "float16 float32 float64"))
    for name in names.split()
}  # fmt: skip


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
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _capsule_destructor(capsule):
    if _capsule_is_valid(capsule, CAPSULE_NAME):  # never consumed: nobody else will delete
        _release(_capsule_pointer(capsule, CAPSULE_NAME))


_DESTRUCTOR = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value
for _kept in (_deleter, _capsule_destructor, _NAME_BUFFER):  # never freed, not even at shutdown
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_kept))


class HostBuffer:
    """A host array as a DLPack producer (``__dlpack__``, ``__dlpack_device__``)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        array = np.asarray(array)
        native = array.dtype.newbyteorder("=")
        if native not in TYPE_CODES:
            raise TypeError(f"HostBuffer: no DLPack type for {array.dtype}")
        # C order and native bytes (ascontiguousarray would make a 0-d array 1-d)
        self.array = np.require(array, native, requirements="C")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (CPU_DEVICE, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device) != (CPU_DEVICE, 0):
            raise BufferError(f"HostBuffer: host memory only, not device {tuple(dl_device)}")
        array = self.array.copy() if copy else self.array
        managed = DLManagedTensor()
        shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
        tensor = managed.dl_tensor
        tensor.data = array.ctypes.data
        tensor.device = DLDevice(CPU_DEVICE, 0)
        tensor.ndim = array.ndim
        tensor.dtype = DLDataType(*TYPE_CODES[array.dtype], 1)
        tensor.shape = shape
        managed.deleter = _deleter
        address = ctypes.addressof(managed)
        _alive[address] = (managed, shape, array)
        return _capsule_new(address, _NAME_ADDRESS, _DESTRUCTOR)


def host_buffers(arrays) -> list[HostBuffer]:
    """``HostBuffer`` of each (array, dtype) pair, cast to its dtype."""
    return [HostBuffer(np.asarray(array, dtype=dtype)) for array, dtype in arrays]


def live_count() -> int:
    """Managed tensors made here and not yet released (for tests)."""
    return len(_alive)
