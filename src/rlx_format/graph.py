"""Graph IR and graph.json v1.

A graph declares inputs (fed at run time), params (weights bound later), constants (values
known now; `value is None` means "stored in the .rlx weight table under the same name") and
nodes, one output value per node named like the node (SSA). Loading validates everything
and reports the first problem with the node name; see spec/graph-json.md.
"""

from __future__ import annotations

import difflib
import heapq
import json
import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .constants import MAX_BODY_DEPTH, MAX_DIM, MAX_NODES, MAX_RANK, MAX_STR
from .dtypes import NUMPY_DTYPES, bf16_to_f32, check_dtype, f32_to_bf16
from .errors import GraphError, brief
from .ops import BODY_TYPES, CONTROL_OPS, LEAF_OPS, OPS, InferCtx, TensorType, bodies, normalize_attrs
from .ops.core import INT64_MAX, INT64_MIN
from .ops.infer_control import TupleType

FORMAT_NAME = "rlx.graph"
GRAPH_VERSION_MAJOR = 1
GRAPH_VERSION_MINOR = 0
_TOP_KEYS = ("format", "version", "name", "inputs", "params", "constants", "nodes", "outputs")
_BODY_KEYS = ("name", "inputs", "constants", "nodes", "outputs")  # an If/Loop/Scan body (attr kind "graph")


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Value:
    """A declared leaf: graph input, param or constant."""

    name: str
    dtype: str
    shape: tuple
    value: np.ndarray | None = None  # constants only

    @property
    def type(self) -> TensorType:
        return TensorType(self.dtype, tuple(self.shape))


