#!/usr/bin/env bash
# One GPU-machine command of the peer comparison (issue 17): our iteration benchmark, TRL 1.16 and OpenRLHF 0.11.2 on
# the same random-weight stand-in, prompts and shape (benchmarks/configs/h200-iteration.yaml), back to back on one
# machine. Each system writes $OUT/h200-peers-TAG-SYSTEM.json (run_all.py's layout, rewritten after every step) and
# its log beside it, under a time limit; copy them to benchmarks/results/ and run `python benchmarks/perf_table.py
# --write` for the README's peer table, which reads one TAG's three files.
#
#   bash benchmarks/peers/run_peers.sh TAG [hybrid] [trl] [openrlhf]     (no SYSTEM: set up only)
#
# Set-up, each step skipped when already done on this machine: the payload (benchmarks/gpu_env.sh, from the parts in
# /tmp/vparts), the peer wheels from .peerwheels (benchmarks/peers/fetch_wheels.sh; carry .peerwheels) into
# PEER_SITE (default /tmp/peersite), the Qwen3-1.7B stand-in in MODEL_DIR (default /tmp/m17; ~25 s to build).
# Environment: GIT_SHA (recorded), MODEL_DIR, PEER_TIMEOUT_S (default 530: each system is cut off there, keeping the
# steps it finished), HYBRID_FLAGS (flags of `hybrid train` on top of the benchmark config, space-separated, e.g.
# "--rollout.no_logprobs": give such a run a TAG of its own, so the default run's file stays), ITERATION_CONFIG (a
# benchmarks/configs/ name without .yaml, default h200-iteration; h200-grpo-4b is issue 48's 4B GRPO shape, which
# hybrid and trl copy and openrlhf does not), STANDIN (the hub shape MODEL_DIR is built with, default Qwen/Qwen3-1.7B;
# Qwen/Qwen3-4B for h200-grpo-4b), TRL_FLAGS (extra trl_grpo.py flags, e.g. "--model-dtype bfloat16").
# One system a device command (each takes 5–7 minutes; the device allows 10), back to back:
#   payload part 0 (carry .vchunks0): mkdir -p /tmp/vparts && cp .vchunks0/* /tmp/vparts/ &&
#                                     python3 data/build_tiny_model.py --standin Qwen/Qwen3-1.7B /tmp/m17 --device cuda
#   parts 1..N-1 (carry .vchunksK, the last also .peerwheels), as ../shared/gpu/README.md §2; the last one ends with
#                                     bash benchmarks/peers/run_peers.sh TAG          (installs everything)
#   then (carry .peerwheels), timeout_s 600 each:
#     GIT_SHA=SHA bash benchmarks/peers/run_peers.sh TAG hybrid
#     GIT_SHA=SHA bash benchmarks/peers/run_peers.sh TAG trl
#     GIT_SHA=SHA bash benchmarks/peers/run_peers.sh TAG openrlhf
set -u
TAG=${1:?usage: run_peers.sh TAG [hybrid] [trl] [openrlhf]}
shift
OUT_DIR=${OUT:-/tmp/peers-out}
MODEL_DIR=${MODEL_DIR:-/tmp/m17}
LIMIT_S=${PEER_TIMEOUT_S:-530}
SHA=${GIT_SHA:-unknown}
PEER_SITE=${PEER_SITE:-/tmp/peersite}
CONFIG_NAME=${ITERATION_CONFIG:-h200-iteration}
STANDIN=${STANDIN:-Qwen/Qwen3-1.7B}
mkdir -p "$OUT_DIR"

source benchmarks/gpu_env.sh \
  || { echo "[peers] no payload: send its parts to /tmp/vparts first (../shared/gpu/README.md §2)"; exit 4; }
