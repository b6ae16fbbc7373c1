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

# trainer.v1.trainer_mode of the NTHR trainer; its settings go in the section trainer.v1.<this name>
# (verl's place for a trainer mode's own settings, as trainer.v1.separate_async).
NTHR_TRAINER = "tokenbalance_nthr"

# Non-tensor key the NTHR trainer puts in the old-log-prob batch's extra_info: the actor worker
# then also returns the last-layer hidden states of the response tokens, under NTHR_HIDDEN_FIELD.
NTHR_HIDDEN_KEY = "tokenbalance_return_hidden"
NTHR_HIDDEN_FIELD = "tokenbalance_hidden"

# Why NTHR is refused as a policy loss or an advantage estimator (it is a trainer mode).
NTHR_UNSUPPORTED = (
    "NTHR is not a policy loss or an advantage estimator on verl: it weights the advantages once per "
    "step from the old policy's last-layer hidden states of every response token, which only the "
    f"{NTHR_TRAINER} trainer collects (in verl's old-log-prob forward). Select "
    f"trainer.v1.trainer_mode={NTHR_TRAINER} with any loss and estimator, NTHR's settings under "
    f"+trainer.v1.{NTHR_TRAINER}.* (docs/verl.md, 'NTHR on verl')."
)
