"""numba kernel of the CPU LSTM's steps (kernels/recurrent.py takes it for float32 LSTMs with the default activations,
no clip, no peepholes, no input_forget and no sequence_lens).

Each step was about ten numpy calls and a split GEMM hand-off, ~95 us of Python and dispatch around its 26 us GEMM
(a 2-layer 256-hidden LSTM at batch 8: 120 us a step against onnxruntime's 53). Here a whole direction's steps run
in one call. The values are the generic kernel's steps, in the same float32 operations: the state times Rᵀ by
simd.skinny_f32 (what its MatMul takes for 2-16 rows), z = x·Wᵀ + b + that, the i, o, f gates by the sigmoid loop
of ufuncs.py, c = f·c + i·tanh(zc), h = o·tanh(c); tanh is ufuncs.tanh_f32_loop (numpy's tanh on the generic path:
they differ by an ulp or two).
"""

from __future__ import annotations

import numpy as np

from rlx_format.numba_setup import numba

from .pool_kernels import skinny_rows
from .ufuncs import sigmoid_f32_loop, tanh_f32_loop


@numba.njit(cache=True, nogil=True, error_model="numpy")
def lstm_steps(xw, rt, h, c, out, d, reverse, exp_terms, tanh_terms):  # pragma: no cover - compiled
    """One direction of an LSTM. xw (seq, batch, 4H) float32, C-contiguous: each step's input projection with both
    biases added; rt (H, 4H) float32, C-contiguous: this direction's Rᵀ (gate order i, o, f, c); h, c (batch, H)
    float32, C-contiguous: the initial states, left holding the final ones; out (seq + 2, dirs, batch, H): Y[t, d]
    written for every step t (reverse: from the last)."""
    seq, batch, g4 = xw.shape
    hid = g4 // 4
    gates = 3 * hid
    z = np.empty(batch * g4, np.float32)
    # each loop reads one buffer and writes another: with in == out the sigmoid and tanh loops are not vectorized
    act = np.empty(batch * gates, np.float32)  # sigmoid of the i, o, f pre-activations
    tcand = np.empty(batch * hid, np.float32)  # tanh of the candidate's
    tc = np.empty(batch * hid, np.float32)
    hf, cf, rtf = h.reshape(-1), c.reshape(-1), rt.reshape(-1)
    for step in range(seq):
        t = seq - 1 - step if reverse else step
        skinny_rows(z, hf, rtf, batch, hid, g4, 0, g4)
        xt = xw[t].reshape(-1)
        for i in range(batch * g4):
            z[i] = xt[i] + z[i]
        for b in range(batch):  # each row's i, o, f and its candidate, straight from z
            sigmoid_f32_loop(z[b * g4:b * g4 + gates], act[b * gates:(b + 1) * gates], False, exp_terms)
            tanh_f32_loop(z[b * g4 + gates:(b + 1) * g4], tcand[b * hid:(b + 1) * hid], tanh_terms, exp_terms)
        for b in range(batch):
            for j in range(hid):
                k = b * hid + j
                g = b * gates + j
                cf[k] = act[g + 2 * hid] * cf[k] + act[g] * tcand[k]  # f * c + i * tanh(zc)
        tanh_f32_loop(cf, tc, tanh_terms, exp_terms)
        y = out[t, d].reshape(-1)
        for b in range(batch):
            for j in range(hid):
                k = b * hid + j
                hf[k] = act[b * gates + hid + j] * tc[k]  # o * tanh(c)
                y[k] = hf[k]