class Graph:
    """A validated compute graph. Nodes are kept in topological order."""

    def __init__(self, name: str, inputs: list[Value], params: list[Value], constants: list[Value],
                 nodes: list[Node], outputs: list[str], *, validate: bool = True):
        self.name = name
        self.inputs = list(inputs)
        self.params = list(params)
        self.constants = {c.name: c for c in constants}
        self.nodes = list(nodes)
        self.outputs = list(outputs)
        self.types: dict[str, TensorType] = {}
        if validate:
            self.validate()

    # ------------------------------------------------------------------ queries
    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.inputs]

    @property
    def param_names(self) -> list[str]:
        return [v.name for v in self.params]

    def leaf_kind(self, name: str) -> str | None:
        if name in self.constants:
            return "Constant"
        if any(v.name == name for v in self.params):
            return "Param"
        if any(v.name == name for v in self.inputs):
            return "Input"
        return None

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def names(self) -> set[str]:
        """Every name the graph uses: inputs, params, constants and nodes (a set to claim new names from)."""
        return ({v.name for v in self.inputs} | {p.name for p in self.params} | set(self.constants)
                | {n.name for n in self.nodes})

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                out.setdefault(i, []).append(n)
        return out

    def copy(self) -> Graph:
        g = Graph.__new__(Graph)
        g.name = self.name
        g.inputs = [Value(v.name, v.dtype, tuple(v.shape)) for v in self.inputs]
        g.params = [Value(v.name, v.dtype, tuple(v.shape)) for v in self.params]
        g.constants = {k: Value(c.name, c.dtype, tuple(c.shape), c.value) for k, c in self.constants.items()}
        g.nodes = [Node(n.name, n.op, list(n.inputs), dict(n.attrs)) for n in self.nodes]
        g.outputs = list(self.outputs)
        g.types = dict(self.types)
        g.depth = getattr(self, "depth", 0)
        return g

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, inputs={self.input_names}, params={len(self.params)}, "
                f"constants={len(self.constants)}, nodes={len(self.nodes)}, outputs={self.outputs})")

    # ------------------------------------------------------------------ validation
    def validate(self) -> Graph:
        """Check names, ops, attrs, arity, acyclicity and infer every type. Sorts nodes."""
        seen: dict[str, str] = {}

        check_name(self.name, "graph name", empty_ok=True)

        def declare(name: object, what: str) -> None:
            check_name(name, what)
            if name in seen:
                raise GraphError(f"duplicate name {name!r:.200}: declared as {seen[name]:.250} and as {what:.250}")
            seen[name] = what

        types: dict[str, TensorType] = {}
        consts: dict[str, np.ndarray] = {}
        for kind, vals in (("input", self.inputs), ("param", self.params), ("constant", self.constants.values())):
            for v in vals:
                declare(v.name, f"{kind} {v.name!r}")
                types[v.name] = _check_value(v, kind)
                if v.value is not None:
                    consts[v.name] = v.value
        for n in self.nodes:
            declare(n.name, f"node {n.name!r}")
            if n.op in LEAF_OPS:
                raise GraphError(f"node {n.name!r}: {n.op} is declared in the {n.op.lower()}s list, not as a node")
            if n.op not in OPS:
                close = close_names(n.op, OPS, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else f"; registered ops: {', '.join(sorted(OPS))}"
                raise GraphError(f"node {n.name!r:.200}: unknown op {n.op!r:.200}{hint}")
            spec = OPS[n.op]
            if not isinstance(n.inputs, list) or not all(isinstance(i, str) for i in n.inputs):
                raise GraphError(f"node {n.name!r}: inputs must be a list of names; got {n.inputs!r}")
            if not spec.min_inputs <= len(n.inputs) <= spec.max_inputs:
                want = spec.min_inputs if spec.min_inputs == spec.max_inputs else \
                    f"{spec.min_inputs}..{spec.max_inputs}"
                raise GraphError(f"node {n.name!r} ({n.op}): {len(n.inputs)} inputs; expected {want}")
            n.attrs = {k: v for k, v in normalize_attrs(n.op, n.attrs, f"node {n.name!r}").items()}
        for n in self.nodes:
            for i in n.inputs:
                if i not in seen:
                    close = close_names(i, seen, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise GraphError(f"node {n.name!r:.200} ({n.op}): input {i!r:.200} is not defined{hint}")
        self.nodes = _toposort(self.nodes, set(types))
        self.depth = _body_depth(self)
        for n in self.nodes:
            _check_tuple_reads(n, types)
            ctx = InferCtx(n.name, n.op, [types[i] for i in n.inputs], n.attrs, [consts.get(i) for i in n.inputs])
            t = OPS[n.op].infer(ctx)
            _check_inferred(t, n)
            types[n.name] = t
            if n.op == "Shape" and ctx.inputs[0].is_static():
                consts[n.name] = np.array(ctx.inputs[0].shape, dtype=np.int64)
        if not self.outputs:
            raise GraphError("graph has no outputs; expected at least one name in 'outputs'")
        for o in self.outputs:
            if o not in types:
                raise GraphError(f"output {o!r} names nothing; expected an input, param, constant or node name")
        if len(set(self.outputs)) != len(self.outputs):
            raise GraphError(f"outputs {self.outputs} repeat a name")
        for o in self.outputs:
            if isinstance(types[o], TupleType):
                raise GraphError(f"output {o!r} is the tuple of results of a control-flow node; name one result "
                                 "(an Item node) instead")
        self.types = types
        return self

    # ------------------------------------------------------------------ JSON
    def to_dict(self, external: frozenset[str] | set[str] = frozenset()) -> dict:
        """The graph.json dict. Constants named in `external` are written without data (their bytes
        live elsewhere, e.g. the .rlx weight table)."""

        def decl(v: Value) -> dict:
            return {"name": v.name, "dtype": v.dtype, "shape": list(v.shape)}

        def const(c: Value) -> dict:
            d = decl(c)
            if c.value is not None and c.name not in external:
                d["data"] = _encode_data(c.value, c.dtype)
            return d

        def node(n: Node) -> dict:
            d: dict[str, Any] = {"name": n.name, "op": n.op, "inputs": list(n.inputs)}
            attrs = {k: v.to_body_dict() if isinstance(v, Graph) else v for k, v in _explicit_attrs(n).items()}
            if attrs:
                d["attrs"] = attrs
            return d

        return {
            "format": FORMAT_NAME, "version": GRAPH_VERSION_MAJOR, "name": self.name,
            "inputs": [decl(v) for v in self.inputs], "params": [decl(v) for v in self.params],
            "constants": [const(c) for c in self.constants.values()],
            "nodes": [node(n) for n in self.nodes], "outputs": list(self.outputs),
        }

    def to_body_dict(self) -> dict:
        """This graph as an If/Loop/Scan body: no format, version or params; constants carry their data."""
        d = self.to_dict()
        return {k: d[k] for k in _BODY_KEYS}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        """Deterministic graph.json text; also written to `path` when given."""
        text = _dump_compact(self.to_dict())
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    @classmethod
    def from_json(cls, src: str | os.PathLike | dict) -> Graph:
        """Load graph.json from a path, a JSON string, or an already-parsed dict."""
        if not isinstance(src, (str, os.PathLike)):
            return cls.from_dict(src)
        where = "graph.json"
        text = str(src)
        if isinstance(src, os.PathLike) or text.lstrip()[:1] not in ("{", "["):
            p = Path(src)
            where = str(p)
            try:
                text = p.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise GraphError(f"{p}: no such file; expected a graph.json path") from None
            except (OSError, UnicodeDecodeError) as e:
                raise GraphError(f"{p}: cannot read as UTF-8 text ({e})") from None
            except ValueError as e:  # a NUL or lone surrogate cannot be in a path
                raise GraphError(f"{brief(text)}: not a usable path ({e}); expected a graph.json path or "
                                 "JSON text") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise GraphError(f"{where}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        except RecursionError:
            raise GraphError(f"{where}: JSON nested too deeply") from None
        except ValueError as e:  # Python refuses integer literals over 4300 digits
            raise GraphError(f"{where}: a number in the JSON cannot be read ({e}); integers MUST fit int64") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Any) -> Graph:
        if not isinstance(d, dict):
            raise GraphError(f"graph must be a JSON object; got {type(d).__name__}")
        _check_document(d)
        if d.get("format") != FORMAT_NAME:
            raise GraphError(f"'format' is {d.get('format')!r}; expected {FORMAT_NAME!r}")
        major, minor = _parse_version(d.get("version"))
        extra = sorted(set(d) - set(_TOP_KEYS))
        if extra:
            if minor > GRAPH_VERSION_MINOR:
                warnings.warn(f"graph.json version {major}.{minor} fields {extra} are not understood by this "
                              f"reader (version {GRAPH_VERSION_MAJOR}.{GRAPH_VERSION_MINOR}); ignoring them",
                              stacklevel=2)
            else:
                raise GraphError(f"unknown top-level field(s) {extra}; expected only {list(_TOP_KEYS)}")
        for key in ("inputs", "params", "constants", "nodes", "outputs"):
            if not isinstance(d.get(key, []), list):
                raise GraphError(f"'{key}' must be a list; got {type(d[key]).__name__}")
            if len(d.get(key, [])) > MAX_NODES:
                raise GraphError(f"'{key}' has {len(d[key])} entries; the cap is {MAX_NODES}")
        _check_body_nesting(d)
        return cls._from_parts(d, "")

    @classmethod
    def _from_parts(cls, d: dict, where: str) -> Graph:
        name = d.get("name", "graph")
        if not isinstance(name, str):
            raise GraphError(f"{where}'name' must be a string; got {name!r}")
        inputs = [_decl_from(e, "inputs", i) for i, e in enumerate(d.get("inputs", []))]
        params = [_decl_from(e, "params", i) for i, e in enumerate(d.get("params", []))]
        consts = [_const_from(e, i) for i, e in enumerate(d.get("constants", []))]
        nodes = [_node_from(e, i) for i, e in enumerate(d.get("nodes", []))]
        outputs = d.get("outputs", [])
        if not all(isinstance(o, str) for o in outputs):
            raise GraphError(f"'outputs' must be a list of names; got {outputs!r}")
        return cls(name, inputs, params, consts, nodes, outputs)


# ---------------------------------------------------------------------- helpers

# C0/C1 control characters (NUL, newline, ...) and lone surrogates, which cannot be encoded as UTF-8
_BAD_NAME_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, else `base_2`, `base_3`, ...: the first name not in `taken`, which it then joins. Passes that
    add nodes claim their names here (from `graph.names()`), so they never collide with the model's."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def check_name(name: object, what: str, empty_ok: bool = False) -> str:
    """Names (values, symbolic dims, the graph): strings of 1..MAX_STR characters, no control characters,
    no lone surrogates (spec/graph-json.md, Names)."""
    if not isinstance(name, str) or not (name or empty_ok) or len(name) > MAX_STR:
        raise GraphError(f"{what}: name must be a non-empty string of at most {MAX_STR} characters; "
                         f"got {brief(name)}")
    bad = _BAD_NAME_CHAR.search(name)
    if bad:
        raise GraphError(f"{what}: name {brief(name)} contains {bad.group()!r} at position {bad.start()}; "
                         "expected no control characters or lone surrogates")
    return name


def _check_document(d: dict) -> None:
    """Document-wide number and string rules, before any field is read (spec/graph-json.md, Numbers and
    strings): integers fit int64, no string or key holds a lone surrogate. Iterative: no depth limit."""
    stack: list[tuple[tuple, Any]] = [((), d)]
    while stack:
        path, v = stack.pop()
        bad = None
        if isinstance(v, int) and not isinstance(v, bool):
            if not INT64_MIN <= v <= INT64_MAX:
                bad = (f"{brief(v)} does not fit int64; expected integers in -2^63..2^63-1 (a float needs a "
                       "decimal point or an exponent)")
        elif isinstance(v, str):
            if not v.isascii() and _SURROGATE.search(v):
                bad = f"{brief(v)} holds a lone surrogate, which UTF-8 cannot encode"
        elif isinstance(v, dict):
            for k, e in v.items():
                if isinstance(k, str) and not k.isascii() and _SURROGATE.search(k):
                    path, bad = (*path, k), f"key {brief(k)} holds a lone surrogate, which UTF-8 cannot encode"
                    break
                stack.append(((*path, k), e))
        elif isinstance(v, list) and not all(type(e) is float or type(e) is int and INT64_MIN <= e <= INT64_MAX
                                             for e in v):  # plain number lists (constant data) need no walk
            stack.extend(((*path, i), e) for i, e in enumerate(v))
        if bad:
            raise GraphError(f"{_json_path(d, path)}: {bad}")


def _json_path(d: dict, path: tuple) -> str:
    """`nodes[3] 'y': attrs.alpha`-style location of a value in a graph document."""
    head, rest = "graph", path
    if len(path) >= 2 and isinstance(path[1], int):
        head = f"{path[0]}[{path[1]}]"
        name = d[path[0]][path[1]].get("name") if isinstance(d[path[0]][path[1]], dict) else None
        if isinstance(name, str) and path[2:] != ("name",):
            head += f" {brief(name)}"
        rest = path[2:]
    elif path:
        head, rest = str(path[0]), path[1:]
    tail = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" if isinstance(k, str) and k.isidentifier()
                   else f"[{brief(k)}]" for k in rest)
    return head + (f" {tail.lstrip('.')}" if tail else "")


def _check_inferred(t: TensorType, n: Node) -> None:
    """Every inferred shape obeys the limits of a declared one: a negative dim (Tile by -1, ConvTranspose
    over-padded) or a huge one must fail here, not at run time."""
    if isinstance(t, TupleType):
        for item in t.items:
            _check_inferred(item, n)
        return
    if t.rank > MAX_RANK:
        raise GraphError(f"node {n.name!r} ({n.op}): output rank {t.rank} exceeds the cap of {MAX_RANK}")
    for d in t.shape:
        if isinstance(d, int) and not 0 <= d <= MAX_DIM:
            raise GraphError(f"node {n.name!r} ({n.op}): inferred output shape {brief(list(t.shape))} has dim "
                             f"{brief(d)}; expected dims in 0..{MAX_DIM} (check the attrs and constant inputs "
                             "that size it)")


HINT_BUDGET = 2_000_000  # character pairs a "did you mean" hint may compare: len(name) x candidate lengths


def close_names(name: str, candidates: Iterable[str], n: int = 1) -> list[str]:
    """Up to `n` close matches of `name` for a "did you mean" hint, with bounded work.

    difflib's ratio() is quadratic in the string lengths: only candidates whose length allows a match
    are compared, until HINT_BUDGET pairs are spent (so names over ~2,000 characters get no hint).
    """
    lo, hi = (3 * len(name) + 6) // 7, 7 * len(name) // 3  # difflib's 0.6 cutoff needs lengths in this range
    pool, cost = [], 0
    for c in candidates:
        if lo <= len(c) <= hi:
            cost += len(name) * len(c)
            if cost > HINT_BUDGET:
                break
            pool.append(c)
    return difflib.get_close_matches(name, pool, n=n)


def _dump_compact(d: dict) -> str:
    """One list entry per line: diff-friendly and still plain JSON."""
    lines = ["{"]
    keys = list(d)
    for k_i, k in enumerate(keys):
        v = d[k]
        tail = "," if k_i < len(keys) - 1 else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f" {json.dumps(k)}: [")
            for i, e in enumerate(v):
                sep = "," if i < len(v) - 1 else ""
                lines.append("  " + json.dumps(e, ensure_ascii=False, separators=(", ", ": ")) + sep)
            lines.append(" ]" + tail)
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{tail}")
    lines.append("}")
    return "\n".join(lines) + "\n"


