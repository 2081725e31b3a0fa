# On a machine of two GPUs (after `source benchmarks/gpu_env.sh`): run two jobs at once, one per GPU, each in an
# environment of its own, so the pair fits one 10-minute device command. What two jobs sharing a machine need:
# their own GPU (CUDA_VISIBLE_DEVICES; the memory benchmark's nvidia-smi sampler follows it), their own Ray temp
# dir and Prefect home, and their own DeepSpeed rendezvous port (single-rank benchmarks default to 29531).
#
#   bash benchmarks/two_gpus.sh OUT_DIR SHA "JOB ON GPU 0" "JOB ON GPU 1"
#
# Each job's output goes to OUT_DIR/gpu<N>.log; the jobs are cut off at 570 s so their results are written.
set -u
out=$1 sha=$2
mkdir -p "$out"
for gpu in 0 1; do
  job=$([ "$gpu" = 0 ] && echo "$3" || echo "$4")
  (export CUDA_VISIBLE_DEVICES=$gpu RAY_TMPDIR=/tmp/ray-gpu$gpu PREFECT_HOME=/tmp/prefect-gpu$gpu \
     MASTER_PORT=$((29531 + 10 * gpu)) GIT_SHA=$sha
   timeout 570 bash -c "$job" > "$out/gpu$gpu.log" 2>&1; echo "[two_gpus] GPU $gpu job exited $?" >> "$out/gpu$gpu.log") &
done
wait
tail -n 3 "$out"/gpu*.log
