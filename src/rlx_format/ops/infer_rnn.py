"""Shape inference for the recurrent ops LSTM, GRU and RNN (ONNX semantics, layout 0).

Inputs: X [seq, batch, input], W [dirs, gates*hidden, input], R [dirs, gates*hidden, hidden], then the
optional inputs named, in order, by the `optional` attr (B, sequence_lens, initial_h, initial_c, P).
The one output packs every ONNX output along axis 0: [seq + states, dirs, batch, hidden] holds Y in rows
0..seq-1, then Y_h (and Y_c for LSTM) in the last rows; the importer slices them apart.
"""

from __future__ import annotations

from .core import InferCtx, TensorType

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
STATES = {"LSTM": 2, "GRU": 1, "RNN": 1}  # rows after Y in the packed output: Y_h (, Y_c)
OPTIONAL = {"LSTM": ("B", "sequence_lens", "initial_h", "initial_c", "P"),
            "GRU": ("B", "sequence_lens", "initial_h"), "RNN": ("B", "sequence_lens", "initial_h")}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACTIVATIONS = ("Sigmoid", "Tanh", "Relu", "HardSigmoid", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "Affine",
               "Elu", "Softsign", "Softplus")


def _dims_match(a, b) -> bool:
    return not (isinstance(a, int) and isinstance(b, int)) or a == b


def infer_recurrent(ctx: InferCtx) -> TensorType:
    op, a = ctx.op, ctx.attrs
    x, w, r = ctx.inputs[:3]
    opt = list(a["optional"])
    allowed = OPTIONAL[op]
    if len(set(opt)) != len(opt) or any(o not in allowed for o in opt) or opt != [o for o in allowed if o in opt]:
        raise ctx.fail(f"optional = {opt}; expected a subset of {list(allowed)} in that order")
    if len(ctx.inputs) != 3 + len(opt):
        raise ctx.fail(f"{len(ctx.inputs)} inputs for optional = {opt}; expected {3 + len(opt)}")
    if x.dtype not in ("f32", "f64", "f16") or w.dtype != x.dtype or r.dtype != x.dtype:
        raise ctx.fail(f"X, W, R have dtypes {x.dtype}, {w.dtype}, {r.dtype}; expected one float dtype")
    if x.rank != 3 or w.rank != 3 or r.rank != 3:
        raise ctx.fail(f"X, W, R have ranks {x.rank}, {w.rank}, {r.rank}; expected 3 each (layout 0)")
    h, g = a["hidden_size"], GATES[op]
    dirs = 2 if a["direction"] == "bidirectional" else 1
    seq, batch, _ = x.shape
    want = {"W": (dirs, g * h, x.shape[2]), "R": (dirs, g * h, h)}
    shapes = {"W": w.shape, "R": r.shape}
    for name, t in zip(opt, ctx.inputs[3:]):
        shapes[name] = t.shape
        if name == "sequence_lens":
            if t.dtype not in ("i32", "i64"):
                raise ctx.fail(f"sequence_lens has dtype {t.dtype}; expected i32 or i64")
            want[name] = (batch,)
            continue
        if t.dtype != x.dtype:
            raise ctx.fail(f"{name} has dtype {t.dtype}; expected {x.dtype}")
        want[name] = {"B": (dirs, 2 * g * h), "initial_h": (dirs, batch, h), "initial_c": (dirs, batch, h),
                      "P": (dirs, 3 * h)}[name]
    for name, expect in want.items():
        got = shapes[name]
        if len(got) != len(expect) or not all(_dims_match(e, d) for e, d in zip(expect, got)):
            raise ctx.fail(f"{name} has shape {list(got)}; expected {list(expect)} (hidden_size {h}, "
                           f"{dirs} direction(s))")
    acts = a["activations"]
    if acts is not None:
        per = len(DEFAULT_ACTIVATIONS[op])
        if len(acts) != per * dirs or any(f not in ACTIVATIONS for f in acts):
            raise ctx.fail(f"activations = {acts}; expected {per * dirs} names from {list(ACTIVATIONS)}")
    rows = seq + STATES[op] if isinstance(seq, int) else ctx.fresh()
    return TensorType(x.dtype, (rows, dirs, batch, h))
