"""Checks on the code numba compiles for a kernel: masked vector stores where a loop should store whole vectors.

LLVM's x86 back end turns a vector store of select(c, x, v), where v was loaded from the same address, into a
masked store of x (only the lanes that change). On AVX2 that is vmaskmovps, which AMD's cores run slowly (a Relu
loop 6.5x slower on Zen 3); on AVX-512 a move under a k mask.
"""

from __future__ import annotations

import re

# a vector store under a mask in AT&T syntax: vmaskmovps/pd (register, mask, memory) or an AVX-512 move to memory
# under a k mask
MASKED_STORE = re.compile(r"vmaskmovp[sd]\s+%[xy]mm\d+,\s*%[xy]mm\d+,\s*[^%\s]"
                          r"|vmov\w+\s+%[xyz]mm\d+,\s*[^%\s][^{\n]*\{%k")


def stores_back_a_select_of_the_load(llvm_ir: str) -> int:
    """Vector stores in optimized LLVM IR of a select one of whose sides is a vector loaded from the same address
    (the back end makes each a masked store). Raises if the IR has no vector float store this reads (another IR
    syntax, such as typed pointers), so that a check of a loop that stores vectors cannot pass by reading nothing."""
    stores = re.findall(r"store <\d+ x float> (%[\w.]+), ptr (%[\w.]+)", llvm_ir)
    if not stores:
        raise ValueError("no vector float store found in the IR: not the loop expected, or an IR syntax this "
                         "does not read")
    loaded = dict(re.findall(r"(%[\w.]+) = load <\d+ x float>, ptr (%[\w.]+)", llvm_ir))
    sides = {m[0]: m[1:] for m in re.findall(
        r"(%[\w.]+) = select <\d+ x i1> [^,]+, <\d+ x float> ([^,]+), <\d+ x float> ([^\s,]+)", llvm_ir)}
    return sum(1 for value, ptr in stores if any(loaded.get(side) == ptr for side in sides.get(value, ())))
