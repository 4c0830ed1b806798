"""The rlx-bake command line: a thin shell over the library. Only this package (rlx_bake.cli: the commands,
passwords.py for where a password comes from, display.py for safe terminal text) prints, prompts and exits."""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path

import click
import numpy as np

from rlx_format.constants import KDF_PROFILE_NAMES
from rlx_format.errors import RlxError
from rlx_format.files import atomic_write, check_output_path, open_for_reading
from rlx_format.lazy import LazyModule

from ..options import AUTO, DEFAULT_MIN_COSINE, DEFAULT_PROFILE, DEFAULT_QUANT_TYPE, DENSE, PROFILES, BakeOptions
from ..passes.registry import PROFILE_HELP, STAGES
from ..quant_choice import quant_types
from .display import markup_safe, plain, printable
from .passwords import password_options, resolve_password


# imported when a command needs them: `rlx-bake --help` loads neither the bake pipeline, the loaders nor the
# sealing libraries (cryptography, argon2)
_sealed = LazyModule("rlx_format.sealed")
_fmt = LazyModule("rlx_format")
_loader = LazyModule("rlx_bake.loader")
_pipeline = LazyModule("rlx_bake.pipeline")


class DefaultGroup(click.Group):
    """`rlx-bake INPUT -o OUT` means `rlx-bake bake INPUT -o OUT`; the global options work anywhere."""

    GLOBAL = ("-q", "--quiet", "--debug")

    def parse_args(self, ctx, args):
        # -q/--debug may come after the command's own arguments: move them in front (before any `--`)
        end = args.index("--") if "--" in args else len(args)
        glob = [a for a in args[:end] if a in self.GLOBAL]
        rest = [a for a in args[:end] if a not in self.GLOBAL] + args[end:]
        # a command name or the group's own --help/--version first: the group; anything else is a bake
        if rest and rest[0] not in self.commands and rest[0] not in ("-h", "--help", "--version"):
            rest = ["bake", *rest]
        return super().parse_args(ctx, [*glob, *rest])


class State:
    def __init__(self, quiet: bool, debug: bool):
        self.quiet, self.debug = quiet, debug
        # emoji off too: a name like ':cross_mark:' must show as typed
        from rich.console import Console  # rich loads when a command runs, not for --help

        self.err = Console(stderr=True, quiet=quiet, highlight=False, emoji=False)
        self.out = Console(highlight=False, emoji=False)
        for c in (self.err, self.out):
            if not c.is_terminal:  # pipes and logs: don't squeeze tables into 80 columns
                c.width = 200


@contextmanager
def handled(state: State):
    """Library errors -> one paragraph on stderr and exit 1; --debug shows the traceback."""
    try:
        yield
    except RlxError as e:
        if state.debug:
            traceback.print_exc()
        click.echo(f"error: {printable(str(e), newlines=True)}", err=True)
        sys.exit(1)
    except OSError as e:
        if state.debug:
            traceback.print_exc()
        where = "" if e.filename is None else str(e.filename)
        click.echo(f"error: {printable(where)}: {printable(str(e.strerror or e))}", err=True)
        sys.exit(1)


@contextmanager
def progress(state: State, what: str):
    """A spinner with the current step on a terminal; silent otherwise."""
    if state.quiet or not state.err.is_terminal:
        yield lambda _msg: None
        return
    with state.err.status(what) as status:
        yield lambda msg: status.update(f"{what}: {msg}")


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option("0.1.0", prog_name="rlx-bake")
@click.option("-q", "--quiet", is_flag=True, help="No progress, tables or 'wrote' lines (anywhere on the line).")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors (anywhere on the line).")
@click.pass_context
def main(ctx, quiet, debug):
    """Bake a model (graph + weights) into one .rlx file, and inspect, seal, verify or run .rlx files.

    \b
    rlx-bake MODEL -o model.rlx                 bake (MODEL: graph.json, bundle dir or .onnx)
    rlx-bake inspect model.rlx                  graph, I/O, weight table, meta
    rlx-bake run model.rlx --input x=x.npy      run on CPU (--device cuda for a GPU)
    """
    ctx.obj = State(quiet, debug)


def _stage_flags(f):
    """One --X/--no-X option per bake stage (passes/registry.py); None keeps the profile's choice."""
    for stage in reversed(STAGES):
        if stage.flag == "quant":  # --quant takes the type; --no-quant is below
            continue
        f = click.option(f"--{stage.flag}/--no-{stage.flag}", default=None, help=stage.help)(f)
    return f


