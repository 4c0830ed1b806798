"""numba kernels of the CPU LSTM's and GRU's steps (kernels/recurrent.py takes them for float32 LSTMs with the default
activations, no clip, no peepholes, no input_forget and no sequence_lens, and float32 GRUs likewise).

Each step was about ten numpy calls and a split GEMM hand-off, ~95 us of Python and dispatch around its 26 us GEMM
(a 2-layer 256-hidden LSTM at batch 8: 120 us a step against onnxruntime's 53). Here a whole direction's steps run
in one call. The values are the generic kernel's steps, in the same float32 operations: the state times Rᵀ by
the few-rows GEMM (what its MatMul takes for 2-16 rows; here simd.gather_panels_f32 over Rᵀ's column panels),
z = x·Wᵀ + b + that, the i, o, f gates by simd.sigmoid_f32, c = f·c + i·tanh(zc), h = o·tanh(c); tanh is
ufuncs.tanh_f32_loop (numpy's tanh on the generic path: they differ by an ulp or two).

Threads: the batch's rows are independent sequences, so they split into groups (kernels/recurrent.py) whose
steps run with no wait on one another. Within a group each step's hidden units may split into blocks; every
thread that runs lstm_steps on the same group (the forward's threads, as chunks of one native job: threads.py)
takes the current step's blocks one at a time from the group's shared counter, and the thread that finishes a
step's last block moves all of them to the next step. A thread waits only for blocks that another thread has
taken and is running, so one thread alone runs every step, whichever threads join, and when. Every element is
computed the same way whichever thread computes it.
"""

from __future__ import annotations

import math

import numpy as np

from rlx_format.numba_setup import numba

from . import aligned
from .atomics import backoff, fetch_add, load, store
from .simd import PANEL_TILE, SKINNY_ROWS, gather_panels_f32, sigmoid_f32
from .ufuncs import tanh_f32_loop

PANEL = math.prod(PANEL_TILE)  # columns of Rᵀ per panel: a column block of gather_panels_f32 (256 AVX-512, 96 AVX2)


