"""Generic compiler passes, each `(graph, ctx) -> PassResult` in pipeline.py (the functions below are
their graph-level implementations)."""

from .affine import fold_affine
from .dce import dead_code_elimination
from .dedupe import dedupe_constants
from .fold import constant_fold
from .fuse import fuse, fuse_conv_activation, fuse_linear
from .inline import inline_known_control
from .pipeline import (AFFINE, DCE, DEDUPE, FOLD, FUSE, FUSE_CONV, FUSE_LINEAR, SIMPLIFY, UNPACK, Pass, PassContext,
                       PassResult, compile_pipeline, in_bodies, run_group)
from .report import PassReport
from .simplify import simplify
from .specialize import specialize_params

__all__ = ["specialize_params", "fold_affine", "constant_fold", "simplify", "fuse", "fuse_conv_activation",
           "fuse_linear", "dead_code_elimination", "dedupe_constants", "inline_known_control", "compile_pipeline",
           "run_group", "in_bodies", "Pass", "PassContext", "PassResult", "PassReport",
           "FOLD", "AFFINE", "SIMPLIFY", "FUSE", "FUSE_CONV", "FUSE_LINEAR", "DCE", "DEDUPE", "UNPACK"]
