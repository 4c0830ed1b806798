"""The shipped erf tables are exactly what scripts/fit_erf_tables.py fits (so the exhaustive check done on the
fitted numbers holds for the shipped ones), and the runtime reads them back bit for bit."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np

from rlx_runtime import erf_tables, ufuncs

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "fit_erf_tables.py"


def _script():
    spec = importlib.util.spec_from_file_location("fit_erf_tables", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_tables_are_the_fit_bit_for_bit():
    from scipy.special import erf  # the fit's reference (a test/dev dependency only)

    fit = _script()
    polys, taylor = fit.fit(erf)
    shipped_polys, shipped_taylor = ufuncs._tables()
    np.testing.assert_array_equal(shipped_polys, polys)
    np.testing.assert_array_equal(shipped_taylor, taylor)
    assert (erf_tables.LO, erf_tables.HI, erf_tables.WIDTH, erf_tables.DEG, erf_tables.TAYLOR_TERMS) == (
        fit.LO, fit.HI, fit.WIDTH, fit.DEG, fit.TAYLOR_TERMS)
    small, big = fit.fit_fast(erf)
    np.testing.assert_array_equal(ufuncs._P, small)
    np.testing.assert_array_equal(ufuncs._Q, big)
    assert (erf_tables.FAST_SPLIT, erf_tables.FAST_ONE, erf_tables.FAST_TOL) == (
        fit.FAST_SPLIT, fit.FAST_ONE, fit.FAST_TOL)
    # the generated module is what the script writes today
    assert pathlib.Path(erf_tables.__file__).read_text() == fit.render(polys, taylor, small, big)


def test_tables_give_correctly_rounded_erf_on_a_sample():
    import math

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-6.5, 6.5, 20000), rng.uniform(-0.3, 0.3, 5000),
                        np.arange(-26, 27) * 0.25]).astype(np.float32)
    want = np.array([math.erf(float(v)) for v in x]).astype(np.float32)
    np.testing.assert_array_equal(ufuncs.erf(x), want)
