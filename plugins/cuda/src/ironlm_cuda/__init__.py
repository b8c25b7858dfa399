"""ironlm-cuda: the NVIDIA CUDA platform plugin for IronLM."""
