"""Which methods and token rules verl can run, and why not the others (docs/methods.md §10, docs/verl.md).

Free of verl imports, like :mod:`.verl_names`: the plugin's config and the grid writer ask the same
question here. verl 0.9.1 calls a policy loss with one micro-batch's old and current log-probs,
advantages and response mask, so a rule runs there when it reads only those (its ``passes`` stage
then sees one micro-batch at a time). The entropy reaches only our ``tokenbalance_lopti`` trainer's
loss, when verl computes it (``actor_rollout_ref.actor.calculate_entropy=True``).
"""

from __future__ import annotations

from tokenbalance.algorithms.methods import Method
from tokenbalance.algorithms.token_rules import TokenRule
from tokenbalance.integrations.verl_names import LOPTI_TRAINER, NTHR_TRAINER

CALCULATE_ENTROPY = "actor_rollout_ref.actor.calculate_entropy"


def verl_rule_problem(rule: TokenRule, *, lopti_trainer: bool, needs_spec: bool = False) -> str | None:
    """Why verl cannot run ``rule`` (``None`` when it can). ``lopti_trainer``: the update runs under
    the ``tokenbalance_lopti`` trainer, whose loss gets the entropy; ``needs_spec``: the rule must
    be named ``MODULE:RULE`` so that verl's workers import it (a launch script)."""
    if needs_spec and rule.spec is None:
        return (
            f"token rule {rule.label} is registered in this process only; name it MODULE:RULE or FILE.py:RULE so "
            "that verl's workers import it"
        )
    if rule.output == "split":
        return (
            f"token rule {rule.label} splits the tokens into two passes; verl runs only Lopti's passes (the "
            f"{LOPTI_TRAINER} trainer): return weights, or run it on our trainer or TRL"
        )
    for need in ("group_ids", "correct"):
        if need in rule.needs:
            return (
                f"token rule {rule.label} needs {need}, which verl's policy loss does not receive (log-probs, "
                "advantages and the response mask only); run it on our trainer"
            )
    if "entropy" in rule.needs and not lopti_trainer:
        return (
            f"token rule {rule.label} needs the entropy, which verl 0.9.1 does not pass to a registered policy "
            f"loss; it reaches the loss of the {LOPTI_TRAINER} trainer with {CALCULATE_ENTROPY}=True"
        )
    return None


def verl_method_problem(method: Method, *, lopti_trainer: bool) -> str | None:
    """Why verl cannot run ``method``'s token-level stages (``None`` when it can; its token rule is
    :func:`verl_rule_problem`'s question). ``lopti_trainer``: under the ``tokenbalance_lopti`` trainer."""
    if method.random_split is not None:
        return (
            "random_split (the step-count control) takes two passes over random halves; verl runs only Lopti's "
            f"passes (the {LOPTI_TRAINER} trainer): run the control on our trainer or TRL"
        )
    if method.nthr is not None and method.lopti is not None:
        return f"NTHR and Lopti are two verl trainers ({NTHR_TRAINER}, {LOPTI_TRAINER}); a launch runs one"
    lopti = method.lopti
    if lopti is not None and (lopti.threshold_mode != "prob" or lopti.renormalize_per_stage):
        return (
            "Lopti's quantile threshold and per-pass renormalisation need the whole batch, while verl gives the "
            "loss one micro-batch and the mini-batch's token count: on verl Lopti takes eta, order and strict_less"
        )
    if method.tr_grpo is not None and method.tr_grpo.weight_kl and not lopti_trainer:
        return (
            "TR-GRPO's weighted KL (weight_kl) is not offered by verl's single-pass loss, whose KL term is verl's "
            f"own; run it under the {LOPTI_TRAINER} trainer or on our trainer (docs/verl.md)"
        )
    return None
