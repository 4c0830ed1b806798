"""CompiledGraph: a graph planned for one backend; `run` executes the generated plan."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlx_format.graph import Graph

from .backend import Backend
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
