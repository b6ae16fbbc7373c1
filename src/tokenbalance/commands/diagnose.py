"""``tokenbalance diagnose``: the papers' measurements on a checkpoint and a fresh batch of rollouts.

Argument parsing, rendering and the ``--json`` file only; the measurements are the library's
(:mod:`tokenbalance.analysis.experiments` says how each differs from the paper), on a
:func:`~tokenbalance.analysis.probe.probe_batch` of ``--prompts`` x ``--group-size`` responses with the advantages of
``--method``: ``buckets`` (AR-Lopti Figures 1 and 3), ``lld`` (the NTHR paper's LLD protocol), ``nthr`` (the tokens
NTHR protects, in context); ``summary`` reads ``buckets --json`` files of several policies (Figure 1 by class over
them). Each: docs/metrics.md ("Offline diagnostics")."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tokenbalance.commands.train import add_config_arguments, config_from_args, nonempty, printed_config_help
from tokenbalance.diagnostics.sinks import dump_json
from tokenbalance.outputs import check_output_file, json_written_by, write_text_atomic


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "diagnose", help="the papers' diagnostics on a checkpoint (buckets, lld, nthr) and over buckets files (summary)"
    )
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

    help_text = (
        "Figure 1 by class over policies: from diagnose buckets --json files (one per policy), how far the "
        "high-probability decision tokens move with every token in the update against the highest bucket alone"
    )
    sub = inner.add_parser("summary", help=help_text, description=help_text)
    sub.add_argument("files", nargs="+", type=nonempty, metavar="JSON", help="diagnose buckets --json files")
    sub.add_argument(
        "--against",
        nargs="+",
        type=nonempty,
        metavar="JSON",
        help="as many files to pair with them in order (e.g. another method's checkpoints of the same seeds): adds "
        "each measure's paired difference with its 95%% t interval",
    )
    sub.set_defaults(func=run_summary)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


# --------------------------------------------------------------------------------------------- shared: checkpoint,
# probe batch, output ---------------------------------------------------------------------------------------------


def probe(args: argparse.Namespace, *, with_hidden: bool = False):
    """The command's :class:`~tokenbalance.analysis.probe.ProbeBatch`: the config of the flags (``--method`` sets
    ``train.method``), the policy of CHECKPOINT, ``--prompts`` x ``--group-size``."""
    from tokenbalance.analysis.probe import probe_batch
    from tokenbalance.run.checkpoints import policy_dir

    config = config_from_args(args)  # --model: a run directory is resolved there too
    if args.checkpoint:
        config.model.path = policy_dir(args.checkpoint)
    return probe_batch(config, prompts=args.prompts, group_size=args.group_size, with_hidden=with_hidden)


def _fmt(value: float, spec: str = "+.4f") -> str:
    return "nan" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


WRITTEN_BY = "tokenbalance diagnose"


def check_json_out(args: argparse.Namespace) -> None:
    """Before the experiment: ``--json FILE`` is new (or, with ``--force``, a file diagnose wrote) and its directory
    writable, so that the results are never lost after the work."""
    if args.json_out:
        check_output_file(args.json_out, "--json", force=args.force, written_by=json_written_by(WRITTEN_BY))


def _write_json(path: str | None, data: dict) -> None:
    if path:
        write_text_atomic(Path(path), dump_json(data, indent=1) + "\n")  # NaN / inf as null (docs/metrics.md)
        print(f"written: {path}")


# --------------------------------------------------------------------------------------------- buckets
# ---------------------------------------------------------------------------------------------


def run_buckets(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.analysis.experiments import bucket_experiment, probe_classes
    from tokenbalance.diagnostics.buckets import parse_edges
    from tokenbalance.diagnostics.token_classes import class_profile

    edges = parse_edges(args.edges)
    if not args.lr > 0:
        raise ValueError(f"--lr: must be > 0, got {args.lr}")
    check_json_out(args)
    batch = probe(args)
    classes = probe_classes(batch)
    results = bucket_experiment(batch, edges=edges, lr=args.lr, classes=classes)
    tokens = int(batch.mask_BT.sum())
    print(
        f"{len(batch.texts_B)} responses ({args.prompts} prompts), {tokens} tokens, accuracy "
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
    profile = None
    if classes is not None:
        profile = class_profile(
            batch.old.logp_BT, batch.mask_BT, classes.class_BT, classes.names, classes.decisions, edges
        )
        print_class_profile(profile)
        print_logp_changes(results)
    _write_json(
        args.json_out,
        {
            "written_by": WRITTEN_BY,
            "edges": list(edges),
            "lr": args.lr,
            "method": batch.method.name,
            "responses": len(batch.texts_B),
            "tokens": tokens,
            "updates": results,
            **({"class_profile": profile} if profile is not None else {}),
        },
    )
    return 0


def print_class_profile(profile: dict) -> None:
    """The token profile by class: tokens per bucket of the old probability, and the lowest bucket's share of
    decisions."""
    print(
        f"\ntoken classes (old-policy probability buckets; decisions: {', '.join(profile['decision_classes'])}): "
        f"{profile['low_share']:.1%} of tokens in {profile['intervals'][0]}, "
        f"{profile['low_decision_share']:.1%} of those decisions"
    )
    width = class_width(row["class"] for row in profile["classes"])
    print(f"  {'class':<{width}}{'tokens':>8}" + "".join(f"{label:>14}" for label in profile["intervals"]))
    for row in profile["classes"]:
        print(f"  {row['class']:<{width}}{row['tokens']:>8}" + "".join(f"{count:>14}" for count in row["buckets"]))


def class_width(names) -> int:
    """The width of a class column: 10, or the longest name and a space."""
    return max([10, *(len(name) + 1 for name in names)])


def print_logp_changes(results: dict) -> None:
    """Per update the mean change of log p by class, bucket (saturated p > 0.999 apart) and sign."""
    for mode, result in results.items():
        print(f"\nupdate on {mode} tokens: mean change of log p by class (tokens)")
        width = class_width(row["class"] for row in result["by_class"])
        for row in result["by_class"]:
            if row["tokens"]:
                print(
                    f"  {row['class']:<{width}}{row['interval']:<14}{row['sign']:<5}"
                    f"{_fmt(row['dlogp_mean'], '+.2e'):>11} ({row['tokens']})"
                )


def run_summary(args: argparse.Namespace) -> int:
    from tokenbalance.ablate.class_moves import paired_table, summary_table

    policies = read_policies(args.files)
    paired = paired_table(policies, read_policies(args.against)) if args.against else None  # checked before printing
    print(
        "high-probability decision tokens (decision classes, highest non-saturated bucket of the old probability): "
        "mean change of log p the advantage's way after one SGD step with every token in the update (all) and with "
        "the highest bucket's tokens only (high only)\n"
    )
    print(summary_table(policies))
    if paired is not None:
        print("\npaired in order with --against (each file minus its pair), mean over pairs:\n")
        print(paired)
    return 0


def read_policies(files: list[str]):
    """Each ``diagnose buckets --json`` file's :class:`~tokenbalance.ablate.class_moves.DecisionMoves`, named by its
    stem (by its path where two stems agree); every file is read before anything is printed."""
    from tokenbalance.ablate.class_moves import decision_moves, read_profile

    paths = [Path(f) for f in files]
    names = [path.stem for path in paths]
    if len(set(names)) < len(names):
        names = [str(path) for path in paths]  # the same stem in two folders: the paths tell them apart
    return [decision_moves(read_profile(path), name) for path, name in zip(paths, names, strict=True)]


# --------------------------------------------------------------------------------------------- lld
# ---------------------------------------------------------------------------------------------


def run_lld(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    import torch

    from tokenbalance.analysis.experiments import LLDSettings, lld_experiment

    if args.lr is not None and not args.lr > 0:
        raise ValueError(f"--lr: must be > 0, got {args.lr}")
    check_json_out(args)
    batch = probe(args)
    lr = args.lr if args.lr is not None else batch.config.optim.lr
    if not lr > 0:
        raise ValueError(f"--lr: must be > 0, got {lr}")
    rows = lld_experiment(batch, LLDSettings(optimizer=args.optimizer, lr=lr, pos_only=args.pos_only))
    print(
        f"{args.prompts} questions x {len(batch.texts_B) // args.prompts} responses, accuracy "
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


# --------------------------------------------------------------------------------------------- nthr
# ---------------------------------------------------------------------------------------------


def run_nthr(args: argparse.Namespace) -> int:
    if printed_config_help(args):
        return 0
    from tokenbalance.analysis.experiments import nthr_groups
    from tokenbalance.diagnostics.nthr_view import bracket_selected

    batch = probe(args, with_hidden=True)
    config, groups = nthr_groups(batch)
    colour = args.color or (not args.plain and sys.stdout.isatty())
    console = None
    if colour:
        from rich.console import Console

        console = Console(force_terminal=True, highlight=False)
    print(
        f"NTHR (beta {config.beta:g}, eta {config.eta}) on {len(batch.texts_B)} responses: {len(groups)} mixed "
        f"group(s); selected tokens (their negative advantage is scaled by eta) are "
        f"{'highlighted' if colour else 'in [brackets]'}"
    )
    if not groups:
        print("no mixed group (every group all correct or all wrong); try more --prompts or a larger --group-size")
    from tokenbalance.diagnostics.token_classes import token_pieces

    tokens_BT = batch.rollout.tokens_BT
    for view in groups[: args.max_groups]:
        first = view.positive_rows[0]
        example = batch.examples_B[first]
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
