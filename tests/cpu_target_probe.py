"""Results of rlx's compiled CPU paths on inputs where undefined behaviour would show (run as a script
under another numba target / numpy dispatch level by test_defined_results.py, or imported in-process).

`python tests/cpu_target_probe.py OUT.npz` writes every result array under its name.
"""

from __future__ import annotations

import sys

import numpy as np


def codec_inputs() -> dict[str, np.ndarray]:
    """float32 tensors [rows, 256] (a multiple of both block sizes) whose blocks hit every codec edge."""
    r = np.random.default_rng(7)
    # 1/d overflows for d below ~2^-128 (Q8_0: d = amax / 127, Q4_0: max / -8, Q4_1: (max - min) / 15,
    # Q5_0: max / -16, Q5_1: (max - min) / 31, TQ1_0 and TQ2_0: d = amax)
    blocks = {
        "normal": r.standard_normal((4, 256)),
        "subnormal": r.standard_normal((2, 256)) * 1e-40,  # 1/d = inf
        "just_above_overflow": np.sign(r.standard_normal((2, 256))) * 2.0**-120,  # 1/d finite for both, d subnormal
        "just_below_overflow": np.sign(r.standard_normal((2, 256))) * 2.0**-130,  # 1/d = inf for both
        "min_subnormal": np.where(np.arange(256) % 3 == 0, np.float32(1e-45), 0).reshape(1, 256),
        "zero": np.zeros((1, 256)),
        "ties": np.tile((np.arange(256) - 127.5) / 2, (1, 1)) * (127 / 64),
        "huge": r.standard_normal((1, 256)) * 1e37,  # fp16 scale overflows to inf (defined)
        "wide_range": np.where(np.arange(256) % 2, 3e38, -3e38).reshape(1, 256),  # max - min = inf: d inf, codes NaN
    }
    return {k: np.asarray(v, np.float32) for k, v in blocks.items()}


def dot_inputs() -> tuple[np.ndarray, np.ndarray]:
    """(x [20, 256] with NaN/+Inf/-Inf in some rows, w [24, 256] with zero blocks)."""
    r = np.random.default_rng(8)
    x = r.standard_normal((20, 256)).astype(np.float32)
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    x[3, 9] = -np.inf
    x[4, 3], x[4, 200] = np.inf, -np.inf  # +Inf and -Inf in one dot: NaN
    w = r.standard_normal((24, 256)).astype(np.float32)
    w[5, :32] = 0  # Inf * 0 inside a block: NaN
    w[6] = 0
    return x, w


def special_floats() -> np.ndarray:
    r = np.random.default_rng(9)
    sample = np.concatenate([r.standard_normal(20000) * s for s in (1e-3, 0.3, 1.0, 3.0, 10.0)])
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 5.9999, 6.0, 6.5, 3.4e38, -3.4e38,
             127.5, -128.5, 128.0, -129.0, 255.5, 256.0, 2.0**31, -(2.0**31), 2.0**63, -(2.0**63), -0.5, 0.99]
    return np.concatenate([np.array(edges), sample]).astype(np.float32)


def _run(op: str, inputs: list[np.ndarray], attrs: dict, consts: tuple[int, ...] = ()) -> np.ndarray:
    from rlx_format import GraphBuilder
    from rlx_format.dtypes import dtype_of_array
    from rlx_runtime import Session

    g = GraphBuilder("probe")
    names = []
    for i, a in enumerate(inputs):
        if i in consts:
            names.append(g.constant(a, name=f"c{i}"))
        else:
            names.append(g.input(f"x{i}", dtype_of_array(a), list(a.shape)))
    g.output(g.op(op, *names, name="y", **attrs))
    feeds = {f"x{i}": a for i, a in enumerate(inputs) if i not in consts}
    return Session().compile(g.build()).run(feeds)["y"]


