"""Execution plan: a graph flattened into slot-addressed steps.

Compile resolves every name to an integer slot, pre-parses attrs, binds constants and computes
where each intermediate dies, so `run` is a tight loop with no name lookups and peak memory is
the live set, not the sum of all tensors.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from rlx_format.dtypes import bf16_to_f32, compute_dtype
from rlx_format.errors import RlxError, RuntimeInputError
from rlx_format.graph import Graph
from rlx_format.ops import body_attrs

from . import aligned
from .backend import Backend
from .kernels import prepare_attrs


@dataclass
class Step:
    name: str
    op: str
    fn: object
    attrs: dict
    ins: tuple[int, ...]
    out: int
    frees: tuple[int, ...]


def leaf_array(backend: Backend, arr: np.ndarray, dtype: str):
    """A leaf value as the runtime holds it: bf16 widened to f32, on the backend's device."""
    return backend.upload(bf16_to_f32(arr) if dtype == "bf16" else arr)


# weight matrices at least this large (elements) with more rows than columns that only MatMul reads, as its right
# operand (K, N), are held in column-major order (each output's K weights contiguous) on the CPU: a GEMV or a
# few-rows GEMM then streams whole rows of Wᵀ, where row-major had it read a 32-column strip of every row at a
# time (few_rows_matmul) or each thread its half of every row (the GEMV split by columns). Measured on a 3072x768
# weight out of memory (Rocket Lake), column-major against row-major: 1 row 0.80-0.87x the time at 1 thread,
# 0.57-0.77x at 2; 4-16 rows 0.45-0.81x; 64 rows 0.78-0.82x; 512 rows 0.92-0.95x. Wider than tall (768x3072) it
# ran 1.25-1.37x slower (OpenBLAS's dot-product GEMV on 768-long rows). GPT-2's decoding step, per-step sums:
# 0.97x at 1 thread, 0.89x at 2. The copy is made at compile (the weights a second time in memory, unless the
# file's memory-mapped pages, then unused, are dropped).
MIN_COLUMN_MAJOR = 1 << 16


def matmul_weights(graph: Graph) -> set[str]:
    """The 2-D float constants of at least MIN_COLUMN_MAJOR elements, more rows than columns, read only as the right
    operand of MatMul or FusedMatMul (and not graph outputs)."""
    uses: dict[str, list[tuple[str, int]]] = {}
    for n in graph.nodes:
        for i, name in enumerate(n.inputs):
            uses.setdefault(name, []).append((n.op, i))
    found = set()
    for name, c in graph.constants.items():
        value = c.value
        if (value is not None and value.ndim == 2 and value.dtype in (np.float32, np.float64)
                and value.size >= MIN_COLUMN_MAJOR and value.shape[0] > value.shape[1] and name not in graph.outputs
                and uses.get(name) and all(u in (("MatMul", 1), ("FusedMatMul", 1)) for u in uses[name])):
            found.add(name)
    return found


def _column_major(w: np.ndarray) -> np.ndarray:
    """w in column-major order; float32 starting on a cache line (aligned.py; a GPT-2 decoding step's 3072x768
    GEMVs from such copies ran its forward ~2-3% faster at 1 thread than from copies 16 bytes off a line)."""
    return aligned.array(w.T).T if w.dtype == np.float32 else np.asfortranarray(w)


# ops whose CPU kernel loads numba whatever their input (the erf and sigmoid ufuncs, which LSTM and GRU gates use too;
# the quant kernels)
NUMBA_OPS = frozenset({"Sigmoid", "Silu", "Erf", "LSTM", "GRU", "DequantMatMul", "Dequantize"})


def loads_numba(graph: Graph) -> bool:
    """Whether every CPU forward of `graph` loads numba: an op of NUMBA_OPS, an exact (erf) Gelu, or a FusedConv
    (or a SqueezeExcite's conv) with a Sigmoid or SiLU epilogue. A compile then loads it first, so that the kernels
    that take their numba path only once numba is loaded (LayerNorm, Softmax, the pointwise and direct convs: other
    bits than their numpy path) take it from the first forward on; else a first forward that loaded numba half-way
    (MiniLM's first Gelu, after its first LayerNorm and attention) gave other values than every later one."""
    return any(n.op in NUMBA_OPS or (n.op == "Gelu" and n.attrs.get("approximate", "none") != "tanh")
               or (n.op == "FusedConv" and n.attrs.get("activation") in ("Sigmoid", "Silu"))
               or (n.op == "SqueezeExcite" and {n.attrs.get("activation"), n.attrs.get("gate_activation")}
                   & {"Sigmoid", "Silu"}) for n in graph.nodes)