if [ ! -f "$PEER_SITE/.installed" ]; then
  ls .peerwheels/*.whl > /dev/null 2>&1 \
    || { echo "[peers] no .peerwheels here: run benchmarks/peers/fetch_wheels.sh and carry .peerwheels"; exit 5; }
  WHEELS=$(ls .peerwheels/*.whl | grep -v '/accelerate-')
  # TRL 1.16 needs accelerate >= 1.10.1: carry ours only where the image's is older (one version of each on the path)
  python3 -c "import accelerate, sys; from packaging.version import Version as V; \
sys.exit(V(accelerate.__version__) < V('1.10.1'))" 2>/dev/null || WHEELS="$WHEELS $(ls .peerwheels/accelerate-*.whl)"
  mkdir -p "$PEER_SITE" && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$PEER_SITE" $WHEELS || { echo "[peers] peer wheel install failed"; exit 5; }
  rm -rf "$PEER_SITE/tests"  # openrlhf's wheel ships a top-level `tests` package
  touch "$PEER_SITE/.installed"
fi
if [ ! -f "$MODEL_DIR/config.json" ]; then
  python3 data/build_tiny_model.py --standin "$STANDIN" "$MODEL_DIR" --device cuda \
    || { echo "[peers] stand-in build failed"; exit 6; }
fi
echo "[peers] ready: payload, $(ls -d "$PEER_SITE"/*.dist-info | wc -l) peer wheels in $PEER_SITE, model $MODEL_DIR," \
  "config $CONFIG_NAME"

summary() {  # the figures, so the command's output shows them even if its files do not come back
  python3 - "$1" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
figures = {k: v for k, v in data["figures"].items() if k.startswith(("iteration_", "startup"))}
print("[peers]", sys.argv[1], json.dumps(figures, default=str), "errors:", json.dumps(data["errors"])[:600])
EOF
}

FAILED=0
for SYSTEM in "$@"; do
  STEM="$OUT_DIR/h200-peers-$TAG-$SYSTEM"
  echo "[peers] $SYSTEM: up to $LIMIT_S s, results $STEM.json"
  case "$SYSTEM" in
    hybrid)  # run_all.py cuts `hybrid train` off at 540 s itself and keeps the steps it committed; a fresh work
      # dir, so an earlier run of the same id is not resumed
      WORK=$(mktemp -d /tmp/hybrid-bench.XXXXXX)
      FLAGS=()
      for FLAG in ${HYBRID_FLAGS:-}; do FLAGS+=("--iteration-flag=$FLAG"); done
      timeout -k 15 $((LIMIT_S + 45)) python3 benchmarks/run_all.py --model "$MODEL_DIR" --only iteration \
        --work-dir "$WORK" --out "$STEM.json" --git-sha "$SHA" --iteration-config "$CONFIG_NAME" "${FLAGS[@]}" \
        > "$STEM.log" 2>&1
      CODE=$?
      cp "$WORK/iteration.log" "$STEM-run.log" 2>/dev/null ;;
    trl)
      PYTHONPATH=$PEER_SITE:$PYTHONPATH timeout -k 15 "$LIMIT_S" python3 benchmarks/peers/trl_grpo.py \
        --model "$MODEL_DIR" --out "$STEM.json" --git-sha "$SHA" --config "benchmarks/configs/$CONFIG_NAME.yaml" \
        ${TRL_FLAGS:-} > "$STEM.log" 2>&1
      CODE=$? ;;
    openrlhf)
      if [ "$CONFIG_NAME" != h200-iteration ]; then
        echo "[peers] openrlhf copies only h200-iteration's shape, not $CONFIG_NAME"; FAILED=1; continue
      fi  # the wrapper kills OpenRLHF's process group at LIMIT_S; `timeout` only backs it up
      PYTHONPATH=$PEER_SITE:$PYTHONPATH timeout -k 15 $((LIMIT_S + 40)) python3 benchmarks/peers/openrlhf_ppo.py \
        --model "$MODEL_DIR" --out "$STEM.json" --log "$STEM.log" --timeout-s "$LIMIT_S" --git-sha "$SHA" \
        > "$STEM-wrapper.log" 2>&1
      CODE=$? ;;
    *) echo "[peers] unknown system $SYSTEM: use hybrid, trl or openrlhf"; FAILED=1; continue ;;
  esac
  echo "[peers] $SYSTEM exited $CODE"
  [ "$CODE" = 0 ] || { FAILED=1; tail -n 25 "$STEM.log"; }
  [ -f "$STEM.json" ] && summary "$STEM.json"
done
exit $FAILED