def _parse_overrides(specs: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    out = []
    for spec in specs:
        glob, sep, t = spec.rpartition("=")
        if not sep or not glob or not t:
            raise click.BadParameter(f"{spec!r}; expected GLOB=TYPE, e.g. 'emb.*=q8_0' or 'head.*={DENSE}'",
                                     param_hint="--quant-weight")
        out.append((glob, t.strip().lower()))
    return tuple(out)


_QUANT_HELP = next(s.help for s in STAGES if s.flag == "quant")


@main.command("bake")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Output .rlx file.")
@click.option("--weights", type=click.Path(path_type=Path), help="safetensors file (default: the bundle's).")
@click.option("--opt", "profile", type=click.Choice(list(PROFILES)), default=DEFAULT_PROFILE, show_default=True,
              help="; ".join(f"{k}: {v}" for k, v in PROFILE_HELP.items()) + ".")
@_stage_flags
@click.option("--quant", "quant_type", type=click.Choice([*quant_types(), AUTO]), default=None, metavar="TYPE|auto",
              help=f"{_QUANT_HELP} TYPE: {', '.join(quant_types())} (the size profile's default: "
                   f"{DEFAULT_QUANT_TYPE}); auto: per weight the smallest type whose cosine stays >= --max-error.")
@click.option("--no-quant", is_flag=True, help="Do not quantize (overrides the size profile).")
@click.option("--max-error", "--min-cosine", "min_cosine", type=click.FloatRange(-1.0, 1.0), default=None,
              metavar="COS", help=f"--quant auto: the lowest weight cosine (dequantized vs f32) accepted "
                                  f"(default {DEFAULT_MIN_COSINE}).")
@click.option("--quant-weight", "quant_weights", multiple=True, metavar="GLOB=TYPE",
              help=f"Per-weight type by glob over param names, e.g. 'emb.*=q8_0' (repeatable, the last match wins; "
                   f"TYPE may be auto or {DENSE}).")
@click.option("--strict", is_flag=True, help="Error if a param has no weight.")
@password_options
@click.option("--kdf", type=click.Choice(list(KDF_PROFILE_NAMES)), default="default", show_default=True,
              help="Argon2id strength when sealing (default = RFC 9106 64 MiB, t=3, p=4).")
@click.option("--report-json", type=click.Path(path_type=Path), help="Also write the bake report as JSON.")
@click.pass_obj
def bake_cmd(state, input_path, output, weights, profile, quant_type, no_quant, min_cosine, quant_weights, strict,
             password_env, password_stdin, password_value, kdf, report_json, **flags):
    """Bake INPUT into OUTPUT (.rlx), optionally sealed with a password."""
    if quant_type is not None and no_quant:
        raise click.UsageError("--quant and --no-quant contradict each other; give one of them")
    if (quant_weights or min_cosine is not None) and no_quant:
        raise click.UsageError("--quant-weight and --max-error choose how to quantize; they contradict --no-quant")
    quant = True if quant_type is not None else (False if no_quant else None)
    overrides = _parse_overrides(quant_weights)
    with handled(state):
        for path in (output, report_json):  # a path that cannot be written fails before the password and the bake
            if path is not None:
                check_output_path(path)
        opts = BakeOptions.from_profile(profile, quant=quant, quant_type=quant_type, quant_min_cosine=min_cosine,
                                        quant_weights=overrides, strict=strict, **flags)
        password = resolve_password(password_env, password_stdin, password_value, confirm=True)  # before the bake
        with progress(state, "baking") as step:
            step("loading")
            graph, ws = _loader.load_graph(input_path, weights)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rf, report = _pipeline.bake(graph, ws, opts, step)
            for w in caught:
                click.echo(f"warning: {printable(str(w.message), newlines=True)}", err=True)
            step("writing")
            if password is not None:
                _sealed.write_rlx_encrypted(output, rf, password, _sealed.KDF_PROFILES[kdf])
            else:
                _fmt.write_rlx(output, rf)
            if report_json is not None:
                text = json.dumps(report.to_dict(), indent=1) + "\n"
                atomic_write(report_json, lambda f: f.write(text.encode()))
        _print_report(state, report, output, password is not None)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _print_report(state: State, report, output: Path, sealed: bool) -> None:
    from rich.table import Table

    # names, notes and reasons come from the input model: markup_safe() before rich sees them
    t = Table(title=markup_safe(f"{output} ({report.profile}{', sealed' if sealed else ''})"), title_justify="left")
    for col in ("weight", "encoding", "shape", "before", "after", "max abs err", "cosine", "note"):
        t.add_column(col)
    for w in report.weights:
        t.add_row(markup_safe(w.name), markup_safe(w.encoding), markup_safe("x".join(map(str, w.shape))),
                  _fmt_bytes(w.bytes_before), _fmt_bytes(w.bytes_after),
                  "" if w.max_abs_err is None else f"{w.max_abs_err:.3g}",
                  "" if w.cosine is None else f"{w.cosine:.6f}", markup_safe(w.note))
    state.err.print(t)
    state.err.print(f"nodes {report.nodes_before} -> {report.nodes_after}; weights "
                    f"{_fmt_bytes(report.total_bytes_before)} -> {_fmt_bytes(report.total_bytes)}; "
                    f"{report.summary()}")
    if report.params_unbound:
        state.err.print(f"params left unbound (set them at run time): {markup_safe(report.params_unbound)}")
    for note in report.notes:
        state.err.print(f"note: {markup_safe(note)}")
    for r in report.folds_refused:
        state.err.print(f"fold refused: {markup_safe(r['node'])} ({markup_safe(r['op'])}): {markup_safe(r['reason'])}")
    _wrote(state, printable(str(output)))


def _wrote(state: State, what: str) -> None:
    """The `wrote FILE` line on stdout; -q silences it too."""
    if not state.quiet:
        click.echo(f"wrote {what}")


def _password_for(path: Path, env, stdin, value) -> str | None:
    return resolve_password(env, stdin, value, confirm=False) if _sealed.is_encrypted(path) else None


def _open(path: Path, env, stdin, value, verify: bool = False):
    return _fmt.read_rlx(path, password=_password_for(path, env, stdin, value), verify=verify)


@main.command("import-onnx")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="Bundle directory to write (graph.json + weights.safetensors).")
@click.pass_obj
def import_onnx_cmd(state, model, output):
    """Convert an ONNX model into a bundle directory (graph.json + weights.safetensors)."""
    from ..onnx import import_onnx
    with handled(state):
        _loader.check_bundle_output(output)
        graph, ws = import_onnx(model)
        _loader.write_bundle(output, graph, ws)
        _wrote(state, f"{output / 'graph.json'} and {output / 'weights.safetensors'} "
                      f"({len(graph.nodes)} nodes, {len(ws)} weights)")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@password_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def inspect(state, path, password_env, password_stdin, password_value, as_json):
    """Show the graph, I/O, weight table and meta (sealed files: the header, or all with a password)."""
    with handled(state):
        if _sealed.is_encrypted(path) and password_env is None and not password_stdin and password_value is None:
            h = _sealed.read_seal_header(path)
            info = {"file": str(path), "encrypted": True, "format": "RLXENC01", "kdf": "argon2id",
                    "memory_kib": h.kdf.memory_kib, "iterations": h.kdf.iterations, "lanes": h.kdf.lanes,
                    "chunk_size": h.chunk_size, "plaintext_bytes": h.length, "chunks": h.n_chunks}
            if as_json:
                click.echo(json.dumps(info, indent=1))
            else:
                for k, v in info.items():
                    click.echo(f"{k}: {printable(str(v))}")
                click.echo("(pass --password-env VAR or --password-stdin to see the contents)")
            return
        rf = _open(path, password_env, password_stdin, password_value)
        g = rf.graph
        info = {"file": str(path), "schema_version": rf.version, "graph": g.name, "nodes": len(g.nodes),
                "ops": _op_counts(g), "inputs": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape)}
                                                 for v in g.inputs],
                "outputs": [{"name": o, **g.types[o].to_json()} for o in g.outputs],
                "params": [{"name": v.name, "dtype": v.dtype, "shape": list(v.shape)} for v in g.params],
                "weights": [{"name": w.name, "encoding": w.encoding, "shape": list(w.shape), "nbytes": w.nbytes,
                             "digest": w.digest, "note": w.note} for w in rf.weights.values()],
                "meta": plain({k: v for k, v in rf.meta.items() if k != "bake"})}
        if as_json:  # ensure_ascii (the default): control and bidi characters arrive as \uXXXX escapes
            click.echo(json.dumps(info, indent=1, default=str))
            return
        # everything below except the fixed words comes from the file: markup_safe() it all
        out = state.out
        out.print(f"[bold]{markup_safe(str(path))}[/bold]  RLXBAKE1 v{rf.version}  graph {markup_safe(repr(g.name))}: "
                  f"{len(g.nodes)} nodes")
        out.print(markup_safe("ops: " + ", ".join(f"{k} x{v}" for k, v in info["ops"].items())))
        for kind in ("inputs", "outputs", "params"):
            for v in info[kind]:
                out.print(markup_safe(f"{kind[:-1]:>6} {v['name']}: {v['dtype']}{v['shape']}"))
        from rich.table import Table

        t = Table("weight", "encoding", "shape", "bytes", "digest", "note")
        for w in info["weights"]:
            t.add_row(*map(markup_safe, (w["name"], w["encoding"], "x".join(map(str, w["shape"])), w["nbytes"],
                                         w["digest"] or "", w["note"])))
        out.print(t)
        out.print(markup_safe(f"meta: tool={_meta_text(rf.meta.get('tool'))}"))
        for k, v in rf.meta.items():
            if k not in ("tool", "bake", "inputs", "outputs", "params"):  # I/O is shown above from the graph
                out.print(markup_safe(f"meta: {_meta_text(k)}={_meta_text(v)}"))
        b = rf.meta.get("bake")
        if isinstance(b, dict) and isinstance(b.get("counts"), dict):
            c, m = b["counts"], _meta_text
            out.print(markup_safe(
                f"bake: profile {m(b.get('profile'))}; nodes {m(b.get('nodes_before'))} -> {m(b.get('nodes_after'))}; "
                f"weights {_meta_bytes(b.get('total_bytes_before', 0))} -> {_meta_bytes(b.get('total_bytes', 0))}; "
                f"skipped {m(c.get('skipped'))}, ternary {m(c.get('ternary'))}, quant {m(c.get('quant'))}"
                + (f" ({m(b['quant_type'])})" if b.get("quant_type") is not None else "")))


