"""Kernels: MatMul, convolution, pooling, normalization and attention."""

from __future__ import annotations

import functools
import math
import string

import numpy as np

from rlx_format.ops import window_count

from .. import conv_direct, conv_pointwise, conv_shifted, conv_taps, threads
from ..backend import backend_of
from ..clamp import relu
from .registry import binder, kernel, register
from .registry import numba_loaded as _numba_loaded  # a module global: tests replace it

register("MatMul", lambda xp, a, x, y: xp.matmul(x, y))


@kernel("MatMul", backend="cpu")
def _matmul_cpu(xp, a, x, y):
    """Split over the forward's threads; a few rows times a weight matrix by rlx's own kernel (a small batch, an
    LSTM step: OpenBLAS packs the whole matrix on every call)."""
    if 2 <= x.ndim <= 3 and y.ndim == 2 and 2 <= math.prod(x.shape[:-1]) <= threads.SKINNY_MAX_ROWS:
        out = threads.few_rows_matmul(x.reshape(-1, x.shape[-1]), y)
        if out is not None:
            return out.reshape(x.shape[:-1] + (y.shape[1],))
    return threads.matmul(x, y)


@binder("MatMul", backend="cpu")
def _bind_matmul(a, x, w):
    """A decoding step's GEMV (one row of float32 times a weight matrix that _gemv_in_halves takes) bound to its
    weights, once numba is loaded: its split job written once (threads.PreparedGemv). Other calls go to the
    kernel."""
    if not (_numba_loaded() and isinstance(x, np.ndarray) and isinstance(w, np.ndarray) and 2 <= x.ndim <= 3
            and w.ndim == 2 and math.prod(x.shape[:-1]) == 1
            and threads.gemv_in_halves_applies((1, x.shape[-1]), x.dtype, w)):
        return None
    shape, w0, gemv = x.shape, w, threads.PreparedGemv(w)
    out_shape = shape[:-1] + (w.shape[1],)

    def step(xp, attrs, x, w):
        if x.shape != shape or x.dtype != np.float32 or w is not w0:
            return _matmul_cpu(xp, attrs, x, w)
        return gemv(x.reshape(1, -1)).reshape(out_shape)
    return step


@kernel("FusedMatMul")
def _fused_matmul(xp, a, x, w, b, residual=None):
    """MatMul, then the bias's Add, then the residual's Add: each op's own kernel on this backend, so the values are
    the unfused ones."""
    be = backend_of(xp)
    y = be.kernel("Add")(xp, {}, be.kernel("MatMul")(xp, {}, x, w), b)
    return y if residual is None else be.kernel("Add")(xp, {}, y, residual)


@kernel("FusedMatMul", backend="cpu")
def _fused_matmul_cpu(xp, a, x, w, b, residual=None):
    """float32, once numba is loaded, x C-contiguous with more rows than the few-rows kernel takes: the GEMM of
    MatMul's CPU kernel (the same calls, split the same way), with the bias and then the residual added to each
    finished block by linear.add_columns while it is in cache, on the thread that computed it. Else the unfused
    kernels. The values are the unfused ones either way."""
    if not (x.dtype == w.dtype == b.dtype == np.float32 and (residual is None or residual.dtype == np.float32)
            and x.flags.c_contiguous and math.prod(x.shape[:-1]) > threads.SKINNY_MAX_ROWS and _numba_loaded()):
        return _fused_matmul(xp, a, x, w, b, residual)
    y = threads.matmul(x.reshape(-1, x.shape[-1]), w, _linear().ColumnBias(b, residual))
    return y.reshape(x.shape[:-1] + (w.shape[1],))


@functools.cache
def _linear():
    """linear.py (numba), imported on first use (an import statement per call cost ~1 us)."""
    from .. import linear
    return linear


def backend_matmul(xp, x, y):
    """The backend's MatMul kernel, for the GEMMs inside other kernels (Conv, attention)."""
    return backend_of(xp).kernel("MatMul")(xp, {}, x, y)


@kernel("Trilu")
def _trilu(xp, a, x):
    return xp.triu(x, a["k"]) if a["upper"] else xp.tril(x, a["k"])


@kernel("GatherElements")
def _gather_elements(xp, a, x, idx):
    ax = a["axis"] % x.ndim
    i = idx.astype(np.int64)
    # off the axis, indices may be shorter than the data (ONNX): read the leading part only, since
    # take_along_axis would broadcast the indices up to the data's shape instead
    x = x[tuple(slice(None) if d == ax else slice(0, n) for d, n in enumerate(idx.shape))]
    return xp.take_along_axis(x, xp.where(i < 0, i + x.shape[ax], i), axis=ax)


@kernel("GatherND")
def _gather_nd(xp, a, x, idx):
    """ONNX GatherND: the last indices axis addresses the first k data axes after `batch_dims`."""
    b, k = a["batch_dims"], idx.shape[-1]
    lead = x.shape[:b]
    n = int(np.prod(lead, dtype=np.int64))
    i = idx.astype(np.int64).reshape(n, -1, k)
    i = xp.where(i < 0, i + xp.asarray(x.shape[b:b + k]), i)
    data = x.reshape((n, *x.shape[b:]))
    rows = xp.arange(n).reshape(n, 1)
    out = data[(rows, *(i[..., j] for j in range(k)))]
    return out.reshape(idx.shape[:-1] + x.shape[b + k:])


_SCATTER_UFUNC = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter_reduce(xp, reduction: str, out, index: tuple, vals) -> None:
    """out[index] (op)= vals in place, repeated indices accumulating (numpy's ufunc.at semantics)."""
    if backend_of(xp).host_arrays:
        getattr(np, _SCATTER_UFUNC[reduction]).at(out, index, vals)
    elif reduction != "mul":
        import cupyx  # cupy's ufunc.at exists only for some ufuncs; these are the supported spellings

        getattr(cupyx, f"scatter_{reduction}")(out, index, vals)
    else:  # cupy has no scatter-multiply: this rare case goes through the host
        host = out.get()
        np.multiply.at(host, tuple(i.get() if hasattr(i, "get") else i for i in index), vals.get())
        out[...] = xp.asarray(host)


