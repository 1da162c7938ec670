"""``loongsage replay RUN --step N [--dump FILE] [--override key=value ...] [--json]``.

Prints the step's recomputed ``train/`` metrics beside the logged ones with their differences
(``controller.replay``); exit code 0 when they were recomputed, whatever the differences.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence


def main(argv: Sequence[str], registries: Any = None) -> int:
    from loongsage.controller.replay import replay_step

    parser = argparse.ArgumentParser(prog="loongsage replay", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory trained with rollout.record=true")
    parser.add_argument("--step", type=int, required=True, help="the step to recompute (>= 1)")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write the step's per-token tensors here (torch.save)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="recompute under another setting: algorithm/policy_loss=gspo, "
                             "algorithm.policy_loss.eps_high=0.4 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(list(argv))
    try:
        result = replay_step(args.run_dir, args.step, args.override, args.dump)
    except (FileNotFoundError, ValueError) as err:
        print(f"loongsage replay: {err}")
        return 2
    if args.json:
        print(json.dumps({"step": result.step, "overrides": list(result.overrides),
                          "rows": [dict(zip(("metric", "logged", "replayed", "difference"), row))
                                   for row in result.rows()]}))
    else:
        print(result.table())
    if result.dumped is not None:
        print(f"per-token tensors: {result.dumped}")
    return 0
