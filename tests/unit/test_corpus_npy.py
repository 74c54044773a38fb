"""The store's ``.npy`` reads take turns: CPython 3.11's AST converter (numpy parses headers
with it) fails a thread when two parse at once."""

import threading

import numpy as np
import pytest

from phoenix.corpus_store.npy import HEADER_LOCK, load_npy


def test_a_read_waits_for_another_thread_holding_the_header_lock(tmp_path):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(5, dtype=np.int64))
    done = threading.Event()
    loaded = []

    def read():
        loaded.append(load_npy(path, mmap_mode="r"))
        done.set()

    with HEADER_LOCK:
        reader = threading.Thread(target=read)
        reader.start()
        assert not done.wait(0.3)  # blocked while another read holds the lock
    assert done.wait(5)
    reader.join()
    np.testing.assert_array_equal(loaded[0], np.arange(5))
    assert isinstance(loaded[0], np.memmap)


def test_a_pickled_array_is_refused(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="pickle"):
        load_npy(path)
