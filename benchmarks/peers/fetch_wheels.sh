#!/usr/bin/env bash
# Downloads, here on the build machine, the wheels the peer benchmarks need on the GPU machine beyond the project's
# payload (../shared/gpu/make_payload.sh DEST --with-ray-prefect: vLLM 0.26, DeepSpeed, Ray, Prefect, datasets) and
# the GPU image (torch 2.11, transformers, accelerate, peft, einops, tensorboard, torchmetrics, sympy, pandas, …):
#   trl 1.16.0          pure Python; imports only what the image and the payload have
#   openrlhf 0.11.2     its cp312 wheel (pure Python inside); its pins on DeepSpeed 0.19.6, Ray 2.55 and
#                       transformers 5.15 are not needed to run (installed with --no-deps)
#   torchdata 0.11.0    openrlhf.utils.deepspeed imports torchdata.stateful_dataloader at module top
#   pylatexenc 2.11     openrlhf.utils.math_utils imports it at module top
#   accelerate 1.15.0   TRL 1.16 needs ≥ 1.10.1; run_peers.sh installs it only where the image's is older
# flash-attn is not fetched: no wheel runs there; benchmarks/peers/flash_attn_standin serves OpenRLHF instead.
# Output: DEST/.peerwheels (git-ignored), about 1.7 MiB: it travels beside any one payload part (name it in carry).
# Usage: benchmarks/peers/fetch_wheels.sh [DEST_REPO_ROOT]   (default: this checkout)
set -euo pipefail
DEST=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
OUT_DIR="$DEST/.peerwheels"
P="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
   --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
   --platform manylinux1_x86_64"
rm -rf "$OUT_DIR" && mkdir -p "$OUT_DIR"
python3 -m pip download -q --no-deps $P -d "$OUT_DIR" \
  trl==1.16.0 openrlhf==0.11.2 torchdata==0.11.0 pylatexenc==2.11 accelerate==1.15.0
for name in trl openrlhf torchdata pylatexenc accelerate; do
  ls "$OUT_DIR"/${name}-*.whl > /dev/null || { echo "fetch_wheels: no $name wheel in $OUT_DIR" >&2; exit 1; }
done
BYTES=$(du -cb "$OUT_DIR"/*.whl | tail -1 | cut -f1)
# a device call carries at most 64 MiB: a payload part (≤ 50 MiB) + the repository (~2 MiB) + these
LIMIT=$((10 * 1024 * 1024))
[ "$BYTES" -le "$LIMIT" ] \
  || { echo "fetch_wheels: $BYTES bytes is over $LIMIT: split them like the payload" >&2; exit 1; }
echo "peer wheels: $(ls "$OUT_DIR" | wc -l) files, $BYTES bytes ($((BYTES / 1024)) KiB) in $OUT_DIR"