@kernel("ScatterND")
def _scatter_nd(xp, a, x, idx, upd):
    out = x.copy()
    k = idx.shape[-1]
    flat_idx = idx.reshape(-1, k).astype(np.int64)
    flat_idx = xp.where(flat_idx < 0, flat_idx + xp.asarray(x.shape[:k]), flat_idx)
    target = tuple(flat_idx[:, j] for j in range(k))
    vals = upd.reshape((-1,) + x.shape[k:])
    if a["reduction"] == "none":
        out[target] = vals  # duplicate indices: the last update wins (ONNX leaves the order undefined)
    else:
        _scatter_reduce(xp, a["reduction"], out, target, vals)
    return out


@kernel("ScatterElements")
def _scatter_elements(xp, a, x, idx, upd):
    out = x.copy()
    ax = a["axis"] % x.ndim
    i = idx.astype(np.int64)
    i = xp.where(i < 0, i + x.shape[ax], i)
    # open grid of positions (cupy's indices() has no sparse=True): dim d varies along axis d only
    grid = [xp.arange(n).reshape([n if d == e else 1 for e in range(idx.ndim)]) for d, n in enumerate(idx.shape)]
    grid[ax] = i
    if a["reduction"] == "none":
        out[tuple(grid)] = upd
    else:
        _scatter_reduce(xp, a["reduction"], out, tuple(grid), upd)
    return out


@kernel("TopK")
def _topk(xp, a, x):
    """The k largest (smallest) along axis, sorted; ties keep the lower index first (stable sort)."""
    ax = a["axis"] % x.ndim
    order = xp.argsort(-x if a["largest"] else x, axis=ax, kind="stable")
    idx = xp.take(order, xp.arange(a["k"]), axis=ax)
    if a["output"] == "indices":
        return idx.astype(np.int64)
    return xp.take_along_axis(x, idx, axis=ax)


@kernel("Einsum", aliases=True)  # numpy may return a view for one operand
def _einsum(xp, a, *xs):
    return xp.einsum(a["equation"].replace(" ", ""), *xs, optimize=len(xs) > 1)


def _spatial(a, nsp):
    return (a.get("strides") or [1] * nsp, a.get("dilations") or [1] * nsp, a.get("pads") or [0] * (2 * nsp))


