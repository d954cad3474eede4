"""Large results arrive without a copy: a read-only array over the mapped result segment."""

from __future__ import annotations

import gc

import pytest

import isorun

np = pytest.importorskip("numpy")


def _mapping_of(address: int) -> str:
    """The /proc/self/maps line of the mapping that holds `address`."""
    with open("/proc/self/maps") as f:
        for line in f:
            span = line.split()[0]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return line.strip()
    return ""


def ramp(n):
    import numpy

    return numpy.arange(n, dtype=numpy.float64)


def test_a_large_array_is_a_read_only_view_of_the_mapped_segment():
    n = 8 << 20  # 64 MiB of float64
    a = isorun.isolated(ramp)(n)
    assert a.dtype == np.float64 and a.shape == (n,)
    assert not a.flags.writeable and not a.flags.owndata
    address = a.__array_interface__["data"][0]
    assert address % 64 == 0
    line = _mapping_of(address)
    # The result segment: a shared mapping of isorun's memfd, not this process's heap.
    assert "memfd:isorun-segment" in line and line.split()[1].endswith("s"), line
    assert a[0] == 0 and a[-1] == n - 1 and a[12345] == 12345
    assert np.array_equal(a, np.arange(n, dtype=np.float64))
    with pytest.raises(ValueError):
        a[0] = 1
    private = a.copy()
    private[0] = 1
    assert private.flags.writeable and a[0] == 0


def constant(n, value):
    import numpy

    return numpy.full(n, value, dtype=numpy.int64)


def test_while_the_array_lives_its_segment_serves_no_other_call():
    f = isorun.isolated(constant)
    a = f(1 << 20, 1)
    view = a[10:20]
    address = a.__array_interface__["data"][0]
    del a
    gc.collect()
    # Segments are pooled: the view still holds this one, so the next calls get others.
    others = [f(1 << 20, 2 + i) for i in range(3)]
    assert all(o.__array_interface__["data"][0] != address for o in others)
    assert "memfd:isorun-segment" in _mapping_of(address)
    assert view.tolist() == [1] * 10
    assert [int(o[0]) for o in others] == [2, 3, 4]


def several():
    import numpy

    return {
        "small": numpy.array([1, 2, 3], dtype=numpy.int8),
        "matrix": numpy.arange(12, dtype=numpy.int32).reshape(3, 4).T,  # not C-contiguous
        "bytes": bytes(range(256)) * 1000,
        "bytearray": bytearray(b"xyz") * 100000,
        "structured": numpy.zeros(5, dtype=[("a", "<i4"), ("b", "<f8")]),
        "text": "plain",
    }


def test_several_buffers_and_layouts_arrive_intact():
    r = isorun.isolated(several)()
    assert r["small"].tolist() == [1, 2, 3]
    assert r["matrix"].tolist() == np.arange(12, dtype=np.int32).reshape(3, 4).T.tolist()
    assert r["bytes"] == bytes(range(256)) * 1000
    assert r["bytearray"] == bytearray(b"xyz") * 100000
    assert r["structured"].dtype.names == ("a", "b") and len(r["structured"]) == 5
    assert r["text"] == "plain"


def test_arrays_travel_as_arguments():
    x = np.linspace(0, 1, 1000)
    assert isorun.isolated(lambda v: float(v.sum()))(x) == pytest.approx(float(x.sum()))
