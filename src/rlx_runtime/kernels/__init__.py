"""The op table. `KERNELS[op](xp, attrs, *inputs)`; the submodules register their kernels on import."""

from . import control, data, elementwise, integer, nn, random_quant, recurrent  # noqa: F401 - they fill KERNELS
from ..backend import host_ints, special
from .registry import FACTS, KERNELS, OVERRIDES, KernelFacts, check_table, kernel, prepare_attrs, register

check_table()  # every op has a generic kernel; overrides name real ops

__all__ = ["KERNELS", "OVERRIDES", "FACTS", "KernelFacts", "register", "kernel", "prepare_attrs", "host_ints",
           "special", "check_table"]