# ops whose CPU kernels have numba paths well ahead of their numpy ones for float32 (the direct and pointwise convs
# with their epilogues in the stores, the row-block MaxPool): ResNet-50's forward ran 1.2-1.5x faster with numba
# loaded than on im2col + BLAS and numpy passes, which is how it ran in a process that never imported numba
NUMBA_FASTER_OPS = frozenset({"Conv", "FusedConv", "MaxPool", "SqueezeExcite"})
# ops whose numba row kernels (one call a row block) beat their numpy steps (~9 ufunc calls) in a model whose weights
# stream through the caches every forward: after each GEMV of a GPT-2 decoding step a 768-wide LayerNorm's numpy
# steps took 39-50 us, not their 12 us hot (numpy's and the interpreter's own state evicted). The step loaded with
# numba: 0.92-0.95x the time at 1 and 2 threads; its load + first forward 0.17-0.19 -> ~0.44 s
NUMBA_FASTER_ROW_OPS = frozenset({"LayerNorm", "Softmax"})
NUMBA_WEIGHT_BYTES = 8 << 20  # float32 constants from which NUMBA_FASTER_ROW_OPS load numba (beyond a 2 MB L2)


def wants_numba(graph: Graph) -> bool:
    """Whether a CPU compile of `graph` loads numba first: every forward loads it (`loads_numba`), the graph has a
    float32 op of NUMBA_FASTER_OPS, or one of NUMBA_FASTER_ROW_OPS and at least NUMBA_WEIGHT_BYTES of float32
    constants. Numba's import (~0.1-0.3 s) and its kernels' cache loads then fall in the compile and first forward,
    and every forward, the first included, takes the same (numba) kernels."""
    def f32(n) -> bool:
        return n.name in graph.types and graph.types[n.name].dtype == "f32"

    if loads_numba(graph) or any(n.op in NUMBA_FASTER_OPS and f32(n) for n in graph.nodes):
        return True
    return (any(n.op in NUMBA_FASTER_ROW_OPS and f32(n) for n in graph.nodes)
            and sum(c.value.nbytes for c in graph.constants.values()
                    if c.value is not None and c.value.dtype == np.float32) >= NUMBA_WEIGHT_BYTES)


_numba_failure: str | None = None  # why numba could not be imported in this process (tried once)


def _load_numba(needed: bool) -> None:
    """Import numba with rlx's settings. Where it cannot be imported (not installed, llvmlite's library missing, a
    platform it does not support) a graph whose kernels need it gets a clear error; the others go on with their numpy
    paths, and later compiles do not try again."""
    global _numba_failure
    if _numba_failure is None:
        try:
            import rlx_format.numba_setup  # noqa: F401 - loads numba with rlx's settings
            return
        except Exception as e:  # noqa: BLE001 - ImportError, llvmlite's OSError, numba's own RuntimeErrors
            _numba_failure = f"{type(e).__name__}: {e}"
    if needed:
        raise RlxError(f"numba could not be imported ({_numba_failure}); this graph's CPU kernels need it (an op "
                       f"among {sorted(NUMBA_OPS)}, an exact Gelu or a Sigmoid/SiLU conv epilogue): install numba "
                       "(`pip install numba`) or run the graph on another device")


