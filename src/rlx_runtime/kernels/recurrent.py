"""LSTM, GRU and RNN with ONNX semantics (layout 0; spec/ops.md, "Recurrent").

The input projection X·Wᵀ for every step is one GEMM per direction; each step then does one
H·Rᵀ GEMM and elementwise gate math. `sequence_lens` stops a batch entry after its length: its
later Y rows stay 0 and its final states are those of its last valid step (a reverse pass starts
at its own last valid step). The packed output is [seq + states, dirs, batch, hidden]: Y, then
Y_h (and Y_c).
"""

from __future__ import annotations

import numpy as np

from rlx_format.ops.infer_rnn import DEFAULT_ACTIVATIONS, GATES, STATES

from ..backend import backend_of, host_ints, special
from .nn import backend_matmul
from .registry import kernel

# activation -> (uses alpha, uses beta, default alpha, default beta)
_PARAMS = {"LeakyRelu": (True, False, 0.01, 0.0), "ThresholdedRelu": (True, False, 1.0, 0.0),
           "ScaledTanh": (True, True, 1.0, 1.0), "Affine": (True, True, 1.0, 0.0),
           "HardSigmoid": (True, True, 0.2, 0.5), "Elu": (True, False, 1.0, 0.0)}


def _activation(xp, name: str, alpha: float, beta: float):
    if name == "Sigmoid":
        return lambda v: special(xp).expit(v)
    if name == "Tanh":
        return xp.tanh
    if name == "Relu":
        return lambda v: xp.maximum(v, v.dtype.type(0))
    if name == "LeakyRelu":
        return lambda v: xp.where(v >= 0, v, v * v.dtype.type(alpha))
    if name == "ThresholdedRelu":
        return lambda v: xp.where(v >= v.dtype.type(alpha), v, v.dtype.type(0))
    if name == "ScaledTanh":
        return lambda v: v.dtype.type(alpha) * xp.tanh(v.dtype.type(beta) * v)
    if name == "Affine":
        return lambda v: v.dtype.type(alpha) * v + v.dtype.type(beta)
    if name == "HardSigmoid":
        return lambda v: xp.clip(v.dtype.type(alpha) * v + v.dtype.type(beta), 0, 1).astype(v.dtype)
    if name == "Elu":
        return lambda v: xp.where(v >= 0, v, v.dtype.type(alpha) * xp.expm1(v))
    if name == "Softsign":
        return lambda v: v / (v.dtype.type(1) + xp.abs(v))
    return lambda v: xp.logaddexp(v.dtype.type(0), v)  # Softplus


def _activations(xp, op: str, a: dict, dirs: int) -> list[list]:
    """Per direction, the activation callables. alpha/beta are consumed in order by the activations that
    take them (ONNX), defaults otherwise."""
    names = a["activations"] or DEFAULT_ACTIVATIONS[op] * dirs
    alphas, betas = list(a["activation_alpha"] or []), list(a["activation_beta"] or [])
    fns = []
    for name in names:
        uses_a, uses_b, da, db = _PARAMS.get(name, (False, False, 0.0, 0.0))
        alpha = alphas.pop(0) if uses_a and alphas else da
        beta = betas.pop(0) if uses_b and betas else db
        fns.append(_activation(xp, name, alpha, beta))
    per = len(DEFAULT_ACTIVATIONS[op])
    return [fns[d * per:(d + 1) * per] for d in range(dirs)]


@kernel("LSTM")
def _lstm(xp, a, x, w, r, *rest):
    return _recurrent(xp, "LSTM", a, x, w, r, rest)


@kernel("GRU")
def _gru(xp, a, x, w, r, *rest):
    return _recurrent(xp, "GRU", a, x, w, r, rest)


@kernel("RNN")
def _rnn(xp, a, x, w, r, *rest):
    return _recurrent(xp, "RNN", a, x, w, r, rest)


