"""Where the CLI gets a password: env var, stdin, hidden prompt or (discouraged) argv."""

from __future__ import annotations

import os
import sys

import click

from rlx_format.errors import RlxError

PROMPT = "\0prompt"  # --password given without a value


def resolve_password(env: str | None, stdin: bool, value: str | None, *, confirm: bool) -> str | None:
    """Return the password from exactly one source, or None if none was asked for."""
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
        return pw
    if stdin:
        line = sys.stdin.readline()
        pw = line[:-1] if line.endswith("\n") else line
        if not pw:
            raise RlxError("--password-stdin: read an empty password from standard input")
        return pw
    if value is None:
        return None
    if value == PROMPT:
        if not sys.stdin.isatty():
            raise RlxError("--password without a value prompts on a terminal, but stdin is not a terminal; "
                           "use --password-env VAR or --password-stdin")
        pw = click.prompt("Password", hide_input=True, confirmation_prompt=confirm, err=True)
        if not pw:
            raise RlxError("empty password")
        return pw
    click.echo("warning: --password VALUE is visible to other users of this machine (process list, shell "
               "history); prefer --password-env VAR or --password-stdin", err=True)
    if not value:
        raise RlxError("--password: empty password")
    return value


def password_options(fn):
    fn = click.option("--password", "password_value", is_flag=False, flag_value=PROMPT, default=None,
                      metavar="[VALUE]", help="Prompt (no value) or take VALUE (visible to other users: warns).")(fn)
    fn = click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")(fn)
    fn = click.option("--password-env", metavar="VAR", help="Read the password from environment variable VAR.")(fn)
    return fn
