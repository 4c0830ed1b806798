"""Real-model CPU forward vs onnxruntime at 1 and 2 threads, plus the first forward after load.

Models: ResNet-50 (the onnx package's light model; its weights are ConstantOfShape fills, which is
fine for speed), a small YOLO-like detector built with the onnx helper API (Conv + SiLU written as
x * Sigmoid(x), a depthwise block, an upsample + concat neck and a Sigmoid head), torch exports with random
weights at real sizes (benchmarks/torch_models.py: MobileNetV3-small, EfficientNet-B0, a GPT-2 small
decoding step, a 2-layer LSTM and a 2-layer GRU; skipped without torch) and MiniLM (batch 8, seq 128;
skipped when its weights are not installed). Each model's forward rows are timed in a fresh process that imports
rlx, onnx, onnxruntime and threadpoolctl only, as a deploy script would (numba is loaded there only if rlx loads it;
a process that had imported numba for something else ran ResNet-50 on other kernels than a deploy script did).
Threads: onnxruntime intra_op_num_threads; rlx numba.set_num_threads (when numba is loaded) and threadpoolctl's BLAS
limit; rlx and onnxruntime are timed in alternating rounds. "load + first forward" is read_rlx + compile + one run
in a fresh process; "no scipy" is the same
with scipy made unimportable, as in a venv with only rlx's dependencies (numba imports scipy when it is
there, ~0.2 s of its one-off setup). Goals (issue #22):
each model <= 1.5x onnxruntime (geometric mean <= 1.0x); first forward after load < 0.5 s.

Run alone with `python benchmarks/real_models.py [--profile] [--only TEXT]` (--profile prints rlx's per-op times;
--only keeps the models whose name contains TEXT, case-insensitive, e.g. `--only mobilenet`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from threadpoolctl import threadpool_limits

from common import Row, best_interleaved, env_note, print_rows
from rlx_format import read_rlx
from rlx_runtime import Session

R = np.random.default_rng(0)


def resnet50() -> tuple[onnx.ModelProto, dict]:
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
    model = onnx.load(str(path))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return model, {model.graph.input[0].name: R.standard_normal(shape).astype(np.float32)}


def yolo_like(size: int = 320) -> tuple[onnx.ModelProto, dict]:
    """A YOLO-style detector: stride-2 SiLU conv stem, residual bottlenecks, a depthwise 3x3 block,
    an upsample + concat neck and a 1x1 head with Sigmoid (85 channels per anchor, 3 anchors)."""
    nodes, inits = [], []
    count = iter(range(10_000))

    def conv(x, cin, cout, k=3, s=1, group=1, act=True):
        i = next(count)
        w = (R.standard_normal((cout, cin // group, k, k)) * np.sqrt(2 / (cin // group * k * k))).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, f"w{i}"),
                      numpy_helper.from_array((R.standard_normal(cout) * 0.1).astype(np.float32), f"b{i}")])
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], kernel_shape=[k, k],
                                      strides=[s, s], pads=[k // 2] * 4, group=group))
        if not act:
            return f"c{i}"
        nodes.append(helper.make_node("Sigmoid", [f"c{i}"], [f"s{i}"]))
        nodes.append(helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"a{i}"]))
        return f"a{i}"

    def bottleneck(x, c):
        y = conv(conv(x, c, c // 2, 1), c // 2, c, 3)
        out = f"res{next(count)}"
        nodes.append(helper.make_node("Add", [x, y], [out]))
        return out

    x = conv("images", 3, 16, 3, 2)
    x = conv(x, 16, 32, 3, 2)
    x = bottleneck(x, 32)
    x = conv(x, 32, 64, 3, 2)
    p3 = bottleneck(x, 64)
    x = conv(p3, 64, 128, 3, 2)
    x = conv(x, 128, 128, 3, 1, group=128)  # depthwise
    p4 = bottleneck(conv(x, 128, 128, 1), 128)
    inits.append(numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"))
    nodes.append(helper.make_node("Resize", [p4, "", "up_scales"], ["up"], mode="nearest"))
    nodes.append(helper.make_node("Concat", ["up", p3], ["cat"], axis=1))
    n3 = conv("cat", 192, 64, 3)
    outs = []
    for name, feat, c in (("h3", n3, 64), ("h4", p4, 128)):
        y = conv(feat, c, 3 * 85, 1, act=False)
        nodes.append(helper.make_node("Sigmoid", [y], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "yolo_like",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])],
                          outs, inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"images": R.random((1, 3, size, size), dtype=np.float32)}


def minilm() -> tuple[onnx.ModelProto, dict, object, dict]:
    """(onnx model, feeds, rlx graph, weights) for MiniLM; ImportError when the weights are missing."""
    import minilm as bench_minilm  # benchmarks/minilm.py: its ONNX writer and the example's graph

    config = bench_minilm.minilm.load_config()
    weights = bench_minilm.load_safetensors(bench_minilm.minilm.model_dir() / "model.safetensors")
    ids = R.integers(1000, 29000, (8, 128)).astype(np.int64)
    mask = np.ones((8, 128), np.int64)
    mask[4:, 100:] = 0
    return (bench_minilm.onnx_minilm(weights, config), {"input_ids": ids, "attention_mask": mask},
            bench_minilm.minilm.build_graph(config), weights)


_FIRST = """
import sys, time
if sys.argv[2] == "without-scipy":  # as in a deploy venv: scipy is not an rlx dependency, but numba imports it
    class _NoScipy:                 # when present (~0.2 s of its first-call setup)
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "scipy":
                raise ImportError("scipy blocked (deploy venv)")
    sys.meta_path.insert(0, _NoScipy())