def _meta_text(v) -> str:
    """A meta value as one line of text: strings as they are, anything else as compact JSON."""
    return v if isinstance(v, str) else json.dumps(plain(v), ensure_ascii=False, default=str)


def _meta_bytes(v) -> str:
    """A byte count from meta; a value that is not a number is shown as it is, not computed with."""
    return _fmt_bytes(v) if type(v) in (int, float) else _meta_text(v)


def _op_counts(g) -> dict:
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    return dict(sorted(counts.items()))


@main.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@password_options
@click.option("--kdf", type=click.Choice(list(KDF_PROFILE_NAMES)), default="default", show_default=True)
@click.pass_obj
def encrypt(state, src, output, password_env, password_stdin, password_value, kdf):
    """Seal a plaintext .rlx file (streamed; any size)."""
    with handled(state):
        check_output_path(output)
        pw = resolve_password(password_env, password_stdin, password_value, confirm=True)
        if pw is None:
            raise click.UsageError("encrypt needs a password: --password-env VAR, --password-stdin or --password")
        if _sealed.is_encrypted(src):
            raise RlxError(f"{src}: already encrypted")
        _sealed.encrypt_file(src, output, pw, _sealed.KDF_PROFILES[kdf])
        _wrote(state, str(output))


@main.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path))
@password_options
@click.pass_obj
def decrypt(state, src, output, password_env, password_stdin, password_value):
    """Unseal to a plaintext .rlx file (writes plaintext to disk)."""
    with handled(state):
        check_output_path(output)
        if not _sealed.is_encrypted(src):
            raise RlxError(f"{src}: not an encrypted rlx file (or missing)")
        pw = resolve_password(password_env, password_stdin, password_value, confirm=False)
        if pw is None:
            raise click.UsageError("decrypt needs a password: --password-env VAR, --password-stdin or --password")
        _sealed.decrypt_file(src, output, pw)
        _wrote(state, str(output))


