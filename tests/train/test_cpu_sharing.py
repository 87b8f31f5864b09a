"""Importing tempering makes PyTorch's OpenMP workers sleep, not spin, between parallel regions
(``benchmarks/cpu_sharing.py`` measures why); a setting of the user's own is left alone."""

import os
import subprocess
import sys

import pytest

PROBE = ("import os, tempering, torch; "
         "print(os.environ['OMP_WAIT_POLICY'], torch.get_num_threads() >= 1)")


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_importing_tempering_sets_the_openmp_wait_policy_unless_given(
        given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [expected, "True"]