def _im2col(xp, x, k, strides, dil, pads, out_sp):
    """(n, c, *k, *out) columns: one strided copy per kernel offset straight from x, and zeros where
    the window reads padding (no padded copy of x, no list of slices to stack)."""
    nsp = len(k)
    cols = xp.empty(x.shape[:2] + tuple(k) + tuple(out_sp), dtype=x.dtype)
    for pos in np.ndindex(*k):
        dst = cols[(slice(None), slice(None)) + pos]
        src, inner = [], []
        for d in range(nsp):
            off = pos[d] * dil[d] - pads[d]  # input index of output 0 along d
            lo = min(out_sp[d], max(0, -(off // strides[d])))  # first output whose input is >= 0
            hi = max(lo, min(out_sp[d], (x.shape[2 + d] - 1 - off) // strides[d] + 1))
            src.append(slice(lo * strides[d] + off, (hi - 1) * strides[d] + off + 1, strides[d]) if hi > lo
                       else slice(0, 0))
            inner.append(slice(lo, hi))
            if lo > 0:
                dst[(slice(None), slice(None)) + (slice(None),) * d + (slice(0, lo),)] = 0
            if hi < out_sp[d]:
                dst[(slice(None), slice(None)) + (slice(None),) * d + (slice(hi, None),)] = 0
        dst[(slice(None), slice(None)) + tuple(inner)] = x[(slice(None), slice(None)) + tuple(src)]
    return cols


def conv_nobias(xp, a, x, w, epilogue=None, im2col=_im2col):
    """Conv without its bias: a fresh contiguous (n, o, *out) array (the GEMM's own result). `epilogue` (CPU
    only) runs on each finished chunk of the GEMM's output, on the thread that computed it (threads.matmul).
    `im2col`: the column builder, _im2col's signature (the CPU passes its numba one for 2-D float32 convs)."""
    nsp = x.ndim - 2
    strides, dil, pads = _spatial(a, nsp)
    g = a["group"]
    n, c = x.shape[:2]
    o, k = w.shape[0], w.shape[2:]
    out_sp = [window_count(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + nsp]) for i in range(nsp)]
    if all(ki == 1 for ki in k) and not any(pads):
        # 1x1: the (strided) input itself is the column matrix; no copy when the stride is 1
        cols = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    else:
        cols = im2col(xp, x, k, strides, dil, pads, out_sp)
    cols = cols.reshape(n, g, (c // g) * math.prod(k), math.prod(out_sp))
    wg = w.reshape(g, o // g, (c // g) * math.prod(k))
    wg = wg[0] if g == 1 else wg
    if epilogue is None:
        y = backend_matmul(xp, wg, cols)
    else:
        from ..threads import matmul
        y = matmul(wg, cols, epilogue)
    return y.reshape(n, o, *out_sp)  # (n, g, o/g, P) -> (n, o, *out)


@kernel("Conv")
def _conv(xp, a, x, w, b=None):
    y = conv_nobias(xp, a, x, w)
    if b is not None:
        y += b.reshape((1, w.shape[0]) + (1,) * (x.ndim - 2))
    return y


def _conv_nobias_cpu(a, x, w, epilogue=None):
    """conv_nobias on the CPU, by the path _conv_path chooses. Both Conv and FusedConv come here (and their bound
    kernels go the same way), so they take the same path and give the same values."""
    return _conv_path(a, x.shape, x.dtype, w, epilogue)(x, epilogue)


def _conv_path(a, shape: tuple, dtype, w: np.ndarray, epilogue, bound: bool = False):
    """The CPU path of a conv of inputs of `shape` and `dtype` with weights w and `epilogue` (the choice reads its
    kind and whether it has a residual): fn(x, epilogue) -> y without the bias unless the epilogue adds it.
    Pointwise 2-D convs: the input is the column matrix (a squeeze-excite block's 1x1-pixel ones one pixel_conv);
    depthwise convs by a numba kernel (conv_taps.py: channel-blocked, or on stride phases); dense 2-D convs direct
    (conv_direct.py) or, stride 1 with large im2col columns, as shifted-view GEMMs; else im2col and a GEMM. bound:
    for a bound kernel, with what does not depend on x's values derived now (a pointwise, depthwise or direct conv's
    job: threads.Prepared); None for the GEMM paths of dense convs (they run long enough that per-call set-up costs
    little, and whether the shifted path pays depends on the thread count)."""
    if len(shape) == 4:
        n, c, h, wd = shape
        o = w.shape[0]
        if _pointwise_2d(a, shape, w):
            if _pixel_conv_applies(shape, dtype, w, epilogue):
                return lambda x, ep: _pixel_conv(a, x, w, ep)
            w2, out = w.reshape(o, c), (n, o, h, wd)

            def blas(x, ep):
                return threads.matmul(w2, x.reshape(c, h * wd) if n == 1 else x.reshape(n, c, h * wd), ep).reshape(out)
            if not (_numba_loaded() and conv_pointwise.use_pointwise(shape, dtype, w, epilogue)):
                return blas

            def pointwise(x, ep):
                return conv_pointwise.pointwise(w2, x.reshape(n, c, h * wd), ep).reshape(out)
            skinny = pointwise if not bound else _prepared(
                lambda res: conv_pointwise.prepare_pointwise(w2, (n, c, h * wd), epilogue, res), out, epilogue,
                pointwise)
            up_to = conv_pointwise.blas_up_to(shape, w)  # without AVX-512 the BLAS takes 7x7 planes (see there)
            if up_to != 1:
                return skinny if up_to == 0 else blas
            return lambda x, ep: (blas if threads.threads_in_use() == 1 else skinny)(x, ep)
        strides, dil, pads = _spatial(a, 2)
        out_sp = [window_count(shape[2 + i], w.shape[2 + i], strides[i], dil[i], pads[i], pads[i + 2])
                  for i in range(2)]
        if conv_taps.use_depthwise(shape, dtype, w, a["group"]):
            if conv_taps.use_blocked(w.shape, out_sp, strides):
                bp = conv_taps.BlockPlan(shape, w, strides, dil, pads, out_sp)
                if bound:
                    return _prepared(lambda res: conv_taps.prepare_blocked(bp, epilogue, res), bp.out_shape,
                                     epilogue, lambda x, ep: conv_taps.run_blocked(bp, x, ep))
                return lambda x, ep: conv_taps.run_blocked(bp, x, ep)
            tp = conv_taps.TapPlan(shape, w, strides, dil, pads, out_sp)
            if bound:
                return _prepared(lambda res: conv_taps.prepare_taps(tp, epilogue, res), tp.out_shape, epilogue,
                                 lambda x, ep: conv_taps.run_taps(tp, x, ep))
            return lambda x, ep: conv_taps.run_taps(tp, x, ep)
        if _numba_loaded() and conv_direct.use_direct(shape, dtype, w, a["group"], epilogue, strides):
            dp = conv_direct.DirectPlan(shape, w, strides, dil, pads, out_sp)
            if bound:
                return _prepared(lambda res: conv_direct.PreparedDirect(dp, epilogue, res), dp.out_shape, epilogue,
                                 lambda x, ep: conv_direct.run_direct(dp, x, ep))
            return lambda x, ep: conv_direct.run_direct(dp, x, ep)
        if bound:
            return None
        if conv_shifted.use_shifted(shape, dtype, w, strides, a["group"], out_sp):
            return lambda x, ep: conv_shifted.conv2d_shifted(x, w, dil, pads, out_sp, ep)
        if dtype == np.float32 and _numba_loaded():
            # the same columns either way; numba's copy only once numba is loaded anyway (compile loads it for a
            # float32 conv graph; a process where numba cannot be imported takes numpy's)
            return lambda x, ep: conv_nobias(np, a, x, w, ep, _im2col_numba)
    return None if bound else lambda x, ep: conv_nobias(np, a, x, w, ep)


def _prepared(prepare, out: tuple, epilogue, per_call):
    """A bound kernel's path run as a threads.Prepared job: prepare(residual) makes it for the residual-ness of
    `epilogue` and the forward's thread count (one per count met, at the second call there); each later call runs
    it with the call's input, a fresh output of shape `out` (n, o, oh, ow) and the call's residual. The first call
    at a count, and any call while another thread runs the job, take per_call(x, ep) (the path's per-call form)."""
    has_res = epilogue is not None and bool(epilogue.args[-1])
    jobs: dict[int, threads.Prepared | None] = {}
    aligned = conv_pointwise._numba_side()[2]
    size = math.prod(out)

    def run(x, ep):
        job = jobs.get(threads.threads_in_use())
        if job is None:
            if threads.threads_in_use() not in jobs:  # the first call: per call (a one-shot forward does not
                jobs[threads.threads_in_use()] = None  # pay for the job, nor the first forward for its making)
                return per_call(x, ep)
            job = jobs[threads.threads_in_use()] = prepare(has_res)
        x = np.ascontiguousarray(x)
        y = aligned.empty(out, out[2] * out[3])
        # flat: one compiled signature of the relocating kernels for every step (each is a cache load at the
        # first forward)
        if has_res:
            ran = ep.args[-2].size == size and job.run(x.reshape(-1), y.reshape(-1), ep.args[-2])
        else:
            ran = job.run(x.reshape(-1), y.reshape(-1))
        return y if ran else per_call(x, ep)
    return run


def _pointwise_2d(a, shape: tuple, w) -> bool:
    """A 1x1, stride-1, unpadded, group-1 2-D conv (inputs of `shape`): its input is the column matrix."""
    return (len(shape) == 4 and w.shape[2] == w.shape[3] == 1 and a["group"] == 1 and not any(a.get("pads") or ())
            and all(s == 1 for s in a.get("strides") or ()))


@functools.cache
def _ufuncs():
    """ufuncs (numba), imported on first use (an import statement per call cost ~1 us)."""
    from .. import ufuncs
    return ufuncs


@functools.cache
def _aligned():
    """aligned.py (numba), imported on first use."""
    from .. import aligned
    return aligned


@functools.cache
def _conv_kernels():
    """conv_kernels (numba), imported on first use (an import statement per call cost ~1 us)."""
    from .. import conv_kernels
    return conv_kernels


def _im2col_numba(xp, x, k, strides, dil, pads, out_sp):
    """_im2col for a 2-D float32 conv on the CPU, by conv_kernels.im2col_2d."""
    cols = np.empty(x.shape[:2] + tuple(k) + tuple(out_sp), np.float32)
    hp, wp = x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3]
    _conv_kernels().im2col_2d(np.ascontiguousarray(x), cols, *strides, *dil, pads[0], pads[1], hp, wp)
    return cols


@kernel("Conv", backend="cpu")
def _conv_cpu(xp, a, x, w, b=None):
    if (b is not None and x.dtype == np.float32 and x.ndim == 4 and _numba_loaded()
            and not _tiny_pointwise(a, x.shape, w)):
        # the bias added by the conv kernels' epilogue, on blocks still in cache: the same add as `y += b`, which
        # read the whole output back (a 256x56x56 output: ~0.17 ns an element)
        return _conv_nobias_cpu(a, x, w, _epilogue(a, b, "Identity"))
    y = _conv_nobias_cpu(a, x, w)
    if b is not None:
        y += b.reshape((1, w.shape[0]) + (1,) * (x.ndim - 2))
    return y


@kernel("FusedConv")
def _fused_conv(xp, a, x, w, b=None, residual=None):
    """Conv, then the residual's Add (a fourth operand), then the activation: each op's own kernel on this backend,
    so the values are the unfused ones."""
    be = backend_of(xp)
    y = be.kernel("Conv")(xp, a, x, w, b)
    if residual is not None:
        y = be.kernel("Add")(xp, {}, y, residual)
    return _unfused_activation(xp, a, y)


def _unfused_activation(xp, a, y):
    """A FusedConv's activation on the conv's result y as the ops it was fused from, each its own kernel on this
    backend."""
    if a["activation"] == "Identity":
        return y
    be = backend_of(xp)
    if a["activation"] == "HardSwish":  # the ops it was fused from, in order
        t = be.kernel("Add")(xp, {}, be.kernel("Mul")(xp, {}, y, xp.asarray(a["alpha"], y.dtype)),
                             xp.asarray(a["beta"], y.dtype))
        return be.kernel("Mul")(xp, {}, y, be.kernel("Clip")(xp, {"min": 0.0, "max": 1.0}, t))
    return be.kernel(a["activation"])(xp, a, y)


def _tiny_fused_conv(a, x, w, b):
    """A one-image float32 FusedConv without a residual whose conv is _tiny_pointwise (a squeeze-excite block's
    1x1-pixel convs): one pixel_conv call once numba is loaded (_pixel_conv_applies), else the calls the unfused
    kernels make (the whole-GEMM np.matmul threads.matmul makes for so small a product, Conv's bias add, the
    activation's kernels) without the dispatch between them (MobileNetV3's: ~20 -> ~9 us each); the same values."""
    if _pixel_conv_applies(x.shape, x.dtype, w, None):
        return _pixel_conv(a, x, w, _epilogue(a, b, a["activation"]))
    o, c = w.shape[:2]
    y = np.matmul(w.reshape(o, c), x.reshape(c, -1))
    if b is not None:
        y += b.reshape(o, 1)
    return _unfused_activation(np, a, y.reshape(1, o, *x.shape[2:]))


# outputs up to this many elements skip the numba epilogue for the unfused ops' own kernels (the same values): a
# squeeze-excite block's 1x1-pixel convs (64-1152 outputs) spent more in the epilogue's 18-argument dispatch than
# in its arithmetic (a 144->576 Clip conv: 20.7 us fused, 12.7 unfused)
TINY_OUTPUT = 4096


# 1x1-pixel convs up to this many multiply-adds run as one pixel_conv (larger ones, a classifier's, are GEMVs that
# threads.matmul splits over the forward's threads from this size on)
PIXEL_MAX_WORK = 1 << 18


def _pixel_conv_applies(shape: tuple, dtype, w, epilogue) -> bool:
    """A pointwise (_pointwise_2d) float32 conv of one image's single pixel (inputs of `shape`), at most
    PIXEL_MAX_WORK multiply-adds, no residual in `epilogue`, numba loaded: conv_kernels.pixel_conv."""
    return (dtype == w.dtype == np.float32 and shape[0] * shape[2] * shape[3] == 1
            and w.shape[0] * w.shape[1] <= PIXEL_MAX_WORK and _numba_loaded()
            and (epilogue is None or not epilogue.args[-1]))


def _pixel_conv_parts(a, w, b) -> tuple[np.ndarray, tuple]:
    """A 1x1-pixel FusedConv's (weights w, bias b) transposed weights and pixel_conv's epilogue fields."""
    return _pixel_weights(w), threads.epilogue_fields(_epilogue(a, b, a["activation"]))[:9]


def _pixel_weights(w: np.ndarray) -> np.ndarray:
    """A 1x1-pixel conv's (O, C, 1, 1) weights as pixel_conv's (C, O), starting on a cache line (its rows are
    loaded as vectors of outputs)."""
    o, c = w.shape[:2]
    return _aligned().array(w.reshape(o, c).T)


def _bound_pixel_conv(o: int, wt: np.ndarray, fields: tuple):
    """_pixel_conv of a bound FusedConv step of `o` outputs with its _pixel_conv_parts derived once: a call is then
    the kernel's own dispatch (a squeeze-excite block's 144->576 conv: 8.7 -> 4.6 us hot, of which ~4 are numba's
    dispatch of its 12 arguments)."""
    kernel = _conv_kernels().pixel_conv

    def run(x, _):
        out = np.empty((1, o, 1, 1), np.float32)
        kernel(out.reshape(-1), np.ascontiguousarray(x).reshape(-1), wt, *fields)
        return out
    return run


def _pixel_conv(a, x, w, epilogue):
    """conv_kernels.pixel_conv of _pixel_conv_applies' conv, `epilogue` (None: the conv alone) applied; the
    transposed weight matrix made once per plan step and weight array."""
    o, c = w.shape[:2]
    cached = a.get("_pixel_weights")
    if cached is None or cached[0] is not w:
        cached = a["_pixel_weights"] = (w, _pixel_weights(w))
    out = np.empty((1, o, 1, 1), np.float32)
    _conv_kernels().pixel_conv(out.reshape(-1), np.ascontiguousarray(x).reshape(-1), cached[1],
                               *threads.epilogue_fields(epilogue)[:9])
    return out


def _tiny_pointwise(a, shape: tuple, w) -> bool:
    """A pointwise 2-D conv (_pointwise_2d) of inputs of `shape` with at most TINY_OUTPUT outputs."""
    return _pointwise_2d(a, shape, w) and shape[0] * w.shape[0] * shape[2] * shape[3] <= TINY_OUTPUT


@kernel("FusedConv", backend="cpu")
def _fused_conv_cpu(xp, a, x, w, b=None, residual=None):
    """Relu before numba is loaded: the conv's own fresh result made non-negative in place (float64, or a process
    where numba cannot be imported). float32 Relu once numba is loaded, and Sigmoid/Silu/LeakyRelu/Clip/HardSwish:
    the GEMM, then bias, residual and activation in one numba pass over each output row while it is in cache (a
    16->72 Relu conv at 56x56: 104 us in three passes, 70 us; ResNet-50's residual Add and Relu of a 256x56x56
    output took 0.8 and 0.6 ms as passes of their own). The values are the unfused ones either way."""
    if residual is None and a["activation"] == "Relu" and x.dtype.kind == "f" and not (
            x.dtype == np.float32 and _numba_loaded()):
        y = _conv_cpu(xp, a, x, w, b)
        return relu(y, out=y)
    tiny = _tiny_pointwise(a, x.shape, w)
    if x.dtype == np.float32 and residual is None and x.shape[0] == 1 and tiny:
        return _tiny_fused_conv(a, x, w, b)
    if (x.dtype != np.float32 or tiny
            or (residual is not None and (residual.dtype != np.float32 or not _numba_loaded()))):
        return _fused_conv(xp, a, x, w, b, residual)
    ep = _epilogue(a, b, a["activation"])
    if residual is not None:
        ep = ep.with_residual(np.ascontiguousarray(residual))
    return _conv_nobias_cpu(a, x, w, ep)


@binder("Conv", "FusedConv", backend="cpu")
def _bind_conv(a, x, w, b=None, residual=None):
    """A float32 2-D conv step's bound kernel (kernels.registry.BINDERS), once numba is loaded: a squeeze-excite
    block's 1x1-pixel FusedConv (_tiny_fused_conv), or the pointwise, depthwise or direct path with its epilogue,
    geometry and weight matrix derived once. Other convs (the im2col and shifted-view GEMMs, which run long
    enough that their wrappers' cost is small): None."""
    if not (_numba_loaded() and isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 4
            and isinstance(w, np.ndarray) and w.dtype == np.float32 and w.ndim == 4
            and (b is None or b.dtype == np.float32) and (residual is None or residual.dtype == np.float32)):
        return None
    fused = "activation" in a
    generic = _fused_conv_cpu if fused else _conv_cpu
    shape, w0, b0, res0 = x.shape, w, b, residual is not None

    def bound(run):
        def step(xp, attrs, x, w, b=None, *residual):
            if x.shape != shape or x.dtype != np.float32 or w is not w0 or b is not b0 or bool(residual) != res0:
                return generic(xp, attrs, x, w, b, *residual)
            return run(x, residual[0] if residual else None)
        return step

    tiny = _tiny_pointwise(a, shape, w)
    if tiny:  # as _fused_conv_cpu runs it
        if not (fused and not res0 and shape[0] == 1):
            return None
        if _pixel_conv_applies(shape, np.float32, w0, None):
            return bound(_bound_pixel_conv(w0.shape[0], *_pixel_conv_parts(a, w0, b0)))
        return bound(lambda x, _: _tiny_fused_conv(a, x, w0, b0))
    if fused:
        ep0 = _epilogue(a, b0, a["activation"])
    else:
        ep0 = None if b0 is None else _epilogue(a, b0, "Identity")
    # the path is chosen as for the epilogue each call passes (a residual's too)
    # (an empty residual: the bound path keeps this epilogue for the step's life, and reads only that it has one)
    conv = _conv_path(a, shape, np.float32, w0, ep0 if not res0 else ep0.with_residual(np.empty(0, np.float32)),
                      bound=True)
    if conv is None:
        return None
    if res0:
        return bound(lambda x, r: conv(x, ep0.with_residual(np.ascontiguousarray(r))))
    return bound(lambda x, _: conv(x, ep0))


def _epilogue(a, b, activation: str):
    """The conv epilogue for bias b and `activation`, built once per plan step, bias array and activation (a step's
    attrs are its own, but the generic FusedConv kernel hands its attrs to Conv; a new bias, a run-time param set
    anew, gets a new one)."""
    cached = a.get("_epilogue")
    if cached is None or cached[0] is not b or cached[1] != activation:
        ep = _conv_kernels().bias_activation(b, activation, a.get("alpha", 0.0), a.get("min"), a.get("max"),
                                             a["group"], a.get("beta", 0.5))
        cached = a["_epilogue"] = (b, activation, ep)
    return cached[2]


@kernel("ConvTranspose")
def _conv_transpose(xp, a, x, w, b=None):
    nsp = x.ndim - 2
    strides, dil, pads = _spatial(a, nsp)
    outpad = a.get("output_padding") or [0] * nsp
    g = a["group"]
    n, cin = x.shape[:2]
    k = w.shape[2:]
    cout_g = w.shape[1]
    full = [(x.shape[2 + i] - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 + outpad[i] for i in range(nsp)]
    y = xp.zeros((n, g, cout_g, *full), dtype=x.dtype)
    xg = x.reshape(n, g, cin // g, *x.shape[2:])
    wg = w.reshape(g, cin // g, cout_g, *k)
    sp = string.ascii_lowercase[:nsp]
    for pos in np.ndindex(*k):
        contrib = xp.einsum(f"NGC{sp},GCO->NGO{sp}", xg, wg[(slice(None),) * 3 + pos], optimize=True)
        idx = tuple(slice(pos[i] * dil[i], pos[i] * dil[i] + (x.shape[2 + i] - 1) * strides[i] + 1, strides[i])
                    for i in range(nsp))
        y[(slice(None),) * 3 + idx] += contrib
    y = y.reshape(n, g * cout_g, *full)
    crop = tuple(slice(pads[i], full[i] - pads[i + nsp]) for i in range(nsp))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nsp)
    return xp.ascontiguousarray(y)


def _pool_pads(a, x, nsp, k, strides, dil):
    """Explicit pads, the output sizes, and the extra end padding that ceil_mode's last window needs."""
    pads = a.get("pads") or [0] * (2 * nsp)
    extra, out_sp = [], []
    for i in range(nsp):
        d = x.shape[2 + i] + pads[i] + pads[i + nsp]
        out = window_count(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + nsp], bool(a["ceil_mode"]))
        out_sp.append(out)
        extra.append(max(0, (out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 - d))
    return pads, extra, out_sp


def _pool_reduce(xp, xpd, k, strides, dil, out_sp, combine):
    """Fold `combine` over the k-window offsets: one strided slice per kernel position.

    prod(k) whole-array ufunc calls beat a reduction over a sliding-window view by ~10x, because each
    call streams contiguous rows instead of gathering tiny windows.
    """
    nsp = len(k)
    acc = None
    for pos in np.ndindex(*k):
        idx = (slice(None), slice(None)) + tuple(
            slice(pos[i] * dil[i], pos[i] * dil[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i]) for i in range(nsp))
        acc = xpd[idx].copy() if acc is None else combine(acc, xpd[idx], out=acc)
    return acc


@kernel("MaxPool")
def _maxpool(xp, a, x):
    nsp = x.ndim - 2
    k = a["kernel_shape"]
    strides, dil, _ = _spatial(a, nsp)
    pads, extra, out_sp = _pool_pads(a, x, nsp, k, strides, dil)
    width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp] + extra[i]) for i in range(nsp)]
    xpd = xp.pad(x, width, constant_values=-np.inf) if any(sum(w) for w in width) else x
    # one axis at a time, the last first: np.maximum's fold is associative to the bit (the first NaN in window
    # order wins, and of a -0.0/0.0 tie the later one, either way), so the values are the whole-window fold's
    for d in reversed(range(nsp)):
        xpd = _pool_reduce(xp, xpd, [k[i] if i == d else 1 for i in range(nsp)],
                           [strides[i] if i == d else 1 for i in range(nsp)], dil,
                           [out_sp[i] if i == d else xpd.shape[2 + i] for i in range(nsp)], xp.maximum)
    return xpd


@kernel("MaxPool", backend="cpu")
def _maxpool_cpu(xp, a, x):
    """2-D float32 once numba is loaded: conv_kernels.maxpool_planes, vector folds of each window row into its
    output row while both are in cache, planes split over the forward's threads (ResNet-50's 3x3/2 pool of
    64x112x112 in its forward: 2.9 ms as _maxpool's whole-array passes, 0.67 ms). The same fold, so the same
    bits."""
    if x.dtype != np.float32 or x.ndim != 4 or x.size == 0 or not _numba_loaded():
        return _maxpool(xp, a, x)
    k = a["kernel_shape"]
    strides, dil, _ = _spatial(a, 2)
    pads, _, out_sp = _pool_pads(a, x, 2, k, strides, dil)
    n, c, h, w = x.shape
    x3 = np.ascontiguousarray(x).reshape(n * c, h, w)
    y = _aligned().empty((n, c, *out_sp), math.prod(out_sp))
    y3 = y.reshape(n * c, *out_sp)
    # a tap costs about what a conv tap does (conv_taps.TAP_COST GEMM multiply-adds: a vector op and its load)
    fold = _conv_kernels().maxpool_planes
    threads.rows_in_chunks(n * c, y.size * k[0] * k[1] * conv_taps.TAP_COST,
                           lambda p0, p1: fold(x3, y3, p0, p1, k[0], k[1], *strides, *dil, pads[0], pads[1]))
    return y


@kernel("AveragePool")
def _avgpool(xp, a, x):
    nsp = x.ndim - 2
    k = a["kernel_shape"]
    strides = a.get("strides") or [1] * nsp
    dil = [1] * nsp
    pads, extra, out_sp = _pool_pads(a, x, nsp, k, strides, dil)
    width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp] + extra[i]) for i in range(nsp)]
    xpd = xp.pad(x, width)
    s = _pool_reduce(xp, xpd, k, strides, dil, out_sp, xp.add)
    ones = xp.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if a["count_include_pad"]:
        inner = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)]
        ones = xp.pad(ones, inner, constant_values=1)
        cnt_w = [(0, 0), (0, 0)] + [(0, extra[i]) for i in range(nsp)]
    else:
        cnt_w = width
    cnt = _pool_reduce(xp, xp.pad(ones, cnt_w), k, strides, dil, out_sp, xp.add)
    return s / cnt