BODY_TYPES.append(Graph)  # graph-valued attrs (If/Loop/Scan bodies) hold Graphs


def _parse_version(v: Any) -> tuple[int, int]:
    if isinstance(v, bool) or v is None:
        raise GraphError(f"'version' is {v!r}; expected {GRAPH_VERSION_MAJOR} or \"{GRAPH_VERSION_MAJOR}.N\"")
    if isinstance(v, int):
        major, minor = v, 0
    elif isinstance(v, str) and re.fullmatch(r"[0-9]{1,9}\.[0-9]{1,9}", v):
        major, minor = (int(p) for p in v.split("."))
    else:
        raise GraphError(f"'version' is {v!r}; expected {GRAPH_VERSION_MAJOR} or \"{GRAPH_VERSION_MAJOR}.N\"")
    if major != GRAPH_VERSION_MAJOR:
        raise GraphError(f"graph.json version {v} is not supported by this reader (major version "
                         f"{GRAPH_VERSION_MAJOR}); upgrade rlx to read it")
    return major, minor


def _check_shape(shape: Any, where: str) -> tuple:
    if not isinstance(shape, (list, tuple)):
        raise GraphError(f"{where}: shape must be a list; got {shape!r:.80}")
    if len(shape) > MAX_RANK:
        raise GraphError(f"{where}: rank {len(shape)} exceeds the cap of {MAX_RANK}")
    for d in shape:
        if isinstance(d, str):
            check_name(d, f"{where}: symbolic dim")
        elif not (isinstance(d, (int, np.integer)) and not isinstance(d, bool) and 0 <= d <= MAX_DIM):
            raise GraphError(f"{where}: dim {brief(d)} in shape {brief(list(shape))}; expected an int in "
                             f"0..{MAX_DIM} or a name")
    return tuple(int(d) if not isinstance(d, str) else d for d in shape)


