"""What onnxruntime's integer matmuls compute on this CPU (tests use it to pick an oracle that is right here).

On CPUs without AVX-512 VNNI / AVX-VNNI, onnxruntime's uint8 x int8 kernels (MatMulInteger, ConvInteger,
QLinearConv, QLinearMatMul, DynamicQuantizeLinear models with QInt8 weights) multiply with vpmaddubsw, which adds
each pair of adjacent products in int16 with saturation: with full-range values (255 * -128 * 2) the int32
sums differ from the exact ones the ONNX spec defines (seen on Zen 3: off by up to 35389 on a 4x300 @ 300x5).
onnxruntime's own remedy is 7-bit weights (quantize_dynamic's reduce_range): pairs then fit int16 and every CPU
computes the exact sum. rlx always computes the exact sum.
"""

from __future__ import annotations

import functools

import numpy as np


@functools.cache
def u8s8_saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 MatMulInteger saturates pair sums on this CPU (255*127 + 255*127 =
    64770 comes back as 32767)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "probe",
                          [helper.make_tensor_value_info("A", TensorProto.UINT8, [1, 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.INT32, None)],
                          [numpy_helper.from_array(np.full((2, 1), 127, np.int8), "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    y = int(sess.run(None, {"A": np.full((1, 2), 255, np.uint8)})[0][0, 0])
    assert y in (64770, 32767), y
    return y != 64770


def int8_weight_range() -> tuple[int, int]:
    """[low, high) of int8 weights that onnxruntime multiplies exactly with uint8 inputs on this CPU: full range
    where it does not saturate, 7 bits where it does."""
    return (-64, 64) if u8s8_saturates() else (-128, 128)