def compute() -> dict[str, np.ndarray]:
    from rlx_format.codecs import CODECS
    from rlx_format.quants import quantize
    from rlx_runtime.ufuncs import erf, gelu_erf, sigmoid, silu

    out: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for name, x in codec_inputs().items():
            for c in CODECS.values():
                out[f"{c.short}/{name}"] = quantize(x, c.name)
        x, w = dot_inputs()
        for enc in CODECS:
            packed = quantize(w, enc)
            for m in (3, 20):  # the fused kernel (<= 12 rows) and the tiled path
                out[f"dqmm/{enc}/{m}"] = _run("DequantMatMul", [x[:m], packed],
                                              {"encoding": enc, "N": 24, "K": 256}, consts=(1,))
        f = special_floats()
        out["erf"] = erf(f)
        out["erf_small"] = erf(f[:100])  # the serial kernel
        out["gelu"] = gelu_erf(f)
        out["sigmoid"] = sigmoid(f)
        out["silu"] = silu(f)
        from rlx_runtime.conv_kernels import ACTIVATION_CODES, bias_activation
        rows = f[: f.size // 4 * 4].reshape(4, -1)  # 4 output channels, each with its bias
        for act in ACTIVATION_CODES:
            y = rows.copy()
            bias_activation(np.array([0.0, -0.5, 1e-3, np.inf], np.float32), act, 0.1, -1.0, 2.0)(
                y[None], 0, 1, 0, 4, 0, y.shape[1])
            out[f"fused_conv/{act}"] = y
        r = np.random.default_rng(10)
        for k, stride in ((3, 1), (3, 2), (5, 1)):  # the depthwise kernel: taps added by fma in order
            xc = r.standard_normal((1, 12, 19, 23)).astype(np.float32)
            xc.reshape(-1)[::31] = np.nan
            wc = r.standard_normal((12, 1, k, k)).astype(np.float32)
            out[f"depthwise/{k}x{k}/s{stride}"] = _run("Conv", [xc, wc], {"group": 12, "pads": [k // 2] * 4,
                                                                          "strides": [stride, stride]}, consts=(1,))
        # rows of 61: straight into the output with AVX-512 (conv_kernels.MIN_ROW_WIDTH), on the grid without
        xc = r.standard_normal((1, 6, 11, 61)).astype(np.float32)
        xc.reshape(-1)[::37] = np.inf
        wc = r.standard_normal((6, 1, 3, 3)).astype(np.float32)
        out["depthwise/3x3/rows"] = _run("Conv", [xc, wc], {"group": 6, "pads": [1] * 4}, consts=(1,))
        # an RGB stem (the direct path, as below), a 60x58 output
        xs = r.standard_normal((1, 3, 120, 116)).astype(np.float32)
        xs.reshape(-1)[::29] = np.inf
        ws = r.standard_normal((16, 3, 3, 3)).astype(np.float32)
        out["stem/3x3/s2"] = _run("Conv", [xs, ws], {"group": 1, "pads": [1] * 4, "strides": [2, 2]}, consts=(1,))
        # dense convs straight from the input's phases (gather_f32: fma in (channel, ky, kx) order), stride 1 and 2,
        # 20 outputs (two 8-channel blocks and a rest), and a pointwise conv on the few-rows GEMM (a 16x17 plane: a
        # masked last vector)
        xd = r.standard_normal((1, 24, 13, 11)).astype(np.float32)
        xd.reshape(-1)[::41] = np.nan
        wd = r.standard_normal((20, 24, 3, 3)).astype(np.float32)
        for stride in (1, 2):
            out[f"direct/3x3/s{stride}"] = _run("Conv", [xd, wd], {"group": 1, "pads": [1] * 4,
                                                                   "strides": [stride, stride]}, consts=(1,))
        xp = r.standard_normal((1, 96, 16, 17)).astype(np.float32)
        out["pointwise/96->144"] = _run("Conv", [xp, r.standard_normal((144, 96, 1, 1)).astype(np.float32)],
                                        {"group": 1}, consts=(1,))
        from rlx_runtime.threads import few_rows_matmul  # the few-rows GEMM: fma in order of k, explicit IR
        xa = r.standard_normal((5, 300)).astype(np.float32)
        xa.reshape(-1)[::37] = np.nan
        out["few_rows_matmul"] = few_rows_matmul(xa, r.standard_normal((300, 203)).astype(np.float32))
        from rlx_runtime.ufuncs import tanh_f32  # the LSTM kernel's tanh: fixed IEEE operations
        out["tanh"] = tanh_f32(f)
        # GlobalAveragePool's vector sums (4 chains, a masked tail, a fixed tree), NaN/Inf channels included
        xg = r.standard_normal((2, 5, 13, 11)).astype(np.float32)
        xg.reshape(-1)[::97] = np.inf
        xg.reshape(-1)[5::131] = np.nan
        out["global_average_pool"] = _run("GlobalAveragePool", [xg], {})
        # MaxPool's vector folds (max_fold_f32: steps 1 and 2, masked tails), NaNs of both signs and -0.0/0.0 ties
        xm = r.standard_normal((1, 3, 23, 45)).astype(np.float32)
        xm.reshape(-1)[::29] = np.nan
        xm.reshape(-1)[7::31] = -np.nan
        xm.reshape(-1)[2::5] = -0.0
        xm.reshape(-1)[3::5] = 0.0
        for k, stride in ((3, 2), (5, 1)):
            out[f"maxpool/{k}x{k}/s{stride}"] = _run("MaxPool", [xm], {"kernel_shape": [k, k], "pads": [k // 2] * 4,
                                                                      "strides": [stride, stride]})
        # an LSTM on the numba step kernel (few-rows GEMM, sigmoid, tanh), a hidden size of 40 (a partial vector)
        xl = r.standard_normal((6, 3, 9)).astype(np.float32)
        wl = (r.standard_normal((1, 160, 9)) * 0.4).astype(np.float32)
        rl = (r.standard_normal((1, 160, 40)) * 0.2).astype(np.float32)
        out["lstm"] = _run("LSTM", [xl, wl, rl], {"hidden_size": 40}, consts=(1, 2))
        for to in ("i8", "u8", "i16", "i32", "i64"):
            out[f"cast/{to}"] = _run("Cast", [f], {"to": to})
            out[f"cast16/{to}"] = _run("Cast", [f.astype(np.float16)], {"to": to})
    return out


if __name__ == "__main__":
    np.savez(sys.argv[1], **{k.replace("/", "__"): v for k, v in compute().items()})
