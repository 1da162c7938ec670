"""Read ``benchmarks/gpu_check.py``'s stage files (``first.json``, ``ray.json``) and say what held.

Used by ``.ci/gpu_check_cpu`` on the ``--cpu`` rehearsal, and on a GPU machine's output for
``docs/backends.md``: every part ran and is ok, and its numbers are the ones that part exists
to show (a part that "ran" but moved nothing, trained no step or checked no tensor fails).

    python3 benchmarks/gpu_check_verdict.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

STAGES = {"first": ("torch_api", "engines", "megatron", "transfer"),
          "ray": ("tiny_run", "sglang_run")}


def _torch_api(r: dict, on_gpu: bool) -> list[str]:
    problems = [f"torch lacks {sorted(r['missing'])}"] if r["missing"] else []
    if r["names"] < 50:  # the sources use over a hundred: the scan found no sources
        problems.append(f"only {r['names']} torch names found")
    return problems


def _engines(r: dict, on_gpu: bool) -> list[str]:
    checked = r["tensors_checked"]
    want = {"train_offloaded", "train_onloaded", "rollout_offloaded", "rollout_onloaded"}
    if not on_gpu:  # the meta dry run must have seen every tensor the real audits saw
        want |= {"train_tensors_on_meta", "rollout_tensors_on_meta"}
    problems = [f"no device audit {name}" for name in sorted(want - set(checked))]
    if not on_gpu and checked.get("train_tensors_on_meta") != checked.get("train_onloaded"):
        problems.append(f"dry run saw {checked.get('train_tensors_on_meta')} train tensors, "
                        f"the audit {checked.get('train_onloaded')}")
    if on_gpu and not r["offload_frees_device"]:
        problems.append(f"offload freed no device memory: {r['memory_bytes']}")
    if r["generated_tokens"] < 1:
        problems.append("nothing generated after onload")
    if not r["logprob_abs_diff_max"] < (0.05 if on_gpu else 1e-3):
        problems.append(f"rollout vs train logprob gap {r['logprob_abs_diff_max']}")
    return problems


def _megatron(r: dict, on_gpu: bool) -> list[str]:
    problems = [] if r["float32_logprob_max_abs_diff"] < 1e-4 else \
        [f"fp32 megatron vs embedded {r['float32_logprob_max_abs_diff']}"]
    if on_gpu and "bfloat16_loss" not in r:
        problems.append("no bf16 step")
    return problems


def _transfer(r: dict, on_gpu: bool) -> list[str]:
    methods = {row["method"] for row in r["rows"]}
    want = "mesh cuda_ipc" if on_gpu else "mesh shm"
    return [] if want in methods else [f"no {want!r} row: {sorted(methods)}"]


def _tiny_run(r: dict, on_gpu: bool) -> list[str]:
    problems = [] if r["steps"] == 4 else [f"{r['steps']} steps, not 4"]
    if on_gpu and not r["all_on_gpu"]:
        problems.append(f"actors off the GPU: {r['actors']}")
    return problems


def _sglang_run(r: dict, on_gpu: bool) -> list[str]:
    if "skipped" in r:
        return [] if on_gpu else [f"skipped on CPU: {r['skipped']}"]
    return [f"{mode}: {r[mode]['steps']} steps" for mode in ("colocated", "disaggregated")
            if "steps" in r[mode] and r[mode]["steps"] != 4]


CHECKS: dict[str, Callable[[dict, bool], list[str]]] = {
    "torch_api": _torch_api, "engines": _engines, "megatron": _megatron,
    "transfer": _transfer, "tiny_run": _tiny_run, "sglang_run": _sglang_run}


def verdict(out_dir: Path) -> dict[str, list[str]]:
    """Part -> what did not hold (empty: passed); a missing stage file or part is a problem."""
    result: dict[str, list[str]] = {}
    for stage, parts in STAGES.items():
        path = out_dir / f"{stage}.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        on_gpu = data.get("device", "cpu").startswith("cuda")
        for name in parts:
            r = data.get(name)
            if r is None:
                result[name] = [f"did not run (no {path.name} entry)"]
            elif not r["ok"]:
                result[name] = [r["error"]]
            else:
                result[name] = CHECKS[name](r, on_gpu)
    return result


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    result = verdict(Path(args[0]))
    print(json.dumps({"passed": [n for n, p in result.items() if not p],
                      "failed": {n: p for n, p in result.items() if p}}))
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
