"""Session and CompiledGraph: the public face of the runtime."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.graph import Graph

from .backend import Backend, backend_for
from .device import Device, parse_device
from .options import CompileOptions
from .plan import Plan


class CompiledGraph:
    """A graph planned for one device. `run` is cheap; `set_param` binds run-time weights.

    On CUDA, constants are uploaded once here; `run` takes numpy or cupy inputs (numpy ones are
    uploaded per call) and returns cupy arrays that stay on the GPU (`rlx_runtime.to_host` or
    `.get()` copies them back).
    """

    def __init__(self, graph: Graph, backend: Backend, options: CompileOptions, report: Any = None):
        self.graph = graph
        self.backend = backend
        self.device = backend.device
        self.device_index = backend.index
        self.options = options
        self.pass_report = report
        self._plan = Plan(graph, backend)
        self._profile: dict | None = {} if options.profile else None

    @property
    def input_names(self) -> list[str]:
        return self.graph.input_names

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    @property
    def param_names(self) -> list[str]:
        return self.graph.param_names

    def plan_ops(self) -> list[str]:
        """The op of every step the forward executes, in order."""
        return [s.op for s in self._plan.steps]

    def set_param(self, name: str, array) -> None:
        """Bind a run-time weight. A numpy array is kept by reference on CPU (do not modify it afterwards);
        on CUDA it is uploaded once, here, and a cupy array is kept by reference."""
        with self.backend.scope():
            self._plan.base[self._plan.param_slot.get(name, -1)] = self._plan.check_param(name, array)

    def run(self, feeds: dict) -> dict:
        """Inputs by name -> outputs by name (numpy on CPU; cupy arrays on CUDA)."""
        plan = self._plan
        # IEEE results (NaN/Inf) are the semantics, not warnings
        with self.backend.scope(), np.errstate(all="ignore"):
            vals = plan.bind_inputs(feeds)
            if self._profile is None:
                return plan.outputs(vals, plan.run_fast(vals))
            return plan.outputs(plan.execute(vals, self._profile))

    # ---------------------------------------------------------------- profiling
    def enable_profiling(self, on: bool = True) -> None:
        self._profile = {} if on else None

    def profile(self) -> dict[str, tuple[int, float]]:
        """op -> (calls, seconds) since profiling was enabled (empty when off)."""
        return {k: (v[0], v[1]) for k, v in (self._profile or {}).items()}

    def reset_profile(self) -> None:
        if self._profile is not None:
            self._profile.clear()


class Session:
    """Compiles graphs (or read .rlx files) for one device: Session(Device.CUDA), Session("cuda:1")."""

    def __init__(self, device: Device | str | Backend = Device.CPU, index: int | None = None):
        if isinstance(device, Backend):  # a backend built by hand (rlx_runtime.backend: adding a backend)
            if index is not None:
                raise RlxError("Session(backend, index): the backend already names its device index")
            self.device, self.index, self.backend = device.device, device.index, device
            return
        if isinstance(device, str):
            device, parsed = parse_device(device)
            index = parsed if index is None else index
        if not isinstance(device, Device):
            raise RlxError(f"Session(device): expected Device.CPU, Device.CUDA, a string like 'cuda:0' or a Backend; "
                           f"got {type(device).__name__}")
        if device is Device.CPU and index:
            raise RlxError(f"Session: a device index ({index}) applies to CUDA only; use Session(Device.CPU)")
        self.device = device
        self.index = index or 0
        self.backend = backend_for(self.device, self.index)

    @property
    def xp(self):
        """The array module graphs run on (numpy, or cupy on CUDA)."""
        return self.backend.xp

    def compile(self, graph_or_file) -> CompiledGraph:
        return self.compile_with(graph_or_file, CompileOptions(optimize=False))

    def compile_with(self, graph_or_file, options: CompileOptions | None = None):
        with self.backend.scope():  # constants are uploaded to this GPU
            return self._compile(graph_or_file, options or CompileOptions())

    def _compile(self, graph_or_file, options: CompileOptions):
        graph = _as_graph(graph_or_file)
        report = None
        if options.param_bindings or options.optimize or options.unpack_quantized or options.precompute:
            from .passes.pipeline import compile_pipeline
            graph, report = compile_pipeline(graph, options)
        if options.cache_param_invariant or options.cache_shape_invariant:
            from .hoist import HoistedGraph, split_param_invariant, split_shape_invariant
            split = (split_shape_invariant if options.cache_shape_invariant else split_param_invariant)(graph)
            if split is not None:
                return HoistedGraph(split, self.backend, options, report)
        return CompiledGraph(graph, self.backend, options, report)


def _as_graph(obj) -> Graph:
    if isinstance(obj, Graph):
        return obj
    materialize = getattr(obj, "materialize_graph", None)
    if materialize is not None:
        return materialize()
    raise RlxError(f"compile() takes a Graph or an RlxFile; got {type(obj).__name__}")
