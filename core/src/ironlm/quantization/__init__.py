"""The core's quantization methods (registered by ``ironlm.builtin_plugin``) and the offline
algorithms behind ``ironlm quantize`` (``ironlm.quantization.offline``).

Every method here produces one of the canonical layouts of ``ironlm.interfaces.quant`` and runs
it through the platform's layer ops, so it runs wherever the platform supports that layout:

  weight_only_int8   int8    per-channel int8 weights, float activations
  smooth_quant       w8a8    per-channel int8 weights, per-token int8 activations
  weight_only_int4   int4    group-wise 4-bit weights (round to nearest)
  awq                int4    AutoAWQ GEMM checkpoints (zero points)
  gptq               int4    GPTQ / GPTQModel checkpoints (act-order included)
  fp8                fp8     float8 e4m3 weights, per-tensor or per-channel scales
  gguf               gguf    a GGUF file's Q4_0, Q4_1, Q8_0, Q4_K, Q6_K tensors as stored
"""
