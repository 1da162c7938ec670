#!/usr/bin/env bash
# The one command for a lent GPU machine (and, with --cpu, its rehearsal here): install the
# carried wheels (benchmarks/gpu_wheels.sh) into a folder of their own, put the project's
# sources on PYTHONPATH, and run benchmarks/gpu_check.py in two stages, each its own process
# with its own time limit and its own JSON file, so a time-out loses only what was left:
#   first  torch_api, engines, megatron, transfer (no Ray; 240 s)
#   ray    tiny_run, sglang_run (Ray and what it brings, installed only now; 300 s)
# With --cpu (the rehearsal on a shared CPU machine) each stage may take 600 s.
# Results: $OUT/first.json, $OUT/ray.json (rewritten after every part) and the logs beside.
#   bash benchmarks/gpu_run.sh [--cpu]
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
wheels="${GPU_WHEELS:-.gpu_wheels}"
site="${GPU_SITE:-/tmp/loongsage-gpu-site}"
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD/loongsage-core/src:$PWD/loongsage-agents/src:$site${PYTHONPATH:+:$PYTHONPATH}"
export RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1

status=0
for stage in first ray; do
  limit=240; [ "$stage" = ray ] && limit=300
  [ "${1:-}" = --cpu ] && limit=600
  "$python" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheels/$stage"/*.whl || { echo "installing $wheels/$stage failed"; exit 1; }
  timeout "$limit" "$python" benchmarks/gpu_check.py --stage "$stage" --out "$out" "$@" \
    2>"$out/$stage.log" || { rc=$?; status=1; echo "stage $stage exited $rc (124 would mean over its $limit s)"; }
done
exit $status
