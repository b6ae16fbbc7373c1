"""``tokenbalance diagnose``: the papers' measurements on a checkpoint and a fresh batch of rollouts.

* ``buckets``: the AR-Lopti paper's bucket-only update experiment (Figure 1 c/e/f and Figure 3).
  Sample ``--prompts`` x ``--group-size`` responses to training prompts, compute the method's
  advantages (GRPO by default), then, each time from the checkpoint, take one SGD step (lr 1e-3,
  as the paper) on the policy loss of all tokens, of the lowest bucket's tokens only and of the
  highest bucket's only (advantages outside the bucket set to 0, denominator all valid tokens, KL
  off, no gradient clipping), re-score the same responses and report per bucket the mean change of
  token probability and the share of positive-advantage tokens whose probability rose (Figure 3's
  "correct ratio"), plus the update's gradient norm (Figure 1 d). Differences from the paper: one
  batch, not an average over training steps; the paper's figure shows distributions, the table
  shows means and quantiles; a Lopti method's "all" update is its two passes (two SGD steps).
* ``lld``: the NTHR paper's LLD protocol (§4): for each question whose group is mixed, reset to the
  checkpoint, one update on that question's group (the method's loss and the training optimizer,
  AdamW at ``optim.lr``, unless ``--optimizer sgd``/``--lr``), then Δ(x) = mean over its correct
  responses of the change of the sequence log-likelihood. The reference policy is the checkpoint.
  ``--pos-only`` zeroes the negative advantages (the paper's "Pos Only").
* ``nthr``: the incorrect responses of mixed groups with the tokens NTHR selects (down-weights)
  highlighted, plus p, eta and tau per group: rich colours on a terminal, ``[brackets]`` otherwise.

    tokenbalance diagnose buckets runs/RUN --prompts 16 --group-size 8 --json buckets.json
    tokenbalance diagnose lld runs/RUN/checkpoints/step_000020 --prompts 32
    tokenbalance diagnose nthr --model /models/Qwen2.5-0.5B-Instruct --set data.template=qwen-instruct
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenbalance.commands.train import add_config_arguments, config_from_args, nonempty, printed_config_help
from tokenbalance.diagnostics.sinks import dump_json
from tokenbalance.outputs import check_output_file


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("diagnose", help="the papers' diagnostics on a checkpoint (buckets, lld, nthr)")
    inner = parser.add_subparsers(dest="diagnostic", metavar="DIAGNOSTIC")

    def common(name: str, help_text: str, prompts: int, method: str):
        sub = inner.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "checkpoint",
            nargs="?",
            type=nonempty,
            metavar="CHECKPOINT",
            help="a policy directory, a run's checkpoints/step_N directory, or a run directory "
            "(its latest checkpoint); default --model / the embedded policy",
        )
        add_config_arguments(sub)
        sub.add_argument("--prompts", type=int, default=prompts, help=f"training prompts sampled (default {prompts})")
        sub.add_argument("--group-size", type=int, help="responses per prompt (default rollout.group_size)")
        sub.add_argument(
            "--method",
            type=nonempty,
            default=method,
            help=f"method preset for the advantages (default {method}; "
            "--set method.KEY=VALUE changes its hyper-parameters)",
        )
        return sub

    sub = common("buckets", "bucket-only single-update experiment (AR-Lopti Figures 1 and 3)", 8, "grpo")
    sub.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3, the paper's)")
    sub.add_argument("--edges", default="0,0.25,0.5,0.75,1", help="bucket edges covering [0, 1]")
    sub.add_argument(
        "--json", dest="json_out", type=nonempty, help="also write the results as JSON to this file (a new file)"
    )
    sub.add_argument("--force", action="store_true", help="replace a --json file an earlier diagnose wrote")
    sub.set_defaults(func=run_buckets)

    sub = common(
        "lld",
        "LLD per question: reset, one update, change of likelihood of correct responses (NTHR paper protocol)",
        16,
        "grpo",
    )
    sub.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="optimizer of the single update")
    sub.add_argument("--lr", type=float, help="learning rate (default optim.lr)")
    sub.add_argument("--pos-only", action="store_true", help="zero the negative advantages (the paper's Pos Only)")
    sub.add_argument("--epsilon", type=float, default=0.0, help="a question is LLD when its Δ is below this")
    sub.add_argument(
        "--json", dest="json_out", type=nonempty, help="also write the results as JSON to this file (a new file)"
    )
    sub.add_argument("--force", action="store_true", help="replace a --json file an earlier diagnose wrote")
    sub.set_defaults(func=run_lld)

    sub = common("nthr", "incorrect responses with the tokens NTHR selects highlighted", 4, "nthr")
    sub.add_argument("--max-groups", type=int, default=4, help="mixed groups shown (default 4)")
    style = sub.add_mutually_exclusive_group()
    style.add_argument("--plain", action="store_true", help="[brackets] instead of colours")
    style.add_argument("--color", action="store_true", help="colours even when not writing to a terminal")
    sub.set_defaults(func=run_nthr)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


# ---------------------------------------------------------------------------------------------
# shared: checkpoint, batch of rollouts
# ---------------------------------------------------------------------------------------------


def resolve_checkpoint(path: str) -> str:
    """A policy directory from a policy directory, a checkpoint directory or a run directory (its
    ``latest`` checkpoint, or the newest complete ``step_*`` when ``latest`` is lost)."""
    from tokenbalance.trainer.checkpoint import resume_checkpoint

    directory = Path(path)
    if directory.is_dir() and not (directory / "config.json").is_file() and (directory / "checkpoints").is_dir():
        checkpoint = resume_checkpoint(directory)
        if checkpoint is None:
            raise ValueError(f"{path}: a run directory without a complete checkpoint (no complete checkpoints/step_*)")
        directory = checkpoint
    if (directory / "model" / "config.json").is_file():
        directory = directory / "model"
    return str(directory)


@dataclass
class DiagnosedBatch:
    """A checkpoint, its config and method, and one fresh :class:`~tokenbalance.trainer.batch.RolloutBatch`
    with old log-probs (built exactly as a training step builds it)."""

    config: Any
    model: Any
    tokenizer: Any
    device: Any
    task: Any
    method: Any
    rollout: Any

    @property
    def packed(self):
        return self.rollout.packed

    @property
    def mask_BT(self):
        return self.rollout.mask_BT

    @property
    def scores_B(self):
        return self.rollout.rewards_B

    @property
    def group_ids_B(self):
        return self.rollout.group_ids_B

    @property
    def correct_B(self):
        return self.rollout.correct_B

    @property
    def old(self):
        return self.rollout.old_logprobs

    @property
    def texts(self) -> list[str]:
        return self.rollout.texts_B

    @property
    def examples(self) -> list:
        return [e for e in self.rollout.examples_P for _ in range(self.rollout.group_size)]


def prepare_batch(args: argparse.Namespace, *, with_hidden: bool = False) -> DiagnosedBatch:
    """Load the checkpoint, sample ``--prompts`` x ``--group-size`` responses, score them, old log-probs."""
    import torch

    from tokenbalance.algorithms.methods import apply_method_overrides, get_method
    from tokenbalance.models import check_special_tokens, load_policy
    from tokenbalance.rollout import SamplingParams, make_engine
    from tokenbalance.tasks import get_task
    from tokenbalance.trainer.batch import sample_batch, with_logprobs
    from tokenbalance.trainer.data import rl_examples
    from tokenbalance.trainer.distributed import DistContext
    from tokenbalance.trainer.loop import derive_seed, prompt_order
    from tokenbalance.trainer.runner import check_before_work, compute_device, policy_path
    from tokenbalance.trainer.scoring import encode_prompts

    config = config_from_args(args)
    if args.checkpoint:
        config.model.path = resolve_checkpoint(args.checkpoint)
    if args.prompts < 1:
        raise ValueError(f"--prompts: must be >= 1, got {args.prompts}")
    group_size = args.group_size or config.rollout.group_size
    if group_size < 2:
        raise ValueError(f"--group-size: must be >= 2 (a group needs a baseline), got {group_size}")
    method = apply_method_overrides(get_method(args.method), config.train.method_overrides)
    check_before_work(config)  # data, tokenizer, prompt lengths, device: before the model loads
    device = compute_device(config)
    path = policy_path(config, device, DistContext(device=device), print)
    model, tokenizer = load_policy(path, device=device, dtype=getattr(torch, config.model.dtype))
    task = get_task(config.data.task)
    check_special_tokens(tokenizer, task.special_tokens)
    pool = rl_examples(config.data)
    chosen = [pool[i] for i in prompt_order(len(pool), config.train.seed, 0)[: args.prompts]]
    prompt_ids = encode_prompts(tokenizer, chosen, config.data.max_prompt_tokens)
    vocab = model.get_input_embeddings().num_embeddings
    if max(max(row) for row in prompt_ids) >= vocab:
        raise ValueError(
            f"{path}: the tokenizer produces ids beyond the model's {vocab} embedding rows; "
            "the checkpoint and the tokenizer do not match"
        )
    r = config.rollout
    batch = sample_batch(
        make_engine(config.rollout.engine, model, tokenizer),
        tokenizer,
        task,
        chosen,
        prompt_ids,
        torch.arange(args.prompts),
        group_size=group_size,
        sampling=SamplingParams(
            r.max_new_tokens, r.temperature, r.top_p, r.top_k, derive_seed(config.train.seed, 0, 0, 97)
        ),
        device=device,
    )
    batch = with_logprobs(
        batch,
        policy=model,
        reference=model,  # the reference policy is the checkpoint
        method=method,
        temperature=r.temperature,
        micro_batch=config.optim.micro_batch_size,
        with_entropy=False,
    )
    if with_hidden and batch.old_logprobs.hidden_BTD is None:
        from tokenbalance.trainer.logprobs import batched_response_logprobs

        old = batched_response_logprobs(
            model, batch.packed, temperature=r.temperature, micro_batch=config.optim.micro_batch_size, with_hidden=True
        )
        batch = dataclasses.replace(batch, old=old)
    return DiagnosedBatch(config, model, tokenizer, device, task, method, batch)


def method_passes(batch: DiagnosedBatch, method, rows=None):
    """The method's update passes on the batch (or some rows of it), reference = the checkpoint."""
    from tokenbalance.trainer.batch import update_inputs

    rollout = batch.rollout
    if rollout.ref_logp_BT is None and method.needs_ref_logp:  # another method than the one sampled for
        rollout = dataclasses.replace(rollout, ref_logp_BT=rollout.old.logp_BT)  # the checkpoint is the reference
    return update_inputs(method, rollout, policy=batch.model, temperature=batch.config.rollout.temperature, rows=rows)


