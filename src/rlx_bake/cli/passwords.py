"""Where the CLI gets a password: env var, stdin, hidden prompt or (discouraged) argv."""

from __future__ import annotations

import os
import sys

import click

from rlx_format.errors import RlxError

PROMPT = "\0prompt"  # --password given without a value


def resolve_password(env: str | None, stdin: bool, value: str | None, *, confirm: bool) -> str | None:
    """Return the password from exactly one source, or None if none was asked for.

    Checked here, before any work: a password that is not UTF-8 text (it is hashed as UTF-8) fails now,
    not after a bake; the message names the source, never the password or the offending byte."""
    sources = [s for s, on in (("--password-env", env is not None), ("--password-stdin", stdin),
                                ("--password", value is not None)) if on]
    if len(sources) > 1:
        raise click.UsageError(f"give one password source, not {' and '.join(sources)}")
    if env is not None:
        pw = os.environ.get(env)
        if pw is None:
            raise RlxError(f"--password-env {env}: environment variable {env} is not set; export it first")
        if not pw:
            raise RlxError(f"--password-env {env}: environment variable {env} is empty; expected a password")
        return _utf8(pw, f"--password-env {env}: environment variable {env}")
    if stdin:
        line = _stdin_line()
        # exactly one line ending, CRLF or LF, so a password piped from a Windows file matches the same text
        # given by --password-env; any other trailing whitespace is part of the password
        pw = line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith("\n") else line
        if not pw:
            raise RlxError("--password-stdin: read an empty password from standard input")
        return _utf8(pw, "--password-stdin: the first line of standard input")
    if value is None:
        return None
    if value == PROMPT:
        if not sys.stdin.isatty():
            raise RlxError("--password without a value prompts on a terminal, but stdin is not a terminal; "
                           "use --password-env VAR or --password-stdin")
        pw = click.prompt("Password", hide_input=True, confirmation_prompt=confirm, err=True)
        if not pw:
            raise RlxError("empty password")
        return _utf8(pw, "--password: the typed password")
    click.echo("warning: --password VALUE is visible to other users of this machine (process list, shell "
               "history); prefer --password-env VAR or --password-stdin", err=True)
    if not value:
        raise RlxError("--password: empty password")
    return _utf8(value, "--password VALUE")


def _utf8(pw: str, source: str) -> str:
    # undecodable bytes reach Python as lone surrogates (surrogateescape: environ, argv, C-locale stdin)
    try:
        pw.encode("utf-8")
    except UnicodeEncodeError:
        raise RlxError(f"{source} is not valid UTF-8 text; rlx passwords are UTF-8 (check the encoding of the "
                       "terminal, file or script it came from)") from None
    return pw


def _stdin_line() -> str:
    """The first line of stdin, line ending included, read as bytes so no newline translation hides a CR."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:
        return sys.stdin.readline()
    data = raw.readline()
    try:
        return data.decode(sys.stdin.encoding or "utf-8", sys.stdin.errors or "strict")
    except UnicodeDecodeError:
        raise RlxError(f"--password-stdin: the first line of standard input is not valid "
                       f"{sys.stdin.encoding or 'utf-8'} text; rlx passwords are UTF-8 (check the encoding of the "
                       "terminal, file or script it came from)") from None


def password_options(fn):
    fn = click.option("--password", "password_value", is_flag=False, flag_value=PROMPT, default=None,
                      metavar="[VALUE]", help="Prompt (no value) or take VALUE (visible to other users: warns).")(fn)
    fn = click.option("--password-stdin", is_flag=True,
                      help="Read the password from the first line of stdin (one trailing \\n or \\r\\n is "
                           "removed).")(fn)
    fn = click.option("--password-env", metavar="VAR", help="Read the password from environment variable VAR.")(fn)
    return fn
