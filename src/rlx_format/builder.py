"""GraphBuilder: write graphs in Python instead of JSON.

    g = GraphBuilder("mlp")
    x = g.input("x", "f32", ["batch", 784])
    w = g.param("w1", "f32", [784, 128])
    g.output(g.relu(g.matmul(x, w)))
    graph = g.build()

Every catalogue op is available as a snake_case method (`g.reduce_mean(x, axes=[1])`) or via
`g.op("ReduceMean", x, axes=[1])`; each returns the new value's name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from .dtypes import dtype_of_array
from .errors import GraphError
from .graph import Graph, Node, Value
from .ops import OPS

_SNAKE = {re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower(): op for op in OPS}
_SNAKE.update({"rms_norm": "RMSNorm", "dequant_mat_mul": "DequantMatMul", "matmul": "MatMul",
               "dequant_matmul": "DequantMatMul", "layer_norm": "LayerNorm", "sdpa": "ScaledDotProductAttention"})


class GraphBuilder:
    def __init__(self, name: str = "graph"):
        self.name = name
        self._inputs: list[Value] = []
        self._params: list[Value] = []
        self._consts: list[Value] = []
        self._nodes: list[Node] = []
        self._outputs: list[str] = []
        self._names: set[str] = set()
        self._counter = 0

    def _claim(self, name: str | None, base: str) -> str:
        if name is None:
            while True:
                self._counter += 1
                name = f"{base}_{self._counter}"
                if name not in self._names:
                    break
        if name in self._names:
            raise GraphError(f"builder: name {name!r} already used")
        self._names.add(name)
        return name

    def input(self, name: str, dtype: str, shape: Sequence) -> str:
        self._inputs.append(Value(self._claim(name, "input"), dtype, tuple(shape)))
        return name

    def param(self, name: str, dtype: str, shape: Sequence) -> str:
        self._params.append(Value(self._claim(name, "param"), dtype, tuple(shape)))
        return name

    def constant(self, value, name: str | None = None, dtype: str | None = None) -> str:
        arr = np.asarray(value)
        if dtype is None:
            if arr.dtype == np.float64:
                arr = arr.astype(np.float32)
            elif arr.dtype.kind == "i" and arr.dtype != np.int64 and np.asarray(value).dtype == np.int_:
                arr = arr.astype(np.int64)
            dtype = dtype_of_array(arr)
        else:
            from .dtypes import NUMPY_DTYPES, float_to_int
            target = NUMPY_DTYPES[dtype]
            arr = float_to_int(np, arr, target) if arr.dtype.kind == "f" and target.kind in "iu" else arr.astype(target)
        name = self._claim(name, "const")
        self._consts.append(Value(name, dtype, tuple(arr.shape), arr.copy(order="C")))
        return name

    def op(self, op: str, *inputs: str, name: str | None = None, **attrs) -> str:
        name = self._claim(name, op.lower())
        self._nodes.append(Node(name, op, list(inputs), attrs))
        return name

    def output(self, *names: str) -> None:
        self._outputs.extend(names)

    def build(self) -> Graph:
        return Graph(self.name, self._inputs, self._params, self._consts, self._nodes, self._outputs)

    def __getattr__(self, attr: str):
        op = _SNAKE.get(attr)
        if op is None:
            raise AttributeError(f"GraphBuilder has no op method {attr!r}")
        return lambda *inputs, name=None, **attrs: self.op(op, *inputs, name=name, **attrs)
