"""bake(): specialize -> fold -> skip-zero -> ternary -> quant -> simplify -> DCE -> dedupe -> weight table."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from rlx_format.codecs import get_codec
from rlx_format.container import TOOL_VERSION, RlxFile, Weight
from rlx_format.dtypes import NUMPY_DTYPES, dtype_of_array
from rlx_format.errors import RlxError
from rlx_format.graph import Graph
from rlx_runtime.passes import (PassReport, constant_fold, dead_code_elimination, dedupe_constants, fold_affine,
                                simplify)
from rlx_runtime.passes import specialize_params as specialize

from .options import BakeOptions
from .passes import pack_ternary_weights, quantize_matmul_weights, skip_zero_matmuls
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


def _affine(g: Graph, preport: PassReport, report: BakeReport) -> Graph:
    start = len(preport.affine_folded)
    g = fold_affine(g, preport)
    for f in preport.affine_folded[start:]:
        report.notes.append(f"{f['op']} {f['node']!r} folded into the weights of {f['into_op']} {f['into']!r} "
                            "(same values in exact arithmetic; float rounding differs slightly)")
    return g


def bake(graph: Graph, weights: dict | None = None, options: BakeOptions | None = None,
         progress: Progress | None = None) -> tuple[RlxFile, BakeReport]:
    """Turn a graph and its weights into an RlxFile ready to write, plus a report."""
    options = options or BakeOptions.from_profile()
    weights = weights if weights is not None else {}
    step = progress or (lambda _msg: None)
    quant_codec = options.quant_codec()
    report = BakeReport(profile=options.profile, nodes_before=len(graph.nodes),
                        quant_type=quant_codec.short if options.quant else None)
    bindings = _check_weights(graph, weights, report, options.strict)
    dense_bytes = {name: int(np.asarray(a).nbytes) for name, a in bindings.items()}
    step("specialize")
    g = specialize(graph, bindings) if bindings else graph.copy()
    preport = PassReport()
    preport.folded_from = report.folded_from  # shared: fold fills it, the packing passes read it
    errors: dict = {}
    # the declared pipeline: (option flag, progress label, pass)
    stages = [
        ("fold", "affine", lambda g: _affine(g, preport, report)),
        ("fold", "fold", lambda g: constant_fold(g, preport, options.fold_growth_limit, options.fold_min_bytes,
                                                    options.fold_memory_budget)),
        ("skip", "skip-zero", lambda g: skip_zero_matmuls(g, report)),
        ("skip", "fold", lambda g: constant_fold(g, preport, options.fold_growth_limit, options.fold_min_bytes,
                                                 options.fold_memory_budget)),  # what skip-zero made known
        ("ternary", "ternary", lambda g: pack_ternary_weights(g, report)),
        ("quant", quant_codec.short, lambda g: quantize_matmul_weights(g, report, errors, quant_codec.name)),
        ("simplify", "simplify", lambda g: simplify(g, preport)),
        ("dce", "dce", lambda g: dedupe_constants(dead_code_elimination(g, preport), preport)),
    ]
    for flag, label, run_pass in stages:
        if getattr(options, flag):
            step(label)
            g = run_pass(g)
    report.folds_refused = preport.fold_refused
    report.nodes_after = len(g.nodes)
    step("weight table")
    rf = RlxFile(g, {}, {})
    sources = {}  # packed constant -> (encoding, N, K, how it was laid out)
    for n in g.nodes:
        if n.op == "DequantMatMul":
            sources[n.inputs[1]] = (n.attrs["encoding"], n.attrs["N"], n.attrs["K"], "transposed to N x K")
        elif n.op == "DequantGather":
            sources[n.inputs[0]] = (n.attrs["encoding"], n.attrs["N"], n.attrs["K"], "table rows")
    for name in sorted(g.constants):
        c = g.constants[name]
        if name in sources:
            enc, n_out, k, layout = sources[name]
            raw = report.packed_from.get(name, name)
            src = report.folded_from.get(raw, raw)
            w = Weight(name, enc, (n_out, k), c.value, "f32", preport.digests.get(name),
                       f"packed from {src!r} ({layout})")
            err = errors.get(raw)
            report.weights.append(WeightReport(name, enc, [n_out, k], n_out * k * 4, int(c.value.nbytes),
                                               err[0] if err else 0.0, err[1] if err else 1.0,
                                               f"{'lossy' if err else 'lossless'} {get_codec(enc).ggml}"))
        else:
            arr = np.require(c.value, dtype=NUMPY_DTYPES[c.dtype], requirements="C")  # keeps 0-d arrays 0-d
            w = Weight.plain(name, arr, c.dtype)
            w.digest = preport.digests.get(name)  # dedupe already hashed these bytes: don't read them twice
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
