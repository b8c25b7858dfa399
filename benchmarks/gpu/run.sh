#!/bin/bash
# The device call (after benchmarks/gpu/prepare.py here), from the repository root:
#   device run: bash benchmarks/gpu/run.sh, carry [".whl", ".gpu"]
# Installs the carried wheels, runs the cuda tests natively on the GPU (the server's too), then
# the figures: where a decode step's time goes (step_profile.py, also with 64-key decode
# partitions) and the end-to-end runs against HF transformers (cuda_e2e.py). About 5 minutes.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep "Model name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 IRONLM_CACHE_DIR=$PWD/.gpu/cache
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_gpu.py \
    tests/test_cuda_attention_kernels.py tests/test_cuda_layer_ops.py tests/test_cuda_platform.py \
    tests/test_cuda_quant_kernels.py tests/test_cuda_server.py --durations=10 \
    > "$OUT/cuda-tests.log" 2>&1
echo "pytest rc $?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/cuda-tests.log" | tail -12
mkdir -p /tmp/profiles
timeout 100 python3 benchmarks/gpu/step_profile.py .gpu/llama1b --batch 1 256 \
    --out-dir /tmp/profiles 2>&1 | grep -E "^b[0-9]"
timeout 60 python3 benchmarks/gpu/step_profile.py .gpu/llama1b --batch 1 \
    --decode-partition-size 64 --out-dir /tmp/profiles 2>&1 | grep -E "^b[0-9]"
tar czf "$OUT/step-profiles.tgz" -C /tmp/profiles .
timeout 200 python3 benchmarks/gpu/cuda_e2e.py .gpu/llama1b --hf \
    --result-file "$OUT/cuda-e2e-llama1b.json" | grep -E '"(b1_tok_s|batch_tok_s|b1_of_bound|batch_vs_hf)"'
timeout 150 python3 benchmarks/gpu/cuda_e2e.py .gpu/llama8b --max-model-len 2048 \
    --gpu-memory-utilization 0.9 --result-file "$OUT/cuda-e2e-llama8b.json" \
    | grep -E '"(b1_tok_s|batch_tok_s|b1_of_bound)"'