def _random_feeds(graph, seed: int, shapes: dict | None = None, given: dict | None = None, sym: int = 2) -> dict:
    """Seeded random inputs: `given` arrays as they are, `shapes` where named, symbolic dims `sym` elsewhere."""
    r = np.random.default_rng(seed)
    feeds = {}
    for v in graph.inputs:
        if given and v.name in given:
            feeds[v.name] = given[v.name]
            continue
        shape = (shapes or {}).get(v.name) or [d if isinstance(d, int) else sym for d in v.shape]
        if v.dtype in ("f32", "f16", "f64", "bf16"):
            a = r.standard_normal(shape).astype(np.float32 if v.dtype == "bf16" else v.dtype.replace("f", "float"))
        elif v.dtype == "bool":
            a = r.random(shape) < 0.5
        else:
            a = r.integers(0, 2, shape).astype({"i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
                                                "u8": np.uint8}[v.dtype])
        feeds[v.name] = a
    return feeds


def _parse_shapes(graph, specs: tuple[str, ...], given: dict) -> dict[str, list[int]]:
    """--shape NAME=1x3x640x640 entries, checked against the graph's inputs (rank and static dims)."""
    by_name = {v.name: v for v in graph.inputs}
    out: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition("=")
        try:
            shape = [int(d) for d in dims.split("x")] if sep and name else None
        except ValueError:
            shape = None
        if shape is None or any(d < 0 for d in shape):
            raise click.BadParameter(f"{spec!r}; expected NAME=DIMxDIMx... with non-negative integers, "
                                     "e.g. x=1x3x640x640", param_hint="--shape")
        _check_input_name(name, by_name, "--shape")
        if name in given:
            raise click.BadParameter(f"{name!r} is given by --input too; give one of them", param_hint="--shape")
        want = by_name[name].shape
        if len(shape) != len(want) or any(isinstance(w, int) and w != d for w, d in zip(want, shape)):
            raise RlxError(f"--shape {name}: {shape} does not fit the input's declared shape {list(want)}; "
                           "give one integer per dim and keep the fixed dims")
        out[name] = shape
    return out