class Plan:
    def __init__(self, graph: Graph, backend: Backend):
        self.graph = graph
        self.backend = backend
        self.xp = backend.xp
        if backend.host_arrays and sys.modules.get("numba") is None and wants_numba(graph):
            _load_numba(needed=loads_numba(graph))
        slot: dict[str, int] = {}
        for v in graph.inputs + graph.params:
            slot[v.name] = len(slot)
        for name in graph.constants:
            slot[name] = len(slot)
        for n in graph.nodes:
            slot[n.name] = len(slot)
        self.slot = slot
        self.n_slots = len(slot)
        self.input_slots = [(v.name, slot[v.name], v.dtype, tuple(v.shape)) for v in graph.inputs]
        self.input_decls = [(v.name, v.dtype, tuple(v.shape)) for v in graph.inputs]
        self.param_slot = {v.name: slot[v.name] for v in graph.params}
        self.param_type = {v.name: v for v in graph.params}
        self.output_slots = [(o, slot[o]) for o in graph.outputs]
        self.base: list = [None] * self.n_slots
        by_columns = matmul_weights(graph) if backend.host_arrays else set()
        for name, c in graph.constants.items():
            if c.value is None:
                raise RlxError(f"constant {name!r} has no data (an external weight that was not loaded); "
                               "compile the RlxFile returned by read_rlx instead of its bare graph")
            value = _column_major(c.value) if name in by_columns else c.value
            self.base[slot[name]] = leaf_array(backend, value, c.dtype)
        keep = set(slot[o] for o in graph.outputs)
        leaf_slots = set(range(len(graph.inputs) + len(graph.params) + len(graph.constants)))
        last_use: dict[int, int] = {}
        for i, n in enumerate(graph.nodes):
            for name in n.inputs:
                last_use[slot[name]] = i
        frees_at: dict[int, list[int]] = {}
        for s, i in last_use.items():
            if s not in keep and s not in leaf_slots:
                frees_at.setdefault(i, []).append(s)
        self.steps = [
            Step(n.name, n.op, backend.kernel(n.op), self._attrs(n), tuple(slot[x] for x in n.inputs),
                 slot[n.name], tuple(frees_at.get(i, ())))
            for i, n in enumerate(graph.nodes)
        ]
        self.leaf_slots = leaf_slots
        from .codegen import generate
        self._fast, self._line_step = generate(self)

    def _attrs(self, n) -> dict:
        """A step's attrs: prepared by the kernel registry, plus a sub-plan per body (If/Loop/Scan), planned
        now on the same backend so a body's errors surface at compile."""
        a = prepare_attrs(n.op, n.attrs)
        keys = body_attrs(n.op)
        if keys:
            a["_plans"] = {k: Plan(n.attrs[k], self.backend) for k in keys}
        return a

    # ---------------------------------------------------------------- binding
    def check_param(self, name: str, value) -> object:
        v = self.param_type.get(name)
        if v is None:
            raise RuntimeInputError(f"set_param: unknown param {name!r}; expected one of "
                                    f"{sorted(self.param_type) or 'none (all params are bound)'}")
        return check_array(self.backend, f"param {name!r}", value, v.dtype, tuple(v.shape), {})

    def bind_inputs(self, feeds: dict) -> list:
        vals = list(self.base)
        checked = check_feeds(self.backend, self.input_decls, feeds)
        for name, s, *_ in self.input_slots:
            vals[s] = checked[name]
        for pname, s in self.param_slot.items():
            if vals[s] is None:
                raise RuntimeInputError(f"run(): param {pname!r} is not set; call set_param({pname!r}, array) "
                                        "or bind it at compile time (CompileOptions(param_bindings=...))")
        return vals

    # ---------------------------------------------------------------- execution
    def run_fast(self, vals: list) -> list:
        """Execute with the generated function; returns the output arrays in order."""
        try:
            return self._fast(vals)
        except RlxError:
            raise
        except Exception as e:  # noqa: BLE001 - find the failing step from the generated line number
            tb = e.__traceback__
            while tb.tb_next is not None and tb.tb_frame.f_code.co_name != "_run":
                tb = tb.tb_next
            step = self.steps[self._line_step.get(tb.tb_lineno, 0)] if self.steps else None
            where = f"node {step.name!r} ({step.op})" if step else "graph"
            raise RlxError(f"{where} failed at run time: {type(e).__name__}: {e}") from e

    def execute(self, vals: list, profile: dict | None = None) -> list:
        """Slot-list execution (used for profiling and by the hoisting runtime)."""
        xp = self.xp
        step = None
        try:
            if profile is None:
                for step in self.steps:
                    vals[step.out] = step.fn(xp, step.attrs, *[vals[i] for i in step.ins])
                    for f in step.frees:
                        vals[f] = None
            else:
                clock = time.perf_counter
                for step in self.steps:
                    t0 = clock()
                    vals[step.out] = step.fn(xp, step.attrs, *[vals[i] for i in step.ins])
                    dt = clock() - t0
                    rec = profile.setdefault(step.op, [0, 0.0])
                    rec[0] += 1
                    rec[1] += dt
                    for f in step.frees:
                        vals[f] = None
        except RlxError:
            raise
        except Exception as e:  # noqa: BLE001 - kernel failures are reported with the node name
            raise RlxError(f"node {step.name!r} ({step.op}) failed at run time: {type(e).__name__}: {e}") from e
        return vals

    def outputs(self, vals: list, results: list | None = None) -> dict:
        """Output dict from the slot list (or from run_fast's `results`), never aliasing leaves."""
        out = {}
        seen: set[int] = set()
        leaf_ids = {id(vals[s]) for s in self.leaf_slots}
        for k, (name, s) in enumerate(self.output_slots):
            a = vals[s] if results is None else results[k]
            # never hand out a leaf, a view into another buffer, or the same array twice
            if id(a) in leaf_ids or id(a) in seen or (getattr(a, "base", None) is not None and not _held_alone(a)):
                a = a.copy()
            elif isinstance(a, np.generic):  # numpy gives 0-d results as scalars: outputs are always arrays
                a = np.asarray(a)
            seen.add(id(a))
            out[name] = a
        return out


