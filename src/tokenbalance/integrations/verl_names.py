"""The names we register into verl, and the token-level stages each policy-loss name switches on.

Outside the ``verl`` subpackage (which checks the installed verl on import) and free of verl and
torch imports, so that the launch validation, the docs and ``tokenbalance ablate --runner verl``
(which writes launch scripts on any machine) can use them without verl installed.
"""

from __future__ import annotations

# policy_loss.loss_mode -> (AR on, TR-GRPO on)
POLICY_LOSS_STAGES: dict[str, tuple[bool, bool]] = {
    "tokenbalance_grpo": (False, False),
    "tokenbalance_ar": (True, False),
    "tokenbalance_tr_grpo": (False, True),
    "tokenbalance_ar_tr_grpo": (True, True),
}
POLICY_LOSS_NAMES = tuple(POLICY_LOSS_STAGES)

# algorithm.adv_estimator -> tokenbalance AdvantageConfig.estimator
ADVANTAGE_ESTIMATORS: dict[str, str] = {
    "tokenbalance_grpo": "grpo",
    "tokenbalance_dr_grpo": "dr_grpo",
    "tokenbalance_rloo": "rloo",
    "tokenbalance_reinforce_pp": "reinforce_pp",
}

# trainer.v1.trainer_mode of the Lopti trainer
LOPTI_TRAINER = "tokenbalance_lopti"

# Non-tensor key the Lopti trainer puts in the batch's extra_info: the name of the pass
# ("lopti_low" / "lopti_high") that the loss must compute.
UPDATE_PASS_KEY = "tokenbalance_update_pass"

# Fully qualified name of our policy-loss config class (policy_loss._target_).
POLICY_LOSS_CONFIG_TARGET = "tokenbalance.integrations.verl.config.TokenBalancePolicyLossConfig"

NTHR_UNSUPPORTED = (
    "NTHR is not supported on verl: it needs the old policy's last-layer hidden states (and the "
    "unembedding) for every response token, and verl's workers return only log-probs and entropy "
    "to the trainer and the loss. Run NTHR with `tokenbalance train` or the TRL integration "
    "(docs/verl.md, 'NTHR')."
)
