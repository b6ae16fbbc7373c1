"""The checks before work that read the machine and the environment rather than the data: the device, the reporting
extras and W&B settings, and a chat model meeting the tiny model's prompt template. Run by
:func:`tokenbalance.run.setup.prepare`; docs/reliability.md."""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from urllib.parse import urlparse

import torch

from tokenbalance.config import DEFAULT_TEMPLATE, REAL_MODEL_SETTINGS, OutputConfig, RunConfig
from tokenbalance.extras import missing_package

REPORTING_EXTRAS = ("tensorboard", "wandb")  # output flags named as their extras (tokenbalance.extras)
WANDB_OPTIONS = ("wandb_project", "wandb_entity", "wandb_name", "wandb_mode")
WANDB_ENV_MODES = ("offline", "online", "disabled", "dryrun", "run")  # what wandb takes from WANDB_MODE


def resolve_device(name: str) -> torch.device:
    """``train.device`` as a device of this machine; ``ValueError`` naming it when there is none."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"train.device={name!r}: unknown device; valid: auto, cpu, cuda, cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={name!r}: CUDA is not available on this machine; use cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"train.device={name!r}: this machine has {torch.cuda.device_count()} CUDA device(s) "
            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})"
        )
    if device.type not in ("cpu", "cuda"):
        available = getattr(torch.backends, device.type, None)
        if available is None or not getattr(available, "is_available", lambda: False)():
            raise ValueError(f"train.device={name!r}: not available on this machine; valid: auto, cpu, cuda, cuda:N")
    if device.type == "cuda" and "LOCAL_RANK" in os.environ and device.index is None:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def check_reporting(output: OutputConfig, environ: Mapping[str, str]) -> None:
    """The reporting extras ``output`` asks for are installed and its W&B settings can work."""
    for flag in REPORTING_EXTRAS:
        module = missing_package(flag) if getattr(output, flag) else None
        if module is not None:
            raise ValueError(f"output.{flag}=true needs the {module} package: pip install {module}")
    problem = wandb_problem(output, environ)
    if problem:
        raise ValueError(problem)


def has_wandb_login(environ: Mapping[str, str]) -> bool:
    """Whether W&B can log in online without asking: ``WANDB_API_KEY``, or an entry for the W&B host
    (``WANDB_BASE_URL``, default api.wandb.ai) in the netrc file ``wandb login`` writes."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = environ.get("NETRC") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_problem(output: OutputConfig, environ: Mapping[str, str]) -> str | None:
    """Why the W&B settings cannot work as given (None when they can): a ``wandb_*`` option set while ``output.wandb``
    is off (it would be ignored), a ``WANDB_MODE`` that is not a W&B mode, or online logging without a login."""
    defaults = OutputConfig()
    if not output.wandb:
        given = [name for name in WANDB_OPTIONS if getattr(output, name) != getattr(defaults, name)]
        if given:
            return (
                f"output.{given[0]}={getattr(output, given[0])!r}: applies only with output.wandb=true (W&B is off "
                "and would ignore it); set output.wandb=true or leave it out"
            )
        return None
    env_mode = environ.get("WANDB_MODE") or None
    if env_mode is not None and env_mode not in WANDB_ENV_MODES:
        return (
            f"WANDB_MODE={env_mode!r} in the environment (it wins over output.wandb_mode): not a W&B mode; valid: "
            "offline, online, disabled; fix or unset it"
        )
    mode = env_mode or output.wandb_mode
    if mode in ("online", "run") and not has_wandb_login(environ):
        return (
            "output.wandb: W&B online needs a login and this machine has none (no WANDB_API_KEY, no netrc entry); "
            "run `wandb login`, or log offline with output.wandb_mode=offline (`wandb sync` uploads it later)"
        )
    return None


def check_real_model_settings(config: RunConfig, tokenizer) -> None:
    """``ValueError`` when a chat model (a tokenizer with a chat template) meets the tiny model's prompt template,
    naming the settings that fit it (:data:`~tokenbalance.config.REAL_MODEL_SETTINGS`): that prompt and budget score
    every answer -3."""
    if config.data.template != DEFAULT_TEMPLATE or not getattr(tokenizer, "chat_template", None):
        return
    flags = " ".join(f"--set {key}={value}" for key, value in REAL_MODEL_SETTINGS)
    raise ValueError(
        f"model.path={config.model.path}: a chat model (its tokenizer has a chat template) with "
        f"data.template={DEFAULT_TEMPLATE!r}, the embedded tiny model's prompt, scores every answer as a format "
        f"error; pass {flags} (the settings of docs/results.md's SmolLM2 runs), or another data.template"
    )
