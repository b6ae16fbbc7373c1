"""The papers' offline experiments on a :class:`~tokenbalance.analysis.probe.ProbeBatch`, each leaving the parameters
as found: :func:`bucket_experiment` (AR-Lopti Figure 1 c/e/f, Figure 3), :func:`lld_experiment` (NTHR §4),
:func:`nthr_groups`. docs/metrics.md ("Offline diagnostics")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenbalance.algorithms.methods import Method, NTHRInputs, compute_advantages
from tokenbalance.algorithms.nthr import NTHRConfig, nthr_correct
from tokenbalance.analysis.probe import ProbeBatch, method_passes, rescore, single_update
from tokenbalance.diagnostics.buckets import bucket_masks, interval_label, probability_change_stats
from tokenbalance.diagnostics.grad_norms import gradient_free_method
from tokenbalance.diagnostics.lld import sequence_deltas
from tokenbalance.diagnostics.nthr_view import GroupSelection, nthr_selections
from tokenbalance.diagnostics.step import update_advantages
from tokenbalance.diagnostics.token_classes import logp_change_by_class, token_classes
from tokenbalance.types import UpdatePass


def _parameters(probe: ProbeBatch) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in probe.model.state_dict().items()}


@dataclass(frozen=True)
class ProbeClasses:
    """The class of every response token of a probe batch (:mod:`tokenbalance.diagnostics.token_classes`)."""

    class_BT: torch.Tensor
    names: tuple[str, ...]
    decisions: tuple[str, ...]


def probe_classes(probe: ProbeBatch) -> ProbeClasses | None:
    """The token classes of the probe's responses, or None when its task does not tell them."""
    task = probe.task  # BaseTask's optional parts: a user's Task may lack them
    names = tuple(getattr(task, "token_class_names", ()))
    text_classes = getattr(task, "text_classes", None)
    if not names or text_classes is None:
        return None
    class_BT = token_classes(text_classes, probe.tokenizer, probe.rollout.tokens_BT, probe.mask_BT, names)
    return ProbeClasses(class_BT, names, tuple(getattr(task, "decision_classes", ())))


def bucket_experiment(
    probe: ProbeBatch,
    *,
    edges: Sequence[float],
    lr: float,
    method: Method | None = None,
    classes: ProbeClasses | None = None,
) -> dict[str, dict]:
    """The single updates on the ``all`` / ``lowest`` / ``highest`` bucket of ``method`` (default the probe's), each
    from the same parameters: tokens touched, gradient norm, per-bucket probability change; with ``classes`` also
    ``by_class`` (:func:`logp_change_by_class`)."""
    method = gradient_free_method(method or probe.method)
    passes, _ = method_passes(probe, method)
    valid_BT = probe.mask_BT.bool()
    adv_BT, policy_BT = update_advantages(passes, valid_BT)
    masks = bucket_masks(probe.old.logp_BT, probe.mask_BT, edges)

    def only(name: str, select_BT: torch.Tensor) -> list[UpdatePass]:
        select_BT = select_BT & policy_BT
        return [
            UpdatePass(name, torch.where(select_BT, adv_BT, torch.zeros_like(adv_BT)), select_BT, select_BT, valid_BT)
        ]

    modes = {"all": passes, "lowest": only("lowest", masks[0]), "highest": only("highest", masks[-1])}
    initial = _parameters(probe)
    results = {}
    for mode, mode_passes in modes.items():
        probe.model.load_state_dict(initial)
        optimizer = torch.optim.SGD([p for p in probe.model.parameters() if p.requires_grad], lr=lr)
        metrics = single_update(probe, method, mode_passes, optimizer)
        new_logp_BT = rescore(probe)
        results[mode] = {
            "updated_tokens": int(sum(int(p.policy_mask_BT.sum()) for p in mode_passes)),
            "updated_interval": "all"
            if mode == "all"
            else interval_label(edges, 0 if mode == "lowest" else len(edges) - 2),
            "grad_norm": metrics["optim/grad_norm"],
            "buckets": probability_change_stats(probe.old.logp_BT, new_logp_BT, adv_BT, probe.mask_BT, edges),
        }
        if classes is not None:
            results[mode]["by_class"] = logp_change_by_class(
                probe.old.logp_BT, new_logp_BT, adv_BT, probe.mask_BT, classes.class_BT, classes.names, edges
            )
    probe.model.load_state_dict(initial)
    return results


