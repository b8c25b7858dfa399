"""Triton kernels of the cuda plugin and their launchers.

Every module here imports triton at its top, so import them only where a kernel is about to run
(inside backend / layer-op methods), never at plugin import time. Launchers take tensors and
launch on whatever device the tensors are on: CUDA tensors on a GPU, CPU tensors under
``TRITON_INTERPRET=1`` (how the tests run without a GPU).
"""
