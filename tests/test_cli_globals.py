"""Global options (-q/--quiet, --debug) work anywhere on the line; -q silences the 'wrote' lines too."""

import numpy as np
from test_cli import bundle, invoke  # noqa: F401 - bundle is a fixture


def test_quiet_after_the_arguments(bundle, tmp_path):  # noqa: F811
    out = tmp_path / "m.rlx"
    for args in ([bundle, "-o", out, "-q"], [bundle, "-q", "-o", out], ["bake", bundle, "-o", out, "--quiet"],
                 ["-q", bundle, "-o", out]):
        out.unlink(missing_ok=True)
        r = invoke(*args)
        assert r.exit_code == 0, (args, r.output)
        assert r.output == "" and out.is_file(), args  # no table, no "wrote" line
    r = invoke(bundle, "-o", out)
    assert f"wrote {out}" in r.output and "gguf_tq1_0" in r.output  # without -q both are there


def test_options_before_the_input_still_mean_bake(bundle, tmp_path):  # noqa: F811
    out = tmp_path / "w.rlx"
    r = invoke("--weights", bundle / "weights.safetensors", bundle / "graph.json", "-o", out, "--opt", "size")
    assert r.exit_code == 0, r.output
    assert out.is_file() and "size" in r.output and "(q8_0)" in r.output


def test_debug_anywhere_shows_the_traceback(tmp_path):
    r = invoke(tmp_path / "missing", "-o", tmp_path / "x.rlx")
    assert r.exit_code == 1 and "Traceback" not in r.output
    r = invoke(tmp_path / "missing", "-o", tmp_path / "x.rlx", "--debug")
    assert r.exit_code == 1 and "Traceback" in r.output
    r = invoke("inspect", tmp_path / "missing", "--debug")
    assert r.exit_code == 1 and "Traceback" in r.output


def test_quiet_silences_every_wrote_line(bundle, tmp_path):  # noqa: F811
    plain, sealed, back, npz = (tmp_path / n for n in ("p.rlx", "s.rlx", "d.rlx", "o.npz"))
    assert invoke(bundle, "-o", plain, "-q").exit_code == 0
    env = {"PW": "pw"}
    r = invoke("encrypt", plain, "-o", sealed, "--password-env", "PW", "--kdf", "fast", "-q", env=env)
    assert r.exit_code == 0 and r.output == "" and sealed.is_file()
    r = invoke("decrypt", sealed, "-o", back, "--password-env", "PW", "-q", env=env)
    assert r.exit_code == 0 and r.output == "" and back.is_file()
    np.save(tmp_path / "x.npy", np.zeros((2, 64), np.float32))
    r = invoke("run", plain, "--input", f"x={tmp_path / 'x.npy'}", "-o", npz, "-q")
    assert r.exit_code == 0 and "wrote" not in r.output and "probs" in r.output and npz.is_file()
    r = invoke("run", plain, "--input", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "o2.npz")
    assert f"wrote {tmp_path / 'o2.npz'}" in r.output


def test_group_help_version_and_commands_unchanged():
    assert invoke("--help").exit_code == 0 and "inspect" in invoke("--help").output
    assert "0.1.0" in invoke("--version").output
    r = invoke("-q")
    assert r.exit_code == 2 and "Missing command" in r.output
    r = invoke("inspect", "--help", "-q")
    assert r.exit_code == 0 and "Show the graph" in r.output
