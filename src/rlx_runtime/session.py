"""Session: compiles graphs (or read .rlx files) for one backend; the public face of the runtime."""

from __future__ import annotations



from rlx_format.errors import RlxError
from rlx_format.graph import Graph

from .backend import Backend, backend_for
from .device import Device, parse_device
from .options import CompileOptions
from .compiled import CompiledGraph
from .hoist import HoistedGraph, split_param_invariant, split_shape_invariant


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

    def compile(self, graph_or_file, options: CompileOptions | None = None) -> CompiledGraph:
        """Plan a Graph or an RlxFile (from read_rlx) for this session's device.

        `options` (CompileOptions(), by default) chooses what happens first: simplify/fold/DCE, binding
        weights as constants, hoisting weight-only work, unpacking quantized weights, profiling. Returns a
        CompiledGraph (or a HoistedGraph, same interface, when hoisting applies)."""
        with self.backend.scope():  # constants are uploaded to this GPU
            return self._compile(graph_or_file, options or CompileOptions())

    def compile_with(self, graph_or_file, options: CompileOptions | None = None) -> CompiledGraph:
        """The same as compile(graph_or_file, options); kept for compatibility."""
        return self.compile(graph_or_file, options)

    def _compile(self, graph_or_file, options: CompileOptions):
        graph = _as_graph(graph_or_file)
        report = None
        if options.param_bindings or options.optimize or options.unpack_quantized or options.precompute:
            from .passes.pipeline import compile_pipeline
            graph, report = compile_pipeline(graph, options)
        if options.cache_param_invariant or options.cache_shape_invariant:
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