@kernel("AveragePool", backend="cpu")
def _avgpool_cpu(xp, a, x):
    """A window as large as the unpadded input (a classifier's last pool, ResNet-50's 7x7) is GlobalAveragePool:
    its CPU kernel (49 shifted adds of the whole input took 0.5-0.75 ms there, the vector sums ~10 us)."""
    if not any(a.get("pads") or ()) and list(a["kernel_shape"]) == list(x.shape[2:]):
        return _gap_cpu(xp, a, x)
    return _avgpool(xp, a, x)


@kernel("GlobalAveragePool")
def _gap(xp, a, x):
    return xp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)


@kernel("GlobalAveragePool", backend="cpu")
def _gap_cpu(xp, a, x):
    """float32 once numba is loaded: each channel's sum by rlx's vector kernel (a fixed order, the same bits on every
    CPU; numpy's pairwise sum sums in another order), divided by the count as np.mean does."""
    if x.dtype != np.float32 or x.ndim < 3 or x.size == 0 or not _numba_loaded():
        return _gap(xp, a, x)
    return _channel_means(x, math.prod(x.shape[2:]))


def _channel_means(x: np.ndarray, w: int) -> np.ndarray:
    """_gap_cpu's numba path: the means of x's rows of w, shaped (N, C, 1, ...), split as a stream."""
    out = np.empty(x.shape[:2] + (1,) * (x.ndim - 2), np.float32)
    flat, means = np.ascontiguousarray(x).reshape(-1), out.reshape(-1)
    row_means = _conv_kernels().row_means
    threads.stream_rows("put_means", means.size, flat.size * _conv_kernels().STREAM_COST, (flat, means), w,
                        lambda r0, r1: row_means(flat[r0 * w:r1 * w], means[r0:r1], w))
    return out


