"""The step-count control's pre-registered report (docs/preregistration/step-count-control.md) from its kept records:
the contrasts C1-C3 over the start-policy means of both conditions, Holm-corrected, and the decision the rule gives
(withheld while a cell is missing), then the secondary outcomes (tokenbalance.ablate.step_control).

    python scripts/step_control_report.py [--records docs/results/step-control] [--out DIR] [--pairing fingerprint]

RECORDS holds one folder per condition (arith-steps, arith-steps-wording), each with the ``records`` folder that
``ablate --records`` keeps. The report goes to stdout, and with --out to DIR/analysis.md (a file tokenbalance wrote
there before is replaced; anything else is not)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenbalance.ablate.grid import STEP_CONTROL_CONDITIONS
from tokenbalance.ablate.results import PAIRING_RULES
from tokenbalance.ablate.step_control import load_condition, report_markdown
from tokenbalance.outputs import check_files_replaceable, record_written, write_text_atomic

REPORT = "analysis.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, default=Path("docs/results/step-control"))
    parser.add_argument("--out", type=Path, help=f"write the report to OUT/{REPORT} too")
    parser.add_argument("--pairing", choices=PAIRING_RULES[:2], default="fingerprint")
    args = parser.parse_args(argv)
    try:
        folders = [args.records / name / "records" for name in STEP_CONTROL_CONDITIONS]
        absent = [str(f) for f in folders if not f.is_dir()]
        if absent:
            raise ValueError(f"--records {args.records}: no records folder {', '.join(absent)}")
        if args.out is not None:
            check_files_replaceable(args.out, [REPORT], "--out")
        report = report_markdown([load_condition(n, f) for n, f in zip(STEP_CONTROL_CONDITIONS, folders)], args.pairing)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out / REPORT, report + "\n")
        record_written(args.out, [REPORT])
    return 0


if __name__ == "__main__":
    sys.exit(main())
