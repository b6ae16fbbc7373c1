#!/usr/bin/env bash
# Shared settings of the four AR-Lopti K&K presets on verl 0.9 (sourced by kk_*.sh).
# Every value below is from the AR-Lopti K&K scripts train_kklogic_*_4x80GB.sh (Yang et al. 2025,
# arXiv 2505.12929; the authors' scripts, zhyang2226/AR-Lopti) unless marked "verl" (a verl 0.9 setting with no
# counterpart in the 2025 fork) or "ours".
#
# Environment (all optional):
#   MODEL=7b|3b          7b: Qwen/Qwen2.5-7B-Instruct-1M (the scripts' default), 3b: Qwen/Qwen2.5-3B-Instruct
#   MODEL_PATH=...       a local copy of the model instead of the hub name (a grid cell sets it from
#                        MODEL_PATH_3B / MODEL_PATH_7B, one per model)
#   ESTIMATOR=grpo|reinforce_pp   advantage estimator (the scripts' default grpo; alternative reinforce_plus_plus)
#   METHOD=NAME          the method: a preset (tokenbalance list-methods) or your token rule (MODULE:RULE or
#                        FILE.py:RULE); each kk_*.sh has its own default, on ESTIMATOR's base (grpo: ar,
#                        reinforce_pp: reinforce_pp_ar); its hyper-parameters change with
#                        +actor_rollout_ref.actor.policy_loss.overrides.<stage>.<field>=... appended
#   DATA_DIR=data/kk     where prepare_kk_data.sh wrote the parquet files
#   N_GPUS=4             GPUs on the node (the scripts: 1 node x 4 x 80 GB)
#   OFFLOAD=1            FSDP CPU offload as the authors' fork: actor parameters and optimizer state, reference
#                        parameters (1, the default); 0: all on the GPU (faster where memory allows)
#   VALIDATION=greedy    greedy validation (verl's default, the table's); sample: one response at T = 1.0,
#                        top_p 1 (the fork's second validation; verl 0.9.1 validates one way per run)
#   LOSS_SCOPE=mini_batch the loss normaliser: verl 0.9.1's (valid tokens of the whole mini-batch, the default);
#                        micro_batch: the AR-Lopti fork's masked mean per micro-batch (docs/verl.md)
#   KEEP_CHECKPOINTS=1   the newest checkpoints verl keeps (ours: verl's default keeps all, ~37 GB each at 3B)
#   DRY_RUN=1            check and print the composed config instead of training (writes nothing here);
#                        1/true/yes/on: a dry run; unset/empty/0/false/no/off: train; anything else is refused
#   extra hydra overrides can be appended to any kk_*.sh command line; a "+KEY=..." for a key these scripts
#   already add (the loss normaliser, the method) replaces theirs.
set -euo pipefail

MODEL="${MODEL:-7b}"
case "$MODEL" in
  7b) MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct-1M}" ;;
  3b) MODEL_PATH="${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}" ;;
  *) echo "MODEL must be 7b or 3b, got '$MODEL'" >&2; exit 2 ;;
esac
DRY_RUN_WORD="$(printf '%s' "${DRY_RUN:-}" | tr '[:upper:]' '[:lower:]')"
case "$DRY_RUN_WORD" in
  ""|0|false|no|off) DRY_RUN=0 ;;
  1|true|yes|on) DRY_RUN=1 ;;
  *) echo "DRY_RUN must be 1/true/yes (a dry run) or 0/false/no/unset (train), got '$DRY_RUN'; nothing started" >&2; exit 2 ;;
esac
ESTIMATOR="${ESTIMATOR:-grpo}"
case "$ESTIMATOR" in
  grpo|reinforce_pp) ;;
  *) echo "ESTIMATOR must be grpo or reinforce_pp, got '$ESTIMATOR'" >&2; exit 2 ;;
esac
DATA_DIR="${DATA_DIR:-data/kk}"
N_GPUS="${N_GPUS:-4}"
KEEP_CHECKPOINTS="${KEEP_CHECKPOINTS:-1}"
case "${OFFLOAD:-1}" in
  1) OFFLOAD=True ;;
  0) OFFLOAD=False ;;
  *) echo "OFFLOAD must be 1 (the fork's CPU offload) or 0, got '$OFFLOAD'" >&2; exit 2 ;;
