"""``TokenBalanceGRPOTrainer``: TRL's ``GRPOTrainer`` with AR, TR-GRPO, Lopti, NTHR and your token rules.

TRL keeps generation, rewards, advantages, reference log-probs, logging, checkpoints and
accelerate / DeepSpeed / vLLM. ``_compute_loss`` reuses TRL's forward (the fused LM head; NTHR's
hidden states captured on it) with our maths (``passes_from_advantages``, ``pass_loss``) and logs the
gradient share from the same forward (docs/metrics.md); ``_generate_and_score_completions`` adds
each completion's group id (and reward, for NTHR); Lopti's two passes are TRL's own rounds
(``num_iterations`` = 2 x mu). What each override does, the differences and commands: docs/trl.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from trl import GRPOTrainer

from tokenbalance.algorithms.loss import pass_loss, pass_normaliser
from tokenbalance.algorithms.methods import Method, NTHRInputs, passes_from_advantages
from tokenbalance.algorithms.nthr import nthr_correct
from tokenbalance.diagnostics.edges import DEFAULT_EDGES, check_bucket_edges
from tokenbalance.diagnostics.grad_share import loss_grad_shares
from tokenbalance.integrations.hidden import capture_last_hidden, decoder_of
from tokenbalance.integrations.trl.config import (
    check_config,
    pass_count,
    trainer_method,
)
from tokenbalance.integrations.trl.hidden import completion_hidden
from tokenbalance.integrations.trl.passes import (
    broadcast_advantages,
    scale_pass_advantages,
)
from tokenbalance.types import LossNormaliser, UpdatePass

FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class TokenBalanceGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose loss is a tokenbalance :class:`Method` (preset name or object).

    Build ``args`` with :func:`tokenbalance.integrations.trl.grpo_config_for_method`: the config carries
    its method, so ``method`` may be left out (given, it must be the same method); a config built
    otherwise trains ``method`` (default GRPO). ``method_overrides`` (``{"lopti.eta": 0.4}``) change the
    method as ``train.method_overrides`` does in our trainer. A config that contradicts the method, or a
    method TRL cannot run, raises ``ValueError`` with the reason.
    ``nthr_max_reward``: the largest reward a completion can get, whose completions NTHR counts as
    correct (default: derived from the reward functions' ``max_reward`` attributes; not needed when
    the method states ``nthr.correct_threshold`` or uses ``nthr.positives="advantage_sign"``).
    ``grad_share_edges``: the probability buckets of the gradient-share metrics (``None``: off).
    All other arguments are ``GRPOTrainer``'s.
    """

    def __init__(
        self,
        model,
        reward_funcs=None,
        args=None,
        *,
        method: Method | str | None = None,
        method_overrides: Mapping[str, Any] | None = None,
        nthr_max_reward: float | None = None,
        grad_share_edges: Sequence[float] | None = DEFAULT_EDGES,
        **kwargs,
    ):
        self.grad_share_edges = None if grad_share_edges is None else check_bucket_edges(grad_share_edges)
        if args is None:
            raise ValueError(
                "args: required; build it with grpo_config_for_method(method, ...) so that TRL's "
                "loss fields agree with the method"
            )
        method = trainer_method(method, args, method_overrides)
        check_config(method, args)
        if method.loss_agg_mode == "seq-mean-token-sum-norm":
            method = method.replace(max_response_len=args.max_completion_length)
        self.balance_method = method
        super().__init__(model, reward_funcs, args, **kwargs)
        if self.aux_loss_enabled:
            raise ValueError(
                "the model adds a mixture-of-experts router loss, which the tokenbalance loss does not "
                "include; set router_aux_loss_coef=0.0"
            )
        if method.nthr is not None:
            decoder_of(self._policy_module())  # fails now, not at the first step
        if self.grad_share_edges is not None:
            self._request_sum_sq_probs()
        self._rewards_per_func = None
        self.nthr_max_reward = None
        if self._needs_rewards():
            self.nthr_max_reward = self._max_reward() if nthr_max_reward is None else float(nthr_max_reward)

    # ------------------------------------------------------------------ overrides

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rewards_per_func = rewards_per_func  # all processes' rows, as TRL gathers them
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        num_rows = output["completion_ids"].shape[0]
        output["group_ids"] = self._group_ids(num_rows)
        if self._needs_rewards():
            output["rewards"] = self._local_rewards(num_rows)
        return output

    def _compute_loss(self, model, inputs):
        method = self.balance_method
        mask_BT = inputs["completion_mask"].bool()
        if "tool_mask" in inputs:
            mask_BT = mask_BT & inputs["tool_mask"].bool()
        grad_share = self.grad_share_edges is not None and self.model.training
        with capture_sum_sq_probs(self._fused_module()) if grad_share else contextlib.nullcontext([]) as sum_sq:
            logp_BT, entropy_BT, hidden_BTD = self._policy_forward(model, inputs)
        old_logp_BT = inputs.get("old_per_token_logps")
        if old_logp_BT is None or method.nthr is not None:
            old_logp_BT = logp_BT.detach()  # the training forward is the old policy (config.check_config)
        nthr_inputs = self._nthr_inputs(inputs, hidden_BTD) if method.nthr is not None else None
        advantages_BT = broadcast_advantages(inputs["advantages"], mask_BT).to(old_logp_BT.dtype)
        passes, metrics = passes_from_advantages(
            method, advantages_BT, mask_BT, old_logp_BT, inputs.get("group_ids"), nthr_inputs
        )
        training = self.model.training
        chosen = [self._pass_index()] if training else range(len(passes))  # eval: the whole objective
        loss = logp_BT.new_zeros(())
        normaliser = None
        for index in chosen:
            update_pass = passes[index]
            if "importance_sampling_ratio" in inputs:
                update_pass = scale_pass_advantages(update_pass, inputs["importance_sampling_ratio"])
            normaliser = self._normaliser(update_pass, inputs, training)
            out = pass_loss(
                method,
                update_pass,
                logp_BT,
                old_logp_BT,
                inputs.get("ref_per_token_logps"),
                entropy_BT,
                normaliser=normaliser,
            )
            loss = loss + out.loss
            metrics.update(out.metrics)
            if len(passes) > 1:
                metrics.update({f"pass/{update_pass.name}/{k}": v for k, v in out.metrics.items()})
        if training and len(passes) > 1:
            metrics["lopti/pass_index"] = float(chosen[0])
        if grad_share and normaliser is not None and logp_BT.requires_grad:
            sum_sq_BT = torch.exp(torch.cat(sum_sq)[:, -logp_BT.shape[1] :]) if sum_sq else None
            metrics.update(
                self._grad_shares(
                    loss, logp_BT, sum_sq_BT, old_logp_BT, mask_BT, advantages_BT, update_pass, normaliser
                )
            )
        self._record(metrics, "train" if training else "eval")
        return loss

    # ------------------------------------------------------------------ helpers

    def _fused_module(self) -> torch.nn.Module:
        """The module TRL patched with its fused LM head (the base model under PEFT)."""
        module = self._policy_module()
        return module.get_base_model() if hasattr(module, "get_base_model") else module

    def _request_sum_sq_probs(self) -> None:
        """Patch the fused head again, asking also for ``log_sum_sq_probs`` (sum_j pi_j^2, no gradient).

        The new forward runs the same kernel on the same inputs; its non-fused path calls TRL's
        patched forward, so generation is unchanged. A TRL without that output keeps its head and
        the metric falls back to the bound.
        """
        try:
            from trl.trainer.utils import add_fused_lm_head

            add_fused_lm_head(
                self._fused_module(),
                temperature=self.temperature,
                cast_lm_head_to_fp32=bool(getattr(self.args, "cast_lm_head_to_fp32", False)),
                outputs=("log_probs", "entropy", "log_sum_sq_probs"),
            )
        except (ImportError, TypeError, ValueError):
            pass

    def _grad_shares(
        self,
        loss: torch.Tensor,
        logp_BT: torch.Tensor,
        sum_sq_probs_BT: torch.Tensor | None,
        old_logp_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        advantages_BT: torch.Tensor,
        update_pass: UpdatePass,
        normaliser: LossNormaliser,
    ) -> dict[str, float]:
        """This micro-batch's token and gradient shares per bucket of the old probability
        (:func:`~tokenbalance.diagnostics.grad_share.loss_grad_shares`; "before" with the host's
        advantage, before NTHR / AR / TR-GRPO weights and the Lopti split, over all valid tokens)."""
        return loss_grad_shares(
            loss,
            logp_BT,
            old_logp_BT,
            mask_BT,
            advantages_BT,
            method=self.balance_method,
            normaliser_mask_BT=update_pass.normaliser_mask_BT,
            policy_normaliser=normaliser.policy,
            edges=self.grad_share_edges,
            sum_sq_probs_BT=sum_sq_probs_BT,
        )

    def _policy_module(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def _needs_rewards(self) -> bool:
        """NTHR with ``positives="correct"`` needs each completion's reward."""
        nthr = self.balance_method.nthr
        return nthr is not None and nthr.positives == "correct"

    def _max_reward(self) -> float | None:
        """The largest weighted reward sum: sum of weight x ``max_reward`` over the reward functions."""
        if self.balance_method.nthr.correct_threshold is not None:
            return None
        maxima = [getattr(func, "max_reward", None) for func in self.reward_funcs]
        weights = [float(w) for w in self.reward_weights.tolist()]
        if any(m is None for m in maxima) or any(w < 0.0 for w in weights):
            names = [name for name, m in zip(self.reward_func_names, maxima) if m is None]
            raise ValueError(
                "NTHR counts the completions with the maximum reward as correct (nthr.positives='correct'), "
                f"but the maximum is unknown: reward function(s) {names} have no max_reward attribute"
                f"{' and some weights are negative' if any(w < 0 for w in weights) else ''}; pass "
                "nthr_max_reward=..., or set nthr.correct_threshold or nthr.positives='advantage_sign'"
            )
        return math.fsum(w * float(m) for w, m in zip(weights, maxima) if m is not None)

    def _local_rewards(self, num_rows: int) -> torch.Tensor:
        """[B] weighted reward sum of this process's completions (NaN where no function scored)."""
        per_func = self._rewards_per_func
        if per_func is None:
            raise RuntimeError("NTHR: TRL did not call _calculate_rewards before returning the batch")
        start = self.accelerator.process_index * num_rows
        per_func = per_func[start : start + num_rows]
        rewards = (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(per_func).all(dim=1)] = torch.nan
        return rewards.to(self.accelerator.device)

    def _group_ids(self, num_rows: int) -> torch.Tensor:
        """[B] prompt-group ids of this process's rows: TRL lays groups out contiguously over ranks."""
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        start = self.accelerator.process_index * num_rows
        rows = torch.arange(start, start + num_rows, device=self.accelerator.device)
        return torch.div(rows, group_size, rounding_mode="floor")

    def _policy_forward(self, model, inputs):
        """TRL's forward: [B, T] log-probs (with gradient), entropies, and NTHR's hidden states."""
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        T = completion_ids.shape[1]
        extra = {key: inputs.get(key) for key in FORWARD_KEYS}
        capture = (
            capture_last_hidden(self._policy_module())
            if self.balance_method.nthr is not None
            else contextlib.nullcontext({})
        )
        with capture as store:
            logp_BT, entropy_BT, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, T, compute_entropy=True, **extra
            )
        hidden_BTD = completion_hidden(store["hidden_BLD"], T) if "hidden_BLD" in store else None
        return logp_BT, entropy_BT, hidden_BTD

    def _nthr_inputs(self, inputs, hidden_BTD: torch.Tensor | None) -> NTHRInputs:
        if hidden_BTD is None:
            raise RuntimeError("NTHR: the training forward did not run the decoder hook")
        group_ids_B = inputs.get("group_ids")
        if group_ids_B is None:
            raise ValueError("inputs['group_ids']: required by NTHR (added by _generate_and_score_completions)")
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        counts = torch.unique(group_ids_B, return_counts=True)[1]
        if bool((counts != group_size).any()):
            raise RuntimeError(
                f"NTHR needs whole prompt groups of {group_size} in each micro-batch, got group "
                f"sizes {counts.tolist()}; see the NTHR constraints in docs/trl.md"
            )
        correct_B = None
        if self._needs_rewards():
            if "rewards" not in inputs:
                raise ValueError("inputs['rewards']: required by NTHR (added by _generate_and_score_completions)")
            correct_B = nthr_correct(inputs["rewards"], self.balance_method.nthr, self.nthr_max_reward)
        head = self._policy_module().get_output_embeddings()
        return NTHRInputs.from_output_layer(
            head, inputs["completion_ids"], hidden_BTD, self.temperature, correct_B=correct_B
        )

    def _pass_index(self) -> int:
        """Which pass this training micro-step runs: TRL round k of 2 x mu -> pass k // mu."""
        passes = pass_count(self.balance_method)
        rounds_per_pass = self.num_iterations // passes
        generate_every = self.args.steps_per_generation * self.num_iterations
        round_index = (self._step % generate_every) // self.args.steps_per_generation
        return round_index // rounds_per_pass

    def _normaliser(self, update_pass: UpdatePass, inputs, training: bool) -> LossNormaliser:
        """Loss denominators with TRL's scope for ``loss_type``, so gradient accumulation and DDP add up.

        ``dapo`` (token-mean): the valid tokens of this optimizer step over all ranks, divided by the
        number of ranks (DDP averages gradients) - TRL's own dapo normaliser. Other loss types: the
        pass's denominators on this micro-batch, times the accumulation steps (TRL's per-micro-batch
        scope; our trainer's ``token_mean_scope="micro_batch"``).
        """
        accumulation = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        if self.loss_type == "dapo":
            tokens = float(inputs["num_items_in_batch"]) / self.accelerator.num_processes
            if training:
                tokens *= accumulation / self.args.steps_per_generation
            tokens = max(tokens, 1.0)
            return LossNormaliser(policy=tokens, regulariser=tokens)
        local = pass_normaliser(self.balance_method, update_pass)
        scale = accumulation if training else 1
        return LossNormaliser(policy=local.policy * scale, regulariser=local.regulariser * scale)

    def _record(self, metrics: dict[str, float], mode: str) -> None:
        """Append ``metrics`` (averaged over ranks) to TRL's metric buffers, logged at each logging step."""
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            per_rank = gather_object([metrics])
            keys = sorted({key for rank in per_rank for key in rank})
            metrics = {}
            for key in keys:
                values = [rank[key] for rank in per_rank if key in rank and math.isfinite(rank[key])]
                metrics[key] = sum(values) / len(values) if values else float("nan")
        for key, value in metrics.items():
            self._metrics[mode][key].append(float(value))


@contextlib.contextmanager
def capture_sum_sq_probs(fused_module: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, each forward of the fused head appends its [B, L-1] sum_j pi_j^2 as a log
    (``FusedCausalLMOutput.log_sum_sq_probs``, no gradient) to the yielded list; nothing when the
    output has none."""
    store: list[torch.Tensor] = []

    def keep(_module, _args, output) -> None:
        value = getattr(output, "log_sum_sq_probs", None)
        if value is not None:
            store.append(value.detach())

    handle = fused_module.register_forward_hook(keep)
    try:
        yield store
    finally:
        handle.remove()
