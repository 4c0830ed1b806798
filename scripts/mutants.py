"""`make check-tests`: do the tests catch the bugs that matter? A curated mutation check.

Each mutant plants one plausible bug in an invariant (sealing, rounding, folding, hoisting, skip-zero,
bf16, Slice clamps, alignment) into a temporary copy of src/, runs the test files that should catch it
(with PYTHONPATH pointing at the copy), and counts it killed when a test fails. Every mutation patches
one exact source snippet; a snippet that is not found exactly once fails the run, so the list cannot rot
silently when the code changes.

Usage: python scripts/mutants.py [-k SUBSTRING] [--list]
Exits 1 when a mutant survives, a snippet is missing, or the unmutated tests do not pass.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    invariant: str
    patches: tuple[tuple[str, str, str], ...]  # (path under src/, exact old snippet, replacement)
    tests: tuple[str, ...]                      # test files (under tests/) that must kill it


SEALED = "rlx_format/sealed.py"
QUANTS = "rlx_format/quants.py"
EVAL = "rlx_runtime/passes/evaluate.py"
GUARD = "if out_b > max(min_bytes, growth_limit * in_b):"
SLICE = "rlx_format/ops/infer_shape.py"
KDF_TESTS = ("test_sealed.py::test_kdf_caps_refused_before_hashing",  # (the tamper matrix would also kill these,
             "test_sealed.py::test_each_kdf_limit_is_refused_before_hashing")  # after minutes of Argon2 work)

MUTANTS = [
    Mutant("aad_dropped", "every chunk authenticates the sealed header (AAD)",
           ((SEALED, "memoryview(self.buf)[:size], self.aad, out)", "memoryview(self.buf)[:size], b\"\", out)"),
            (SEALED, "aead.decrypt_into(h.nonce(i), view, aad,", "aead.decrypt_into(h.nonce(i), view, b\"\",")),
           ("test_known_answers.py", "test_sealed.py")),
    Mutant("nonce_counter_fixed", "the nonce counts chunks (reordering fails)",
           ((SEALED, 'struct.pack(">IB", i, 1 if', 'struct.pack(">IB", 0, 1 if'),),
           ("test_known_answers.py", "test_sealed.py")),
    Mutant("last_chunk_flag_off", "the last chunk's nonce carries the last-chunk flag",
           ((SEALED, "1 if i == self.n_chunks - 1 else 0)", "0)"),),
           ("test_known_answers.py", "test_sealed.py")),
    Mutant("kdf_memory_cap_gone", "readers refuse Argon2 memory above the cap before hashing",
           ((SEALED, "KDF_MIN_MEMORY_KIB <= m <= KDF_MAX_MEMORY_KIB", "KDF_MIN_MEMORY_KIB <= m"),),
           KDF_TESTS),
    Mutant("kdf_time_cap_gone", "readers refuse Argon2 iterations above the cap before hashing",
           ((SEALED, "KDF_MIN_TIME <= t <= KDF_MAX_TIME", "KDF_MIN_TIME <= t"),),
           KDF_TESTS),
    Mutant("kdf_lanes_cap_gone", "readers refuse more Argon2 lanes than the cap before hashing",
           ((SEALED, "1 <= p <= KDF_MAX_LANES", "1 <= p"),),
           KDF_TESTS),
    Mutant("digest_not_checked", "verify recomputes and compares every weight digest",
           (("rlx_format/container.py", "            if got != w.digest:\n", "            if False:\n"),),
           ("test_container.py", "test_reader_hardening.py", "test_cli.py")),
    Mutant("alignment_32", "tensors start at 64-byte aligned offsets",
           (("rlx_format/constants.py", "ALIGNMENT = 64 ", "ALIGNMENT = 32 "),),
           ("test_known_answers.py", "test_container.py")),
    Mutant("q8_0_ties_to_zero", "Q8_0/TQ2_0 round exact .5 ties away from zero",
           ((QUANTS, "a - fl >= _HALF else fl", "a - fl > _HALF else fl"),),
           ("test_known_answers.py", "test_quants.py")),
    Mutant("q8_0_ties_to_even", "Q8_0 rounds half away from zero, not to even",
           ((QUANTS, "np.int32(min(max(_roundf(x[b, i] * inv),", "np.int32(min(max(np.rint(x[b, i] * inv),"),),
           ("test_known_answers.py", "test_quants.py")),
    Mutant("ternary_ties_to_zero", "TQ1_0/TQ2_0 round +-0.5 away from zero (to +-1), not to 0",
           ((QUANTS, "np.int32(v >= _HALF) - np.int32(v <= -_HALF) + 1",
             "np.int32(v > _HALF) - np.int32(v < -_HALF) + 1"),),
           ("test_known_answers.py", "test_quants.py")),
    Mutant("bf16_truncates", "f32 -> bf16 rounds to nearest even",
           (("rlx_format/dtypes.py", "rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16",
             "rounded = (u >> 16) << 16"),),
           ("test_known_answers.py",)),
    Mutant("bf16_ties_away", "f32 -> bf16 breaks ties to even, not away from zero",
           (("rlx_format/dtypes.py", "rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16",
             "rounded = ((u + 0x8000) >> 16) << 16"),),
           ("test_known_answers.py",)),
    Mutant("fold_guard_min", "a boundary folds up to max(min_bytes, growth x its constants)",
           ((EVAL, GUARD, GUARD.replace("max", "min")),),
           ("test_guard_edges.py", "test_partial_eval.py")),
    Mutant("fold_guard_off_by_one", "a boundary of exactly growth x its constants still folds",
           ((EVAL, GUARD, GUARD.replace(">", ">=")),),
           ("test_guard_edges.py", "test_partial_eval.py")),
    Mutant("fold_guard_first_leaf", "the guard counts every constant the closure reads",
           ((EVAL, "return sum(origin.get(k, v.value.nbytes) for k, v in c.leaves.items())",
             "return max(origin.get(k, v.value.nbytes) for k, v in c.leaves.items())"),),
           ("test_guard_edges.py", "test_partial_eval.py")),
    Mutant("budget_strict", "a sweep that needs exactly the budget fits",
           ((EVAL, "if peak <= budget:", "if peak < budget:"),),
           ("test_guard_edges.py", "test_partial_eval.py")),
    Mutant("budget_forgets_results", "at compile the folded results count against the budget",
           ((EVAL, "keep_results = growth_limit is None", "keep_results = False"),),
           ("test_guard_edges.py", "test_partial_eval.py")),
    Mutant("hoist_first_owner_only", "set_param invalidates every boundary that reads the param",
           (("rlx_runtime/hoist.py", "        for b in owners:\n", "        for b in owners[:1]:\n"),),
           ("test_guard_edges.py", "test_hoist.py")),
    Mutant("skip_zero_probes_ends", "skip-zero reads the whole weight, not its first/last values",
           (("rlx_bake/passes/skip_zero.py", "zero = not np.any(flat)", "zero = True"),),
           ("test_guard_edges.py", "test_bake.py")),
    Mutant("slice_neg_end_clamp", "a negative-step Slice end clamps to -1 (before index 0)",
           ((SLICE, "min(max(end, -1), d - 1)", "min(max(end, 0), d - 1)"),),
           ("test_known_answers.py", "test_ops_oracle.py")),
    Mutant("slice_neg_start_clamp", "a negative-step Slice start clamps to d - 1",
           ((SLICE, "return min(max(start, 0), d - 1), min", "return min(max(start, 0), d), min"),),
           ("test_known_answers.py", "test_ops_oracle.py")),
    Mutant("gelu_tanh", "Gelu without `approximate` is the exact erf form",
           (("rlx_runtime/kernels/elementwise.py", 'if a["approximate"] == "tanh":\n        return _gelu(xp, a, x)',
             'if True:\n        return _gelu(xp, {**a, "approximate": "tanh"}, x)'),),
           ("test_minilm.py",)),
    Mutant("clip_alias_undeclared", "a kernel that returns its input says so (else in-place ops write through it)",
           (("rlx_runtime/kernels/elementwise.py", '@kernel("Clip", aliases=True)', '@kernel("Clip")'),),
           ("test_kernel_facts.py",)),
    Mutant("quant_collapse_unchecked", "a weight whose block decodes to zeros is kept dense",
           (("rlx_bake/passes/quant.py", "    if _collapsed(rows, full, codec.block):", "    if False:"),),
           ("test_quant_auto.py",)),
    Mutant("layernorm_eps_floor", "LayerNorm uses the model's epsilon (MiniLM: 1e-12)",
           (("rlx_runtime/kernels/nn.py", 'y = d / xp.sqrt(var + x.dtype.type(a["epsilon"])) * scale',
             'y = d / xp.sqrt(var + x.dtype.type(max(a["epsilon"], 1e-5))) * scale'),),
           ("test_row_kernels.py", "test_minilm.py")),
    Mutant("layernorm_rows_eps_floor", "the CPU LayerNorm row kernel uses the model's epsilon",
           (("rlx_runtime/kernels/nn.py", 'np.float32(a["epsilon"]), _ufuncs().layer_norm_rows',
             'np.float32(max(a["epsilon"], 1e-5)), _ufuncs().layer_norm_rows'),),
           ("test_row_kernels.py",)),
    Mutant("erf_margin_too_small", "the fast erf path hands over every input its margin cannot decide",
           (("rlx_runtime/ufuncs.py", "    m = FAST_TOL * abs(r)", "    m = 1e-13 * abs(r)"),),
           ("test_ufuncs.py",)),
    Mutant("gelu_redo_skipped", "GELU redoes on the exact path what the fast path was unsure of",
           (("rlx_runtime/ufuncs.py", "        _redo(xs, outs, flags, words, polys, taylor, gelu)",
             "        if not gelu:\n            _redo(xs, outs, flags, words, polys, taylor, gelu)"),),
           ("test_ufuncs.py",)),
    Mutant("erf_chunk_edge_skipped", "erf/GELU chunks over the threads cover every element",
           (("rlx_runtime/ufuncs.py", "lambda s, e: _fast_blocks(flat, out, s, e,",
             "lambda s, e: _fast_blocks(flat, out, s + (s > 0), e,"),),
           ("test_ufuncs.py",)),
    Mutant("softmax_odd_rows_fast", "a softmax row with a non-finite max goes to the generic steps",
           (("rlx_runtime/ufuncs.py", "        if not abs(m) < np.inf:", "        if False:"),),
           ("test_threads.py", "test_runtime.py")),
    Mutant("softmax_not_normalized", "the row softmax divides by its row's sum",
           (("rlx_runtime/ufuncs.py", "            row[i] = row[i] / den", "            row[i] = row[i] / 1.0"),),
           ("test_runtime.py", "test_threads.py")),
    Mutant("max_f32_tail_reads_zero", "max_f32's masked tail lanes read -inf",
           (("rlx_runtime/simd.py", "_first_lanes(builder, left, LANES), low)",
             "_first_lanes(builder, left, LANES))"),),
           ("test_simd_kernels.py",)),
    Mutant("exp_shifted_drops_nan", "exp_shifted_f32 keeps NaN",
           (("rlx_runtime/simd.py", '"uno", d, d), d, _exp_neg_abs(builder, d, scalef))',
             '"uno", d, d), _const(d.type, 0.0), _exp_neg_abs(builder, d, scalef))'),),
           ("test_simd_kernels.py", "test_runtime.py")),
    Mutant("split_gemm_wrong_leading_axis", "a batched GEMM split by its leading axis slices every operand that has it",
           (("rlx_runtime/threads.py", "    lead_b = b.ndim == out.ndim and b.shape[0] > 1", "    lead_b = False"),),
           ("test_threads.py",)),
    Mutant("blas_not_restored", "the BLAS gets its thread count back when the last forward ends",
           (("rlx_runtime/threads.py", "                    c.set(_saved)", "                    pass"),),
           ("test_threads.py",)),
    Mutant("conv_epilogue_group_bias", "FusedConv's per-block epilogue adds each group's own channel bias",
           (("rlx_runtime/conv_kernels.py", "bv = bias[(bi % groups) * m + r]", "bv = bias[r]"),),
           ("test_fused_residual.py", "test_fused_conv.py")),
    Mutant("conv_epilogue_group_bias_fused_pass", "the one-pass bias + activation takes each group's own bias",
           (("rlx_runtime/conv_kernels.py", "c1 - c0, bias[(bi % groups) * m + r], act,", "c1 - c0, bias[r], act,"),),
           ("test_fused_conv.py",)),
    Mutant("relu_epilogue_drops_bias", "the one-pass Relu epilogue adds the bias before the max",
           (("rlx_runtime/conv_kernels.py", "    v = run[i] + bv\n            run[i] = np.float32(0.0) if v <= 0",
             "    v = run[i]\n            run[i] = np.float32(0.0) if v <= 0"),),
           ("test_fused_conv.py",)),
    Mutant("repeat_planes_odd_columns", "a nearest 2x upsample repeats each element into both of its columns",
           (("rlx_runtime/conv_kernels.py", "first[2 * j + 1] = v", "first[2 * j + 1] = src[0]"),),
           ("test_runtime.py",)),
    Mutant("repeat_factors_empty_output", "a nearest Resize to an empty axis is not taken as row copies",
           (("rlx_runtime/kernels/data.py", "if k < 1 or d_out % d_in", "if d_out % d_in"),),
           ("test_runtime.py",)),
    Mutant("repeat_factors_ignore_channels", "an upsample that also resizes C is not taken as row copies",
           (("rlx_runtime/kernels/data.py", "d_out % d_in or (ax < 2 and k != 1):", "d_out % d_in:"),),
           ("test_runtime.py",)),
    Mutant("numba_not_loaded_at_compile", "a graph whose forward loads numba has it loaded by compile",
           (("rlx_runtime/plan.py", "not in sys.modules and loads_numba(graph):", "not in sys.modules and False:"),),
           ("test_runtime.py",)),
    Mutant("tiny_conv_bias_dropped", "a squeeze-excite block's 1x1-pixel FusedConv adds its bias",
           (("rlx_runtime/kernels/nn.py", "        y += b.reshape(o, 1)\n", "        pass\n"),),
           ("test_fused_conv.py",)),
    Mutant("sigmoid_ln2_low_part_sign", "the sigmoid's range reduction subtracts k times both parts of ln 2",
           (("rlx_runtime/simd.py", "_fma(builder, k, c(-float(EXP_LN2_LO)),",
             "_fma(builder, k, c(float(EXP_LN2_LO)),"),),
           ("test_simd_kernels.py",)),
    Mutant("sigmoid_scalef_rounds_down", "AVX-512's scaling by 2^k rounds to nearest, as the two-factor one",
           (("rlx_runtime/simd.py", "ir.Constant(_I32, 4)])  # all lanes", "ir.Constant(_I32, 9)])  # all lanes"),),
           ("test_simd_kernels.py",)),
    Mutant("sigmoid_two_factor_scale_not_split", "without AVX-512, a subnormal exp(-|x|) takes two normal powers",
           (("rlx_runtime/simd.py", "lowest = _const(vi, SCALE_MIN)", "lowest = _const(vi, -150)"),),
           ("test_defined_results.py",)),
    Mutant("tanh_estrin_terms_swapped", "tanh's exponential pairs each coefficient with its own power",
           (("rlx_runtime/ufuncs.py", "(p3 + p2 * s) * s2", "(p2 + p3 * s) * s2"),),
           ("test_recurrent.py", "test_speed_kernels.py")),
    Mutant("sigmoid_bias_dropped", "a Sigmoid/SiLU epilogue adds the conv bias before the activation",
           (("rlx_runtime/simd.py", "_sigmoid_vec(builder, builder.fadd(x, bv), is_silu)",
             "_sigmoid_vec(builder, x, is_silu)"),),
           ("test_simd_kernels.py", "test_fused_conv.py")),
    Mutant("few_rows_pass_stores_to_row_zero", "each pass of the few-rows GEMM stores its own rows",
           (("rlx_runtime/simd.py", "base = builder.mul(builder.add(first, const(j)), n_)",
             "base = builder.mul(const(j), n_)"),),
           ("test_simd_kernels.py", "test_conv_paths.py")),
    Mutant("copy_drops_the_last_elements", "a row copy without masked moves ends with single elements",
           (("rlx_runtime/simd.py", "                    vectors(dense, 8)\n                    elements()",
             "                    vectors(dense, 8)"),),
           ("test_simd_kernels.py",)),
    Mutant("kernel_cache_ignores_sources", "numba's cache folder changes with every file that compiles kernels",
           (("rlx_format/numba_setup.py", 'if b"njit" in data or b"@intrinsic" in data:', "if False:"),),
           ("test_numba_cache.py",)),
    Mutant("simd_scale_group_shares_one_d", "each block of a scale group gets its own fp16 d",
           (("rlx_runtime/simd.py", "ds, ir.Constant(_I32, k)) for k", "ds, ir.Constant(_I32, 0)) for k"),),
           ("test_simd_kernels.py",)),
    Mutant("simd_dot_skips_the_remainder", "the blocks after the last whole scale group are summed too",
           (("rlx_runtime/simd.py", "_block_loop(builder, rest, nb, state", "_block_loop(builder, rest, rest, state"),),
           ("test_simd_kernels.py",)),
    Mutant("pool_finished_not_reset", "each native job counts its own finished chunks",
           (("rlx_runtime/pool_kernels.py", "    _store(ctrl, FINISHED, 0)\n", ""),),
           ("test_pool.py",)),
    Mutant("pool_workers_idle", "workers take chunks of native jobs",
           (("rlx_runtime/pool_kernels.py", "        ran = _take_chunks(ctrl, ti, tf, starts)", "        ran = 0"),),
           ("test_pool.py",)),
    Mutant("steps_forget_their_operands", "a native step keeps the arrays its row points into alive",
           (("rlx_runtime/threads.py", "self.keep += (a, b, out)  # the row holds only their addresses", "pass"),),
           ("test_pool.py",)),
    Mutant("skinny_tail_from_the_start", "the few-rows GEMM's last columns start after the whole vectors",
           (("rlx_runtime/simd.py", "passes(tail, False, _first_lanes(builder, left, lanes))",
             "passes(c0_, False, _first_lanes(builder, left, lanes))"),),
           ("test_pool.py",)),
    Mutant("parallel_kernels_ignore_the_forward", "numba's parallel kernels run on the forward's thread count",
           (("rlx_runtime/numba_parallel.py", "        if n is None:\n            return fn(*args)",
             "        if True:\n            return fn(*args)"),),
           ("test_pool.py",)),
    Mutant("workers_ignore_yield", "polling workers sleep when a numba parallel kernel wants the cores",
           (("rlx_runtime/pool_kernels.py", "            if _load(ctrl, YIELD):", "            if False:"),),
           ("test_pool.py",)),
    Mutant("taps_mul_then_add", "a tap conv adds each product by fma",
           (("rlx_runtime/simd.py", "out.append(_fma(builder, ws, x, acc))",
             "out.append(builder.fadd(acc, builder.fmul(ws, x)))"),),
           ("test_conv_paths.py",)),
    Mutant("tap_rows_tail_unmasked", "a tap row's last vector writes nothing past the row",
           (("rlx_runtime/simd.py", '_masked(builder, "store", _VF, builder.gep(dp, [d]), mask, v)',
             "_store_vec(builder, v, dp, d)"),),
           ("test_simd_kernels.py",)),
    Mutant("tap_rows_straight_pitch", "a depthwise conv computed row by row reads its rows wq apart in the phases",
           (("rlx_runtime/conv_kernels.py", "tap_rows_f32(out, c * oh * ow, ow, phases, 0, wq, oh,",
             "tap_rows_f32(out, c * oh * ow, ow, phases, 0, ow, oh,"),),
           ("test_conv_paths.py",)),
    Mutant("blocked_taps_mul_then_add", "the blocked depthwise kernel adds each product by fma",
           (("rlx_runtime/simd.py", "[_fma(builder, w, _load_vec(builder, sp, builder.add(pos, off), _V16), acc)",
             "[builder.fadd(acc, builder.fmul(w, _load_vec(builder, sp, builder.add(pos, off), _V16)))"),),
           ("test_simd_kernels.py", "test_conv_paths.py")),
    Mutant("blocked_padding_rows_kept", "a band's rows above or below the input are zero in the blocked buffer",
           (("rlx_runtime/conv_kernels.py", "buf[(i - first) * row:(i - first + 1) * row] = 0.0",
             "pass"),),
           ("test_conv_paths.py",)),
    Mutant("blocked_left_pad_dropped", "the blocked buffer puts each input pixel past its row's left padding",
           (("rlx_runtime/conv_taps.py", "self.where = (rows * wp + pads[1] + cols) * BLOCK",
             "self.where = (rows * wp + cols) * BLOCK"),),
           ("test_conv_paths.py",)),
    Mutant("blocked_transpose_store_unmasked", "a transposed tile writes only its rows' lanes",
           (("rlx_runtime/simd.py", "builder.gep(dp, [to]), builder.select(live, row_mask, none), v)",
             "builder.gep(dp, [to]), builder.select(live, col_mask, none), v)"),),
           ("test_simd_kernels.py",)),
    Mutant("blocked_band_overlap_lost", "a band reads the (kh - 1) * dh input rows below its last output row's",
           (("rlx_runtime/conv_kernels.py", "last = first + (b1 - 1 - b0) * sh + reach",
             "last = first + (b1 - b0) * sh"),),
           ("test_conv_paths.py",)),
    Mutant("blocked_split_rows_skipped", "a split by output rows covers every row",
           (("rlx_runtime/conv_taps.py", "return [0, self.blocks], threads.chunk_edges(oh, nthreads, min_chunk=1)",
             "return [0, self.blocks], threads.chunk_edges(oh, nthreads, min_chunk=1)[:-1] + [oh - 1]"),),
           ("test_conv_paths.py",)),
    Mutant("bound_pixel_conv_without_bias", "a bound squeeze-excite 1x1-pixel conv adds its bias",
           (("rlx_runtime/kernels/nn.py", "fields = threads.epilogue_fields(_epilogue(a, b, a[\"activation\"]))[:9]",
             "fields = threads.epilogue_fields(_epilogue(a, None, a[\"activation\"]))[:9]"),),
           ("test_bound_kernels.py",)),
    Mutant("bound_means_shape_unchecked", "a bound GlobalAveragePool hands another input shape to the kernel",
           (("rlx_runtime/kernels/nn.py", "if x.shape != shape or x.dtype != np.float32:\n            return _gap_cpu(",
             "if x.dtype != np.float32:\n            return _gap_cpu("),),
           ("test_bound_kernels.py",)),
    Mutant("bound_means_row_width", "a bound GlobalAveragePool averages over every spatial axis",
           (("rlx_runtime/kernels/nn.py", "shape, w = x.shape, math.prod(x.shape[2:])",
             "shape, w = x.shape, math.prod(x.shape[3:])"),),
           ("test_bound_kernels.py",)),
    Mutant("blocked_for_wide_3x3_rows", "3x3 depthwise convs to rows of MIN_ROW_WIDTH and up keep the phase kernel",
           (("rlx_runtime/conv_taps.py", "w_shape[2] * w_shape[3] <= 9 and", "w_shape[2] * w_shape[3] < 9 and"),),
           ("test_conv_paths.py",)),
    Mutant("pointwise_small_planes_skinny", "pointwise convs on planes under MIN_PIXELS go to the BLAS",
           (("rlx_runtime/conv_pointwise.py", "and pixels >= MIN_PIXELS", ""),),
           ("test_conv_paths.py",)),
    Mutant("pointwise_small_plane_big_weights_skinny", "a small plane's large weight matrix goes to the BLAS",
           (("rlx_runtime/conv_pointwise.py", "(pixels >= SMALL_PLANE or w.shape[0] * shape[1] < SMALL_PLANE_WEIGHTS)",
             "True"),),
           ("test_conv_paths.py",)),
    Mutant("split_fill_one_row", "a direct conv's phase fill split over threads fills each band's every row",
           (("rlx_runtime/conv_direct.py", "phases, *dp.fill, q0, q1)\n            steps.added()",
             "phases, *dp.fill, q0, q0 + 1)\n            steps.added()"),),
           ("test_conv_paths.py",)),
    Mutant("column_major_wide_weights", "only taller-than-wide MatMul weights are held column-major",
           (("rlx_runtime/plan.py", "value.shape[0] > value.shape[1]", "value.shape[0] > 0"),),
           ("test_runtime.py",)),
    Mutant("few_rows_without_numba", "a few-rows MatMul takes the BLAS while numba is not loaded",
           (("rlx_runtime/threads.py", "\n            and _kernels() is not None):", "):"),),
           ("test_runtime.py",)),
    Mutant("layer_norm_var_of_x", "LayerNorm's variance is the mean of (x - mean) squared",
           (("rlx_runtime/ufuncs.py", "            sq[i] = d * d", "            sq[i] = row[i] * row[i]"),),
           ("test_runtime.py",)),
    Mutant("heap_keeps_nothing", "freed arrays up to 32 MiB stay on the heap for the next forward",
           (("rlx_runtime/heap.py", "MMAP_THRESHOLD = 32 << 20", "MMAP_THRESHOLD = 1 << 17"),),
           ("test_heap.py",)),
    Mutant("blas_threads_left_wide", "the BLAS is single-threaded again when the last blas_threads scope ends",
           (("rlx_runtime/threads.py", "            if _wide_calls == 0:", "            if _wide_calls < 0:"),),
           ("test_pool.py",)),
    Mutant("phase_fill_ignores_the_stride", "the phase fill takes every sw-th input column",
           (("rlx_runtime/conv_kernels.py", "src + (p + sh * r - top) * w + first, cols, sw)",
             "src + (p + sh * r - top) * w + first, cols, 1)"),),
           ("test_conv_paths.py",)),
    Mutant("copy_tail_reads_past_the_row", "a step-2 copy's masked tail loads only the elements it keeps",
           (("rlx_runtime/simd.py", "need = builder.sub(builder.mul(left, two), one)",
             "need = builder.mul(left, two)"),),
           ("test_simd_kernels.py",)),
    Mutant("im2col_ignores_column_dilation", "im2col's window columns are kx * dilation apart",
           (("rlx_runtime/conv_kernels.py", "(oy * sh + ky * dh) * wp + kx * dw, ow, sw)",
             "(oy * sh + ky * dh) * wp + kx, ow, sw)"),),
           ("test_conv_paths.py",)),
    Mutant("tap_remainder_dropped", "the 1-3 whole vectors after the 4-chain blocks are summed too",
           (("rlx_runtime/simd.py", "    for count in range(1, tile):", "    for count in range(1, 1):"),),
           ("test_conv_paths.py",)),
    Mutant("row_sum_tail_reads_one_more", "the vector sum's masked tail loads only the elements summed",
           (("rlx_runtime/simd.py", "_first_lanes(builder, left, LANES), zero)",
             "_first_lanes(builder, builder.add(left, ir.Constant(_I64, 1)), LANES), zero)"),),
           ("test_simd_kernels.py",)),
    Mutant("tanh_polynomial_short", "tanh's small branch is a + a^3 P(a^2)",
           (("rlx_runtime/ufuncs.py", "t3) * z + t4) * z * a + a", "t3) * z + t4) * a + a"),),
           ("test_speed_kernels.py",)),
    Mutant("lstm_output_gate_is_forget", "the LSTM kernel's h is the output gate times tanh(c)",
           (("rlx_runtime/recurrent_kernels.py", "v = og[j] * tcb[j]", "v = fg[j] * tcb[j]"),),
           ("test_recurrent.py",)),
    Mutant("lstm_step_advances_early", "the LSTM's threads move to the next step only after its last block",
           (("rlx_runtime/recurrent_kernels.py", "if fetch_add(sync, 1 + seq + s, 1) == parts - 1:",
             "if fetch_add(sync, 1 + seq + s, 1) >= 0:"),),
           ("test_recurrent.py",)),
    Mutant("tanh_scale_not_split", "tanh's subnormal exp(-2|x|) is scaled by two normal powers of two",
           (("rlx_runtime/ufuncs.py", "k1 = k if k < 125 else np.int32(125)", "k1 = k"),),
           ("test_speed_kernels.py",)),
    Mutant("clamp_slice_short", "clamp's slices cover the whole tensor",
           (("rlx_runtime/clamp.py", "e = min(flat.size, s + CHUNK)", "e = min(flat.size, s + CHUNK - 1)"),),
           ("test_clamp.py",)),
    Mutant("relu_epilogue_keeps_minus_zero", "the numba Relu ties like numpy's maximum (-0.0 gives 0.0)",
           (("rlx_runtime/conv_kernels.py", "run[i] = np.float32(0.0) if v <= 0 else v",
             "run[i] = np.float32(0.0) if v < 0 else v"),),
           ("test_fused_conv.py",)),
    Mutant("pointwise_epilogue_rows", "the pointwise kernel's epilogue runs on the block it just computed",
           (("rlx_runtime/pool_kernels.py", "bias_act_rows(out, rows, n, 0, 1, j0, j1,",
             "bias_act_rows(out, rows, n, 0, 1, 0, j1 - j0,"),),
           ("test_conv_paths.py",)),
    Mutant("pointwise_epilogue_whole_width", "the pointwise epilogue runs on the panel of columns just computed",
           (("rlx_runtime/pool_kernels.py", "j0, j1, p0, p1, 1, bias,", "j0, j1, c0, c1, 1, bias,"),),
           ("test_conv_paths.py",)),
    Mutant("maxpool_tie_keeps_the_earlier", "MaxPool's vector fold gives a -0.0/0.0 tie to the later tap, as numpy",
           (("rlx_runtime/simd.py", 'builder.fcmp_ordered(">=", new, old)', 'builder.fcmp_ordered(">", new, old)'),),
           ("test_pools.py",)),
    Mutant("maxpool_first_column_of_a_padded_tap", "a padded tap folds only the output columns it reaches inside",
           (("rlx_runtime/conv_kernels.py", "lo = 0 if off >= 0 else (sw - 1 - off) // sw",
             "lo = 0 if off >= 0 else (sw - off) // sw"),),
           ("test_pools.py",)),
    Mutant("first_lanes_one_short", "a masked tail covers exactly the elements left",
           (("rlx_runtime/simd.py", "builder.sub(builder.shl(ir.Constant(ity, 1), n),",
             "builder.sub(builder.shl(ir.Constant(ity, 1), builder.sub(n, ir.Constant(ity, 1))),"),),
           ("test_simd_kernels.py", "test_pools.py")),
    Mutant("direct_piece_one_row_short", "a direct conv's pieces of grid rows cover every output row",
           (("rlx_runtime/conv_kernels.py", "g1 = min(g_hi, g0 + piece_rows)", "g1 = min(g_hi, g0 + piece_rows - 1)"),),
           ("test_conv_paths.py",)),
    Mutant("residual_added_before_the_bias", "a fused residual is added to the biased sum, each sum rounded",
           (("rlx_runtime/conv_kernels.py", "row[i] = (row[i] + bv) + added[i]", "row[i] = row[i] + (bv + added[i])"),),
           ("test_fused_residual.py",)),
    Mutant("tap_residual_of_image_zero", "a tap conv's epilogue adds its own image's residual",
           (("rlx_runtime/conv_kernels.py",
             "    out = y[n].reshape(-1)\n    image_res = res[n * out.size:] if has_res else res\n",
             "    out = y[n].reshape(-1)\n    image_res = res\n"),),
           ("test_fused_residual.py",)),
    Mutant("blocked_residual_of_image_zero", "a blocked depthwise conv's epilogue adds its own image's residual",
           (("rlx_runtime/conv_kernels.py",
             "    xf, out = x.reshape(-1), y[n].reshape(-1)\n    image_res = res[n * out.size:] if has_res else res\n",
             "    xf, out = x.reshape(-1), y[n].reshape(-1)\n    image_res = res\n"),),
           ("test_fused_residual.py",)),
    Mutant("direct_residual_from_row_zero", "a direct conv's residual epilogue covers the piece's rows",
           (("rlx_runtime/conv_kernels.py", "j0, j1, g0 * ow, g1 * ow, 1, bias,",
             "j0, j1, 0, (g1 - g0) * ow, 1, bias,"),),
           ("test_fused_residual.py",)),
    Mutant("pointwise_residual_of_image_zero", "a pointwise conv's epilogue adds its own image's residual",
           (("rlx_runtime/threads.py", "fields[-2][image * image_size:(image + 1) * image_size]", "fields[-2]"),),
           ("test_fused_residual.py",)),
    Mutant("native_row_drops_the_residual", "a native epilogue row carries the residual flag",
           (("rlx_runtime/pool_kernels.py", "ti[r, 18], ti[r, 19], ti[r, 20] = res.ctypes.data, res.size, has_res",
             "ti[r, 18], ti[r, 19], ti[r, 20] = res.ctypes.data, res.size, False"),),
           ("test_fused_residual.py",)),
    Mutant("residual_fused_across_a_broadcast", "only a residual of the conv output's own shape is fused",
           (("rlx_runtime/passes/fuse.py", "or not graph.types[c_name] == graph.types[r_name] == graph.types[add.name]",
             "or not graph.types[c_name] == graph.types[add.name]"),),
           ("test_fused_residual.py",)),
    Mutant("lstm_panel_offsets_unshifted", "a column of Rᵀ is read from its own panel at its place in the panel",
           (("rlx_runtime/recurrent_kernels.py", "* PANEL - p * PANEL", "* PANEL"),),
           ("test_recurrent.py",)),
    Mutant("lstm_groups_share_a_counter", "each row group of the LSTM's steps has its own step counter",
           (("rlx_runtime/kernels/recurrent.py", "lambda i: lstm_steps(*args, sync[i % groups]",
             "lambda i: lstm_steps(*args, sync[0]"),),
           ("test_recurrent.py",)),
    Mutant("lstm_projection_bias_half", "the LSTM projection's fused bias is both of its biases",
           (("rlx_runtime/kernels/recurrent.py", "ColumnBias(wb + rb)", "ColumnBias(wb)"),),
           ("test_recurrent.py",)),
    Mutant("python_job_split_below_its_threshold", "a batched matmul splits as a Python job from 2^22 multiply-adds",
           (("rlx_runtime/threads.py", "threads = threads_for(work) if work >= _MIN_PYTHON_SPLIT else 1",
             "threads = threads_for(work)"),),
           ("test_threads.py",)),
    Mutant("caller_does_not_wait_for_the_workers", "the caller's part of a native job waits for every chunk",
           (("rlx_runtime/pool_kernels.py", "_take_chunks(ctrl, ti, tf, starts)\n        for i in range(polls):",
             "_take_chunks(ctrl, ti, tf, starts)\n        return 1, seen\n        for i in range(polls):"),),
           ("test_pool.py", "test_threads.py")),
    Mutant("lstm_group_rows_overlap", "a row group runs its own rows only",
           (("rlx_runtime/kernels/recurrent.py", "edges[i % groups], edges[i % groups + 1])",
             "edges[i % groups], batch)"),),
           ("test_recurrent.py",)),
    Mutant("lstm_elementwise_rows_from_zero", "a row group's gates are its own rows'",
           (("rlx_runtime/recurrent_kernels.py", "        for b in range(b0, b1):\n            zb, xb",
             "        for b in range(0, b1):\n            zb, xb"),),
           ("test_recurrent.py",)),
    Mutant("few_rows_part_offset", "a part pass starts after the rows of the larger parts",
           (("rlx_runtime/simd.py", "builder.and_(here, const(-2 * size))", "builder.and_(here, const(-size))"),),
           ("test_simd_kernels.py",)),
    Mutant("few_rows_block_vectors_overlap", "a column block's passes of several vectors cover it side by side",
           (("rlx_runtime/simd.py", "builder.mul(b, const(vectors * lanes))", "builder.mul(b, const(lanes))"),),
           ("test_simd_kernels.py",)),
    Mutant("few_rows_part_rows_dropped", "rows short of a whole pass are all computed",
           (("rlx_runtime/simd.py", "size = 1 << ((per_pass - 1).bit_length() - 1)", "size = per_pass // 4"),),
           ("test_simd_kernels.py",)),
    Mutant("lstm_panel_stops_past_its_end", "a block's columns are split at panel boundaries",
           (("rlx_runtime/recurrent_kernels.py", "stop = min(end, (p + 1) * PANEL)", "stop = end"),),
           ("test_recurrent.py",)),
    Mutant("direct_band_one_row_short", "a direct conv's bands of output rows over the threads cover every row",
           (("rlx_runtime/conv_direct.py", "return [(0, o, g0, g1) for g0, g1",
             "return [(0, o, g0, g1 - 1) for g0, g1"),),
           ("test_conv_paths.py",)),
    Mutant("whole_rows_run_short", "a block of whole rows is activated over all of its elements",
           (("rlx_runtime/conv_kernels.py", "activate(flat, b0 * m * n, (b1 - b0) * m * n,",
             "activate(flat, b0 * m * n, (b1 - b0) * m * n - 1,"),),
           ("test_fused_conv.py", "test_conv_paths.py")),
    Mutant("tap_epilogue_skips_a_channel", "the tap kernel's epilogue covers every channel once",
           (("rlx_runtime/conv_kernels.py", "            done = c + 1", "            done = c + 2"),),
           ("test_fused_conv.py", "test_conv_paths.py")),
    Mutant("direct_bias_of_block_zero", "each 8-channel block of a direct conv gets its own channels' bias",
           (("rlx_runtime/conv_kernels.py", "bias[j0:] if has_bias else bias,", "bias,"),),
           ("test_conv_paths.py",)),
    Mutant("direct_native_row_short", "a direct conv's native pool row covers its whole channel range",
           (("rlx_runtime/pool_kernels.py", "= r0, r1, wq, piece_rows", "= r0, r1 - 1, wq, piece_rows"),),
           ("test_conv_paths.py",)),
    Mutant("conv_bias_dropped_in_kernel", "a plain Conv's bias is added by the conv kernels' epilogue",
           (("rlx_runtime/kernels/nn.py", '_epilogue(a, b, "Identity"))', '_epilogue(a, None, "Identity"))'),),
           ("test_conv_paths.py",)),
    Mutant("wide_tile_columns_misplaced", "each weight tile of a wide DequantMatMul batch fills its own columns of y",
           (("rlx_runtime/packed.py", "            y[:, r0:r1] = matmul(", "            y[:, : r1 - r0] = matmul("),),
           ("test_simd_kernels.py",)),
    Mutant("wide_batches_tile_the_weight", "a wide DequantMatMul batch is the long operand (packed once per tile)",
           (("rlx_runtime/packed.py", "wide = wide_rows is not None and x2.shape[0] >= wide_rows",
             "wide = wide_rows is not None and x2.shape[0] > 2 * wide_rows"),),
           ("test_simd_kernels.py",)),
    Mutant("linear_bias_of_block_zero", "each column block of a FusedMatMul gets its own columns' bias",
           (("rlx_runtime/linear.py", "    add = bias[c0:c1]", "    add = bias[0:c1 - c0]"),),
           ("test_fused_linear.py",)),
    Mutant("linear_residual_dropped", "a FusedMatMul's residual is added after its bias",
           (("rlx_runtime/linear.py", "row[i] = (row[i] + add[i]) + other[i]", "row[i] = row[i] + add[i]"),),
           ("test_fused_linear.py",)),
    Mutant("linear_fuses_a_shared_product", "fuse_linear leaves a product that another node reads",
           (("rlx_runtime/passes/fuse.py", "            mm = single(m_name, \"MatMul\")\n",
             "            mm = single(m_name, \"MatMul\") or single(m_name, \"MatMul\", 2)\n"),),
           ("test_fused_linear.py",)),
    Mutant("linear_bias_per_row_fused", "fuse_linear takes only a bias of one value per column",
           (("rlx_runtime/passes/fuse.py", "and bt.shape[-1] == ot.shape[-1])", "and True)"),),
           ("test_fused_linear.py",)),
    Mutant("linear_weight_row_major", "a FusedMatMul's weight is held column-major where MatMul's would be",
           (("rlx_runtime/plan.py", "all(u in ((\"MatMul\", 1), (\"FusedMatMul\", 1)) for u in uses[name])",
             "all(u in ((\"MatMul\", 1),) for u in uses[name])"),),
           ("test_fused_linear.py",)),
    Mutant("row_scale_next_row", "a tensor times one value per row multiplies each row by its own value",
           (("rlx_runtime/conv_kernels.py", "        v = small[r]\n        at = r * width",
             "        v = small[min(r + 1, small.size - 1)]\n        at = r * width"),),
           ("test_clamp.py",)),
    Mutant("layer_norm_chunk_at_zero", "each chunk of LayerNorm's rows writes its own rows",
           (("rlx_runtime/kernels/nn.py", "b, bias is not None, dst[r0 * width:r1 * width], width, eps)",
             "b, bias is not None, dst[0:(r1 - r0) * width], width, eps)"),),
           ("test_row_kernels.py",)),
    Mutant("softmax_chunk_flags_at_zero", "each chunk of softmax rows flags its own odd rows",
           (("rlx_runtime/ufuncs.py", "width, odd[r0:r1]))", "width, odd[0:r1 - r0]))"),),
           ("test_row_kernels.py",)),
    Mutant("aligned_start_unmoved", "aligned.empty slides its start onto a cache line",
           (("rlx_runtime/aligned.py", "    skip = ((LINE - buf.ctypes.data % LINE) % LINE) // 4", "    skip = 0"),),
           ("test_aligned.py",)),
    Mutant("pointwise_output_unaligned", "a pointwise conv's output starts on a cache line",
           (("rlx_runtime/conv_pointwise.py", "    y = aligned.empty((n, o, p))",
             "    y = np.empty((n, o, p), np.float32)"),),
           ("test_aligned.py",)),
    Mutant("bound_conv_shape_unchecked", "a bound conv hands inputs of another shape to the kernel",
           (("rlx_runtime/kernels/nn.py", "            if x.shape != shape or x.dtype != np.float32 or w is not w0",
             "            if x.dtype != np.float32 or w is not w0"),),
           ("test_bound_kernels.py",)),
    Mutant("bound_conv_weight_unchecked", "a bound conv hands a param set anew to the kernel",
           (("rlx_runtime/kernels/nn.py", "x.dtype != np.float32 or w is not w0 or b is not b0",
             "x.dtype != np.float32 or b is not b0"),),
           ("test_bound_kernels.py",)),
    Mutant("bound_conv_residual_dropped", "a bound residual conv adds its residual",
           (("rlx_runtime/kernels/nn.py", "lambda x, r: conv(x, ep0.with_residual(np.ascontiguousarray(r))))",
             "lambda x, r: conv(x, ep0))"),),
           ("test_bound_kernels.py",)),
    Mutant("bound_conv_activation_dropped", "a bound FusedConv applies its activation",
           (("rlx_runtime/kernels/nn.py", "        ep0 = _epilogue(a, b0, a[\"activation\"])",
             "        ep0 = _epilogue(a, b0, \"Identity\")"),),
           ("test_bound_kernels.py",)),
    Mutant("tap_plan_bottom_pad", "a depthwise conv's phases start after its top padding",
           (("rlx_runtime/conv_taps.py", "        self.fill = (sh, sw, pads[0], pads[1], hq)",
             "        self.fill = (sh, sw, pads[2], pads[1], hq)"),),
           ("test_conv_paths.py",)),
    Mutant("pixel_conv_bias_dropped", "a 1x1-pixel conv adds its bias before the activation",
           (("rlx_runtime/conv_kernels.py", "        if has_bias:\n            for j in range(o):",
             "        if False:\n            for j in range(o):"),),
           ("test_bound_kernels.py",)),
    Mutant("pixel_conv_weights_stale", "a 1x1-pixel conv's transposed weights follow a param set anew",
           (("rlx_runtime/kernels/nn.py", "is not w:\n        cached = a[\"_pixel_weights\"]",
             "is not w and False:\n        cached = a[\"_pixel_weights\"]"),),
           ("test_bound_kernels.py",)),
    Mutant("stream_scale_rows_from_zero", "a split squeeze-excite scale's chunk starts at its own rows",
           (("rlx_runtime/pool_kernels.py", "big = numba.carray(_f32_at(ti[r, 1] + 4 * r0 * width)",
             "big = numba.carray(_f32_at(ti[r, 1])"),),
           ("test_clamp.py",)),
    Mutant("stream_means_rows_from_zero", "a split GlobalAveragePool's chunk writes its own channels' means",
           (("rlx_runtime/pool_kernels.py",
             "out = numba.carray(_f32_at(ti[r, 2] + 4 * r0), (r1 - r0,))\n        row_means",
             "out = numba.carray(_f32_at(ti[r, 2]), (r1 - r0,))\n        row_means"),),
           ("test_clamp.py",)),
    Mutant("prepared_job_never_run", "a bound conv runs its prepared job from its second call on",
           (("rlx_runtime/kernels/nn.py", "ran = job.run(x.reshape(-1), y.reshape(-1))", "ran = False"),),
           ("test_bound_kernels.py",)),
    Mutant("prepared_job_not_locked", "one caller at a time runs a prepared job (its tables and scratch)",
           (("rlx_runtime/threads.py", "not self._using.acquire(blocking=False):",
             "not (self._using.acquire(blocking=False) or True):"),
            ("rlx_runtime/threads.py", "            return True\n        finally:\n            self._using.release()",
             "            return True\n        finally:\n            pass")),
           ("test_bound_kernels.py",)),
    Mutant("prepared_relocation_offset_dropped", "a prepared job's rows point at this call's arrays plus their offsets",
           (("rlx_runtime/pool_kernels.py", "bases[relocs[i, 2]] + relocs[i, 3]", "bases[relocs[i, 2]]"),),
           ("test_bound_kernels.py", "test_fused_residual.py")),
    Mutant("placement_workers_not_kept_off", "a held forward keeps the workers off its caller's CPU",
           (("rlx_runtime/threads.py", "            if _pool is not None:\n                _pool.keep_off(_hold)\n",
             ""),),
           ("test_placement.py",)),
    Mutant("placement_caller_not_released", "a held forward puts its caller's allowed CPUs back",
           (("rlx_runtime/threads.py", "                placement.release_caller(_hold)\n", ""),),
           ("test_placement.py",)),
    Mutant("bound_conv_path_without_residual", "a bound conv picks its path for the epilogue with its residual",
           (("rlx_runtime/kernels/nn.py", "w0, ep0 if not res0 else ep0.with_residual(np.empty(0, np.float32)),",
             "w0, ep0,"),),
           ("test_bound_kernels.py",)),
    Mutant("split_gemm_output_unaligned", "a split GEMM's float32 output starts on a cache line",
           (("rlx_runtime/threads.py", "    if dtype == np.float32 and _kernels() is not None:\n        from .aligned",
             "    if dtype == np.float64 and _kernels() is not None:\n        from .aligned"),),
           ("test_aligned.py",)),
]


def _apply(tree: Path, m: Mutant) -> list[Path]:
    """Patch the copy in place; return the files touched. Each snippet must occur exactly once."""
    touched = []
    for rel, old, new in m.patches:
        path = tree / rel
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            raise SystemExit(f"mutant {m.name}: snippet found {count} times in src/{rel} (expected once); "
                             f"update scripts/mutants.py to the current code:\n  {old!r}")
        path.write_text(text.replace(old, new))
        touched.append(path)
    return touched


def _pytest(src: Path, cache: Path, tests: tuple[str, ...]) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(src), NUMBA_CACHE_DIR=str(cache), CI="1", PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not slow and not cuda",
           *[f"tests/{t}" for t in tests]]
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # a mutant that hangs a test (a pool that never finishes) is caught too
        return 1, f"FAILED timed out after {_TIMEOUT_S} s (a hang)"
    return r.returncode, r.stdout + r.stderr


_TIMEOUT_S = 600


def _killed_by(output: str) -> str:
    hit = re.search(r"^FAILED (\S+)", output, re.M)
    return hit.group(1).removeprefix("tests/") if hit else "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="run only mutants whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if args.k in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name:24} {m.invariant}  [{', '.join(m.tests)}]")
        return 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rlx-mutants-") as tmp:
        tree, cache = Path(tmp) / "src", Path(tmp) / "numba"
        shutil.copytree(ROOT / "src", tree, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        for m in chosen:  # every snippet must be present before spending minutes on tests
            for p in _apply(tree, m):
                shutil.copy2(ROOT / "src" / p.relative_to(tree), p)
        # the unmutated copy must pass the tests the mutants rely on (and is the one being imported)
        probe = subprocess.run([sys.executable, "-c", "import rlx_format; print(rlx_format.__file__)"],
                               env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True)
        if not probe.stdout.startswith(str(tree)):
            print(f"the copy is not what gets imported: {probe.stdout.strip() or probe.stderr.strip()}")
            return 1
        files = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        t0 = time.monotonic()
        rc, out = _pytest(tree, cache, files)
        if rc != 0:
            print(out[-4000:])
            print(f"baseline: the unmutated tests fail (exit {rc}); fix them first")
            return 1
        print(f"baseline: {len(files)} test files pass on the unmutated copy ({time.monotonic() - t0:.0f} s)\n")
        print(f"{'mutant':24} {'result':9} {'seconds':>7}  killed by")
        survived = []
        for m in chosen:
            t0 = time.monotonic()
            touched = _apply(tree, m)
            try:
                rc, out = _pytest(tree, cache, m.tests)
            finally:
                for p in touched:  # restore the original bytes and mtime (numba and bytecode caches key on it)
                    shutil.copy2(ROOT / "src" / p.relative_to(tree), p)
            result = {0: "SURVIVED", 1: "killed"}.get(rc, f"error {rc}")
            if rc != 1:
                survived.append(m.name)
            by = _killed_by(out) if rc == 1 else ("-" if rc == 0 else out.strip().splitlines()[-1][:80])
            print(f"{m.name:24} {result:9} {time.monotonic() - t0:7.1f}  {by}", flush=True)
    print(f"\n{len(chosen) - len(survived)} of {len(chosen)} mutants killed in {time.monotonic() - start:.0f} s")
    if survived:
        print(f"not killed: {', '.join(survived)}: add a test that fails on that bug")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