esac
VALIDATION="${VALIDATION:-greedy}"
case "$VALIDATION" in
  greedy) VAL_KWARGS=(actor_rollout_ref.rollout.val_kwargs.do_sample=False) ;;
  sample)
    VAL_KWARGS=(actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.rollout.val_kwargs.temperature=1.0
      actor_rollout_ref.rollout.val_kwargs.top_p=1.0 actor_rollout_ref.rollout.val_kwargs.top_k=-1
      actor_rollout_ref.rollout.val_kwargs.n=1) ;;
  *) echo "VALIDATION must be greedy or sample, got '$VALIDATION'" >&2; exit 2 ;;
esac
LOSS_SCOPE="${LOSS_SCOPE:-mini_batch}"
case "$LOSS_SCOPE" in
  mini_batch | micro_batch) ;;
  *) echo "LOSS_SCOPE must be mini_batch (verl's normaliser) or micro_batch (the fork's), got '$LOSS_SCOPE'" >&2; exit 2 ;;
esac
VAL_FILES="[$DATA_DIR/3ppl/test_new.parquet,$DATA_DIR/4ppl/test_new.parquet,$DATA_DIR/5ppl/test_new.parquet,$DATA_DIR/6ppl/test_new.parquet,$DATA_DIR/7ppl/test_new.parquet]"
POLICY_LOSS=actor_rollout_ref.actor.policy_loss

COMMON_OVERRIDES=(
  # data: 64 prompts x 8 rollouts = 512 responses per RL step; prompt / response 400 / 4096 tokens
  "data.train_files=$DATA_DIR/merge_34567ppl/train.parquet"
  "data.val_files=$VAL_FILES"
  data.train_batch_size=64
  data.max_prompt_length=400
  data.max_response_length=4096
  # the prompts carry the Qwen chat turns already (gen-data's qwen-instruct template); the
  # reference tokenised them verbatim, so the chat template passes the text through (ours)
  "actor_rollout_ref.model.custom_chat_template='{{ messages[0].content }}'"
  "actor_rollout_ref.model.path=$MODEL_PATH"
  actor_rollout_ref.model.use_remove_padding=True
  # actor: mini-batch 256 responses = 32 prompts (verl counts prompts), micro-batch 8 per GPU
  actor_rollout_ref.actor.ppo_mini_batch_size=32
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
  actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.shuffle=False
  actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.optim.weight_decay=0.01
  actor_rollout_ref.actor.optim.clip_grad=1.0
  actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.0
  # FSDP CPU offload (OFFLOAD): the fork's param_offload, grad_offload and optimizer_offload for the actor and
  # param_offload for the reference (verl 0.9.1 has no grad_offload key)
  "actor_rollout_ref.actor.fsdp_config.param_offload=$OFFLOAD"
  "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$OFFLOAD"
  "actor_rollout_ref.ref.fsdp_config.param_offload=$OFFLOAD"
  # clipped surrogate: eps_low 0.20, eps_high 0.24, dual clip c = 10
  actor_rollout_ref.actor.clip_ratio_low=0.2
  actor_rollout_ref.actor.clip_ratio_high=0.24
  actor_rollout_ref.actor.clip_ratio_c=10.0
  actor_rollout_ref.actor.loss_agg_mode=token-mean
  actor_rollout_ref.actor.entropy_coeff=0.0
  # KL as a loss: k3 (low_var_kl) x 0.001 (verl clamps its log-ratio at 20, the fork at 5)
  actor_rollout_ref.actor.use_kl_loss=True
  actor_rollout_ref.actor.kl_loss_type=low_var_kl
  actor_rollout_ref.actor.kl_loss_coef=0.001
  algorithm.use_kl_in_reward=False
  algorithm.kl_ctrl.kl_coef=0.001
  algorithm.gamma=1.0
  algorithm.lam=1.0
  # tokenbalance's policy-loss config class: the method (run_method below) travels in it
  "$POLICY_LOSS._target_=tokenbalance.integrations.verl.config.TokenBalancePolicyLossConfig"
  # the loss normaliser (LOSS_SCOPE): mini_batch (verl 0.9.1's) or micro_batch (the fork's)
  "+$POLICY_LOSS.token_mean_scope=$LOSS_SCOPE"
  "algorithm.adv_estimator=tokenbalance_$ESTIMATOR"
  # rollout: vLLM, T 0.7, top_p 1, top_k -1, TP 1, 60 % memory, eager; log-prob micro-batch 8
  actor_rollout_ref.rollout.name=vllm
  actor_rollout_ref.rollout.n=8
  actor_rollout_ref.rollout.temperature=0.7
  actor_rollout_ref.rollout.top_p=1.0
  actor_rollout_ref.rollout.top_k=-1
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6
  actor_rollout_ref.rollout.enforce_eager=True
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8
  # K&K reward (Logic-RL scoring: 3 / -0.5 / -1 / -3) from tokenbalance.tasks.kk
  reward.custom_reward_function.path=pkg://tokenbalance.integrations.verl.reward
  reward.custom_reward_function.name=compute_score
  # validation (VALIDATION): greedy (verl's default; the fork also logs a T = 1.0 sample)
  "${VAL_KWARGS[@]}"
  # schedule: 5 epochs (350 steps), validate before training and every 20 steps, save every 20
  trainer.total_epochs=5
  trainer.val_before_train=True
  trainer.test_freq=20
  trainer.save_freq=20
  # checkpoint retention (ours, KEEP_CHECKPOINTS): the fork keeps every one (fp32 weights + Adam state:
  # 12 bytes per parameter, ~0.67 TB per 3B run); a resume needs only the newest
  "trainer.max_actor_ckpt_to_keep=$KEEP_CHECKPOINTS"
  trainer.n_gpus_per_node="$N_GPUS"
  trainer.nnodes=1
  trainer.project_name=AR-Lopti
  "trainer.logger=[console,wandb]"
)

