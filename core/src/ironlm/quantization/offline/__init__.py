"""The offline algorithms behind ``ironlm quantize``: calibration data, a float Llama decoder
layer to run it through, SmoothQuant's migration, AWQ's scale search, GPTQ's error
compensation, and the writer of the quantized HF folder (``quantizer.quantize_model``).

Kept free of heavy imports: the CLI reads the names below when it builds its parser."""

# the --quant-type values (the methods with an offline path)
QUANT_TYPES = ("weight_only_int8", "smooth_quant", "awq", "gptq", "fp8", "weight_only_int4")
# -t values: the dtype of everything left unquantized
DTYPE_NAMES = ("fp16", "bf16", "fp32")
