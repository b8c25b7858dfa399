#!/bin/bash
# The device call (after benchmarks/gpu/prepare.py here), from the repository root:
#   device run: bash benchmarks/gpu/run.sh, carry [".whl", ".gpu"]
# Installs the carried wheels, runs the cuda tests natively on the GPU, then the figures.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 IRONLM_CACHE_DIR=$PWD/.gpu/cache
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_gpu.py \
    tests/test_cuda_attention_kernels.py tests/test_cuda_layer_ops.py tests/test_cuda_platform.py \
    tests/test_cuda_quant_kernels.py -s --durations=10 > "$OUT/cuda-tests.log" 2>&1
echo "pytest rc $?"; grep -E "passed|failed|^FAILED|^ERROR|decode attention:" "$OUT/cuda-tests.log"
timeout 200 python3 benchmarks/gpu/cuda_e2e.py .gpu/llama1b --eager --hf \
    --result-file "$OUT/cuda-e2e-llama1b.json" | tail -3
timeout 150 python3 benchmarks/gpu/cuda_e2e.py .gpu/llama8b --max-model-len 2048 \
    --gpu-memory-utilization 0.9 --result-file "$OUT/cuda-e2e-llama8b.json" | tail -3