def _check_value(v: Value, kind: str) -> TensorType:
    where = f"{kind} {v.name!r}"
    check_dtype(v.dtype, where)
    v.shape = _check_shape(v.shape, where)
    if v.value is not None:
        if kind != "constant" or any(isinstance(d, str) for d in v.shape):
            raise GraphError(f"{where}: only constants with static shapes carry data")
        want = NUMPY_DTYPES[v.dtype]
        if v.value.dtype.newbyteorder("=") != want.newbyteorder("=") or tuple(v.value.shape) != tuple(v.shape):
            raise GraphError(f"{where}: data is {v.value.dtype}{list(v.value.shape)}; expected "
                             f"{v.dtype}{list(v.shape)}")
    return v.type


def _entry(e: Any, section: str, i: int, keys: Iterable[str]) -> dict:
    if not isinstance(e, dict):
        raise GraphError(f"{section}[{i}] must be an object; got {type(e).__name__}")
    missing = [k for k in keys if k not in e]
    if missing:
        raise GraphError(f"{section}[{i}] ({e.get('name', '?')!r}) is missing {missing}")
    check_name(e["name"], f"{section}[{i}]")
    return e


def _decl_from(e: Any, section: str, i: int) -> Value:
    e = _entry(e, section, i, ("name", "dtype", "shape"))
    where = f"{section}[{i}] {e['name']!r}"
    return Value(e["name"], check_dtype(e["dtype"], where), _check_shape(e["shape"], where))