@binder("GlobalAveragePool", backend="cpu")
def _bind_gap(a, x):
    """A float32 GlobalAveragePool step bound to its input's shape (once numba is loaded): the checks and the row
    width decided once. Other calls go to the kernel."""
    if not (_numba_loaded() and isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim >= 3 and x.size):
        return None
    shape, w = x.shape, math.prod(x.shape[2:])

    def step(xp, attrs, x):
        if x.shape != shape or x.dtype != np.float32:
            return _gap_cpu(xp, attrs, x)
        return _channel_means(x, w)
    return step


def _se_conv_attrs(a: dict, prefix: str) -> dict:
    """A SqueezeExcite's squeeze (prefix "") or gate ("gate_") conv as FusedConv attrs: 1x1, stride 1, group 1,
    its activation's attrs; made once per plan step (its epilogue is cached in them)."""
    key = f"_{prefix or 'squeeze_'}conv"
    conv = a.get(key)
    if conv is None:
        conv = a[key] = {"strides": None, "pads": None, "dilations": None, "group": 1,
                         **{k: a.get(prefix + k) for k in ("activation", "alpha", "beta", "min", "max")}}
    return conv


@kernel("SqueezeExcite")
def _squeeze_excite(xp, a, x, w1, b1, w2, b2):
    """x times the gate FusedConv(FusedConv(GlobalAveragePool(x), w1, b1), w2, b2): each op's own kernel on this
    backend, so the values are the unfused ones (IEEE products commute: the Mul's operand order does not matter)."""
    be = backend_of(xp)
    means = be.kernel("GlobalAveragePool")(xp, {}, x)
    hidden = be.kernel("FusedConv")(xp, _se_conv_attrs(a, ""), means, w1, b1)
    gate = be.kernel("FusedConv")(xp, _se_conv_attrs(a, "gate_"), hidden, w2, b2)
    return be.kernel("Mul")(xp, {}, x, gate)