def pack_panels(rt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rᵀ (k, n) float32 as (panels (ceil(n / PANEL), k, PANEL), offsets (panels, k) int64): panel p holds columns
    p*PANEL .. (p+1)*PANEL - 1 of every row, contiguous (the last zero-padded), and offsets[p, i] + col is where
    column col of row i is in the flat panels, for col in that panel (simd.gather_panels_f32's row offsets). A step's
    GEMM then reads each panel as one stream: Rᵀ's rows, 4H floats apart (4 KiB and more: a page apart), left the
    prefetchers idle (8x256 @ 256x1024: 62 GMAC/s as rows of Rᵀ, 76 as panels). A panel is a column block of the
    kernel, whose passes of few rows take several vectors side by side (32-column panels held them to one). The
    products and their order are the same, so the same bits. The panels start on a cache line (aligned.py)."""
    k, n = rt.shape
    count = -(-n // PANEL)
    padded = np.zeros((k, count * PANEL), np.float32)
    padded[:, :n] = rt
    panels = aligned.array(padded.reshape(k, count, PANEL).transpose(1, 0, 2))
    p = np.arange(count, dtype=np.int64)[:, None]
    offsets = p * k * PANEL + np.arange(k, dtype=np.int64)[None, :] * PANEL - p * PANEL
    return panels, np.ascontiguousarray(offsets)


@numba.njit(cache=True, nogil=True)
def _next_block(sync, seq, block, hid, reverse):  # pragma: no cover - compiled
    """(step, its time index, the block's first hidden unit, its units) for this thread to run next: step >= seq
    once every step is done, 0 units after waiting for the step in progress to finish (every block of it taken
    by other threads)."""
    s = load(sync, 0)
    if s >= seq:
        return s, 0, 0, 0
    k = fetch_add(sync, 1 + s, 1)
    if k * block < hid:
        j0 = k * block
        return s, seq - 1 - s if reverse else s, j0, min(hid, j0 + block) - j0
    polls = 0
    while load(sync, 0) == s:
        backoff(polls)
        polls += 1
    return s, 0, 0, 0


@numba.njit(cache=True, nogil=True)
def _block_done(sync, seq, s, parts):  # pragma: no cover - compiled
    """Count a block of step s finished; the step's last block moves every thread on to the next step."""
    if fetch_add(sync, 1 + seq + s, 1) == parts - 1:
        store(sync, 0, s + 1)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _recurrence(z, hin, pf, offsets, g0, g1, n, hid, j0, w, b0, b1):  # pragma: no cover - compiled
    """z[b, g*hid + j0 + j] = (hin·Rᵀ) there for rows b0..b1, gates g0..g1 - 1, the block's columns j < w, a
    panel's columns at a time (z flat (batch, n), n the gates' columns; hin flat (batch, hid))."""
    for g in range(g0, g1):
        col, end = g * hid + j0, g * hid + j0 + w
        while col < end:
            p = col // PANEL
            stop = min(end, (p + 1) * PANEL)
            for r0 in range(b0, b1, SKINNY_ROWS):
                gather_panels_f32(z[r0 * n:], hin[r0 * hid:], pf, offsets[p], min(b1 - r0, SKINNY_ROWS), hid, n,
                                  col, stop)
            col = stop


@numba.njit(cache=True, nogil=True, error_model="numpy")
def lstm_steps(xw, panels, offsets, hbuf, c, out, d, reverse, exp_terms, tanh_terms, sync, block, b0,
               b1):  # pragma: no cover - compiled
    """One direction of an LSTM, or this thread's share of it. xw (seq, batch, 4H) float32, C-contiguous: each
    step's input projection with both biases added; panels, offsets: this direction's Rᵀ (H, 4H) (gate order i,
    o, f, c) in column panels (pack_panels); hbuf (2, batch, H) float32: hbuf[0] holds the initial h, and the
    final h ends in hbuf[seq % 2]; c (batch, H) float32, C-contiguous: the initial c, left holding the final one;
    out (seq + 2, dirs, batch, H): Y[t, d] written for every step t (reverse: from the last); sync: 1 + 2 * seq
    zeroed int64 words shared by the threads (the step in progress, then each step's blocks taken, then its blocks
    finished); block: hidden units per block; b0, b1: the batch rows run (the others are not read or written:
    another call may run them at the same time with its own sync)."""
    seq, batch, g4 = xw.shape
    hid = g4 // 4
    parts = -(-hid // block)
    z = np.empty(batch * g4, np.float32)  # this thread's pre-activations (only its block's columns are used)
    # each loop reads one buffer and writes another: with in == out the sigmoid and tanh loops are not vectorized
    act = np.empty(3 * batch * block, np.float32)  # sigmoid of the block's i, o, f pre-activations
    tcand = np.empty(batch * block, np.float32)  # tanh of its candidates'
    tc = np.empty(batch * block, np.float32)  # tanh of its new c
    pf = panels.reshape(-1)
    while True:
        s, t, j0, w = _next_block(sync, seq, block, hid, reverse)
        if s >= seq:
            return
        if w == 0:
            continue
        hin, hout = hbuf[s % 2].reshape(-1), hbuf[(s + 1) % 2].reshape(-1)
        _recurrence(z, hin, pf, offsets, 0, 4, g4, hid, j0, w, b0, b1)
        xt = xw[t].reshape(-1)
        # each loop over slices of the rows (indices from 0: numba drops its negative-index fix-up, and the loops
        # vectorize; z[at + j] += ... took 5 of a 40 us step at batch 8)
        for b in range(b0, b1):
            zb, xb = z[b * g4:(b + 1) * g4], xt[b * g4:(b + 1) * g4]
            for g in range(4):
                zg, xg = zb[g * hid + j0:g * hid + j0 + w], xb[g * hid + j0:g * hid + j0 + w]
                for j in range(w):
                    zg[j] = xg[j] + zg[j]
            for g in range(3):
                sigmoid_f32(act, (3 * b + g) * w, z, b * g4 + g * hid + j0, w, np.float32(-0.0), False)
            ab = act[3 * b * w:3 * (b + 1) * w]
            ig, og, fg = ab[:w], ab[w:2 * w], ab[2 * w:]
            tb, tcb = tcand[b * w:(b + 1) * w], tc[b * w:(b + 1) * w]
            tanh_f32_loop(zb[3 * hid + j0:3 * hid + j0 + w], tb, tanh_terms, exp_terms)
            cb = c[b, j0:j0 + w]
            for j in range(w):  # f * c + i * tanh(zc)
                cb[j] = fg[j] * cb[j] + ig[j] * tb[j]
            tanh_f32_loop(cb, tcb, tanh_terms, exp_terms)
            hb, yb = hout[b * hid + j0:b * hid + j0 + w], out[t, d, b, j0:j0 + w]
            for j in range(w):  # o * tanh(c)
                v = og[j] * tcb[j]
                hb[j] = v
                yb[j] = v
        _block_done(sync, seq, s, parts)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def gru_steps(xw, panels, offsets, hbuf, out, d, reverse, rb, has_rb, before_reset, exp_terms, tanh_terms, sync, block,
              b0, b1):  # pragma: no cover - compiled
    """One direction of a GRU, or this thread's share of it, in lstm_steps' way. xw (seq, batch, 3H) float32,
    C-contiguous: each step's input projection with Wb added; panels, offsets: Rᵀ (H, 3H) (gates z, r, h); rb
    (3H,) float32: Rb (has_rb False: none); before_reset: linear_before_reset (else block must be H: the
    candidate's product needs the whole reset gate of a row); hbuf (2, batch, H): hbuf[0] the initial h, the final
    h in hbuf[seq % 2]; out (seq + 1, dirs, batch, H): Y[t, d] for every step t. As the generic step:
    z = σ((x + h·Rzᵀ) + Rbz), r = σ((x + h·Rrᵀ) + Rbr), h' = (1 - z)·tanh(c) + z·h with c = x + r·(h·Rhᵀ + Rbh)
    (linear_before_reset) or (x + (r·h)·Rhᵀ) + Rbh."""
    seq, batch, g3 = xw.shape
    hid = g3 // 3
    parts = -(-hid // block)
    z = np.empty(batch * g3, np.float32)  # this thread's h·Rᵀ, then pre-activations (its block's columns)
    act = np.empty(2 * batch * block, np.float32)  # sigmoid of the block's z and r pre-activations
    cand = np.empty(batch * block, np.float32)  # its candidates' pre-activations
    th = np.empty(batch * block, np.float32)  # and their tanh
    rh = np.empty(batch * hid, np.float32)  # r·h (without linear_before_reset)
    pf = panels.reshape(-1)
    one = np.float32(1.0)
    while True:
        s, t, j0, w = _next_block(sync, seq, block, hid, reverse)
        if s >= seq:
            return
        if w == 0:
            continue
        hin, hout = hbuf[s % 2].reshape(-1), hbuf[(s + 1) % 2].reshape(-1)
        _recurrence(z, hin, pf, offsets, 0, 3 if before_reset else 2, g3, hid, j0, w, b0, b1)
        xt = xw[t].reshape(-1)
        for b in range(b0, b1):  # the z and r gates: (x + h·Rᵀ) + Rb
            zb, xb = z[b * g3:(b + 1) * g3], xt[b * g3:(b + 1) * g3]
            for g in range(2):
                at = g * hid + j0
                zg, xg, rg = zb[at:at + w], xb[at:at + w], rb[at:at + w]
                for j in range(w):
                    zg[j] = xg[j] + zg[j]
                if has_rb:
                    for j in range(w):
                        zg[j] = zg[j] + rg[j]
                sigmoid_f32(act, (2 * b + g) * w, z, b * g3 + at, w, np.float32(-0.0), False)
            if not before_reset:  # r·h, the whole row (block is H)
                rgate, hp = act[(2 * b + 1) * w:2 * (b + 1) * w], hin[b * hid:(b + 1) * hid]
                rhb = rh[b * hid:(b + 1) * hid]
                for j in range(w):
                    rhb[j] = rgate[j] * hp[j]
        if not before_reset:
            _recurrence(z, rh, pf, offsets, 2, 3, g3, hid, j0, w, b0, b1)
        for b in range(b0, b1):
            zb, xb = z[b * g3:(b + 1) * g3], xt[b * g3:(b + 1) * g3]
            at = 2 * hid + j0
            rec, xh, rbh = zb[at:at + w], xb[at:at + w], rb[at:at + w]
            ab = act[2 * b * w:2 * (b + 1) * w]
            zgate, rgate = ab[:w], ab[w:]
            cb, tb = cand[b * w:(b + 1) * w], th[b * w:(b + 1) * w]
            if before_reset:
                if has_rb:
                    for j in range(w):
                        rec[j] = rec[j] + rbh[j]
                for j in range(w):
                    cb[j] = xh[j] + rgate[j] * rec[j]
            else:
                for j in range(w):
                    cb[j] = xh[j] + rec[j]
                if has_rb:
                    for j in range(w):
                        cb[j] = cb[j] + rbh[j]
            tanh_f32_loop(cb, tb, tanh_terms, exp_terms)
            at = b * hid + j0
            hp, hb, yb = hin[at:at + w], hout[at:at + w], out[t, d, b, j0:j0 + w]
            for j in range(w):
                v = (one - zgate[j]) * tb[j] + zgate[j] * hp[j]
                hb[j] = v
                yb[j] = v
        _block_done(sync, seq, s, parts)