import numpy as np
from rlx_format import read_rlx
from rlx_runtime import Session
feeds = dict(np.load(sys.argv[1] + "/feeds.npz"))
t0 = time.perf_counter()
Session().compile(read_rlx(sys.argv[1] + "/model.rlx")).run(feeds)
print(time.perf_counter() - t0)
"""


_PYCACHE = tempfile.TemporaryDirectory(prefix="rlx-bench-pycache-")  # the fresh processes' bytecode, this run only


def _first_forward(tmp: Path, mode: str = "as-installed") -> float:
    """read_rlx + compile + the first run in a fresh process (imports done before the clock starts;
    numba kernels come from the on-disk cache, which the previous runs filled, and Python's bytecode from a
    pycache folder, as in an installed package: with PYTHONDONTWRITEBYTECODE set, as on these VMs, each process
    compiled the modules the first forward imports from source, ~40-70 ms)."""
    env = _env()
    times = []
    for _ in range(2):  # the first run may still fill the numba cache for a new source tree, and writes the bytecode
        r = subprocess.run([sys.executable, "-c", _FIRST, str(tmp), mode], capture_output=True, text=True, check=True,
                           env=env, timeout=600)
        times.append(float(r.stdout.split()[-1]))
    return times[-1]


def _set_threads(n: int):
    numba = sys.modules.get("numba")
    if numba is not None:  # loaded by rlx's compile (or a kernel); else rlx runs no numba code
        numba.set_num_threads(n)
    return threadpool_limits(limits=n, user_api="blas")


def _env(extra_path: str = "") -> dict:
    """The fresh processes' environment: this process's import path, bytecode from a pycache folder."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=os.pathsep.join([extra_path, *sys.path] if extra_path else sys.path),
               PYTHONPYCACHEPREFIX=_PYCACHE.name)
    return env


_RESULT = "real_models forward result: "  # marks the --forward process's result line (JSON) on its stdout


def _forward_rows(name: str, tmp: Path, threads: list[int], profile: bool) -> dict:
    """The forward timings, timed by this script's --forward mode in a fresh process (see the module docstring)."""
    cmd = [sys.executable, __file__, "--forward", str(tmp), "--threads", ",".join(map(str, threads)), "--name", name]
    r = subprocess.run(cmd + ["--profile"] * profile, capture_output=True, text=True, check=False,
                       env=_env(str(Path(__file__).parent)), timeout=1800)
    if r.returncode:
        raise RuntimeError(f"the forward process for {tmp} failed:\n{r.stderr[-3000:]}")
    result = [line for line in r.stdout.splitlines() if line.startswith(_RESULT)]
    print("\n".join(line for line in r.stdout.splitlines() if not line.startswith(_RESULT)))  # --profile's tables
    return json.loads(result[-1][len(_RESULT):])


def forward(name: str, tmp: Path, threads: list[int], profile: bool) -> dict:
    """--forward: load tmp/model.rlx and tmp/model.onnx, check rlx's outputs against onnxruntime's, time both at
    each thread count; returns the per-thread times and whether rlx loaded numba (printed as JSON on the line
    marked _RESULT)."""
    feeds = dict(np.load(tmp / "feeds.npz"))
    compiled = Session().compile(read_rlx(tmp / "model.rlx"))
    out = compiled.run(feeds)
    times, ref = [], None
    for n in threads:
        sess_opts = ort.SessionOptions()
        sess_opts.intra_op_num_threads = n
        sess_opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(tmp / "model.onnx"), sess_opts, providers=["CPUExecutionProvider"])
        if ref is None:
            ref = sess.run(None, feeds)
            for r, o in zip(ref, compiled.output_names):
                np.testing.assert_allclose(out[o], r, rtol=2e-3, atol=2e-4)
        with _set_threads(n):
            t_rlx, t_ort = best_interleaved(lambda c=compiled, f=feeds: c.run(f),
                                             lambda s=sess, f=feeds: s.run(None, f))
            if profile:
                _print_profile(name, n, compiled, feeds)
        times.append((n, t_rlx, t_ort))
    return {"numba": "numba" in sys.modules, "times": times}