def single_update(batch: DiagnosedBatch, method, passes, optimizer, rows=None) -> dict:
    """One optimizer step per pass on ``rows`` (all: the whole batch), without gradient clipping."""
    from tokenbalance.trainer.distributed import DistContext
    from tokenbalance.trainer.update import run_update_passes

    rows = slice(None) if rows is None else rows
    old = batch.old.logp_BT[rows]
    return run_update_passes(
        method=method,
        passes=passes,
        policy=batch.model,
        optimizer=optimizer,
        packed=batch.packed.rows(rows),
        old_logp_BT=old,
        ref_logp_BT=old if method.needs_ref_logp else None,
        temperature=batch.config.rollout.temperature,
        mini_batch_rows=old.shape[0],
        micro_batch_rows=batch.config.optim.micro_batch_size,
        grad_clip=math.inf,
        token_mean_scope="mini_batch",
        ctx=DistContext(device=batch.device),
    ).metrics


def rescore(batch: DiagnosedBatch, rows=None):
    from tokenbalance.trainer.logprobs import batched_response_logprobs

    packed = batch.packed if rows is None else batch.packed.rows(rows)
    return batched_response_logprobs(
        batch.model,
        packed,
        temperature=batch.config.rollout.temperature,
        micro_batch=batch.config.optim.micro_batch_size,
    ).logp_BT


