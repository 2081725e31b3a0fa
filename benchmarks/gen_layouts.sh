#!/usr/bin/env bash
# One GPU-machine command that compares engine layouts of the rollout's generation (issue 17: generation against its
# decode roofline), each in a fresh process of profile_generation.py --rates-only at the iteration's shape, with the
# model runner in a child process (the colocated default). Each layout writes
# $OUT/h200-gen-profile-DATE-TAG-NAME.json and its log, and prints its rate. A layout takes ~170 s on an H200
# (s38: the engine's start 146 s, most of it the child's imports and torch.compile, which every layout of its own
# settings pays again; then two timed generates), so each is cut off after LAYOUT_S seconds (default 185) and a layout
# that cannot have LAYOUT_S of the command's TOTAL_S (default 560) left is skipped, not started: the command fits the
# device's 10 minutes, and a skipped layout is named so that the next command can take it.
#
#   bash benchmarks/gen_layouts.sh TAG ["NAME:FLAGS" ...]    (default: the default layout and FA3 unsplit)
#   e.g. bash benchmarks/gen_layouts.sh s38 "bs64:--block-size 64" "bs128:--block-size 128"
#        bash benchmarks/gen_layouts.sh s39 "default:" "coreapart:--engine-core-process"
#
# Needs the payload installed (benchmarks/gpu_env.sh) and the stand-in in MODEL_DIR (default /tmp/m17).
set -u
TAG=${1:?usage: gen_layouts.sh TAG ["NAME:FLAGS" ...]}
shift
[ $# -gt 0 ] || set -- "default:" "splits1:--fa-max-splits 1"
OUT_DIR=${OUT:-/tmp/gen-out}
MODEL_DIR=${MODEL_DIR:-/tmp/m17}
LIMIT_S=${LAYOUT_S:-185}
DEADLINE=$(( $(date +%s) + ${TOTAL_S:-560} ))
mkdir -p "$OUT_DIR"
source benchmarks/gpu_env.sh || { echo "[layouts] no payload: send its parts to /tmp/vparts first"; exit 4; }
for LAYOUT in "$@"; do
  NAME=${LAYOUT%%:*}
  if [ $(( DEADLINE - $(date +%s) )) -lt "$LIMIT_S" ]; then
    echo "[layouts] $NAME skipped: less than LAYOUT_S=$LIMIT_S s of TOTAL_S left; run it in the next command"
    continue
  fi
  STEM="$OUT_DIR/h200-gen-profile-$(date +%F)-$TAG-$NAME"
  # shellcheck disable=SC2086  # the layout's flags are words
  timeout -k 10 "$LIMIT_S" python3 benchmarks/profile_generation.py --model "$MODEL_DIR" --out "$STEM.json" \
    --executor-backend mp --rates-only --variants seeded_no_logprobs ${LAYOUT#*:} > "$STEM.log" 2>&1
  echo "[layouts] $NAME exited $?"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); f = d['figures']
print('[layouts]', sys.argv[2], 'start', f.get('engine_start_s'), json.dumps(f.get('gen_tok_s_seeded_no_logprobs')),
      d['errors'] or '')" "$STEM.json" "$NAME" 2>/dev/null || echo "[layouts] $NAME: no results file"
done