def _recurrent(xp, op: str, a: dict, x, w, r, rest):
    opt = dict(zip(a["optional"], rest))
    seq, batch, _ = x.shape
    dirs, h = w.shape[0], a["hidden_size"]
    g = GATES[op]
    dt = x.dtype
    out = xp.zeros((seq + STATES[op], dirs, batch, h), dt)
    bias = opt.get("B")
    lens = np.asarray(host_ints(xp, opt["sequence_lens"]), np.int64) if "sequence_lens" in opt else None
    if lens is not None and ((lens < 0) | (lens > seq)).any():
        raise ValueError(f"sequence_lens {lens.tolist()} outside [0, {seq}]")
    acts = _activations(xp, op, a, dirs)
    clip = a["clip"]
    rows = xp.arange(batch)
    peep = opt.get("P")
    fast = _numba_steps(xp, op, a, x, w, r, peep, lens)
    for d in range(dirs):
        reverse = a["direction"] == "reverse" or (a["direction"] == "bidirectional" and d == 1)
        wb = bias[d, :g * h] if bias is not None else None
        rb = bias[d, g * h:] if bias is not None else None
        # [seq, batch, gates*hidden]: the whole sequence's input projection as one 2-D GEMM (a 3-D matmul ran
        # one small GEMM per step: 14 ms of a 64-step LSTM layer that takes 2 ms this way), its biases added by
        # FusedMatMul's kernel (on the CPU to each block of the GEMM as it is done, ~80 us a layer less than a pass
        # of its own; the values are MatMul's then Add's); a GRU adds Rbh inside the reset product
        x2 = x.reshape(seq * batch, x.shape[2])
        if wb is None:
            xw = backend_matmul(xp, x2, w[d].T)
        else:
            xw = backend_of(xp).kernel("FusedMatMul")(xp, {}, x2, w[d].T, wb if op == "GRU" else wb + rb)
        xw = xw.reshape(seq, batch, g * h)
        ht = opt["initial_h"][d] if "initial_h" in opt else xp.zeros((batch, h), dt)
        ct = None if op != "LSTM" else opt["initial_c"][d] if "initial_c" in opt else xp.zeros((batch, h), dt)
        if fast:
            before_reset = op != "GRU" or bool(a["linear_before_reset"])
            _direction(op, xw, _transposed_weight(a, r, d), ht, ct, rb, out, d, reverse, before_reset)
            continue
        step_fn = {"LSTM": _lstm_step, "GRU": _gru_step, "RNN": _rnn_step}[op]
        rd = _step_weights(xp, r[d])
        for s in range(seq):
            if lens is None:
                t = seq - 1 - s if reverse else s
                h_new, c_new = step_fn(xp, a, xw[t], ht, ct, rd, rb, peep[d] if peep is not None else None,
                                       acts[d], clip, h)
                out[t, d] = h_new
                ht, ct = h_new, c_new
                continue
            valid = s < lens  # entries still inside their sequence
            t_b = np.where(valid, (lens - 1 - s) if reverse else s, 0)
            xt = xw[xp.asarray(t_b), rows]
            h_new, c_new = step_fn(xp, a, xt, ht, ct, rd, rb, peep[d] if peep is not None else None, acts[d],
                                   clip, h)
            keep = xp.asarray(valid)[:, None]
            ht = xp.where(keep, h_new, ht)
            ct = xp.where(keep, c_new, ct) if ct is not None else None
            idx = np.nonzero(valid)[0]
            if idx.size:
                out[xp.asarray(t_b[idx]), d, xp.asarray(idx)] = h_new[xp.asarray(idx)]
        out[seq, d] = ht
        if op == "LSTM":
            out[seq + 1, d] = ct
    return out


def _numba_steps(xp, op, a, x, w, r, peep, lens) -> bool:
    """Whether the steps run as a numba kernel (recurrent_kernels.py): a CPU float32 LSTM with the default
    activations and none of clip, peepholes, input_forget or sequence_lens, or such a GRU."""
    be = backend_of(xp)
    default = a["activations"] is None or list(a["activations"]) == DEFAULT_ACTIVATIONS[op] * w.shape[0]
    kernel = (op == "LSTM" and not a["input_forget"] and peep is None) or op == "GRU"
    return bool(kernel and be.host_arrays and be.fused_kernels and x.dtype == w.dtype == r.dtype == np.float32
                and default and a["clip"] is None and lens is None)


