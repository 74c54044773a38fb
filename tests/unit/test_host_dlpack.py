"""DLPack capsules over numpy memory (phoenix/stub/host_dlpack.py): values, lifetimes, and
the Triton stub's way of consuming them."""

import ctypes
import gc

import numpy as np
import pytest

from phoenix.stub import host_dlpack
from phoenix.stub.host_dlpack import HostBuffer, host_buffers, live_count

# The served output dtypes (contracts), at the edges of their ranges.
SERVED = [
    np.array([[2**63 - 1, -(2**63), 0, 2**53 + 1]], np.int64),
    np.array([[2**31 - 1, -(2**31), 7]], np.int32),
    np.array([[1.5, -0.0, np.float32(3.4e38), np.float32(1e-45)]], np.float32),
    np.array([[-128, 127, 0]], np.int8),
]


@pytest.mark.parametrize("array", SERVED, ids=lambda a: str(a.dtype))
def test_a_consumer_reads_the_same_bits_and_shape(array):
    got = np.from_dlpack(HostBuffer(array))
    assert got.dtype == array.dtype and got.shape == array.shape
    assert got.tobytes() == array.tobytes()


def test_shapes_empty_scalar_and_strided_arrays():
    assert np.from_dlpack(HostBuffer(np.zeros((0, 5), np.int8))).shape == (0, 5)
    assert np.from_dlpack(HostBuffer(np.float32(2.5))).shape == ()
    strided = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]  # not C-ordered
    np.testing.assert_array_equal(np.from_dlpack(HostBuffer(strided)), strided)


def test_host_buffers_cast_to_the_dtypes_given():
    a, b = host_buffers([([1, 2], np.int64), (np.float64([0.5]), np.float32)])
    assert np.from_dlpack(a).dtype == np.int64 and np.from_dlpack(b).dtype == np.float32


def test_dtypes_without_a_dlpack_code_are_refused():
    bad = (np.array([True]), np.array(["x"]), np.array([1 + 2j]), np.zeros(2, np.longdouble))
    for array in bad:
        with pytest.raises(TypeError, match="no DLPack type"):
            HostBuffer(array)


def test_other_byte_orders_are_made_native():
    big_endian = np.array([1, 2, 3], ">i4")
    got = np.from_dlpack(HostBuffer(big_endian))
    assert got.dtype == np.dtype("=i4")
    np.testing.assert_array_equal(got, [1, 2, 3])


def test_a_consumer_asking_for_a_copy_gets_one_and_another_device_is_refused():
    array = np.arange(4, dtype=np.int32)
    copied = np.from_dlpack(HostBuffer(array), copy=True)
    shared = np.from_dlpack(HostBuffer(array))
    assert not np.shares_memory(copied, array) and np.shares_memory(shared, array)
    with pytest.raises(BufferError, match="host memory only"):
        HostBuffer(array).__dlpack__(dl_device=(2, 0))


def test_memory_lives_until_the_consumer_or_the_unconsumed_capsule_goes():
    gc.collect()
    before = live_count()
    consumed = np.from_dlpack(HostBuffer(np.arange(5, dtype=np.int64)))
    unconsumed = HostBuffer(np.arange(3, dtype=np.int32)).__dlpack__()
    assert live_count() == before + 2
    del unconsumed  # nobody took it: its destructor releases
    assert live_count() == before + 1
    np.testing.assert_array_equal(consumed, np.arange(5))  # still readable
    del consumed  # the consumer calls the deleter
    gc.collect()
    assert live_count() == before


_python = ctypes.PyDLL(None)  # own prototypes: ctypes.pythonapi's are shared with others
_set_name = _python.PyCapsule_SetName
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_pointer = _python.PyCapsule_GetPointer
_pointer.restype = ctypes.c_void_p
_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def test_consumed_as_the_triton_stub_does_released_once_by_its_deleter():
    # The 2.51 stub takes the pointer, renames the capsule "used_dlpack" (not the protocol's
    # "used_dltensor") and calls the deleter when its tensor goes. The capsule's destructor
    # must then leave the memory alone, whatever the name.
    gc.collect()
    before = live_count()
    array = np.arange(6, dtype=np.int64) * 2**60
    capsule = HostBuffer(array).__dlpack__()
    address = _pointer(capsule, host_dlpack.CAPSULE_NAME)
    _set_name(capsule, b"used_dlpack")
    managed = host_dlpack.DLManagedTensor.from_address(address)
    tensor = managed.dl_tensor
    assert tensor.ndim == 1 and tensor.shape[0] == 6 and not tensor.strides
    assert (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes) == (0, 64, 1)
    data = (ctypes.c_int64 * 6).from_address(tensor.data)
    assert list(data) == list(array)
    del capsule  # renamed: its destructor must not release
    assert live_count() == before + 1
    managed.deleter(ctypes.pointer(managed))  # the stub's tensor goes
    assert live_count() == before
