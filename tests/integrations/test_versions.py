"""The host version guard: a clear message naming installed and supported versions."""

import os
from importlib import metadata

import pytest

from tokenbalance.integrations.versions import (
    HOST_EXTRAS,
    SUPPORTED_HOSTS,
    HostVersionError,
    parse_version,
    require_host,
    version_in_range,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.9.1", (0, 9, 1)), ("0.9.1.dev0", (0, 9, 1)), ("1.16.0rc1", (1, 16, 0)), ("2", (2,)), ("1.15+cpu", (1, 15))],
)
def test_parse_version(text, expected):
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    ("installed", "inside"),
    [("0.9.1", True), ("0.9.1.post1", True), ("0.9.2", False), ("0.9.0", False), ("0.10.0", False), ("0.8.5", False)],
)
def test_verl_range(installed, inside):
    assert version_in_range(installed, *SUPPORTED_HOSTS["verl"]) is inside


def test_transfer_queue_names_the_extra_that_installs_it(monkeypatch):
    monkeypatch.delenv("TOKENBALANCE_SKIP_HOST_CHECK", raising=False)
    with pytest.raises(
        HostVersionError,
        match=r"TransferQueue 0.1.12 is installed, .*TransferQueue>=0.1.11,<0.1.12.*tokenbalance\[verl\]",
    ):
        require_host("TransferQueue", installed="0.1.12")


def test_out_of_range_names_both_versions(monkeypatch):
    monkeypatch.delenv("TOKENBALANCE_SKIP_HOST_CHECK", raising=False)
    with pytest.raises(HostVersionError) as info:
        require_host("trl", installed="1.12.0")
    message = str(info.value)
    assert "trl 1.12.0 is installed" in message
    assert "trl>=1.15,<1.17" in message


def test_override_accepts_untested_version(monkeypatch):
    monkeypatch.setenv("TOKENBALANCE_SKIP_HOST_CHECK", "1")
    assert require_host("trl", installed="1.12.0") == "1.12.0"


@pytest.mark.parametrize("host", sorted(SUPPORTED_HOSTS))
def test_installed_hosts_are_in_range(host):
    """CI installs both extras, so there a missing host fails (the integration suites would
    otherwise skip); elsewhere the integration tests skip cleanly without their host."""
    try:
        installed = metadata.version(host)
    except metadata.PackageNotFoundError:
        if os.environ.get("CI"):
            pytest.fail(
                f"{host} is not installed in CI: its integration tests would be skipped "
                f"(scripts/test.sh installs the '{HOST_EXTRAS[host]}' extra)"
            )
        pytest.skip(f"{host} not installed")
    assert version_in_range(require_host(host), *SUPPORTED_HOSTS[host]), installed
