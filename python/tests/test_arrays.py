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


# Where the worker made an array: the /proc/self/maps line of its data, in the worker.
def _made_in(a) -> str:
    return _mapping_of(a.__array_interface__["data"][0])


def filled(n, value, zeros=False):
    import numpy

    a = numpy.zeros(n, dtype=numpy.int64) if zeros else numpy.full(n, value, dtype=numpy.int64)
    return a, _made_in(a)


N = 8 << 20  # 64 MiB of int64: large enough to be placed


def _segment_for(n):
    """A first call, so that a segment large enough for such a result is in the pool; its
    result is dropped at once, giving the segment back."""
    first, _ = isorun.isolated(filled)(n, 1)
    del first
    gc.collect()


def test_a_large_array_is_made_where_the_result_goes():
    _segment_for(N)
    a, made_in = isorun.isolated(filled)(N, 2)
    assert "memfd:isorun-segment" in made_in and made_in.split()[1].endswith("s"), made_in
    assert "memfd:isorun-segment" in _mapping_of(a.__array_interface__["data"][0])
    assert a.shape == (N,) and int(a.min()) == 2 and int(a.max()) == 2


def test_zeros_made_in_a_used_segment_are_zeros():
    _segment_for(N)  # its bytes are all 1s
    a, made_in = isorun.isolated(filled)(N, 0, zeros=True)
    assert "memfd:isorun-segment" in made_in
    assert not a.any()


def views_and_others(n):
    import numpy

    a = numpy.arange(n, dtype=numpy.int64)
    b = numpy.arange(n, dtype=numpy.int64) * 2  # a second large array: copied
    return a[3:-3], a[:10], b, _made_in(a), _made_in(b)


def test_views_of_the_placed_array_and_other_arrays_arrive_intact():
    _segment_for(N)
    inner, head, b, a_in, b_in = isorun.isolated(views_and_others)(N)
    assert "memfd:isorun-segment" in a_in and "memfd:isorun-segment" not in b_in
    assert np.array_equal(inner, np.arange(3, N - 3, dtype=np.int64))
    assert head.tolist() == list(range(10))
    assert np.array_equal(b, np.arange(N, dtype=np.int64) * 2)


def after_a_temporary(n):
    import numpy

    t = numpy.ones(n, dtype=numpy.int64)
    total = int(t.sum())
    del t  # the placed storage is free again
    r = numpy.full(n, total, dtype=numpy.int64)
    return r, _made_in(r)


def test_storage_freed_by_the_function_is_placed_again():
    _segment_for(N)
    r, made_in = isorun.isolated(after_a_temporary)(N)
    assert "memfd:isorun-segment" in made_in
    assert int(r.min()) == N and int(r.max()) == N


def written_by_a_forked_child(n):
    import os

    import numpy

    a = numpy.full(n, 1, dtype=numpy.int64)
    pid = os.fork()
    if pid == 0:  # the child's writes go to its own copy, never to the worker's result
        a[:] = 9
        os._exit(0)
    os.waitpid(pid, 0)
    return a, _made_in(a)


def test_a_forked_child_cannot_change_a_placed_array():
    _segment_for(N)
    a, made_in = isorun.isolated(written_by_a_forked_child)(N)
    assert "memfd:isorun-segment" in made_in
    assert int(a.min()) == 1 and int(a.max()) == 1


def grown(n):
    import numpy

    a = numpy.arange(n, dtype=numpy.int64)
    a.resize(2 * n, refcheck=False)  # NumPy reallocates: the bytes move with it
    return a


def test_a_reallocated_array_keeps_its_bytes():
    r = isorun.isolated(grown)(N // 2)
    assert np.array_equal(r[: N // 2], np.arange(N // 2, dtype=np.int64)) and not r[N // 2:].any()


def test_an_early_result_is_copied_and_intact():
    _segment_for(N)
    a, made_in = isorun.isolated(filled, early_result=True)(N, 5)
    # Placing is off where the segment is sealed early: the array was the worker's own memory.
    assert "memfd:isorun-segment" not in made_in
    assert int(a.min()) == 5 and int(a.max()) == 5


def slice_of_a_large_array(n):
    import numpy

    a = numpy.arange(4 * n, dtype=numpy.int64)  # placed; only its start is returned
    return a[: n // 2], _made_in(a)


@pytest.fixture
def roomy_pool():
    """A pool that keeps a segment larger than the caller's default 256 MiB of idle ones."""
    isorun.set_segment_pool(max_idle_bytes="1G")
    yield
    isorun.set_segment_pool(max_idle_bytes=isorun._pool.DEFAULT_MAX_IDLE_BYTES)


def test_a_slice_of_a_placed_array_carries_only_itself(roomy_pool):
    _segment_for(4 * N)
    s, made_in = isorun.isolated(slice_of_a_large_array)(N)
    assert "memfd:isorun-segment" in made_in
    assert np.array_equal(s, np.arange(N // 2, dtype=np.int64))


def second_large_array(n):
    import numpy

    kept = numpy.ones(n, dtype=numpy.int64)  # placed, and still alive when the result is written
    r = numpy.full(n, 3, dtype=numpy.int64)
    return r, int(kept.sum())


def test_a_large_array_that_was_not_placed_is_copied():
    _segment_for(N)
    r, total = isorun.isolated(second_large_array)(N)
    assert total == N and int(r.min()) == 3 and int(r.max()) == 3