@binder("SqueezeExcite", backend="cpu")
def _bind_squeeze_excite(a, x, w1, b1, w2, b2):
    """A one-image float32 SqueezeExcite step whose unfused steps would run conv_kernels' kernels (the channel means,
    two pixel_convs, the row scale) bound to its shapes: one conv_kernels.squeeze_excite call (MobileNetV3-small's
    blocks: four steps' dispatch, ~45-60 us inside a forward, in one), or, where the means and the scale would split
    over the forward's threads (threads.stream_rows: a large x), those pieces one after the other. Either way the
    unfused kernels on the same rows: the same bits. Other blocks: None (the kernel composes the unfused ops)."""
    from .elementwise import row_scale, scaled_rows

    arrays = (x, w1, b1, w2, b2)
    if not (_numba_loaded() and all(isinstance(t, np.ndarray) and t.dtype == np.float32 for t in arrays)
            and x.ndim == 4 and x.shape[0] == 1 and x.flags.c_contiguous and x.size):
        return None
    shape, c, width = x.shape, x.shape[1], x.shape[2] * x.shape[3]
    pixel = (1, c, 1, 1)
    a1, a2 = _se_conv_attrs(a, ""), _se_conv_attrs(a, "gate_")
    if not (_tiny_pointwise(a1, pixel, w1) and _tiny_pointwise(a2, (1, w1.shape[0], 1, 1), w2)
            and _pixel_conv_applies(pixel, np.float32, w1, None) and _pixel_conv_applies(pixel, np.float32, w2, None)
            and row_scale(x, np.empty(pixel, np.float32)) is not None):
        return None
    (w1t, f1), (w2t, f2) = _pixel_conv_parts(a1, w1, b1), _pixel_conv_parts(a2, w2, b2)
    squeeze, excite = _bound_pixel_conv(w1.shape[0], w1t, f1), _bound_pixel_conv(c, w2t, f2)
    k = _conv_kernels()
    ints = np.array([f[i] for f in (f1, f2) for i in (1, 2, 5, 7)], np.int64)
    floats = np.array([f[i] for f in (f1, f2) for i in (3, 4, 6, 8)], np.float32)
    bias1, bias2, scratch_size = f1[0], f2[0], 2 * c + w1.shape[0]
    work = x.size * k.STREAM_COST
    aligned = _aligned()

    def step(xp, attrs, x, w1_, b1_, w2_, b2_):
        if (x.shape != shape or x.dtype != np.float32 or not x.flags.c_contiguous
                or w1_ is not w1 or b1_ is not b1 or w2_ is not w2 or b2_ is not b2):
            return _squeeze_excite(xp, attrs, x, w1_, b1_, w2_, b2_)
        if threads.threads_for(work) > 1:  # as the unfused steps: the means and the scale split over the threads
            return scaled_rows(x, excite(squeeze(_channel_means(x, width), None), None), width)
        out = aligned.empty(shape, width)
        k.squeeze_excite(x.reshape(-1), out.reshape(-1), width, w1t, bias1, w2t, bias2, ints, floats,
                         np.empty(scratch_size, np.float32))
        return out
    return step