def _const_from(e: Any, i: int) -> Value:
    v = _decl_from(e, "constants", i)
    if "data" in e:
        v.value = _decode_data(e["data"], v, f"constants[{i}] {v.name!r}")
    return v


def _node_from(e: Any, i: int) -> Node:
    e = _entry(e, "nodes", i, ("name", "op"))
    if not isinstance(e["op"], str):
        raise GraphError(f"nodes[{i}] {e['name']!r}: op must be a string; got {e['op']!r}")
    attrs = e.get("attrs", {}) or {}
    spec = OPS.get(e["op"])
    if spec is not None and isinstance(attrs, dict):
        for k, a in spec.attrs.items():
            if a.kind == "graph" and isinstance(attrs.get(k), dict):
                attrs = {**attrs, k: _body_from(attrs[k], f"node {e['name']!r} ({e['op']}) attr {k!r}")}
    return Node(e["name"], e["op"], e.get("inputs", []), attrs)


def _body_from(d: dict, where: str) -> Graph:
    """An If/Loop/Scan body (spec/graph-json.md, Bodies): a closed graph without params; errors say where."""
    extra = sorted(set(d) - set(_BODY_KEYS))
    if extra:
        raise GraphError(f"{where}: unknown body field(s) {extra}; expected only {list(_BODY_KEYS)} (a body has no "
                         "params: it reads weights as captured inputs)")
    for key in ("inputs", "constants", "nodes", "outputs"):
        if not isinstance(d.get(key, []), list):
            raise GraphError(f"{where}: '{key}' must be a list; got {type(d[key]).__name__}")
    try:
        return Graph._from_parts(d, "")
    except GraphError as e:
        raise GraphError(f"{where}: {e}") from None


