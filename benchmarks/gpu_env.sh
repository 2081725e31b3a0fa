# Source on the GPU machine after the payload parts are in /tmp/vparts (see ../shared/gpu/README.md): installs
# vLLM 0.26 + DeepSpeed (+ Ray, Prefect) into /tmp/site once, and exports what the project's code needs there.
# Wheels in .gpuextra (git-ignored, carried with the last part) are installed beside them: peft for LoRA runs,
# `pip download --no-deps -d .gpuextra peft==0.21.2` (the version pyproject pins).
if [ ! -f /tmp/site/.installed ]; then
  cat /tmp/vparts/part.* > /tmp/payload.tar && mkdir -p /tmp/pl /tmp/site && tar xf /tmp/payload.tar -C /tmp/pl \
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      /tmp/pl/deps/*.whl $(ls .gpuextra/*.whl 2>/dev/null) \
    && tar xJf /tmp/pl/vllm_trim.tar.xz -C /tmp/site && touch /tmp/site/.installed || { echo "payload install failed"; return 4; }
fi
export PYTHONPATH=$PWD:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 \
  VLLM_ALLOW_INSECURE_SERIALIZATION=1
