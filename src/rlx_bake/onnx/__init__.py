"""ONNX import: `import_onnx(path) -> (Graph, weights)`, lowering ONNX ops to the rlx catalogue.

Initializers become params with their weights (so the bake specializes, folds and packs them);
Constant nodes become constants, and every node whose operands are all constants is evaluated at
import; `dim_param` becomes a symbolic dim (anonymous ones, '?' or -1, each a fresh one). Shape-like
operands given as inputs in newer opsets (Reshape/Slice/Pad/Squeeze/Unsqueeze/ReduceX/Clip/Split/...)
are read at import time when they are constants and become attrs; those computed at run time from
Shape use the input forms of Reshape/Expand/Tile/ConstantOfShape/Slice/Pad/Resize. External-data
tensors are memory-mapped from their files (never copied twice), which must lie inside the model's
folder (external_data.py). Every unsupported op is reported in one error (ops inside If/Loop/Scan
bodies included). Needs the `onnx` extra.
"""

from .importer import import_onnx

__all__ = ["import_onnx"]