@dataclass(frozen=True)
class LLDSettings:
    """The single update of the LLD protocol: ``optimizer`` (``adamw``: the run's betas and weight decay; or ``sgd``)
    at ``lr``; ``pos_only`` zeroes the negative advantages (the paper's Pos Only)."""

    optimizer: str
    lr: float
    pos_only: bool = False


def lld_experiment(probe: ProbeBatch, settings: LLDSettings) -> list[dict]:
    """Δ(x) for every mixed question, each measured from the same parameters after one update on its group."""
    initial = _parameters(probe)
    optim = probe.config.optim
    out = []
    for g in torch.unique(probe.group_ids_B).tolist():
        rows = (probe.group_ids_B == g).nonzero(as_tuple=True)[0]
        correct = probe.correct_B[rows]
        if not 0 < int(correct.sum()) < rows.numel():
            continue
        probe.model.load_state_dict(initial)
        passes, _ = method_passes(probe, probe.method, rows)
        if settings.pos_only:
            passes = [
                UpdatePass(
                    p.name, p.advantages_BT.clamp(min=0), p.policy_mask_BT, p.kl_entropy_mask_BT, p.normaliser_mask_BT
                )
                for p in passes
            ]
        params = [p for p in probe.model.parameters() if p.requires_grad]
        optimizer = (
            torch.optim.SGD(params, lr=settings.lr)
            if settings.optimizer == "sgd"
            else torch.optim.AdamW(
                params, lr=settings.lr, betas=(optim.beta1, optim.beta2), weight_decay=optim.weight_decay
            )
        )
        single_update(probe, probe.method, passes, optimizer, rows)
        positive = rows[correct]
        seq, tok = sequence_deltas(rescore(probe, positive), probe.old.logp_BT[positive], probe.mask_BT[positive])
        first = probe.examples_B[int(rows[0])]
        out.append(
            {
                "question": int(g),
                "example": f"{first.data_source}:{first.index}",
                "correct": int(correct.sum()),
                "group_size": int(rows.numel()),
                "delta": float(seq.mean()),
                "delta_tok": float(tok.mean()),
            }
        )
    probe.model.load_state_dict(initial)
    return out


def nthr_groups(probe: ProbeBatch) -> tuple[NTHRConfig, list[GroupSelection]]:
    """The probe method's NTHR settings (the defaults when it has none) and, per mixed group, the tokens NTHR selects
    in its incorrect responses. Needs the probe's hidden states."""
    config = probe.method.nthr or NTHRConfig()
    if probe.old.hidden_BTD is None:
        raise ValueError("nthr_groups: the probe batch has no hidden states (probe_batch(..., with_hidden=True))")
    advantages = compute_advantages(probe.method, probe.scores_B, probe.group_ids_B, probe.mask_BT)
    inputs = NTHRInputs.from_output_layer(
        probe.model.get_output_embeddings(),
        probe.rollout.tokens_BT,
        probe.old.hidden_BTD,
        probe.temperature,
        max_reward=probe.rollout.max_reward,
    )
    groups = nthr_selections(
        advantages,
        probe.mask_BT,
        probe.group_ids_B,
        inputs.tokens_BT,
        probe.old.logp_BT,
        inputs.hidden_BTD,
        inputs.unembed_VD,
        config,
        temperature=inputs.temperature,
        unembed_bias_V=inputs.unembed_bias_V,
        correct_B=nthr_correct(probe.scores_B, config, inputs.max_reward),
    )
    return config, groups
