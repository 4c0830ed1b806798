"""Kernels: LSTM and GRU (ONNX equations, default activations), one time step at a time."""

from __future__ import annotations

from .registry import kernel


def _sigmoid(xp, v):
    return 1 / (1 + xp.exp(-v))


def _clip(xp, a, v):
    return v if a["clip"] is None else xp.clip(v, -a["clip"], a["clip"])


def _steps(a, d: int, seq: int):
    """Direction d's time order: forward, or reverse (the second direction of a bidirectional one)."""
    rev = a["direction"] == "reverse" or (a["direction"] == "bidirectional" and d == 1)
    return range(seq - 1, -1, -1) if rev else range(seq)


@kernel("LSTM")
def _lstm(xp, a, x, w, r, b, h0, c0, p):
    """Gates i, o, f, c (ONNX order); peepholes p are i, o, f. Returns Y, Y_h or Y_c as attr output asks."""
    hs = a["hidden_size"]
    ys, hn, cn = [], [], []
    for d in range(w.shape[0]):
        xw = x @ w[d].T + (b[d, :4 * hs] + b[d, 4 * hs:])  # every step's input projection at once
        h, c = h0[d], c0[d]
        pi, po, pf = p[d, :hs], p[d, hs:2 * hs], p[d, 2 * hs:]
        y = [None] * x.shape[0]
        for t in _steps(a, d, x.shape[0]):
            g = xw[t] + h @ r[d].T
            i = _sigmoid(xp, _clip(xp, a, g[:, :hs] + pi * c))
            f = _sigmoid(xp, _clip(xp, a, g[:, 2 * hs:3 * hs] + pf * c))
            cand = xp.tanh(_clip(xp, a, g[:, 3 * hs:]))
            c = f * c + i * cand
            o = _sigmoid(xp, _clip(xp, a, g[:, hs:2 * hs] + po * c))
            h = o * xp.tanh(c)
            y[t] = h
        ys.append(xp.stack(y) if y else xp.zeros((0,) + h.shape, x.dtype))
        hn.append(h)
        cn.append(c)
    if a["output"] == "Y_h":
        return xp.stack(hn)
    if a["output"] == "Y_c":
        return xp.stack(cn)
    return xp.stack(ys, axis=1)


@kernel("GRU")
def _gru(xp, a, x, w, r, b, h0):
    """Gates z, r, h (ONNX order); linear_before_reset applies R_h before the reset gate."""
    hs = a["hidden_size"]
    ys, hn = [], []
    for d in range(w.shape[0]):
        xw = x @ w[d].T + b[d, :3 * hs]
        rb = b[d, 3 * hs:]
        h = h0[d]
        y = [None] * x.shape[0]
        for t in _steps(a, d, x.shape[0]):
            hr = h @ r[d, :2 * hs].T + rb[:2 * hs]
            z = _sigmoid(xp, _clip(xp, a, xw[t, :, :hs] + hr[:, :hs]))
            rg = _sigmoid(xp, _clip(xp, a, xw[t, :, hs:2 * hs] + hr[:, hs:]))
            if a["linear_before_reset"]:
                cand = xw[t, :, 2 * hs:] + rg * (h @ r[d, 2 * hs:].T + rb[2 * hs:])
            else:
                cand = xw[t, :, 2 * hs:] + (rg * h) @ r[d, 2 * hs:].T + rb[2 * hs:]
            h = (1 - z) * xp.tanh(_clip(xp, a, cand)) + z * h
            y[t] = h
        ys.append(xp.stack(y) if y else xp.zeros((0,) + h.shape, x.dtype))
        hn.append(h)
    return xp.stack(hn) if a["output"] == "Y_h" else xp.stack(ys, axis=1)
