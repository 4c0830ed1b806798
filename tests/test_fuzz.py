"""Fuzzing in CI with a bounded budget (RLX_FUZZ_EXAMPLES, default 150 per target).

`make fuzz` runs scripts/fuzz.py for longer and prints cases/s.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_targets import (hostile_graphs, hostile_rlx, mutate, mutate_header, mutate_json, random_op_doc, seed_graph,
                          seed_onnx, seed_rlx, seed_safetensors, seed_sealed, target_graph_json,
                          target_graph_lifecycle, target_onnx, target_read_rlx,
                          target_safetensors, target_sealed)

BUDGET = settings(max_examples=int(os.environ.get("RLX_FUZZ_EXAMPLES", "150")), deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
SEEDS = {"rlx": seed_rlx(), "sealed": seed_sealed(), "st": seed_safetensors(), "graph": seed_graph().to_dict(),
         "onnx": seed_onnx()}
HOSTILE_RLX, HOSTILE_GRAPHS = hostile_rlx(), hostile_graphs()


def test_seeds_are_valid():
    assert target_read_rlx(SEEDS["rlx"]) and target_sealed(SEEDS["sealed"])
    assert target_safetensors(SEEDS["st"]) and target_graph_json(SEEDS["graph"]) and target_onnx(SEEDS["onnx"])


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_read_rlx_mutated(seed):
    target_read_rlx(mutate(SEEDS["rlx"], np.random.default_rng(seed)))


@BUDGET
@given(st.binary(max_size=512))
def test_read_rlx_random_bytes(data):
    target_read_rlx(data)
    target_read_rlx(b"RLXBAKE1" + data)


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_read_rlx_header_fields_mutated(seed):
    target_read_rlx(mutate_header(SEEDS["rlx"], np.random.default_rng(seed)))


@pytest.mark.parametrize("name", sorted(HOSTILE_RLX))
def test_read_rlx_hostile_files(name):
    assert not target_read_rlx(HOSTILE_RLX[name])


@BUDGET
@given(st.integers(0, 2**32 - 1), st.sampled_from(sorted(HOSTILE_RLX)))
def test_read_rlx_hostile_mutated(seed, name):
    target_read_rlx(mutate(HOSTILE_RLX[name], np.random.default_rng(seed)))


@pytest.mark.parametrize("name", sorted(HOSTILE_GRAPHS))
def test_graph_json_hostile_names(name):
    assert not target_graph_json(HOSTILE_GRAPHS[name])


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_graph_json_mutated(seed):
    rng = np.random.default_rng(seed)
    doc = SEEDS["graph"]
    for _ in range(int(rng.integers(1, 4))):
        doc = mutate_json(doc, rng)
    target_graph_json(doc)


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_graph_random_op_lifecycle(seed):
    """One op with edge-value inputs/attrs/names: refused with an RlxError, or loads, writes, re-reads and
    runs to outputs of the inferred shapes."""
    target_graph_lifecycle(random_op_doc(np.random.default_rng(seed)))


@BUDGET
@given(st.text(max_size=200))
def test_graph_json_random_text(text):
    target_graph_json("{" + text)


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_sealed_mutated(seed):
    data = mutate(SEEDS["sealed"], np.random.default_rng(seed))
    assert not target_sealed(data) or data == SEEDS["sealed"]


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_safetensors_mutated(seed):
    target_safetensors(mutate(SEEDS["st"], np.random.default_rng(seed)))


@BUDGET
@given(st.integers(0, 2**32 - 1))
def test_onnx_import_mutated(seed):
    target_onnx(mutate(SEEDS["onnx"], np.random.default_rng(seed)))


@pytest.mark.parametrize("doc", [
    {"format": "rlx.graph", "version": 1, "inputs": [{"name": "x", "dtype": "f32", "shape": [1] * 100}],
     "outputs": ["x"]},
    "[" * 100_000,
    {"format": "rlx.graph", "version": 1, "nodes": [{"name": "n", "op": "Relu", "inputs": "x"}], "outputs": ["n"]},
])
def test_graph_json_hostile_documents(doc):
    assert not target_graph_json(doc)
