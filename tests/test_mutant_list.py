"""The curated mutation check's list stays applicable between its (long) full runs: every mutant's snippet occurs
exactly once in its source file (scripts/mutants.py refuses to run otherwise, but only when that mutant runs), each
mutant changes something, and the test files it names exist. A refactor that moves a snippet fails here, in
`make test`, instead of at the next `make check-tests`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _mutants():
    spec = importlib.util.spec_from_file_location("rlx_mutants", ROOT / "scripts" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = _mutants()


def test_mutant_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_patches_one_place_and_names_existing_tests(mutant):
    for rel, old, new in mutant.patches:
        text = (ROOT / "src" / rel).read_text()
        assert text.count(old) == 1, f"{mutant.name}: {rel} holds its snippet {text.count(old)} times, not once"
        assert old != new
    for t in mutant.tests:  # a file, or a file::test id
        assert (ROOT / "tests" / t.split("::")[0]).is_file(), f"{mutant.name}: no tests/{t}"
