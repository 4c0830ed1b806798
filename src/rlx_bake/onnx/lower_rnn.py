"""Lowerings: LSTM, GRU, RNN (every opset form, both layouts, every optional input and output).

The catalogue op computes all ONNX outputs in one pass, packed along axis 0 (Y rows, then Y_h, then
Y_c); each requested output is a slice of it. layout=1 ([batch, seq, ...]) is transposed around it.
"""

from __future__ import annotations

from rlx_format.ops.infer_rnn import OPTIONAL, STATES

from .context import LOWER, Unsupported

_ONNX_INPUT = {"B": 3, "sequence_lens": 4, "initial_h": 5, "initial_c": 6, "P": 7}


def _recurrent(op: str):
    def lower(ctx, n, a):
        layout = a.get("layout", 0)
        x = n.input[0]
        if layout:
            x = ctx.emit("Transpose", [x], {"perm": [1, 0, 2]})
        ins, optional = [x, n.input[1], n.input[2]], []
        for name in OPTIONAL[op]:
            pos = _ONNX_INPUT[name]
            if len(n.input) > pos and n.input[pos]:
                src = n.input[pos]
                if layout and name in ("initial_h", "initial_c"):  # [batch, dirs, hidden] -> [dirs, batch, hidden]
                    src = ctx.emit("Transpose", [src], {"perm": [1, 0, 2]})
                ins.append(src)
                optional.append(name)
        if "hidden_size" not in a:
            raise Unsupported(f"{op} without hidden_size")
        attrs = {"hidden_size": a["hidden_size"], "direction": a.get("direction", "forward"), "optional": optional}
        for k in ("activations", "activation_alpha", "activation_beta", "clip"):
            if k in a:
                attrs[k] = list(a[k]) if isinstance(a[k], (list, tuple)) else a[k]
        if op == "LSTM":
            attrs["input_forget"] = a.get("input_forget", 0)
        if op == "GRU":
            attrs["linear_before_reset"] = a.get("linear_before_reset", 0)
        packed = ctx.emit(op, ins, attrs)
        k = STATES[op]
        outs = list(n.output) + [""] * (1 + k - len(n.output))
        if outs[0]:
            y = ctx.emit("Slice", [packed], {"starts": [0], "ends": [-k], "axes": [0]},
                         None if layout else outs[0])
            if layout:  # [seq, dirs, batch, hidden] -> [batch, seq, dirs, hidden]
                ctx.emit("Transpose", [y], {"perm": [2, 0, 1, 3]}, outs[0])
        for j, name in enumerate(outs[1:1 + k]):
            if not name:
                continue
            idx = ctx.const(-k + j, "int64")
            state = ctx.emit("Gather", [packed, idx], {"axis": 0}, None if layout else name)
            if layout:  # [dirs, batch, hidden] -> [batch, dirs, hidden]
                ctx.emit("Transpose", [state], {"perm": [1, 0, 2]}, name)
    return lower


for _op in ("LSTM", "GRU", "RNN"):
    LOWER[_op] = _recurrent(_op)