def _check_input_name(name: str, by_name: dict, option: str) -> None:
    if name not in by_name:
        raise RlxError(f"{option} {printable(name)}: the source graph has no input of that name; its inputs are "
                       f"{', '.join(printable(n) for n in by_name)}")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--against", type=click.Path(path_type=Path), help="Source graph.json / bundle to compare outputs with.")
@click.option("--weights", type=click.Path(path_type=Path), help="Weights for --against.")
@click.option("--seed", default=0, show_default=True)
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy",
              help="With --against: an input array to run both on (repeatable); other inputs are random.")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=1x3x640x640",
              help="With --against: the shape of a random input (repeatable); unnamed symbolic dims are 2.")
@password_options
@click.pass_obj
def verify(state, path, against, weights, seed, inputs, shapes, password_env, password_stdin, password_value):
    """Check every digest and the padding (exit 1 if any weight has no digest); with --against, also run
    both on the same inputs (--input files, else seeded random ones shaped by --shape) and compare outputs."""
    from rlx_runtime import Session
    with handled(state):
        rf = _open(path, password_env, password_stdin, password_value)
        click.echo(f"{path}: {rf.verify()} weight digests OK")
        if against is None:
            if inputs or shapes:
                raise click.UsageError("--input and --shape choose the inputs of --against; give --against SRC")
            return
        graph, ws = _loader.load_graph(against, weights)
        by_name = {v.name: v for v in graph.inputs}
        given = {}
        for spec in inputs:
            name, sep, file = spec.partition("=")
            if not sep or not name:
                raise click.BadParameter(f"{spec!r}; expected NAME=FILE.npy", param_hint="--input")
            _check_input_name(name, by_name, "--input")
            given[name] = _load_npy(name, file)
        sizes = _parse_shapes(graph, shapes, given)
        ref = Session().compile(graph)
        for name in graph.param_names:
            if name in ws:
                ref.set_param(name, ws[name])
        baked = Session().compile(rf)
        feeds = _random_feeds(graph, seed, sizes, given)
        a, b = ref.run(feeds), baked.run(feeds)
        for name in graph.outputs:
            if np.shape(a[name]) != np.shape(b[name]):
                raise RlxError(f"output {printable(name)}: the baked file gives shape {list(np.shape(b[name]))}, "
                               f"the source {list(np.shape(a[name]))}; the file does not match its source")
            x, y = np.asarray(a[name], np.float64).ravel(), np.asarray(b[name], np.float64).ravel()
            diff = float(np.max(np.abs(x - y))) if x.size else 0.0
            den = np.linalg.norm(x) * np.linalg.norm(y)
            cos = float(x @ y / den) if den else 1.0
            click.echo(f"output {printable(name)}: max abs diff {diff:.3g}, cosine {cos:.8f} "
                       f"(shape {list(np.shape(a[name]))})")


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--input", "inputs", multiple=True, metavar="NAME=FILE.npy", help="An input array (repeatable).")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write outputs to an .npz file.")
@click.option("--unpack", is_flag=True, help="Dequantize packed weights once at load and run plain matmuls.")
@click.option("--device", "device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N",
              help="Where to run (CUDA needs the cuda extra and a GPU).")
