"""Turn a Plan into one generated straight-line Python function.

`run` then costs one Python call per op and nothing else: values live in local variables, dead
ones are dropped with `del`, and elementwise ops whose first input dies at that step write into
it in place (only when that input is a fresh buffer of the same type, never a view of an input,
param or constant).
"""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import FLOAT_DTYPES

# ops whose outputs are always new buffers (never views of their inputs)
FRESH_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "MatMul", "Exp", "Log", "Sqrt", "Neg", "Abs", "Relu",
    "Sigmoid", "Tanh", "Sin", "Cos", "Gelu", "Silu", "Softmax", "LogSoftmax", "Conv", "ConvTranspose",
    "LayerNorm", "RMSNorm", "GroupNorm", "BatchNormalization", "DequantMatMul", "Erf", "Softplus", "Reciprocal",
})
# ops whose kernels may return a view of input 0 (numpy reshape/transpose/slicing semantics)
VIEW_OPS = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "DepthToSpace"})
_INPLACE_BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide", "Max": "maximum",
                   "Min": "minimum"}
_INPLACE_UNARY = {"Relu": None, "Exp": "exp", "Neg": "negative", "Abs": "absolute", "Tanh": "tanh",
                  "Sqrt": "sqrt", "Sin": "sin", "Cos": "cos"}


def _fits(shape: tuple, out: tuple) -> bool:
    """True if `shape` can never widen `out` when broadcast: each dim is 1 or the same as out's."""
    if len(shape) > len(out):
        return False
    return all(d == 1 or d == o for d, o in zip(shape[::-1], out[::-1]))


def generate(plan) -> tuple[object, dict[int, int]]:
    """Return (fn(vals) -> list of outputs, {source line -> step index}) for the plan."""
    g = plan.graph
    types = g.types
    producer_op = {n.name: n.op for n in g.nodes}
    # a buffer that some view op reads may still be visible through that view after its own last use,
    # so it is never written in place
    viewed = {n.inputs[0] for n in g.nodes if n.op in VIEW_OPS and n.inputs}
    name_of = {s: n for n, s in plan.slot.items()}
    ns: dict = {"xp": plan.xp, "np": np}
    lines = ["def _run(vals):"]
    line_step: dict[int, int] = {}
    loaded = set()
    for i, st in enumerate(plan.steps):
        for s in st.ins:
            if s in plan.leaf_slots and s not in loaded:
                lines.append(f"    v{s} = vals[{s}]")
                loaded.add(s)
        ns[f"K{i}"], ns[f"A{i}"] = st.fn, st.attrs
        args = ", ".join(f"v{s}" for s in st.ins)
        first = st.ins[0] if st.ins else None
        inplace = (plan.backend.inplace_ufuncs and first is not None and first in st.frees
                   and producer_op.get(name_of[first]) in FRESH_OPS and name_of[first] not in viewed
                   and types[name_of[first]] == types[st.name]
                   and types[st.name].rank > 0  # numpy hands back scalars, not buffers, for 0-d results
                   and st.ins.count(first) == 1
                   and all(_fits(types[name_of[i]].shape, types[st.name].shape) for i in st.ins[1:]))
        int_div = st.op == "Div" and types[st.name].dtype not in FLOAT_DTYPES  # np.divide is true division
        # numpy ufuncs give rank-0 results as scalars, which cannot be written into (out=)
        inplace = inplace and types[st.name].rank > 0
        if inplace and st.op in _INPLACE_BINARY and len(st.ins) == 2 and not int_div:
            code = f"    v{st.out} = np.{_INPLACE_BINARY[st.op]}({args}, out=v{first})"
        elif inplace and st.op == "Relu":
            code = f"    v{st.out} = np.maximum(v{first}, 0, out=v{first})"
        elif inplace and st.op in _INPLACE_UNARY and len(st.ins) == 1:
            code = f"    v{st.out} = np.{_INPLACE_UNARY[st.op]}(v{first}, out=v{first})"
        else:
            code = f"    v{st.out} = K{i}(xp, A{i}{', ' if args else ''}{args})"
        lines.append(code)
        line_step[len(lines)] = i
        for f in st.frees:
            if f != st.out:
                lines.append(f"    del v{f}")
    for _, s in plan.output_slots:
        if s in plan.leaf_slots and s not in loaded:
            lines.append(f"    v{s} = vals[{s}]")
            loaded.add(s)
    lines.append("    return [" + ", ".join(f"v{s}" for _, s in plan.output_slots) + "]")
    src = "\n".join(lines) + "\n"
    # the name is quoted: compile() refuses a NUL in the filename, and names reach only this string
    exec(compile(src, f"<rlx plan {g.name!r}>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns["_run"], line_step
