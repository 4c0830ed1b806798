"""The op table. `KERNELS[op](xp, attrs, *inputs)`; the submodules register their kernels on import."""

from . import control, data, elementwise, integer, nn, random_quant, recurrent  # noqa: F401 - they fill KERNELS
from .registry import KERNELS, check_table, host_ints, kernel, prepare_attrs, special

__all__ = ["KERNELS", "kernel", "prepare_attrs", "host_ints", "special", "check_table"]