def _held_alone(a: np.ndarray) -> bool:
    """Whether view `a`'s memory is reachable through `a` alone, so it can be handed out uncopied: its base is
    referenced by nothing else and owns its memory (a fresh result reshaped), or is a numba array whose allocation
    nothing else holds (aligned.empty's, the conv kernels' outputs: copying YOLO-like's two outputs took 0.2-0.4 ms
    of each forward). Weights, feeds, caches and kernels' scratch are held elsewhere too, so their views are
    copied; so is a read-only view."""
    b = a.base
    # 3 references: `a`'s, the local name, getrefcount's argument
    if not isinstance(b, np.ndarray) or not a.flags.writeable or sys.getrefcount(b) > 3:
        return False
    if b.flags.owndata:
        return True
    m = b.base
    return type(m).__name__ == "_MemInfo" and sys.getrefcount(m) <= 3


def check_feeds(backend: Backend, decls: list[tuple[str, str, tuple]], feeds) -> dict:
    """Validate run() inputs against (name, dtype, shape) declarations: a dict, no unknown or missing
    names, dtypes, ranks, static dims, and symbolic dims bound consistently across inputs."""
    if not isinstance(feeds, dict):
        raise RuntimeInputError(f"run() takes a dict of input name -> array; got {type(feeds).__name__}")
    expected = [n for n, *_ in decls]
    unknown = sorted(set(feeds) - set(expected))
    if unknown:
        raise RuntimeInputError(f"run(): unknown input(s) {unknown}; expected {expected}")
    dims: dict[str, tuple[int, str]] = {}
    checked = {}
    for name, dtype, shape in decls:
        if name not in feeds:
            raise RuntimeInputError(f"run(): missing input {name!r} ({dtype}{list(shape)}); expected {expected}")
        checked[name] = check_array(backend, f"input {name!r}", feeds[name], dtype, shape, dims)
    return checked


def check_array(backend: Backend, what: str, value, dtype: str, shape: tuple, dims: dict):
    want = compute_dtype(dtype)
    a = value if backend.owns(value) else np.asarray(value)
    if dtype == "bf16" and a.dtype == np.float32:
        pass
    elif a.dtype != want:
        raise RuntimeInputError(f"{what}: dtype {a.dtype}; expected {want} ({dtype})")
    if a.ndim != len(shape):
        raise RuntimeInputError(f"{what}: rank {a.ndim} (shape {list(a.shape)}); expected rank {len(shape)} "
                                f"{list(shape)}")
    for i, (got, exp) in enumerate(zip(a.shape, shape)):
        if isinstance(exp, int):
            if got != exp:
                raise RuntimeInputError(f"{what}: dim {i} is {got}; expected {exp} (shape {list(shape)})")
        else:
            prev = dims.get(exp)
            if prev is not None and prev[0] != got:
                raise RuntimeInputError(f"{what}: dim {i} ({exp!r}) is {got}, but {prev[1]} bound {exp!r} = "
                                        f"{prev[0]}; expected the same size")
            dims.setdefault(exp, (got, what))
    return backend.upload(a)
