"""bake(): specialize -> the stages of passes/registry.py (affine, fold, skip-zero to a fixed point; ternary;
quant; simplify, fuse, DCE, dedupe to a fixed point) -> weight table."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from rlx_format.codecs import get_codec
from rlx_format.container import TOOL_VERSION, RlxFile, Weight
from rlx_format.dtypes import NUMPY_DTYPES, dtype_of_array
from rlx_format.errors import RlxError
from rlx_format.graph import Graph
from rlx_runtime.passes import Pass, PassContext, PassReport, run_group
from rlx_runtime.passes.inbodies import resolve_all
from rlx_runtime.passes import specialize_params as specialize

from .options import BakeOptions
from .passes.registry import STAGES, Stage
from .report import BakeReport, WeightReport

Progress = Callable[[str], None]


def _check_weights(graph: Graph, weights: dict, report: BakeReport, strict: bool) -> dict:
    params = {p.name: p for p in graph.params}
    dtypes = getattr(weights, "dtypes", {})
    extra = sorted(set(weights) - set(params))
    if weights and len(extra) == len(weights):
        raise RlxError(f"none of the {len(weights)} weights matches a param of the graph (e.g. {extra[:3]}); "
                       f"the graph's params are {sorted(params)[:10]} — is this the right weights file?")
    if extra:
        report.extra_weights = extra
        warnings.warn(f"weights not used by any param (ignored): {extra}", stacklevel=3)
    bindings = {}
    for name, arr in weights.items():
        if name not in params:
            continue
        p = params[name]
        got_dt = dtypes.get(name) or dtype_of_array(np.asarray(arr))
        if got_dt != p.dtype:
            raise RlxError(f"weight {name!r}: dtype {got_dt}; the graph declares param {name!r} as {p.dtype} "
                           "(convert the weights file or fix the graph; rlx never casts silently)")
        if tuple(arr.shape) != tuple(p.shape):
            raise RlxError(f"weight {name!r}: shape {list(arr.shape)}; the graph declares {list(p.shape)}")
        bindings[name] = arr
    unbound = [p for p in params if p not in bindings]
    if unbound and strict:
        raise RlxError(f"--strict: param(s) {unbound} have no weight; supply them or drop --strict to keep them "
                       "as run-time params")
    report.params_baked = [p for p in params if p in bindings]
    report.params_unbound = unbound
    return bindings


def _run_stages(g: Graph, options: BakeOptions, ctx: PassContext, report: BakeReport, step: Progress) -> Graph:
    """The enabled stages in declared order; each group's passes together to a fixed point."""
    groups: list[tuple[str, list[tuple[Stage, Pass]]]] = []
    for stage in STAGES:
        if not getattr(options, stage.flag):
            continue
        if not groups or groups[-1][0] != stage.group:
            groups.append((stage.group, []))
        groups[-1][1].extend((stage, p) for p in stage.passes)
    for _, members in groups:
        section = {id(p): stage.report for stage, p in members}

        def after(p: Pass, res, section=section) -> None:
            if section[id(p)] is not None:
                getattr(report, section[id(p)]).extend(res.entries)
            report.notes.extend(res.notes)

        g = run_group(g, [p for _, p in members], ctx, before=lambda p: step(p.name), after=after)
    return g


def bake(graph: Graph, weights: dict | None = None, options: BakeOptions | None = None,
         progress: Progress | None = None) -> tuple[RlxFile, BakeReport]:
    """Turn a graph and its weights into an RlxFile ready to write, plus a report."""
    options = options or BakeOptions.from_profile()
    options.check()
    weights = weights if weights is not None else {}
    step = progress or (lambda _msg: None)
    report = BakeReport(profile=options.profile, nodes_before=len(graph.nodes),
                        quant_type=options.quant_type if options.quant else None)
    bindings = _check_weights(graph, weights, report, options.strict)
    dense_bytes = {name: int(np.asarray(a).nbytes) for name, a in bindings.items()}
    step("specialize")
    g = specialize(graph, bindings) if bindings else graph.copy()
    # the provenance the passes share: fold fills folded_from, packing fills packed_from and quality
    preport = PassReport(folded_from=report.folded_from)
    ctx = PassContext(options, preport, packed_from=report.packed_from)
    g = _run_stages(g, options, ctx, report, step)
    report.folds_refused = preport.fold_refused
    report.nodes_after = len(g.nodes)
    step("weight table")
    rf = RlxFile(g, {}, {})
    sources = {}  # packed constant -> (encoding, N, K, how it was laid out)
    for n, _, top in resolve_all(g):  # inside bodies too: a packed weight a body reads is a captured constant
        if n.op not in ("DequantMatMul", "DequantGather", "Dequantize"):
            continue
        packed = top(n.inputs[1] if n.op == "DequantMatMul" else n.inputs[0])
        if packed is None:  # a body's own (inline) constant: not in the weight table
            continue
        if n.op == "DequantMatMul":
            sources[packed] = (n.attrs["encoding"], n.attrs["N"], n.attrs["K"], "transposed to N x K")
        elif n.op == "DequantGather":
            sources[packed] = (n.attrs["encoding"], n.attrs["N"], n.attrs["K"], "table rows")
        elif n.op == "Dequantize" and packed in ctx.packed_from:
            rows, k = n.attrs["shape"]
            pad = ctx.quality.get(packed, {}).get("padded", 0)
            sources[packed] = (n.attrs["encoding"], rows, k, "conv weight, rows by its first axis"
                               + (f", each padded with {pad} zeros" if pad else ""))
    for name in sorted(g.constants):
        c = g.constants[name]
        if name in sources:
            enc, n_out, k, layout = sources[name]
            raw = report.packed_from.get(name, name)
            src = report.folded_from.get(raw, raw)
            w = Weight(name, enc, (n_out, k), c.value, "f32", ctx.digests.get(name),
                       f"packed from {src!r} ({layout})")
            q = ctx.quality.get(name)
            note = f"{'lossy' if q else 'lossless'} {get_codec(enc).ggml}"
            if q and q["auto"]:
                note += f" (auto: cosine >= {options.quant_min_cosine})"
            dense = q["dense_bytes"] if q else n_out * k * 4
            report.weights.append(WeightReport(name, enc, [n_out, k], dense, int(c.value.nbytes),
                                               q["max_abs_err"] if q else 0.0, q["cosine"] if q else 1.0, note))
        else:
            arr = np.require(c.value, dtype=NUMPY_DTYPES[c.dtype], requirements="C")  # keeps 0-d arrays 0-d
            w = Weight.plain(name, arr, c.dtype)
            w.digest = ctx.digests.get(name)  # dedupe already hashed these bytes: don't read them twice
            note = "param" if name in bindings else "folded/constant"
            report.weights.append(WeightReport(name, c.dtype, list(c.shape), dense_bytes.get(name, arr.nbytes),
                                               int(arr.nbytes), None, None, note))
        rf.weights[name] = w
    rf.meta = {
        "tool": TOOL_VERSION,
        "inputs": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape)} for v in g.inputs],
        "outputs": [{"name": o, **g.types[o].to_json()} for o in g.outputs],
        "params": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape)} for v in g.params],
        "bake": report.to_dict(),
    }
    return rf, report