def _check_body_nesting(d: dict) -> None:
    """Before any body is built (bodies are built recursively): nesting depth <= MAX_BODY_DEPTH and at most
    MAX_NODES nodes in all graphs together. Iterative."""
    stack, total = [(d, 0)], 0
    while stack:
        g, depth = stack.pop()
        nodes = g.get("nodes", [])
        if not isinstance(nodes, list):
            continue  # the graph's own checks name it
        total += len(nodes)
        if total > MAX_NODES:
            raise GraphError(f"the graph and its bodies have more than {MAX_NODES} nodes in all (the cap)")
        for e in nodes:
            spec = OPS.get(e.get("op")) if isinstance(e, dict) and isinstance(e.get("op"), str) else None
            attrs = e.get("attrs") if spec is not None else None
            if not isinstance(attrs, dict):
                continue
            for k, a in spec.attrs.items():
                if a.kind == "graph" and isinstance(attrs.get(k), dict):
                    if depth + 1 > MAX_BODY_DEPTH:
                        raise GraphError(f"node {brief(e.get('name'))} ({e['op']}): bodies nested more than "
                                         f"{MAX_BODY_DEPTH} deep; the cap is {MAX_BODY_DEPTH}")
                    stack.append((attrs[k], depth + 1))


def _body_depth(g: Graph) -> int:
    """How deep bodies nest below `g` (0: none), from the bodies' own (already validated) depths."""
    depth = 0
    for n in g.nodes:
        if n.op not in CONTROL_OPS:
            continue
        for b in bodies(n):
            if isinstance(b, Graph):
                depth = max(depth, getattr(b, "depth", 0) + 1)
    if depth > MAX_BODY_DEPTH:
        raise GraphError(f"bodies nested {depth} deep; the cap is {MAX_BODY_DEPTH}")
    return depth


