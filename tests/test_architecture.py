"""The package layout docs/architecture.md describes: layers import downwards only, no two modules import each
other (directly or around a loop), and no module imports another module's private names."""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
LAYERS = ["rlx_format", "rlx_runtime", "rlx_bake"]  # each may import only those before it


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[0] not in LAYERS:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imports(mods: dict[str, pathlib.Path]):
    """(module, imported module, imported name or None) for every import, lazy ones included."""
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield name, a.name, None
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    yield name, sub if sub in mods else target, None if sub in mods else a.name


def test_layers_import_downwards_only():
    mods = _modules()
    bad = []
    for src, dst, _ in _imports(mods):
        top_src, top_dst = src.split(".")[0], dst.split(".")[0]
        if top_dst in LAYERS and LAYERS.index(top_dst) > LAYERS.index(top_src):
            bad.append(f"{src} -> {dst}")
    assert bad == []


def test_no_import_cycles():
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for src, dst, _ in _imports(mods):
        if dst in mods and dst != src and not src.startswith(dst + "."):  # a package's __init__ is its parent
            graph[src].add(dst)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    loops: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert loops == []


def test_no_module_imports_private_names_of_another():
    mods = _modules()
    bad = sorted(f"{src} imports {dst}.{name}" for src, dst, name in _imports(mods)
                 if name and name.startswith("_") and not name.startswith("__") and dst in mods)
    assert bad == []


def _module_imports(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level:
        return [node.module or ""]
    return []


def test_numba_is_first_imported_through_rlxs_setup():
    """Every module that imports numba or llvmlite at its top imports rlx_format.numba_setup before them: numba's
    import there runs off a forward's CPU hold (rlx_format/cpu_hold.py), where numba sizes its thread pool, and
    points numba's cache at rlx's folder before any kernel is decorated."""
    late = []
    for name, p in _modules().items():
        if name == "rlx_format.numba_setup":
            continue
        seen_setup = False
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == "numba_setup":
                seen_setup = True  # rlx_format's own modules: from .numba_setup import numba
            for mod in _module_imports(node):
                if mod == "rlx_format.numba_setup":
                    seen_setup = True
                elif mod.split(".")[0] in ("numba", "llvmlite") and not seen_setup:
                    late.append(f"{name}: {mod}")
    assert late == []


def test_the_cli_starts_without_the_heavy_modules():
    """`rlx-bake --help` stays quick because building the CLI loads none of these (they load when a command
    runs); timing itself is benchmarked, not tested."""
    import subprocess
    import sys

    heavy = ["numba", "rich", "cryptography", "argon2", "scipy", "onnx", "rlx_runtime.kernels", "rlx_bake.pipeline",
             "rlx_format.quants", "rlx_format.sealed", "rlx_bake.passes.quant"]
    code = ("import sys\nfrom click.testing import CliRunner\nfrom rlx_bake.cli import main\n"
            "r = CliRunner().invoke(main, ['--help'])\nassert r.exit_code == 0, r.output\n"
            f"print([m for m in {heavy!r} if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_a_relu_cnn_loads_numba_at_compile_and_its_first_forward_is_every_forwards():
    """A plain Conv/Relu/pool CNN (ResNet's ops, fused or not, its 7x7 stem included) needs numba for nothing, but
    its numba conv kernels run ResNet-50 1.2-1.5x faster than im2col + BLAS (numba's import, ~0.1-0.3 s, is paid
    once at compile: ResNet-50's load + first forward stays under 0.5 s), so compile loads it, and the first forward
    already takes the numba kernels: the same bits as the second."""
    import subprocess
    import sys

    code = ("import sys, numpy as np\nfrom rlx_format import GraphBuilder\nfrom rlx_runtime import Session\n"
            "g = GraphBuilder()\nx = g.input('x', 'f32', [1, 3, 64, 64])\n"
            "rng = np.random.default_rng(0)\n"
            "s = g.relu(g.op('Conv', x, g.constant(rng.standard_normal((64, 3, 7, 7)).astype(np.float32)),"
            " pads=[3, 3, 3, 3], strides=[2, 2]))\n"
            "w = g.constant(rng.standard_normal((8, 64, 3, 3)).astype(np.float32))\n"
            "b = g.constant(np.ones(8, np.float32))\n"
            "h = g.relu(g.op('Conv', s, w, b, pads=[1, 1, 1, 1]))\n"
            "g.output(g.op('GlobalAveragePool', g.relu(g.add(h, h)), name='y'))\n"
            "c = Session().compile(g.build())\nassert 'FusedConv' in c.plan_ops(), c.plan_ops()\n"
            "loaded = 'numba' in sys.modules\nxin = rng.standard_normal((1, 3, 64, 64)).astype(np.float32)\n"
            "a, b = c.run({'x': xin})['y'], c.run({'x': xin})['y']\n"
            "print(loaded, np.array_equal(a.view(np.uint32), b.view(np.uint32)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"]