@click.option("--verify", is_flag=True, help="Check every weight digest before running (one read of the file).")
@password_options
@click.pass_obj
def run(state, path, inputs, output, unpack, device, verify, password_env, password_stdin, password_value):
    """Run an .rlx file with inputs from .npy files (weight digests are checked only with --verify)."""
    from rlx_runtime import CompileOptions, Session, to_host
    with handled(state):
        session = Session(device)  # a bad device or a missing GPU fails before any file is read
        if output is not None:
            check_output_path(output)
        password = _password_for(path, password_env, password_stdin, password_value)  # before reading inputs
        feeds = {}
        for spec in inputs:
            if "=" not in spec:
                raise click.BadParameter(f"{spec!r}; expected NAME=FILE.npy", param_hint="--input")
            name, file = spec.split("=", 1)
            feeds[name] = _load_npy(name, file)
        rf = _fmt.read_rlx(path, password=password, verify=verify)
        if output is not None:  # refuse before running, not after
            _check_npz_names(output, rf.graph.outputs)
        compiled = session.compile_with(rf, CompileOptions(unpack_quantized=True)) if unpack else session.compile(rf)
        out = to_host(compiled.run(feeds))
        for name, arr in out.items():
            shown = printable(name)
            click.echo(f"{shown}: {arr.dtype}{list(arr.shape)} min {arr.min():.6g} max {arr.max():.6g}"
                       if arr.size and arr.dtype.kind in "fiu" else f"{shown}: {arr.dtype}{list(arr.shape)}")
        if output is not None:
            atomic_write(output, lambda f: _write_npz(f, out))
            _wrote(state, printable(str(output)))


_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0,
                       # 3.0 differs from 2.0 only in a UTF-8 (not latin-1) header; ASCII headers read the same
                       (3, 0): np.lib.format.read_array_header_2_0}


def _load_npy(name: str, file: str) -> np.ndarray:
    """Read one --input .npy, checking its header against the file size before allocating anything."""
    where = f"--input {name}: {file}"
    with open_for_reading(file, "a .npy file", where) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise RlxError(f"{where}: the file is empty; expected a .npy array (numpy.save)")
        try:
            version = np.lib.format.read_magic(f)
            if version not in _NPY_HEADER_READERS:
                raise ValueError(f"format version {version[0]}.{version[1]} is not supported")
            shape, fortran_order, dtype = _NPY_HEADER_READERS[version](f)
        except ValueError as e:
            raise RlxError(f"{where}: not a .npy array ({e}); write it with numpy.save") from None
        if dtype.hasobject:
            raise RlxError(f"{where}: dtype {dtype} holds Python objects, which are never unpickled; "
                           "expected a numeric array")
        if any(d < 0 for d in shape):
            raise RlxError(f"{where}: header shape {list(shape)} has a negative dim; the file is corrupted")
        need, have = math.prod(shape) * dtype.itemsize, size - f.tell()
        if need > have:
            raise RlxError(f"{where}: header declares {dtype}{list(shape)} ({need} bytes of data) but only {have} "
                           "bytes follow it; the file is truncated or corrupted")
        f.seek(0)
        try:
            return np.lib.format.read_array(f, allow_pickle=False)
        except MemoryError:
            raise RlxError(f"{where}: {dtype}{list(shape)} needs {need} bytes; not enough memory") from None
        except ValueError as e:
            raise RlxError(f"{where}: not a .npy array ({e})") from None


def _npz_name_problem(name: str, names: list[str]) -> str | None:
    """Why `name` cannot be an .npz member that every unzip puts next to the others (None if it can)."""
    if not name:
        return "it is empty"
    if "/" in name or "\\" in name:
        return "it contains a path separator ('/' or '\\')"
    if name in (".", ".."):
        return "it is a relative directory name ('.' or '..')"
    if not name.isprintable():
        return "it contains control or invisible characters"
    if name.endswith(".npy") and name[:-4] in names:
        return f"it ends in '.npy', so np.load would confuse it with output {name[:-4]!r}"
    return None


def _check_npz_names(output: Path, names: list[str]) -> None:
    for name in names:
        why = _npz_name_problem(name, names)
        if why is not None:
            raise RlxError(f"-o {output}: output {name!r} cannot be saved in an .npz file: {why}; .npz members "
                           "must be plain, distinct file names: rename the output in the model or run without -o")


def _write_npz(f, arrays: dict) -> None:
    """np.savez, but every array under its own name: savez's own keywords (file, allow_pickle) collide."""
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)


if __name__ == "__main__":  # pragma: no cover
    main()
