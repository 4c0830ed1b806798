"""import_onnx: read the model, lower every node, report everything unsupported at once."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from rlx_format.dtypes import dtype_of_array
from rlx_format.errors import GraphError, RlxError
from rlx_format.graph import Graph, Value

from ..weights import WeightSet
from . import lower_control, lower_math, lower_nn, lower_qint, lower_rnn, lower_shape  # noqa: F401 - fill LOWER
from .context import onnx_attrs, ImportContext, ONNX_DTYPES, LOWER, onnx, Unsupported
from .lower_control import BodyUnsupported


def _value_type(vi) -> tuple[str, tuple] | None:
    tt = vi.type.tensor_type
    dt = ONNX_DTYPES.get(tt.elem_type)
    if dt is None or not tt.HasField("shape"):
        return (dt, None) if dt else None
    dims = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and not _anonymous(d.dim_param):
            dims.append(d.dim_param)
        else:  # unknown: -1, '', '?', ... each its own symbol (two '?' dims need not be equal)
            dims.append(f"{vi.name}:d{i}")
    return dt, tuple(dims)


def _anonymous(param: str) -> bool:
    """A dim_param that names no dimension ('?', '-1', '*', 'None'): exporters write these for 'unknown'."""
    p = param.strip()
    return not any(c.isalnum() for c in p) or p.lstrip("-").isdigit() or p in ("None", "none", "null")


def _subgraph_ops(node, label: str) -> list[tuple[str, str]]:
    """(op key, where) of every node inside the graph attributes (If/Loop/Scan bodies) of `node`, nested
    ones included, so one report names all the work an unsupported control-flow op would hide."""
    out = []
    stack = [(node, label)]
    while stack:
        n, where = stack.pop()
        for attr in n.attribute:
            for body in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                for i, sub in enumerate(body.node):
                    sub_label = sub.name or (sub.output[0] if sub.output else f"#{i}")
                    sub_where = f"{sub_label} (in {where}.{attr.name})"
                    op = sub.op_type if sub.domain in ("", "ai.onnx") else f"{sub.domain}.{sub.op_type}"
                    out.append((f"{op} (inside a subgraph)", sub_where))
                    stack.append((sub, sub_where))
    return out


def import_onnx(path: str | os.PathLike) -> tuple[Graph, WeightSet]:
    """Load an ONNX model as an rlx Graph plus its initializers (params with weights)."""
    if onnx is None:
        raise RlxError("ONNX import needs the onnx package: pip install 'rlx[onnx]'")
    path = Path(path)
    if not path.is_file():
        raise RlxError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise RlxError(f"{path}: not a valid ONNX model ({type(e).__name__}: {e})") from None
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is only a helper for ranks
        inferred = model
    ctx = ImportContext(model, path)
    g = model.graph
    for vi in list(inferred.graph.value_info) + list(g.input) + list(g.output):
        t = _value_type(vi)
        if t is not None:
            ctx.types[vi.name] = t
    for t in g.initializer:
        try:
            ctx.inits[t.name] = ctx.tensor(t)
        except RlxError:
            raise
        except Exception as e:  # noqa: BLE001 - onnx/numpy raise many types for corrupt tensors
            raise RlxError(f"{path}: initializer {t.name!r} is malformed ({type(e).__name__}: {e})") from None
        ctx.init_dtype[t.name] = ONNX_DTYPES.get(t.data_type, "?")
        ctx.types[t.name] = (ctx.init_dtype[t.name], tuple(ctx.inits[t.name].shape))
        ctx.names.add(t.name)
    init_names = set(ctx.inits)
    inputs = []
    for vi in g.input:
        if vi.name in init_names:
            continue
        t = _value_type(vi)
        if t is None or t[1] is None:
            raise RlxError(f"{path}: graph input {vi.name!r} has an unsupported type or no shape")
        inputs.append(Value(vi.name, t[0], t[1]))
        ctx.names.add(vi.name)
    ctx.static_inputs = all(isinstance(d, int) for v in inputs for d in v.shape)
    unsupported: Counter = Counter()
    where: dict[str, list[str]] = {}

    def refuse(items) -> None:
        for k, at in items:  # (op key, where): counted once per node, located by label
            unsupported[k] += 1
            where.setdefault(k, []).append(at)

    for i, n in enumerate(g.node):
        if n.domain not in ("", "ai.onnx"):
            key = f"{n.domain}.{n.op_type}"
        else:
            key = n.op_type
        label = n.name or (n.output[0] if n.output else f"#{i}")
        lower = LOWER.get(n.op_type) if n.domain in ("", "ai.onnx") else None
        if lower is None:
            refuse([(key, label), *_subgraph_ops(n, label)])
            continue
        try:
            lower(ctx, n, onnx_attrs(n))
        except BodyUnsupported as e:  # the ops inside its bodies that cannot be lowered, each with where it is
            refuse(e.items)
        except Unsupported as e:  # with what a refused If/Loop/Scan would hide
            refuse([(f"{n.op_type} ({e})", label), *_subgraph_ops(n, label)])
        except KeyError as e:
            refuse([(f"{n.op_type} (missing attribute {e})", label)])
        except RlxError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt node (bad tensor attr, missing inputs, ...)
            raise RlxError(f"{path}: node {label!r} ({n.op_type}) is malformed ({type(e).__name__}: {e})") from None
    if unsupported:
        lines = [f"  {op}: {count} node(s), e.g. {', '.join(where[op][:5])}" for op, count in unsupported.most_common()]
        raise RlxError(f"{path}: {sum(unsupported.values())} node(s) use ops rlx does not support:\n"
                       + "\n".join(lines) + "\nsupported ONNX ops: " + ", ".join(sorted(LOWER)))
    used = {i for n in ctx.nodes for i in n.inputs} | {o.name for o in g.output}
    weights = WeightSet()
    weights.sources.append(str(path))
    params = []
    for name, arr in ctx.inits.items():
        if name not in used:
            continue
        dt = ctx.init_dtype[name]
        if dt == "?":
            raise RlxError(f"{path}: initializer {name!r} has an unsupported data type")
        params.append(Value(name, dt, tuple(arr.shape)))
        weights[name] = arr
        weights.dtypes[name] = dt
    consts = []
    for name, arr in ctx.consts.items():
        if name not in used:
            continue
        dt = dtype_of_array(arr)
        consts.append(Value(name, dt, tuple(arr.shape), arr))
    outputs = [o.name for o in g.output]
    try:
        graph = Graph(g.name or path.stem, inputs, params, consts, ctx.nodes, outputs)
    except GraphError as e:  # validation of the lowered graph: say which file it came from
        raise GraphError(f"{path}: {e}") from None
    return graph, weights