def _models(only: str = ""):
    """(name, onnx model for onnxruntime, feeds, (graph, weights) for rlx or None to import the onnx model), for
    the models whose name contains `only` (case-insensitive); each is built only when it is kept."""
    def keep(name: str) -> bool:
        return only.lower() in name.lower()

    for name, build in (("ResNet-50 (light) 1x3x224x224", resnet50), ("YOLO-like 1x3x320x320", yolo_like)):
        if keep(name):
            yield name, *build(), None
    try:
        import torch_models  # benchmarks/torch_models.py: real torchvision / transformers exports
        for name, build in (
                ("MobileNetV3-small (torchvision) 1x3x224x224",
                 lambda: torch_models.torchvision_cnn("mobilenet_v3_small")),
                ("EfficientNet-B0 (torchvision) 1x3x224x224", lambda: torch_models.torchvision_cnn("efficientnet_b0")),
                ("GPT-2 small decode step (HF), past 127", torch_models.gpt2_step),
                ("LSTM 2x256 (torch) b8 s64", torch_models.lstm),
                ("GRU 2x256 (torch) b8 s64", lambda: torch_models.lstm(kind="GRU"))):
            if keep(name):
                yield name, *build(), None
    except ImportError as e:
        print(f"[real_models: torch exports skipped: {e}]", file=sys.stderr)
    if not keep("MiniLM b8 s128"):
        return
    try:
        model, feeds, graph, weights = minilm()
    except (ImportError, OSError) as e:
        print(f"[real_models: MiniLM skipped: {e}]", file=sys.stderr)
        return
    yield "MiniLM b8 s128", model, feeds, (graph, weights)  # the example's graph, as benchmarks/minilm.py


def main(profile: bool = False, only: str = "") -> list[Row]:
    from rlx_bake import BakeOptions, bake  # here, not at the top: the --forward process imports no bake code
    from rlx_bake.onnx import import_onnx
    from rlx_format import write_rlx

    rows = []
    threads = [1, 2] if (os.cpu_count() or 1) >= 2 else [1]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model, feeds, source in _models(only):
            path = Path(tmp) / "model.onnx"
            onnx.save(model, str(path))
            g, ws = import_onnx(path) if source is None else source
            rf, _ = bake(g, ws, BakeOptions.from_profile("exact"))
            write_rlx(Path(tmp) / "model.rlx", rf)
            np.savez(Path(tmp) / "feeds.npz", **feeds)
            t_first = _first_forward(Path(tmp))
            rows.append(Row("real", f"{name} load + first forward", t_first, 0.5, "(absolute s)", "<= 1.0x",
                            unit="s"))
            t_bare = _first_forward(Path(tmp), "without-scipy")
            rows.append(Row("real", f"{name} first forward, no scipy", t_bare, 0.5, "(absolute s)", "<= 1.0x",
                            unit="s"))
            fwd = _forward_rows(name, Path(tmp), threads, profile)
            print(f"[real_models: {name}: the deploy process {'loaded' if fwd['numba'] else 'did not load'} numba]",
                  file=sys.stderr)
            for n, t_rlx, t_ort in fwd["times"]:
                rows.append(Row("real", f"{name} forward, {n} thread{'s' * (n > 1)}", t_rlx, t_ort, "onnxruntime",
                                "<= 1.5x"))
    fwd = [r for r in rows if r.peer_name == "onnxruntime"]
    if fwd:
        gm = float(np.exp(np.mean([np.log(r.ratio) for r in fwd])))
        rows.append(Row("real", "forward geometric mean (all rows above)", gm, 1.0, "(ratio)", "<= 1.0x",
                        unit="x"))
    return rows


def _print_profile(name: str, n: int, compiled, feeds) -> None:
    compiled.enable_profiling(True)
    for _ in range(3):
        compiled.run(feeds)
    prof = compiled.profile()
    compiled.enable_profiling(False)
    total = sum(t for _, t in prof.values())
    print(f"-- rlx profile {name}, {n} thread(s): {total / 3 * 1e3:.1f} ms per forward")
    for op, (calls, t) in sorted(prof.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"   {op:22} {calls // 3:4} calls {t / 3 * 1e3:8.2f} ms {100 * t / total:5.1f}%")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Real-model CPU forward: rlx vs onnxruntime (issue #22).")
    parser.add_argument("--profile", action="store_true", help="print rlx's per-op times per model")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="keep the models whose name contains TEXT (case-insensitive), e.g. mobilenet")
    parser.add_argument("--forward", type=Path, help=argparse.SUPPRESS)  # internal: one model's forward process
    parser.add_argument("--threads", default="1", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.forward:
        result = forward(args.name, args.forward, [int(n) for n in args.threads.split(",")], args.profile)
        print(_RESULT + json.dumps(result))
        sys.exit(0)
    print(env_note())
    print_rows(main(profile=args.profile, only=args.only))
