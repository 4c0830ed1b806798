"""Turn a Plan into one generated straight-line Python function.

`run` then costs one Python call per op and nothing else: values live in local variables, dead
ones are dropped with `del`, and elementwise ops whose first input dies at that step write into
it in place (only when that input is a fresh buffer of the same type: produced by a node whose
kernel never aliases, read by no aliasing node; never an input, param or constant). Which ops alias
and which compute in place is stated once, with each kernel (kernels.registry.KernelFacts).

A step whose op has a binder on the backend (kernels.registry.BINDERS) calls it at its first run: the
kernel it returns, bound to that step's attrs and inputs, takes the step's place in the generated
function's namespace for every later call (BIND = False keeps the registered kernels: tests compare).

A view whose geometry compile knows (a reshape to a static shape, a transpose, a Slice by attrs of a static input)
is an inline expression instead of a kernel call (INLINE_VIEWS = False keeps the calls: tests compare).
"""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import FLOAT_DTYPES

from .clamp import relu
from .kernels.data import slice_index
from .kernels.elementwise import multiply_cpu
from .kernels.registry import FACTS, KERNELS

BIND = True  # steps call their op's binder at their first run (module docstring)
INLINE_VIEWS = True  # views whose geometry compile knows are inline expressions (_view_code; False: kernel calls)

# in-place spellings that are not a plain numpy ufunc over the inputs
_INPLACE_CALLS = {"relu": "_relu({0}, out={0})", "multiply": "_multiply({0}, {1}, out={0})"}


def _fits(shape: tuple, out: tuple) -> bool:
    """True if `shape` can never widen `out` when broadcast: each dim is 1 or the same as out's."""
    if len(shape) > len(out):
        return False
    return all(d == 1 or d == o for d, o in zip(shape[::-1], out[::-1]))


_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def _view_code(st, in_type, out_type, ns: dict, key: str) -> str | None:
    """The step as an inline expression on its input when it is a view whose geometry compile knows: a reshape to
    a static shape, a transpose, a Slice by attrs of a static input. The op's kernel would work it out on every
    call (~2-4 us of Python each; GPT-2's decoding step has ~200 of them). None: call the kernel. Only for the
    generic kernels (a backend's own kernel for the op is called), whose values these are: `x.reshape(shape)`,
    `x.transpose(perm)` and the same index that Slice's kernel takes (kernels.data.slice_index)."""
    if st.fn is not KERNELS.get(st.op) or not st.ins or in_type is None:
        return None
    x = f"v{st.ins[0]}"
    if st.op in _RESHAPES and out_type.is_static():
        return f"{x}.reshape({tuple(out_type.shape)!r})"
    if st.op == "Transpose":
        perm = st.attrs["perm"]
        return f"{x}.transpose({tuple(range(in_type.rank))[::-1] if perm is None else tuple(perm)!r})"
    if st.op == "Slice" and len(st.ins) == 1 and in_type.is_static():
        ns[key] = slice_index(in_type.shape, st.attrs, st.attrs["starts"], st.attrs["ends"])
        return f"{x}[{key}]"
    return None


def _binding(ns: dict, key: str, kernel, bind):
    """The step's first call: bind(attrs, *inputs) (None: the kernel itself) becomes ns[key], the name the
    generated function calls the step by, and runs this call too. Two threads' first calls each bind; the
    kernels they bind give the same values."""
    def first(xp, attrs, *inputs):
        ns[key] = bind(attrs, *inputs) or kernel
        return ns[key](xp, attrs, *inputs)
    return first


def generate(plan) -> tuple[object, dict[int, int]]:
    """Return (fn(vals) -> list of outputs, {source line -> step index}) for the plan."""
    g = plan.graph
    types = g.types
    producer_op = {n.name: n.op for n in g.nodes}
    # a buffer that an aliasing op reads may still be visible through its result after its own last use,
    # so it is never written in place; nor is an aliasing op's result (it may be another value's buffer)
    viewed = {n.inputs[0] for n in g.nodes if FACTS[n.op].aliases and n.inputs}
    name_of = {s: n for n, s in plan.slot.items()}
    ns: dict = {"xp": plan.xp, "np": np, "_relu": relu, "_multiply": multiply_cpu}
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
        facts = FACTS[st.op]
        producer = producer_op.get(name_of[first]) if first is not None else None
        inplace = (facts.inplace is not None and plan.backend.inplace_ufuncs and first in st.frees
                   and producer is not None and not FACTS[producer].aliases and name_of[first] not in viewed
                   and types[name_of[first]] == types[st.name]
                   and types[st.name].rank > 0  # numpy hands back scalars, not buffers, for 0-d results
                   and st.ins.count(first) == 1
                   and all(_fits(types[name_of[i]].shape, types[st.name].shape) for i in st.ins[1:])
                   and (types[st.name].dtype in FLOAT_DTYPES or not facts.inplace_floats_only))
        view = (_view_code(st, types.get(name_of[first]) if first is not None else None, types[st.name], ns, f"I{i}")
                if INLINE_VIEWS else None)
        if view is not None:
            code = f"    v{st.out} = {view}"
        elif inplace and facts.inplace in _INPLACE_CALLS:
            code = f"    v{st.out} = " + _INPLACE_CALLS[facts.inplace].format(*(f"v{i}" for i in st.ins))
        elif inplace:
            code = f"    v{st.out} = np.{facts.inplace}({args}, out=v{first})"
        else:
            code = f"    v{st.out} = K{i}(xp, A{i}{', ' if args else ''}{args})"
            bind = plan.backend.binder(st.op) if BIND else None
            if bind is not None:
                ns[f"K{i}"] = _binding(ns, f"K{i}", st.fn, bind)
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
    ns["SOURCE"] = src  # for tests and debugging
    # the name is quoted: compile() refuses a NUL in the filename, and names reach only this string
    exec(compile(src, f"<rlx plan {g.name!r}>", "exec"), ns)  # noqa: S102 - our own generated code
    return ns["_run"], line_step
