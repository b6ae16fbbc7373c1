"""The cost of each method over GRPO on one batch, and the update's FLOP/s against the matmul rate.

One realistic batch of the embedded default (the SFT-warmed tiny policy, 16 K&K prompts x 8
responses, sampled once). For each method, from the same weights and a fresh optimizer:

* prepare: the old-policy log-prob pass (with last-layer hidden states for NTHR) and
  ``build_update_passes`` (advantages, AR / NTHR weights, the Lopti split);
* update: ``run_update`` (forward + backward + AdamW per pass and mini-batch); GRPO's is
  also timed with every row running its own prompt (``optim.share_prompts=off``), to show that gain.

The reference log-probs (the KL term, the same for every method) are computed once, outside the
timings. Methods run round-robin so a slow spell of the machine hits all of them. The update's
floating-point operations are counted with ``torch.utils.flop_counter`` and divided by its time,
then compared with the matrix-multiply rate measured in the same process, in the model's dtype.

``--device`` / ``--dtype`` / ``--shape`` run it elsewhere (a policy of that shape with random weights,
``benchmarks/_shapes.py``; the default is the embedded SFT policy on the CPU) and ``--methods`` picks
the rows (GRPO always among them).

    .venv/bin/python benchmarks/update_cost.py --repeats 7 [--profile]
    python benchmarks/update_cost.py --device cuda --dtype bfloat16 --shape qwen2.5-0.5b --methods grpo,lopti,nthr --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable

import _before_torch  # noqa: F401  (the threading environment, before torch loads)

import torch
from torch.utils.flop_counter import FlopCounterMode

from _common import interleaved_medians, machine_line, markdown_table, matmul_flops_per_s, profile_shares, synchronize
from _rl_batch import RLBatch, embedded_batch
from _shapes import add_data_option, add_placement_options, placement, run_config
from tokenbalance.algorithms.loss import pass_loss
from tokenbalance.algorithms.methods import NTHRInputs, build_update_passes
from tokenbalance.algorithms.presets import get_method
from tokenbalance.trainer import update as update_module
from tokenbalance.trainer.evaluate import full_reward
from tokenbalance.trainer.logprobs import batched_response_logprobs, response_logprobs
from tokenbalance.trainer.loop import make_optimizer
from tokenbalance.trainer.update import UpdateRows, UpdateSettings, UpdateSpec, run_update

METHODS = ("grpo", "ar", "tr_grpo", "nthr", "lopti", "ar_lopti")
UNSHARED = "grpo, prompts not shared"
# the budgets: total cost over GRPO for AR / TR-GRPO / NTHR, the update phase for Lopti
BUDGETS = {"ar": ("step", 1.03), "tr_grpo": ("step", 1.03), "nthr": ("step", 1.10), "lopti": ("update", 2.10)}


def prepare(batch: RLBatch, method, ref_logp_BT: torch.Tensor):
    cfg, policy, packed = batch.parts.config, batch.parts.state.policy, batch.packed
    old = batched_response_logprobs(
        policy,
        packed,
        temperature=cfg.rollout.temperature,
        micro_batch=cfg.optim.micro_batch_size,
        with_hidden=method.needs_hidden_states,
    )
    nthr_inputs = None
    if method.needs_hidden_states:
        head = policy.get_output_embeddings()
        assert old.hidden_BTD is not None  # asked for with with_hidden
        nthr_inputs = NTHRInputs.from_output_layer(
            head,
            packed.input_ids_BL[:, packed.prompt_len :],
            old.hidden_BTD,
            cfg.rollout.temperature,
            max_reward=full_reward(batch.parts.runtime.task),
        )
    passes, _ = build_update_passes(
        method, batch.scores_B, batch.group_ids_B, batch.mask_BT, old.logp_BT, ref_logp_BT, nthr_inputs
    )
    return passes, old.logp_BT


def method_work(batch: RLBatch, method, old, ref_logp_BT) -> Callable[[], None]:
    """The method's own arithmetic, without the model: ``build_update_passes`` on the stored old
    log-probs (and hidden states), then every pass's loss and its backward to the log-probs."""
    packed, policy = batch.packed, batch.parts.state.policy
    head = policy.get_output_embeddings()
    nthr_inputs = NTHRInputs.from_output_layer(
        head,
        packed.input_ids_BL[:, packed.prompt_len :],
        old.hidden_BTD,
        1.0,
        max_reward=full_reward(batch.parts.runtime.task),
    )

    def run():
        passes, _ = build_update_passes(
            method,
            batch.scores_B,
            batch.group_ids_B,
            batch.mask_BT,
            old.logp_BT,
            ref_logp_BT,
            nthr_inputs if method.needs_hidden_states else None,
        )
        logp_BT = old.logp_BT.clone().requires_grad_(True)
        for update_pass in passes:
            pass_loss(method, update_pass, logp_BT, old.logp_BT, ref_logp_BT, old.entropy_BT).loss.backward()

    return run


