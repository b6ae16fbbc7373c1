"""The CPU harness's own pieces, in-process and fast: the cpu platform, the sampling of the
``hf_cpu`` rollout server, the test reward, and the plugin's guard of verl's TRL check.

The end-to-end launches that use them are in ``test_verl_e2e.py``.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

pytest.importorskip("verl")

from tests.integrations.verl_cpu import reward
from tests.integrations.verl_cpu.launch import HOOK_MODULE, REPO_ROOT, SRC_DIR, child_env, read_metrics


def test_ci_runs_the_slow_end_to_end_tests():
    """CI is ``.ci/run`` -> ``scripts/test.sh``, which runs the default suite (``-m "not slow"``) and
    then the slow suite (``-m slow``): nothing else may deselect ``slow``."""
    import re

    addopts = re.findall(r'^addopts = "(.*)"$', (REPO_ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert len(addopts) == 1 and "-m" not in addopts[0].split(), addopts
    assert "bash scripts/test.sh" in (REPO_ROOT / ".ci" / "run").read_text()
    script = (REPO_ROOT / "scripts" / "test.sh").read_text()
    assert 'run_pytest -m "not slow"' in script and "run_pytest -m slow" in script


def test_the_child_environment_points_at_this_checkout(tmp_path):
    env = child_env(tmp_path)
    assert env["PYTHONPATH"].split(":") == [str(SRC_DIR), str(REPO_ROOT)]
    assert (SRC_DIR / "tokenbalance" / "__init__.py").exists()
    assert importlib.util.find_spec(HOOK_MODULE) is not None
    assert env["VERL_PLATFORM"] == "cpu"


def test_metrics_file_is_read_per_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "data": {"a": 1.0}}\n{"step": 2, "data": {"a": 2.0}}\n{"step": 2, "data": {"v": 3}}\n')
    assert read_metrics(path) == {1: {"a": 1.0}, 2: {"a": 2.0, "v": 3}}


def test_cpu_platform_reports_cpu_gloo_and_a_gpu_ray_resource():
    from tests.integrations.verl_cpu.platform import PlatformCPU

    platform = PlatformCPU()
    assert (platform.device_name, platform.communication_backend_name(), platform.ray_resource_name()) == (
        "cpu",
        "gloo",
        "GPU",
    )
    assert platform.current_device() == "cpu"
    free, total = platform.device_module.mem_get_info()
    assert 0 < free <= total
    assert platform.device_module.memory_allocated() == 0
    assert not platform.is_platform_available(use_smi_check=True)  # never auto-detected


def test_filter_logits_top_k_and_top_p():
    from tests.integrations.verl_cpu.rollout import filter_logits

    logits_V = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = lambda out: torch.isfinite(out).tolist()  # noqa: E731
    assert kept(filter_logits(logits_V, top_k=2, top_p=1.0)) == [True, True, False, False]
    # nucleus 0.7: 0.5 alone is below it, 0.5 + 0.3 crosses it, so the first two stay
    assert kept(filter_logits(logits_V, top_k=-1, top_p=0.7)) == [True, True, False, False]
    assert kept(filter_logits(logits_V[[2, 0, 3, 1]], top_k=-1, top_p=0.7)) == [False, True, False, True]
    assert kept(filter_logits(logits_V, top_k=-1, top_p=1.0)) == [True] * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The rollout server class on a tiny policy, built without Ray (its methods are plain Python)."""
    from types import SimpleNamespace

    from tests.integrations.verl_cpu.rollout import HFRolloutServer
    from tokenbalance.models import TinyModelConfig, build_tiny_model, save_policy, train_tokenizer

    tokenizer = train_tokenizer(["knights and knaves " * 20], vocab_size=300)
    config = TinyModelConfig(
        hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=64
    )
    path = save_policy(build_tiny_model(config, tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("tiny") / "m")
    rollout_config = SimpleNamespace(seed=7, prompt_length=8, response_length=6)
    return HFRolloutServer(rollout_config, SimpleNamespace(path=str(path)))


def test_server_samples_reproducibly_per_prompt_occurrence(server):
    params = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "logprobs": True}
    server.set_global_steps(0)
    first = [server.generate([5, 6, 7], dict(params), request_id=str(i)) for i in range(3)]
    server.set_global_steps(0)
    again = [server.generate([5, 6, 7], dict(params), request_id="other") for _ in range(3)]
    assert [out.token_ids for out in first] == [out.token_ids for out in again]
    assert len({tuple(out.token_ids) for out in first}) > 1  # occurrences draw different samples
    for out in first:
        assert 1 <= len(out.token_ids) <= 6 and len(out.log_probs) == len(out.token_ids)
        assert all(logp <= 0 and math.isfinite(logp) for logp in out.log_probs)
        assert out.extra_fields["global_steps"] == 0


def test_server_greedy_and_length_budget(server):
    server.set_global_steps(1)
    greedy = [server.generate([1, 2, 3, 4, 5, 6, 7], {"temperature": 0}, request_id="g").token_ids for _ in range(2)]
    assert greedy[0] == greedy[1]
    assert len(greedy[0]) <= 6 and server.generate([1, 2], {"temperature": 0}, "g").log_probs is None


def test_server_weight_update_loads_the_weights_and_rejects_unknown_names(server):
    state = {name: tensor.clone() for name, tensor in server.model.state_dict().items()}
    server.update_weights({name: torch.zeros_like(tensor) for name, tensor in state.items()}, global_steps=3)
    assert server.global_steps == 3
    assert all(float(p.detach().abs().sum()) == 0 for p in server.model.parameters())
    with pytest.raises(KeyError, match="unexpected"):
        server.update_weights({**state, "not.a.weight": torch.zeros(1)})
    server.update_weights(state, global_steps=0)


def test_reward_varies_with_the_response():
    truth = {"solution_text_format": "(1) Oliver is a knight\n(2) Ethan is a knave"}
    assert reward.compute_score("kk_logic", "Oliver", truth) == 1.0
    assert reward.compute_score("kk_logic", "zzz", truth) == 0.0
    assert reward.compute_score("kk_logic", "Oz", truth) == 0.5
    assert reward.compute_score("kk_logic", "   ", truth) == 0.0


def test_plugin_narrows_verls_trl_check_to_the_value_head_class():
    """verl 0.9.1 imports TRL's AutoModelForCausalLMWithValueHead whenever TRL is installed; TRL
    1.16 has no such class, which broke every model build. With our plugin loaded, verl's check
    is true only when the class can be imported."""
    import verl  # noqa: F401  (loads our plugin, which installs the guard)
    from verl.models.transformers import monkey_patch
    from verl.utils import import_utils, model

    from tokenbalance.integrations.verl.compat import trl_value_head_importable

    expected = importlib.util.find_spec("trl") is not None and trl_value_head_importable()
    for module in (import_utils, monkey_patch, model):
        assert module.is_trl_available() is expected, module.__name__
