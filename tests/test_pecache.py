import numpy as np
import pytest

from rlx_format import GraphBuilder, RlxError
from rlx_runtime import CompileOptions, PECache, PECacheKey, Session, split_shape_invariant


def K(name="rope"):
    return PECacheKey(name)


def test_key_fields_are_type_tagged():
    assert K().add(1) != K().add(1.0)
    assert K().add(1) != K().add(True)
    assert K().add(1.0) != K().add(True)
    assert K().add("1") != K().add(1)
    assert K().add(0.0) != K().add(-0.0)  # by bit pattern
    assert K().add(float("nan")) == K().add(float("nan"))  # same bits compare equal
    assert K().add(1).add(2) != K().add(2).add(1)
    assert K("a").add(1) != K("b").add(1)
    assert K().add(3).add_shape([2, 5]) == K().add(3).add_shape((2, 5))


def test_shape_collisions():
    assert K().add_shape([2, 1]) != K().add_shape([2])
    assert K().add_shape([1, 23]) != K().add_shape([12, 3])
    assert K().add_shapes([[1, 2], [3]]) != K().add_shapes([[1], [2, 3]])
    assert K().add_shapes([[1, 2], [3]]) != K().add_shapes([[3], [1, 2]])
    assert K().add_shapes([[4]]) != K().add_shape([4])
    assert K().add_shapes([]) != K()


def test_array_fields():
    a = np.arange(6, dtype=np.float32)
    assert K().add(a) == K().add(a.copy())
    assert K().add(a) != K().add(a.reshape(2, 3))
    assert K().add(a) != K().add(a.astype(np.float64))
    b = a.copy()
    b[5] = 7
    assert K().add(a) != K().add(b)
    with pytest.raises(RlxError, match="unsupported value type"):
        K().add([1, 2])


def test_hit_returns_same_object_and_is_read_only():
    c = PECache()
    made = []

    def factory():
        made.append(1)
        return np.ones(4, np.float32)

    v1 = c.get_or_create(K().add_shape([4]), factory)
    v2 = c.get_or_create(K().add_shape([4]), factory)
    assert v1 is v2 and made == [1] and (c.hits, c.misses) == (1, 1)
    with pytest.raises(ValueError):
        v1[0] = 3


def test_miss_replaces_entry_and_names_are_independent():
    c = PECache()
    a = c.get_or_create(K("a").add(1), lambda: np.zeros(2))
    b = c.get_or_create(K("b").add(1), lambda: np.ones(2))
    a2 = c.get_or_create(K("a").add(2), lambda: np.full(2, 2.0))
    assert a2 is not a and c.get(K("a").add(1)) is None and c.get(K("b").add(1)) is b
    assert len(c) == 2 and c.names() == ["a", "b"]


def test_factory_failure_keeps_previous_entry():
    c = PECache()
    v = c.get_or_create(K().add(1), lambda: np.zeros(2))

    def boom():
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        c.get_or_create(K().add(2), boom)
    assert c.get(K().add(1)) is v


def test_alternating_keys_recompute_unless_capacity():
    for cap, expected_misses in ((1, 6), (2, 2)):
        c = PECache(capacity=cap)
        for i in range(6):
            c.get_or_create(K().add(i % 2), lambda i=i: np.full(1, i % 2))
        assert c.misses == expected_misses
    with pytest.raises(RlxError):
        PECache(capacity=0)


def rope_graph():
    g = GraphBuilder("rope")
    x = g.input("x", "f32", ["b", "seq", 8])
    seq = g.squeeze(g.slice(g.shape(x), starts=[1], ends=[2]), axes=[0])
    pos = g.cast(g.range(g.constant(np.array(0, np.int64)), seq, g.constant(np.array(1, np.int64))), to="f32")
    inv = g.constant((1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32), name="inv_freq")
    ang = g.mul(g.unsqueeze(pos, axes=[1]), g.unsqueeze(inv, axes=[0]))
    cos = g.concat(g.cos(ang), g.cos(ang), axis=1, name="cos_table")
    sin = g.concat(g.sin(ang), g.sin(ang), axis=1, name="sin_table")
    g.output(g.add(g.mul(x, cos), g.mul(x, sin), name="y"))
    return g.build()


def test_rope_table_built_once_per_sequence_length():
    split = split_shape_invariant(rope_graph())
    assert sorted(split.boundary) == ["cos_table", "sin_table"]
    c = Session().compile_with(rope_graph(), CompileOptions(cache_shape_invariant=True, profile=True))
    ref = Session().compile(rope_graph())
    r = np.random.default_rng(0)
    for _ in range(5):
        x = r.standard_normal((2, 16, 8)).astype(np.float32)
        np.testing.assert_array_equal(c.run({"x": x})["y"], ref.run({"x": x})["y"])
    # the table has two Sin and two Cos nodes (concat of two halves): built once over 5 runs
    assert c.profile()["Sin"][0] == 2 and c.profile()["Cos"][0] == 2 and c.profile()["Mul"][0] >= 10
    x = r.standard_normal((3, 9, 8)).astype(np.float32)  # new length: rebuilt once
    np.testing.assert_array_equal(c.run({"x": x})["y"], ref.run({"x": x})["y"])
    c.run({"x": x})
    assert c.profile()["Sin"][0] == 4
    x = r.standard_normal((5, 9, 8)).astype(np.float32)  # the key is Shape(x) as a whole: batch counts too
    c.run({"x": x})
    assert c.profile()["Sin"][0] == 6