def update(batch: RLBatch, method, passes, old_logp_BT, ref_logp_BT) -> dict:
    cfg, policy = batch.parts.config, batch.parts.state.policy
    return run_update(
        UpdateSpec(
            method,
            passes,
            UpdateRows(batch.packed, old_logp_BT, ref_logp_BT),
            UpdateSettings(
                temperature=cfg.rollout.temperature,
                mini_batch_rows=cfg.optim.mini_batch_size,
                micro_batch_rows=cfg.optim.micro_batch_size,
                grad_clip=cfg.optim.grad_clip,
                token_mean_scope=cfg.optim.token_mean_scope,
            ),
        ),
        policy,
        make_optimizer(policy, cfg),
        batch.parts.runtime.ctx,
    ).metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="also profile one GRPO update")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated presets (grpo is always run)")
    parser.add_argument(
        "--matmul-size", type=int, help="side of the timed square matmul (default 512 on CPU, 8192 on CUDA)"
    )
    add_placement_options(parser, shapes=("embedded", "tiny", "qwen2.5-0.5b"), default_shape="embedded")
    add_data_option(parser)
    args = parser.parse_args(argv)
    device, dtype = placement(args)
    torch.set_num_threads(args.threads)
    names = tuple(dict.fromkeys(["grpo", *args.methods.split(",")]))
    batch = embedded_batch(config=run_config(args.data_count), shape=args.shape, device=device, dtype=dtype)
    sync = functools.partial(synchronize, device)
    cfg = batch.parts.config
    ref_logp_BT = batched_response_logprobs(
        batch.parts.state.reference,
        batch.packed,
        temperature=cfg.rollout.temperature,
        micro_batch=cfg.optim.micro_batch_size,
    ).logp_BT
    methods = {name: get_method(name) for name in names}
    prepared: dict[str, tuple[list, torch.Tensor]] = {}

    def prepare_fn(name):
        def run():
            batch.parts.state.policy.load_state_dict(batch.initial_state)
            prepared[name] = prepare(batch, methods[name], ref_logp_BT)

        return run

    def update_fn(name):
        def run():
            batch.parts.state.policy.load_state_dict(batch.initial_state)
            passes, old_logp_BT = prepared[name]
            return update(batch, methods[name], passes, old_logp_BT, ref_logp_BT)

        return run

    def unshared_logprobs(*args, forward_settings, **kwargs):
        unshared = dataclasses.replace(forward_settings, share_prompts=False)
        return response_logprobs(*args, forward_settings=unshared, **kwargs)

    def unshared_update():  # GRPO with every row's prompt in its own forward (optim.share_prompts=off; the
        # rows above share prompts on every device: update() gives UpdateSettings' default forward)
        update_module.response_logprobs = unshared_logprobs  # type: ignore[assignment]
        try:
            return update_fn("grpo")()
        finally:
            update_module.response_logprobs = response_logprobs

    prep_s, _ = interleaved_medians({name: prepare_fn(name) for name in names}, args.repeats, sync=sync)
    update_s, _ = interleaved_medians(
        {**{name: update_fn(name) for name in names}, UNSHARED: unshared_update}, args.repeats, sync=sync
    )
    batch.parts.state.policy.load_state_dict(batch.initial_state)
    old = batched_response_logprobs(
        batch.parts.state.policy,
        batch.packed,
        temperature=cfg.rollout.temperature,
        micro_batch=cfg.optim.micro_batch_size,
        with_hidden=True,
        with_entropy=True,
    )
    work_s, _ = interleaved_medians(
        {name: method_work(batch, methods[name], old, ref_logp_BT) for name in names}, args.repeats * 10, sync=sync
    )
    with FlopCounterMode(display=False) as counter:
        update_fn("grpo")()
    grpo_flops = counter.get_total_flops()
    matmul_size = args.matmul_size or (8192 if device.type == "cuda" else 512)
    peak = matmul_flops_per_s(matmul_size, dtype=dtype, device=device)

    rows = []
    base_total = prep_s["grpo"] + update_s["grpo"]
    for name in names:
        total = prep_s[name] + update_s[name]
        budget = BUDGETS.get(name)
        verdict = ""
        if budget:
            phase, limit = budget
            ratio = total / base_total if phase == "step" else update_s[name] / update_s["grpo"]
            verdict = f"{phase} {ratio:.3f}x (goal <= {limit}x: {'met' if ratio <= limit else 'missed'})"
        rows.append(
            [
                name,
                f"{prep_s[name] * 1e3:.0f}",
                f"{update_s[name] * 1e3:.0f}",
                f"{total * 1e3:.0f}",
                f"{update_s[name] / update_s['grpo']:.3f}x",
                f"{total / base_total:.3f}x",
                verdict,
            ]
        )
    rows.append(
        [
            UNSHARED,
            "",
            f"{update_s[UNSHARED] * 1e3:.0f}",
            "",
            f"{update_s[UNSHARED] / update_s['grpo']:.3f}x",
            "",
            "the update without the shared-prompt forward",
        ]
    )
    tokens = int(batch.packed.attention_mask_BL.sum())
    print(
        f"Batch: {batch.packed.input_ids_BL.shape[0]} responses x {batch.packed.input_ids_BL.shape[1]} columns "
        f"(prompt {batch.packed.prompt_len}), {tokens} real tokens; mini-batch {cfg.optim.mini_batch_size}, "
        f"micro-batch {cfg.optim.micro_batch_size}; median of {args.repeats} interleaved runs."
    )
    print(f"Policy: {args.shape}, {args.dtype} on {device}.")
    print(machine_line(device))
    print()
    print(
        markdown_table(
            ["method", "prepare (ms)", "update (ms)", "total (ms)", "update vs GRPO", "total vs GRPO", "budget"], rows
        )
    )
    base_total = prep_s["grpo"] + update_s["grpo"]
    print()
    print(
        "The method's own arithmetic (no model forward): build_update_passes + each pass's loss and backward "
        f"to the log-probs, median of {args.repeats * 10}; its extra over GRPO as a share of GRPO's prepare + "
        "update above. NTHR's hidden states come from the old-policy forward it shares with GRPO (the "
        "prepare column)."
    )
    print()
    print(
        markdown_table(
            ["method", "own arithmetic (ms)", "extra over GRPO (ms)", "extra / GRPO prepare + update"],
            [
                [
                    name,
                    f"{work_s[name] * 1e3:.1f}",
                    f"{(work_s[name] - work_s['grpo']) * 1e3:+.1f}",
                    f"{(work_s[name] - work_s['grpo']) / base_total:+.1%}",
                ]
                for name in names
            ],
        )
    )
    achieved = grpo_flops / update_s["grpo"]
    print()
    print(
        markdown_table(
            [
                "GRPO update FLOPs",
                "update time (s)",
                "achieved FLOP/s",
                f"matmul rate ({matmul_size}x{matmul_size} {args.dtype})",
                "fraction",
            ],
            [
                [
                    f"{grpo_flops / 1e9:.1f} G",
                    f"{update_s['grpo']:.3f}",
                    f"{achieved / 1e9:.1f} G",
                    f"{peak / 1e9:.1f} G",
                    f"{achieved / peak:.0%}",
                ]
            ],
        )
    )
    if args.profile:
        print()
        print(profile_shares(update_fn("grpo"), "GRPO update: forward, backward, AdamW"))


if __name__ == "__main__":
    main()