def _fmt(value: float, spec: str = "+.4f") -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


WRITTEN_BY = "tokenbalance diagnose"


def _json_written_by_us(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("written_by") == WRITTEN_BY
    except (OSError, ValueError, AttributeError):
        return False


def check_json_out(args: argparse.Namespace) -> None:
    """Before the experiment: ``--json FILE`` is new (or, with ``--force``, a file diagnose wrote)
    and its directory writable, so that the results are never lost after the work."""
    if args.json_out:
        check_output_file(args.json_out, "--json", force=args.force, written_by=_json_written_by_us)


def _write_json(path: str | None, data: dict) -> None:
    if path:
        from tokenbalance.trainer.checkpoint import write_text_atomic

        write_text_atomic(Path(path), dump_json(data, indent=1) + "\n")  # NaN / inf as null (docs/metrics.md)
        print(f"written: {path}")


def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """The text each token adds to the decoded prefix (a multi-byte character goes to the token that
    completes it), falling back to the token decoded alone when decoding is not prefix-stable."""
    pieces, previous = [], ""
    for i, token in enumerate(ids):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if text.startswith(previous) and not text.endswith("\ufffd"):
            pieces.append(text[len(previous) :])
            previous = text
        elif text.endswith("\ufffd") and i + 1 < len(ids):
            pieces.append("")  # an incomplete character: shown with the token that completes it
        else:
            pieces.append(tokenizer.decode([token], skip_special_tokens=False))
            previous = text
    return pieces


# ---------------------------------------------------------------------------------------------
# buckets
# ---------------------------------------------------------------------------------------------


def bucket_experiment(batch: DiagnosedBatch, *, edges, lr: float) -> dict:
    """The three single updates (all / lowest / highest bucket) from the same checkpoint."""
    import torch

    from tokenbalance.diagnostics.buckets import bucket_masks, interval_label, probability_change_stats
    from tokenbalance.diagnostics.grad_norms import gradient_free_method
    from tokenbalance.diagnostics.step import update_advantages
    from tokenbalance.types import UpdatePass

    method = gradient_free_method(batch.method)
    passes, _ = method_passes(batch, method)
    adv_BT, policy_BT = update_advantages(passes, batch.mask_BT.bool())
    masks = bucket_masks(batch.old.logp_BT, batch.mask_BT, edges)
    valid = batch.mask_BT.bool()

    def only(name, select):
        select = select & policy_BT
        return [UpdatePass(name, torch.where(select, adv_BT, torch.zeros_like(adv_BT)), select, select, valid)]

    modes = {"all": passes, "lowest": only("lowest", masks[0]), "highest": only("highest", masks[-1])}
    initial = {k: v.detach().clone() for k, v in batch.model.state_dict().items()}
    results = {}
    for mode, mode_passes in modes.items():
        batch.model.load_state_dict(initial)
        optimizer = torch.optim.SGD([p for p in batch.model.parameters() if p.requires_grad], lr=lr)
        metrics = single_update(batch, method, mode_passes, optimizer)
        new = rescore(batch)
        results[mode] = {
            "updated_tokens": int(sum(int(p.policy_mask_BT.sum()) for p in mode_passes)),
            "updated_interval": "all"
            if mode == "all"
            else interval_label(edges, 0 if mode == "lowest" else len(edges) - 2),
            "grad_norm": metrics["optim/grad_norm"],
            "buckets": probability_change_stats(batch.old.logp_BT, new, adv_BT, batch.mask_BT, edges),
        }
    batch.model.load_state_dict(initial)
    return results


def run_buckets(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.diagnostics.buckets import parse_edges

    edges = parse_edges(args.edges)
    if not args.lr > 0:
        raise ValueError(f"--lr: must be > 0, got {args.lr}")
    check_json_out(args)
    batch = prepare_batch(args)
    results = bucket_experiment(batch, edges=edges, lr=args.lr)
    tokens = int(batch.mask_BT.sum())
    print(
        f"{len(batch.texts)} responses ({args.prompts} prompts), {tokens} tokens, accuracy "
        f"{float(batch.correct_B.float().mean()):.3f}; method {batch.method.name} (KL off), one SGD step, "
        f"lr {args.lr:g}"
    )
    print(
        "dp: mean change of token probability after the update; up|A>0: share of positive-advantage tokens "
        "whose probability rose (Figure 3); down|A<0: share of negative-advantage tokens whose probability fell"
    )
    for mode, result in results.items():
        print(
            f"\nupdate on {mode} tokens ({result['updated_interval']}, {result['updated_tokens']} tokens), "
            f"gradient norm {result['grad_norm']:.4g}"
        )
        print(
            f"  {'bucket':<14}{'tokens':>7}{'dp mean':>11}{'dp p10':>11}{'dp p50':>11}{'dp p90':>11}"
            f"{'up|A>0':>9}{'down|A<0':>10}"
        )
        dp = "+.2e"  # one SGD step moves probabilities by 1e-6..1e-3: fixed decimals would print zeros
        for row in result["buckets"]:
            print(
                f"  {row['interval']:<14}{row['tokens']:>7}{_fmt(row['dp_mean'], dp):>11}"
                f"{_fmt(row['dp_p10'], dp):>11}{_fmt(row['dp_p50'], dp):>11}{_fmt(row['dp_p90'], dp):>11}"
                f"{_fmt(row['pos_up_frac'], '.3f'):>9}{_fmt(row['neg_down_frac'], '.3f'):>10}"
            )
    _write_json(
        args.json_out,
        {
            "written_by": WRITTEN_BY,
            "edges": list(edges),
            "lr": args.lr,
            "method": batch.method.name,
            "responses": len(batch.texts),
            "tokens": tokens,
            "updates": results,
        },
    )
    return 0


# ---------------------------------------------------------------------------------------------
# lld
# ---------------------------------------------------------------------------------------------


def lld_experiment(batch: DiagnosedBatch, *, optimizer_name: str, lr: float, pos_only: bool) -> list[dict]:
    """Δ(x) for every mixed question, each measured from the checkpoint after one update on its group."""
    import torch

    from tokenbalance.diagnostics.lld import sequence_deltas
    from tokenbalance.types import UpdatePass

    initial = {k: v.detach().clone() for k, v in batch.model.state_dict().items()}
    out = []
    for g in torch.unique(batch.group_ids_B).tolist():
        rows = (batch.group_ids_B == g).nonzero(as_tuple=True)[0]
        correct = batch.correct_B[rows]
        if not 0 < int(correct.sum()) < rows.numel():
            continue
        batch.model.load_state_dict(initial)
        passes, _ = method_passes(batch, batch.method, rows)
        if pos_only:
            passes = [
                UpdatePass(
                    p.name, p.advantages_BT.clamp(min=0), p.policy_mask_BT, p.kl_entropy_mask_BT, p.normaliser_mask_BT
                )
                for p in passes
            ]
        params = [p for p in batch.model.parameters() if p.requires_grad]
        optimizer = (
            torch.optim.SGD(params, lr=lr)
            if optimizer_name == "sgd"
            else torch.optim.AdamW(
                params,
                lr=lr,
                betas=(batch.config.optim.beta1, batch.config.optim.beta2),
                weight_decay=batch.config.optim.weight_decay,
            )
        )
        single_update(batch, batch.method, passes, optimizer, rows)
        positive = rows[correct]
        seq, tok = sequence_deltas(rescore(batch, positive), batch.old.logp_BT[positive], batch.mask_BT[positive])
        out.append(
            {
                "question": int(g),
                "example": f"{batch.examples[int(rows[0])].data_source}:{batch.examples[int(rows[0])].index}",
                "correct": int(correct.sum()),
                "group_size": int(rows.numel()),
                "delta": float(seq.mean()),
                "delta_tok": float(tok.mean()),
            }
        )
    batch.model.load_state_dict(initial)
    return out


def run_lld(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    import torch

    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr: must be > 0, got {args.lr}")
    check_json_out(args)
    batch = prepare_batch(args)
    lr = args.lr if args.lr is not None else batch.config.optim.lr
    if not lr > 0:
        raise ValueError(f"--lr: must be > 0, got {lr}")
    rows = lld_experiment(batch, optimizer_name=args.optimizer, lr=lr, pos_only=args.pos_only)
    print(
        f"{args.prompts} questions x {len(batch.texts) // args.prompts} responses, accuracy "
        f"{float(batch.correct_B.float().mean()):.3f}; {len(rows)} mixed question(s); one {args.optimizer} step "
        f"(lr {lr:g}) of {batch.method.name}{' (pos only)' if args.pos_only else ''} per question from the "
        "checkpoint"
    )
    summary: dict[str, float] = {"questions": len(rows)}
    if rows:
        print(f"\n  {'question':<22}{'N+/G':>7}{'delta':>12}{'delta/token':>13}  LLD (delta < {args.epsilon:g})")
        for row in rows:
            flag = "yes" if row["delta"] < args.epsilon else ""
            print(
                f"  {row['example']:<22}{row['correct']:>4}/{row['group_size']:<2}{row['delta']:>12.4g}"
                f"{row['delta_tok']:>13.4g}  {flag}"
            )
        deltas = torch.tensor([r["delta"] for r in rows], dtype=torch.float64)
        q = torch.quantile(deltas, torch.tensor([0.1, 0.5], dtype=torch.float64)).tolist()
        summary.update(
            {
                "delta_mean": float(deltas.mean()),
                "delta_p10": q[0],
                "delta_p50": q[1],
                "frac_below_eps": float((deltas < args.epsilon).double().mean()),
            }
        )
        print(
            f"\nmean delta {summary['delta_mean']:.4g}, p10 {q[0]:.4g}, median {q[1]:.4g}, "
            f"LLD share {summary['frac_below_eps']:.3f}"
        )
    else:
        print(
            "no mixed question (every group all correct or all wrong): nothing to measure; "
            "try more --prompts or a larger --group-size"
        )
    _write_json(
        args.json_out,
        {
            "written_by": WRITTEN_BY,
            "method": batch.method.name,
            "pos_only": args.pos_only,
            "optimizer": args.optimizer,
            "lr": lr,
            "epsilon": args.epsilon,
            "summary": summary,
            "questions": rows,
        },
    )
    return 0


# ---------------------------------------------------------------------------------------------
# nthr
# ---------------------------------------------------------------------------------------------


def run_nthr(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.algorithms.methods import NTHRInputs, compute_advantages
    from tokenbalance.algorithms.nthr import NTHRConfig, nthr_correct
    from tokenbalance.diagnostics.nthr_view import bracket_selected, nthr_selections

    batch = prepare_batch(args, with_hidden=True)
    config = batch.method.nthr or NTHRConfig()
    advantages = compute_advantages(batch.method, batch.scores_B, batch.group_ids_B, batch.mask_BT)
    inputs = NTHRInputs.from_output_layer(
        batch.model.get_output_embeddings(),
        batch.rollout.tokens_BT,
        batch.old.hidden_BTD,
        batch.config.rollout.temperature,
        max_reward=batch.rollout.max_reward,
    )
    groups = nthr_selections(
        advantages,
        batch.mask_BT,
        batch.group_ids_B,
        inputs.tokens_BT,
        batch.old.logp_BT,
        inputs.hidden_BTD,
        inputs.unembed_VD,
        config,
        temperature=inputs.temperature,
        unembed_bias_V=inputs.unembed_bias_V,
        correct_B=nthr_correct(batch.scores_B, config, inputs.max_reward),
    )
    colour = args.color or (not args.plain and sys.stdout.isatty())
    console = None
    if colour:
        from rich.console import Console

        console = Console(force_terminal=True, highlight=False)
    print(
        f"NTHR (beta {config.beta:g}, eta {config.eta}) on {len(batch.texts)} responses: {len(groups)} mixed "
        f"group(s); selected tokens (their negative advantage is scaled by eta) are "
        f"{'highlighted' if colour else 'in [brackets]'}"
    )
    if not groups:
        print("no mixed group (every group all correct or all wrong); try more --prompts or a larger --group-size")
    tokens_BT = inputs.tokens_BT
    for view in groups[: args.max_groups]:
        first = view.positive_rows[0]
        example = batch.examples[first]
        print(
            f"\n=== question {example.data_source}:{example.index}: {len(view.positive_rows)} positive, "
            f"{len(view.negative_rows)} negative, p = {view.p:.3f}, eta = {view.eta:.3f}, tau = {view.tau:.4g}"
        )
        for n, row in enumerate(view.negative_rows):
            valid = batch.mask_BT[row].bool()
            ids = tokens_BT[row][valid].tolist()
            chosen = view.selected_NT[n][valid].tolist()
            pieces = token_pieces(batch.tokenizer, ids)
            print(
                f"--- response {row} (reward {float(batch.scores_B[row]):g}): {sum(chosen)} of {len(ids)} tokens "
                "selected"
            )
            if console is not None:
                from rich.text import Text

                text = Text()
                for piece, picked in zip(pieces, chosen):
                    text.append(piece, style="bold black on yellow" if picked else None)
                console.print(text)
            else:
                print(bracket_selected(pieces, chosen))
    return 0
