#!/usr/bin/env bash
# Download what benchmarks/gpu_check.py needs on a lent GPU machine and that machine lacks
# (benchmarks/gpu_wheels.txt: cp312 manylinux wheels, --no-deps, exactly that set), cut Ray's
# wheel down to fit (benchmarks/gpu_carry.py), check that one call carries at most 64 MiB with
# the working tree, and print the carry list and the one command to run there.
#
#   bash benchmarks/gpu_wheels.sh                  # for the GPU machine, into .gpu_wheels/
#   bash benchmarks/gpu_wheels.sh --local DIR      # the same set for this machine's python
#                                                  # (the CPU rehearsal, .ci/gpu_check_cpu)
# Layout: DIR/first/*.whl (the Ray-free stage), DIR/ray/*.whl (the Ray stage).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
dest="$repo/.gpu_wheels"
target=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
if [ "${1:-}" = "--local" ]; then
  dest="${2:?--local needs a folder}"
  target=()
fi
rm -rf "$dest/first" "$dest/ray"
mkdir -p "$dest/first" "$dest/ray"
# this repository's distributions are built from a copy (with the recipes their symlink names),
# so the build leaves no build/ or egg-info folders in the checkout, as `make wheels` does
copy="$(mktemp -d)"
trap 'rm -rf "$copy"' EXIT
(cd "$repo" && tar -c --exclude=__pycache__ --exclude='*.egg-info' --exclude=build recipes loongsage-*/) \
  | tar -x -C "$copy"

for stage in first ray; do
  specs=() sources=()
  while read -r group spec; do
    [ "$group" = "$stage" ] || continue
    case "$spec" in
      antlr4-python3-runtime==*) sources+=("$spec") ;;  # source archive only on PyPI: pure Python
      ./*) sources+=("$copy/${spec#./}") ;;  # this repository's distribution
      *) specs+=("$spec") ;;
    esac
  done < <(grep -v '^#' "$repo/benchmarks/gpu_wheels.txt")
  "$python" -m pip download --quiet --no-deps --only-binary=:all: "${target[@]}" -d "$dest/$stage" "${specs[@]}"
  [ ${#sources[@]} -eq 0 ] || "$python" -m pip wheel --quiet --no-deps -w "$dest/$stage" "${sources[@]}"
  want=$(( ${#specs[@]} + ${#sources[@]} ))
  have=$(find "$dest/$stage" -name '*.whl' | wc -l)
  [ "$have" -eq "$want" ] || { echo "$stage: $have wheels for $want requirements" >&2; exit 1; }
done
"$python" "$repo/benchmarks/gpu_carry.py" prune "$dest"/ray/ray-*.whl

if [ ${#target[@]} -eq 0 ]; then
  echo "wheels for this machine's $("$python" -V) in $dest"
  exit 0
fi
"$python" "$repo/benchmarks/gpu_carry.py" size "$repo" "$dest"
cat <<MSG
carry: [".gpu_wheels"]
command (one call; the Ray-free stage first, within 240 s, then the Ray stage; JSON under \$OUT):
  bash benchmarks/gpu_run.sh; python3 benchmarks/gpu_check_verdict.py "$OUT"
MSG