# run_preset NAME [overrides...]: launch verl through our validating entry point (a dry run checks the
# composed config with ours and verl's own validate_config, then stops).
run_preset() {
  local name="$1"; shift
  local overrides=() arg
  local -A appended=()
  # a second "+KEY=..." (yours, appended to a kk_*.sh line, for a key this script already adds: the loss
  # normaliser, the method) would make hydra refuse the run; it is passed as "KEY=...", which replaces ours
  for arg in "${COMMON_OVERRIDES[@]}" "trainer.experiment_name=kk_${name}_${ESTIMATOR}_${MODEL}" "$@"; do
    if [[ "$arg" == +* && "$arg" != ++* ]]; then
      if [[ -n "${appended[${arg%%=*}]:-}" ]]; then arg="${arg#+}"; else appended[${arg%%=*}]=1; fi
    fi
    overrides+=("$arg")
  done
  TOKENBALANCE_VERL_DRY_RUN="$DRY_RUN" python -m tokenbalance.integrations.verl.main "${overrides[@]}"
}

# preset_of NAME: the preset NAME on ESTIMATOR's base (ar -> ar or reinforce_pp_ar; grpo -> grpo or reinforce_pp).
preset_of() {
  if [[ "$ESTIMATOR" == grpo ]]; then echo "$1"; elif [[ "$1" == grpo ]]; then echo reinforce_pp; else echo "reinforce_pp_$1"; fi
}

# run_method NAME TRAINER [overrides...]: $METHOD on verl's sync trainer (sync: our tokenbalance_sync, verl's
# plus the stop on request), our Lopti trainer (lopti, one actor update per pass) or our NTHR trainer (nthr,
# FSDP2: it reads the hidden states), through run_preset. Each stops at the next step with a checkpoint when
# the file TOKENBALANCE_STOP_FILE names exists (docs/verl.md, "Stopping a run with a checkpoint").
run_method() {
  local name="$1" trainer="$2"; shift 2
  local trainer_mode=()
  case "$trainer" in
    sync) trainer_mode=(trainer.v1.trainer_mode=tokenbalance_sync) ;;
    lopti) trainer_mode=(trainer.v1.trainer_mode=tokenbalance_lopti) ;;
    nthr) trainer_mode=(trainer.v1.trainer_mode=tokenbalance_nthr actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.ref.strategy=fsdp2) ;;
    *) echo "TRAINER must be sync, lopti or nthr, got '$trainer'" >&2; exit 2 ;;
  esac
  run_preset "$name" "$POLICY_LOSS.loss_mode=tokenbalance" "+$POLICY_LOSS.method=$METHOD" ${trainer_mode[@]+"${trainer_mode[@]}"} "$@"
}