_MIN_STEP_SPLIT = 1 << 18  # multiply-adds of a step's state times Rᵀ from which the steps split over the threads
#                           (~3 us of GEMM; handing a step's blocks over costs well under a microsecond)
_GROUP_ROWS = 4  # batch rows a group at least has: a 256-hidden layer at 2 threads, batch 8 as two groups 2.77 ms,
#                 as hidden blocks 2.85; batch 4 as two groups of 2 rows 1.89, as blocks 1.81 (batch 2 level)


def _transposed_weight(a: dict, r, d: int):
    """Rᵀ of direction d in column panels (recurrent_kernels.pack_panels: (panels, offsets)): made once per plan
    step and weight (the steps' attrs are their own), not per forward (a 1 MiB copy per layer of the LSTM
    benchmark model)."""
    from ..recurrent_kernels import pack_panels
    cached = a.get("_rt")
    if cached is None or cached[0] is not r:
        cached = a["_rt"] = (r, [pack_panels(np.ascontiguousarray(r[k].T, np.float32)) for k in range(r.shape[0])])
    return cached[1][d]


def _direction(op: str, xw, packed, ht, ct, rb, out, d: int, reverse: bool, before_reset: bool = True) -> None:
    """One direction's steps by the numba kernel over the forward's threads (LSTM: recurrent_kernels.lstm_steps, ct
    its initial c; GRU: gru_steps, rb its Rb or None, before_reset its linear_before_reset); the final h (and c)
    go to out's last rows. The batch's rows are independent sequences: they split into groups of at least
    _GROUP_ROWS rows, each group's steps run with no wait on the others; threads left over split each step's
    hidden units into blocks within a group (a barrier per step), but for a GRU without linear_before_reset,
    whose candidate's product needs a row's whole reset gate."""
    from ..recurrent_kernels import gru_steps, lstm_steps
    from ..threads import run_chunks, threads_in_use
    from ..ufuncs import EXP_TERMS, TANH_TERMS
    seq, batch, gh = xw.shape
    hid = gh // GATES[op]
    threads = threads_in_use() if batch * gh * hid >= _MIN_STEP_SPLIT else 1
    groups = max(1, min(threads, batch // _GROUP_ROWS))
    block = -(-hid // max(1, threads // groups)) if before_reset else hid
    block = min(hid, -(-block // 32) * 32)  # whole 32-column vectors of the few-rows GEMM
    parts = -(-hid // block)
    edges = [batch * g // groups for g in range(groups + 1)]
    hbuf = np.empty((2, batch, hid), np.float32)
    hbuf[0] = ht
    sync = np.zeros((groups, 1 + 2 * seq), np.int64)
    xw = np.ascontiguousarray(xw)
    if op == "LSTM":
        c = np.array(ct, np.float32, order="C")  # a fresh copy: the kernel updates it in place
        args = (xw, *packed, hbuf, c, out, d, reverse, EXP_TERMS, TANH_TERMS)
        kernel = lstm_steps
    else:
        has_rb = rb is not None
        rbv = np.ascontiguousarray(rb, np.float32) if has_rb else np.zeros(gh, np.float32)
        args = (xw, *packed, hbuf, out, d, reverse, rbv, has_rb, before_reset, EXP_TERMS, TANH_TERMS)
        kernel = gru_steps
    # chunk i runs group i % groups: its blocks' shared loop (Python jobs: each thread takes the GIL once per
    # call, then runs every step without it); the groups' first chunks come first, so each group has a thread
    run_chunks(groups * parts,
               lambda i: kernel(*args, sync[i % groups], block, edges[i % groups], edges[i % groups + 1]))
    if op == "LSTM":
        out[-2, d] = hbuf[seq % 2]
        out[-1, d] = c
    else:
        out[-1, d] = hbuf[seq % 2]


def _rec(xp, hs, r):
    """hs @ r.T for a step's few rows of state. `r` is (gates*hidden, hidden), or on the CPU its transpose made
    contiguous once per call (`_step_weights`), which the MatMul kernel multiplies by rlx's few-rows kernel.
    Otherwise computed as (r @ hs.T).T: OpenBLAS packs the long operand of a GEMM with few rows, and r's rows are
    already the packed layout's (8x256 @ 256x1024: 87 us this way, 175 us the other)."""
    if isinstance(r, _Transposed):
        return backend_matmul(xp, hs, r.t)
    return backend_matmul(xp, r, hs.T).T


class _Transposed:
    """A recurrence weight held as its contiguous transpose; a slice of its rows is a contiguous copy of the
    transpose's columns, made once (GRU's steps slice the same rows every step)."""

    def __init__(self, t):
        self.t = t
        self._slices: dict = {}

    def __getitem__(self, rows: slice) -> _Transposed:
        key = (rows.start, rows.stop)
        if key not in self._slices:
            self._slices[key] = _Transposed(np.ascontiguousarray(self.t[:, rows]))
        return self._slices[key]


def _step_weights(xp, r):
    """The weight the steps multiply by: on the CPU (float32) its transpose, contiguous (see _rec)."""
    if backend_of(xp).host_arrays and r.dtype == np.float32:
        return _Transposed(np.ascontiguousarray(r.T))
    return r


def _clip(xp, v, clip):
    return v if clip is None else xp.clip(v, -clip, clip).astype(v.dtype)


def _lstm_step(xp, a, xt, h_prev, c_prev, r, rb, peep, acts, clip, h):
    f, g, hf = acts
    z = xt + _rec(xp, h_prev, r)
    zi, zo, zf, zc = (z[:, k * h:(k + 1) * h] for k in range(4))  # ONNX gate order i, o, f, c
    if peep is None and not a["input_forget"]:  # i, o, f through f in one call (it is elementwise)
        s = f(_clip(xp, z[:, :3 * h], clip))
        i, o, fg = s[:, :h], s[:, h:2 * h], s[:, 2 * h:]
        c = fg * c_prev + i * g(_clip(xp, zc, clip))
        return o * hf(c), c
    if peep is not None:
        zi = zi + peep[:h] * c_prev
        zf = zf + peep[2 * h:] * c_prev
    i = f(_clip(xp, zi, clip))
    fg = (xp.asarray(1, z.dtype) - i) if a["input_forget"] else f(_clip(xp, zf, clip))
    c = fg * c_prev + i * g(_clip(xp, zc, clip))
    if peep is not None:
        zo = zo + peep[h:2 * h] * c
    o = f(_clip(xp, zo, clip))
    return o * hf(c), c


def _gru_step(xp, a, xt, h_prev, _c, r, rb, _peep, acts, clip, h):
    f, g = acts
    hr = _rec(xp, h_prev, r[:2 * h])  # z and r gates; the candidate's recurrence depends on the reset gate
    zz, zr = xt[:, :h] + hr[:, :h], xt[:, h:2 * h] + hr[:, h:]
    if rb is not None:
        zz, zr = zz + rb[:h], zr + rb[h:2 * h]
    zg = f(_clip(xp, zz, clip))
    rg = f(_clip(xp, zr, clip))
    rh = r[2 * h:]
    rbh = rb[2 * h:] if rb is not None else None
    if a["linear_before_reset"]:
        rec = _rec(xp, h_prev, rh)
        if rbh is not None:
            rec = rec + rbh
        cand = xt[:, 2 * h:] + rg * rec
    else:
        cand = xt[:, 2 * h:] + _rec(xp, rg * h_prev, rh)
        if rbh is not None:
            cand = cand + rbh
    hh = g(_clip(xp, cand, clip))
    return (xp.asarray(1, hh.dtype) - zg) * hh + zg * h_prev, None


def _rnn_step(xp, a, xt, h_prev, _c, r, _rb, _peep, acts, clip, h):
    return acts[0](_clip(xp, xt + _rec(xp, h_prev, r), clip)), None