def _check_tuple_reads(n: Node, types: dict) -> None:
    for i in n.inputs:
        if isinstance(types[i], TupleType) and n.op != "Item":
            raise GraphError(f"node {n.name!r} ({n.op}): input {i!r} is the tuple of results of a control-flow "
                             "node; read one result with an Item node (attr index)")


def _decode_data(data: Any, v: Value, where: str) -> np.ndarray:
    if any(isinstance(d, str) for d in v.shape):
        raise GraphError(f"{where}: a constant with data needs a static shape; got {list(v.shape)}")
    try:
        flat = np.array(data, dtype=np.float64 if v.dtype in ("f32", "f16", "bf16", "f64") else None)
    except (TypeError, ValueError) as e:
        raise GraphError(f"{where}: data is not a list of numbers ({e})") from None
    if flat.dtype == object or flat.ndim > 1:
        raise GraphError(f"{where}: data must be a flat list of numbers in C order")
    n = int(np.prod(v.shape, dtype=np.int64))
    if flat.size != n:
        raise GraphError(f"{where}: data has {flat.size} values; expected {n} for shape {list(v.shape)}")
    want = NUMPY_DTYPES[v.dtype]
    if want.kind == "f" or v.dtype == "bf16":
        with np.errstate(over="ignore"):
            narrow = flat.astype(np.float32 if v.dtype == "bf16" else want)
        if np.any(np.isinf(narrow) & np.isfinite(flat)):
            raise GraphError(f"{where}: data has values outside the {v.dtype} range")
        return (f32_to_bf16(narrow) if v.dtype == "bf16" else narrow).reshape(v.shape)
    if v.dtype == "bool" and not np.isin(flat, (0, 1)).all():
        raise GraphError(f"{where}: bool data must be true/false or 0/1")
    if want.kind in "iu" and flat.size and (flat.dtype.kind not in "iub"):
        raise GraphError(f"{where}: integer constant has non-integer data")
    if want.kind in "iu" and flat.size and (flat.min() < np.iinfo(want).min or flat.max() > np.iinfo(want).max):
        raise GraphError(f"{where}: data has values outside the {v.dtype} range")
    return flat.astype(want).reshape(v.shape)


def _encode_data(a: np.ndarray, dtype: str) -> list:
    if dtype == "bf16":
        return bf16_to_f32(a).ravel().astype(np.float64).tolist()
    return np.asarray(a).ravel().tolist()


def _explicit_attrs(n: Node) -> dict:
    """Attrs that differ from their catalogue default (so round trips are stable)."""
    spec = OPS[n.op]
    return {k: v for k, v in n.attrs.items() if k in spec.attrs and v != spec.attrs[k].default}


def _toposort(nodes: list[Node], leaves: set[str]) -> list[Node]:
    """Kahn's algorithm, stable with respect to the given order; iterative (no recursion)."""
    index = {n.name: i for i, n in enumerate(nodes)}
    indeg = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for src in set(n.inputs):
            if src in index:
                indeg[i] += 1
                users[index[src]].append(i)
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = [nodes[i].name for i, d in enumerate(indeg) if d > 0]
        raise GraphError(f"graph has a cycle through node {stuck[0]!r} ({len(stuck)} nodes involved); "
                         "expected a DAG")
    if order == list(range(len(nodes))):
        return nodes
    return [nodes[i] for i in order]
