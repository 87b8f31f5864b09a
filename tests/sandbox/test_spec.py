"""Bad input is refused before any backend is touched, with the value and what to do."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tempering.sandbox import SandboxSpec
from tempering.sandbox.spec import host_cpus


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("memory_mb", -5, "-5"),
    ("backend", "vmware", "unknown backend 'vmware'"),
    ("cpus", 10_000, "ask for at most"),
    ("cpus", 0, "greater than 0"),
    ("pids", 1, "pids"),
    ("disk_mb", 0, "disk_mb"),
    ("workdir", "relative/dir", "absolute"),
    ("workdir", "/usr", "system directory"),
    ("env", {"A=B": "x"}, "not valid"),
    ("writable_dirs", ("etc/app",), "'etc/app' must be a normalised absolute path"),
    ("writable_dirs", ("/etc",), "'/etc' is a system directory"),
    ("writable_dirs", ("/tmp/x",), "'/tmp/x' lies in /tmp"),
    ("writable_dirs", ("/srv/a", "/srv/a/b"), "'/srv/a' and '/srv/a/b' nest"),
    ("writable_dirs", ("/workspace/x",), "'/workspace/x' and the workdir '/workspace' nest"),
    ("writable_dirs", ("/srv/a:b",), "without ':'"),
    ("writable_dirs", ("/srv/a", "/srv/a"), "names a directory twice"),
    ("rootfs", "/definitely/not/here", "not an existing"),
    ("colour", "blue", "colour"),
])
def test_bad_values_are_named(field: str, value: object, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        SandboxSpec(**{field: value})
    assert needle in str(info.value) and field in str(info.value)


def test_defaults_and_key() -> None:
    spec = SandboxSpec()
    assert (spec.backend, spec.workdir, spec.network) == ("local", "/workspace", False)
    assert spec.key() == SandboxSpec().key() != SandboxSpec(memory_mb=1024).key()
    assert SandboxSpec(cpus=host_cpus()).cpus == host_cpus()


def test_spec_is_frozen() -> None:
    with pytest.raises(ValidationError):
        SandboxSpec().memory_mb = 5  # type: ignore[misc]


def test_missing_bubblewrap_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    from tempering.errors import SandboxUnavailableError
    from tempering.sandbox.host import host

    monkeypatch.setenv("PATH", "/nonexistent")
    host.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="apt-get install -y bubblewrap"):
            host()
    finally:
        host.cache_clear()  # the next test checks the host again, with the real PATH