@kernel("BatchNormalization")
def _bn(xp, a, x, scale, bias, mean, var):
    shp = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / xp.sqrt(var + var.dtype.type(a["epsilon"]))
    return (x - mean.reshape(shp)) * inv.reshape(shp) + bias.reshape(shp)


@kernel("LayerNorm")
def _layernorm(xp, a, x, scale, bias=None):
    axes = tuple(range(a["axis"] % x.ndim, x.ndim))
    mu = xp.mean(x, axis=axes, keepdims=True)
    d = x - mu
    var = xp.mean(d * d, axis=axes, keepdims=True)
    y = d / xp.sqrt(var + x.dtype.type(a["epsilon"])) * scale
    return y if bias is None else y + bias


@kernel("LayerNorm", backend="cpu")
def _layernorm_cpu(xp, a, x, scale, bias=None):
    """float32 once numba is loaded, scale and bias the normalized shape's size: a row at a time (ufuncs.
    layer_norm_rows; each sum in one vector order); else the generic kernel."""
    axis = a["axis"] % x.ndim
    width = math.prod(x.shape[axis:])
    if not (x.dtype == scale.dtype == np.float32 and _numba_loaded() and width > 0 and x.size > 0
            and scale.size == width and (bias is None or (bias.dtype == np.float32 and bias.size == width))):
        return _layernorm(xp, a, x, scale, bias)
    out = np.empty(x.shape, np.float32)
    b = np.ascontiguousarray(bias).reshape(-1) if bias is not None else out.reshape(-1)[:0]
    flat, dst = np.ascontiguousarray(x).reshape(-1), out.reshape(-1)
    scale, eps, rows_of = np.ascontiguousarray(scale).reshape(-1), np.float32(a["epsilon"]), _ufuncs().layer_norm_rows

    rows, work = flat.size // width, flat.size * _ufuncs().ROW_PASS_COST
    if threads.one_chunk(rows, work):
        rows_of(flat, scale, b, bias is not None, dst, width, eps)
        return out

    def chunk(r0: int, r1: int) -> None:
        rows_of(flat[r0 * width:r1 * width], scale, b, bias is not None, dst[r0 * width:r1 * width], width, eps)

    threads.rows_in_chunks(rows, work, chunk)
    return out


