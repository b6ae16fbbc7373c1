"""The names we register into verl, and what the keys users typed before one loss name stand for.

Outside the ``verl`` subpackage (which checks the installed verl on import) and free of verl and
torch imports, so that the launch validation, the docs and ``tokenbalance ablate --runner verl``
(which writes launch scripts on any machine) can use them without verl installed (docs/verl.md).
"""

from __future__ import annotations

# policy_loss.loss_mode of our loss; the method is policy_loss.method (+ policy_loss.overrides)
POLICY_LOSS = "tokenbalance"
POLICY_LOSS_KEY = "actor_rollout_ref.actor.policy_loss"

# Deprecated loss names (one per stage combination, before POLICY_LOSS): still accepted, each as
# policy_loss.method=grpo with these stages on (the flat fields below set their values).
LEGACY_POLICY_LOSSES: dict[str, tuple[str, ...]] = {
    "tokenbalance_grpo": (),
    "tokenbalance_ar": ("ar",),
    "tokenbalance_tr_grpo": ("tr_grpo",),
    "tokenbalance_ar_tr_grpo": ("ar", "tr_grpo"),
}
POLICY_LOSS_NAMES = (POLICY_LOSS, *LEGACY_POLICY_LOSSES)

# Deprecated flat policy_loss fields -> the override each stands for (policy_loss.overrides.<key>).
LEGACY_FIELDS: dict[str, str] = {
    **{f"ar_{name}": f"ar.{name}" for name in ("alpha", "tau", "neg_adv_weight", "prob_source")},
    **{
        f"tr_grpo_{name}": f"tr_grpo.{name}"
        for name in ("shape", "alpha", "tau", "mu", "lower", "upper", "prob_source", "placement")
    },
    **{f"lopti_{name}": f"lopti.{name}" for name in ("eta", "order", "strict_less")},
    "token_rule": "token_rule",
}

# The method's settings verl has its own keys for: on verl those keys hold them (one source of truth).
VERL_OWNED: dict[str, str] = {
    "advantage": "algorithm.adv_estimator (and algorithm.gamma)",
    "clip": "actor_rollout_ref.actor.clip_ratio_low / clip_ratio_high / clip_ratio_c",
    "kl": "actor_rollout_ref.actor.use_kl_loss / kl_loss_type / kl_loss_coef",
    "entropy_coeff": "actor_rollout_ref.actor.entropy_coeff",
    "loss_agg_mode": "actor_rollout_ref.actor.loss_agg_mode",
    "policy_loss_agg_mode": "actor_rollout_ref.actor.loss_agg_mode",
    "max_response_len": "actor_rollout_ref.actor.loss_scale_factor",
    "dynamic_sampling": "verl's DAPO recipe (its own trainer)",
    "recommended_temperature": "actor_rollout_ref.rollout.temperature",
}

# algorithm.adv_estimator -> tokenbalance AdvantageConfig.estimator
ADVANTAGE_ESTIMATORS: dict[str, str] = {
    "tokenbalance_grpo": "grpo",
    "tokenbalance_dr_grpo": "dr_grpo",
    "tokenbalance_rloo": "rloo",
    "tokenbalance_reinforce_pp": "reinforce_pp",
}

# policy_loss.token_mean_scope: the loss normaliser's scope. "mini_batch" is verl 0.9.1's (the mini-batch's
# valid tokens over all ranks, the paper's objective); "micro_batch" the AR-Lopti fork's (a masked mean
# per micro-batch, divided by the gradient-accumulation steps), as our trainer's optim.token_mean_scope.
TOKEN_MEAN_SCOPE_KEY = f"{POLICY_LOSS_KEY}.token_mean_scope"
TOKEN_MEAN_SCOPES = ("mini_batch", "micro_batch")

# trainer.v1.trainer_mode of the Lopti trainer
LOPTI_TRAINER = "tokenbalance_lopti"

# trainer.v1.trainer_mode of verl's sync trainer plus the stop on request (integrations/verl/stop.py):
# the grid's single-pass cells run it.
SYNC_TRAINER = "tokenbalance_sync"

# The environment variable naming the file whose presence asks our trainers to save a checkpoint and
# stop at the next step (read in the Ray actor that runs the fit loop: pass it through ray_init's
# runtime_env, as run_cell.sh does).
STOP_FILE_ENV = "TOKENBALANCE_STOP_FILE"

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
    f"trainer.v1.trainer_mode={NTHR_TRAINER} with a method that has NTHR ({POLICY_LOSS_KEY}.method=nthr; its "
    f"settings as {POLICY_LOSS_KEY}.overrides.nthr.*) and any estimator (docs/verl.md, 'NTHR on verl')."
)
