"""kernels.cu without a GPU: its per-lane code compiled for the host by g++ and checked against numpy,
and the whole file compiled for sm_90 by nvcc when the toolkit is present (the CUDA tier then runs
the real kernels on a GPU: test_cuda.py)."""

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from rlx_format.quants import dequantize, quantize
from rlx_runtime.cuda import fused

HARNESS = r"""
#include <cstring>
#include <cstddef>
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
#include "kernels.cu"

extern "C" float host_half(unsigned int h) { return rlx_half_to_float(h); }

// What one warp computes for row n, lane by lane, then the sum the shuffle reduction forms.
extern "C" void host_gemv(int tq2, const unsigned char* w, const float* x, float* y, int N, int K, int M) {
    for (int n = 0; n < N; ++n) {
        float total[RLX_MAX_M] = {0};
        for (int lane = 0; lane < 32; ++lane) {
            float acc[RLX_MAX_M] = {0};
            if (tq2) rlx_tq2_0_lane(w, x, n, K, M, lane, acc); else rlx_q8_0_lane(w, x, n, K, M, lane, acc);
            for (int m = 0; m < RLX_MAX_M; ++m) total[m] += acc[m];
        }
        for (int m = 0; m < M; ++m) y[(size_t)m * N + n] = total[m];
    }
}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not installed")
    d = tmp_path_factory.mktemp("cu")
    (d / "kernels.cu").write_text(fused.source())
    (d / "harness.cpp").write_text(HARNESS)
    so = d / "harness.so"
    subprocess.run([gxx, "-O1", "-shared", "-fPIC", "-I", str(d), "-o", str(so), str(d / "harness.cpp")],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    lib.host_half.restype = ctypes.c_float
    lib.host_half.argtypes = [ctypes.c_uint]
    return lib


def test_half_decode_all_65536_patterns(host_kernels):
    bits = np.arange(1 << 16, dtype=np.uint32)
    got = np.array([host_kernels.host_half(int(b)) for b in bits], np.float32)
    ref = bits.astype(np.uint16).view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, ref)  # NaN == NaN for assert_array_equal


@pytest.mark.parametrize("enc", ["gguf_q8_0", "gguf_tq2_0"])
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_lane_code_computes_the_gemv(host_kernels, enc, m):
    rng = np.random.default_rng(m)
    n, k = 24, 768
    w = rng.standard_normal((n, k)).astype(np.float32)
    if enc == "gguf_tq2_0":
        w = (rng.integers(-1, 2, (n, k)) * np.float32(0.75)).astype(np.float32)
    p = np.ascontiguousarray(quantize(w, enc))
    x = np.ascontiguousarray(rng.standard_normal((m, k)).astype(np.float32))
    y = np.zeros((m, n), np.float32)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    host_kernels.host_gemv(int(enc == "gguf_tq2_0"), ptr(p), ptr(x), ptr(y), n, k, m)
    ref = x.astype(np.float64) @ dequantize(p, enc).astype(np.float64).T
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-4)


def test_rows_limit_matches_the_kernel():
    assert f"#define RLX_MAX_M {fused.FUSED_MAX_ROWS}" in fused.source()


def test_nvcc_compiles_for_sm90(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    src = tmp_path / "kernels.cu"
    src.write_text(fused.source())
    r = subprocess.run([nvcc, "-ptx", "-arch=sm_90", "-std=c++14", "-o", str(tmp_path / "k.ptx"), str(src)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    assert ".entry rlx_q8_0_gemv" in ptx and ".entry rlx_tq2_0_gemv" in ptx


def _nvrtc():
    """libnvrtc from the nvidia-cuda-nvrtc-cu12 wheel (test extra): the compiler cupy.RawModule uses."""
    try:
        import nvidia.cuda_nvrtc as pkg
    except ImportError:
        pytest.skip("nvidia-cuda-nvrtc-cu12 not installed")
    import pathlib

    libs = sorted(p for d in pkg.__path__ for p in pathlib.Path(d).rglob("libnvrtc.so.*") if ".alt." not in p.name)
    if not libs:
        pytest.skip(f"no libnvrtc.so.* under {list(pkg.__path__)}")
    return ctypes.CDLL(str(libs[0]))


def _nvrtc_compile(source: str, arch: str) -> tuple[int, str, str]:
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None) == 0
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++14"]  # as fused.py asks RawModule
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    ptx = ""
    if rc == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, buf)
        ptx = buf.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(), ptx


@pytest.mark.parametrize("arch", ["compute_70", "compute_90"])
def test_nvrtc_compiles_the_kernels(arch):
    """No headers, no nvcc: exactly what cupy.RawModule does on the GPU machine, minus the launch."""
    rc, log, ptx = _nvrtc_compile(fused.source(), arch)
    assert rc == 0, log
    assert ".entry rlx_q8_0_gemv" in ptx and ".entry rlx_tq2_0_gemv" in ptx


def test_nvrtc_reports_a_broken_kernel():
    rc, log, _ = _nvrtc_compile(fused.source().replace("rlx_store_rows(acc, y", "rlx_store_rows(acc, yy", 1),
                                "compute_90")
    assert rc != 0 and "yy" in log


@pytest.mark.parametrize("script", ["gpu-check", "gpu-wheels"])
def test_gpu_scripts_parse(script):
    import pathlib

    path = pathlib.Path(__file__).parent.parent / "scripts" / script
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
