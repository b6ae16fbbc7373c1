"""Version safety: what the plugin uses of verl and TransferQueue is checked at import, one line per change."""

from __future__ import annotations

import sys
import types

import pytest

verl = pytest.importorskip("verl")

from tokenbalance.integrations.verl import plugin, validation
from tokenbalance.integrations.verl.host_api import CORE_API, TRAINER_API, api_changes, check_host_api
from tokenbalance.integrations.versions import SKIP_HOST_CHECK, HostVersionError


def test_the_installed_verl_has_everything_the_plugin_uses():
    assert api_changes(CORE_API) == []
    pytest.importorskip("transfer_queue")
    assert api_changes(TRAINER_API) == []


@pytest.fixture
def changed_host(monkeypatch):
    """A stand-in host module whose release renamed, dropped and extended what we call."""
    module = types.ModuleType("changed_host")

    class Trainer:
        def _update_actor(self, batch):  # `metrics` dropped
            return batch

        def _setup(self, config):  # a new required parameter
            return config

        def _compute_advantage(self, batch, metrics, *, timer=None):  # a new optional one: fine
            return batch

    module.Trainer = Trainer
    monkeypatch.setitem(sys.modules, "changed_host", module)
    return {
        "changed_host:Trainer._update_actor": ("self", "batch", "metrics"),
        "changed_host:Trainer._setup": ("self",),
        "changed_host:Trainer._compute_advantage": ("self", "batch", "metrics"),
        "changed_host:Trainer._compute_old_log_prob": ("self", "batch", "metrics"),
        "changed_host:REGISTRY": None,
    }


def test_each_change_is_named(changed_host):
    assert api_changes(changed_host) == [
        "changed_host.Trainer._update_actor: parameters (self, batch), tested with (self, batch, metrics)",
        "changed_host.Trainer._setup: new required parameter(s) config",
        "changed_host.Trainer._compute_old_log_prob is missing",
        "changed_host.REGISTRY is missing",
    ]


def test_a_change_fails_at_import_in_one_line_unless_skipped(changed_host, monkeypatch):
    monkeypatch.delenv(SKIP_HOST_CHECK, raising=False)
    with pytest.raises(HostVersionError) as info:
        check_host_api(changed_host, "verl 9.9.9")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("verl 9.9.9 changed what the tokenbalance verl plugin uses: changed_host.Trainer")
    assert "changed_host.REGISTRY is missing" in message and "tested with verl 0.9.1, TransferQueue 0.1.11" in message
    monkeypatch.setenv(SKIP_HOST_CHECK, "1")
    check_host_api(changed_host, "verl 9.9.9")  # at your own risk, as the version check


def test_the_plugin_raises_a_change_but_skips_the_trainers_when_a_dependency_is_missing(changed_host, monkeypatch):
    pytest.importorskip("transfer_queue")
    monkeypatch.delenv(SKIP_HOST_CHECK, raising=False)
    monkeypatch.setattr(validation, "TRAINER_IMPORT_ERROR", None)
    monkeypatch.setattr(plugin, "TRAINER_API", changed_host)
    with pytest.raises(HostVersionError, match="changed_host.Trainer._update_actor: parameters"):
        plugin.register_all()
    monkeypatch.setattr(plugin, "TRAINER_API", {"no_such_module_for_tokenbalance:thing": None})
    plugin.register_all()  # a missing module is a missing dependency: the losses stay, the trainers are skipped
    assert validation.TRAINER_IMPORT_ERROR.startswith("ModuleNotFoundError: No module named 'no_such_module")