@kernel("RMSNorm")
def _rmsnorm(xp, a, x, scale):
    axes = tuple(range(a["axis"] % x.ndim, x.ndim))
    ms = xp.mean(x * x, axis=axes, keepdims=True)
    return x / xp.sqrt(ms + x.dtype.type(a["epsilon"])) * scale


@kernel("GroupNorm")
def _groupnorm(xp, a, x, scale, bias):
    n, c = x.shape[:2]
    g = a["num_groups"]
    xg = x.reshape(n, g, -1)
    mu = xp.mean(xg, axis=2, keepdims=True)
    d = xg - mu
    var = xp.mean(d * d, axis=2, keepdims=True)
    y = (d / xp.sqrt(var + x.dtype.type(a["epsilon"]))).reshape(x.shape)
    shp = (1, c) + (1,) * (x.ndim - 2)
    return y * scale.reshape(shp) + bias.reshape(shp)


def _sdpa_scores(xp, a, q, k, mask):
    """The attention scores: (q·scale)·kᵀ plus the causal and given masks (a fresh array)."""
    t = q.dtype.type
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = backend_matmul(xp, q * t(scale), xp.swapaxes(k, -1, -2))  # scale the (smaller) q, not the scores
    lq, lk = q.shape[-2], k.shape[-2]
    neg_inf = t(-np.inf)
    if a["causal"]:
        s += xp.where(xp.tril(xp.ones((lq, lk), dtype=bool)), t(0), neg_inf)
    if mask is not None:
        s += xp.where(mask, t(0), neg_inf) if mask.dtype == bool else mask  # small bias, broadcast in place
    return s


def _sdpa_softmax(xp, s):
    """Softmax of the scores over the last axis, in place (and returned)."""
    t = s.dtype.type
    m = xp.max(s, axis=-1, keepdims=True)
    s -= xp.where(xp.isfinite(m), m, t(0))
    xp.exp(s, out=s)
    den = xp.sum(s, axis=-1, keepdims=True)
    s /= xp.where(den == 0, t(1), den)  # fully masked rows give zeros, not NaN
    return s


@kernel("ScaledDotProductAttention")
def _sdpa(xp, a, q, k, v, mask=None):
    return backend_matmul(xp, _sdpa_softmax(xp, _sdpa_scores(xp, a, q, k, mask)), v)


def _sdpa_block_cpu(a, q, k, v, mask):
    """_sdpa on the CPU: float32 scores once numba is loaded take the row softmax (ufuncs.softmax_rows, its own exp
    and sum order; the rows it leaves, a non-finite max, by _sdpa_softmax), the rest _sdpa itself."""
    if q.dtype != np.float32 or not _numba_loaded():
        return _sdpa(np, a, q, k, v, mask)
    s = _sdpa_scores(np, a, q, k, mask)
    s = _ufuncs().softmax_last(s, s, lambda rows: _sdpa_softmax(np, rows))
    return backend_matmul(np, s, v)


_SDPA_BLOCK_BYTES = 1 << 18  # scores per block: a block's softmax passes stay in the core's L2


@kernel("ScaledDotProductAttention", backend="cpu")
def _sdpa_cpu(xp, a, q, k, v, mask=None):
    """Block by block along the batch axis (or the head axis for one sequence), on the forward's threads:
    each block's scores stay in cache through the softmax passes. Each block is _sdpa_block_cpu on its slice, so
    the values are those of the whole tensor's."""
    axis = 0 if q.shape[0] > 1 or q.ndim < 4 else 1
    scores = math.prod(q.shape[:-1]) * k.shape[-2] * q.itemsize
    if (q.ndim < 3 or q.shape[axis] < 2 or scores < 2 * _SDPA_BLOCK_BYTES or k.ndim != q.ndim or v.ndim != q.ndim
            or not q.dtype == k.dtype == v.dtype or (mask is not None and mask.ndim > q.ndim)):
        return _sdpa_block_cpu(a, q, k, v, mask)
    from ..threads import run_chunks
    n = q.shape[axis]
    per = max(1, min(n, _SDPA_BLOCK_BYTES * n // scores))  # indices per block
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    out = np.empty(lead + (q.shape[-2], v.shape[-1]), q.dtype)
    m = None if mask is None else mask.reshape((1,) * (q.ndim - mask.ndim) + mask.shape)

    def block(i: int) -> None:
        s = (slice(None),) * axis + (slice(i * per, (i + 1) * per),)

        def part(t):
            return t if t is None or t.shape[axis] == 1 else t[s]

        out[s] = _sdpa_block_cpu(a, q[s], part(k), part(v), part(m))

    run_chunks(-(-n // per), block)
    return out
