"""The core's own plugin: registered through the same hooks as every third-party plugin.

Registers the pure-torch reference attention backend (runs on any platform; the oracle plugin
kernels are tested against), the executors (``uni`` in-process, ``mp`` one process per rank,
``ray`` Ray actors: available when the ``ray`` extra is installed), the model architectures, the
quantization methods (each produces a canonical layout the platform's layer ops run), and the
speculative proposers ``ngram`` (prompt lookup) and ``draft_model``, and vLLM's file-based KV
connector (``ExampleConnector``, also under its older name ``SharedStorageConnector``).
Imports happen inside the hooks so that loading this module costs nothing.
"""

from __future__ import annotations

from typing import Callable

from ironlm.hookspecs import hookimpl

IRONLM_CONTRACT_VERSION = "1.0"  # the plugin contract this module is written against


@hookimpl
def register_attention_backends(register: Callable[[type], None]) -> None:
    from ironlm.attention.reference import ReferenceAttentionBackend

    register(ReferenceAttentionBackend)


@hookimpl
def register_executors(register: Callable[[type], None]) -> None:
    from ironlm.executor.mp import MultiprocExecutor
    from ironlm.executor.ray_executor import RayExecutor
    from ironlm.executor.uniproc import UniProcExecutor

    register(UniProcExecutor)
    register(MultiprocExecutor)
    register(RayExecutor)


@hookimpl
def register_quantization_methods(register: Callable[[type], None]) -> None:
    from ironlm.quantization.awq import AWQMethod
    from ironlm.quantization.fp8 import Fp8Method
    from ironlm.quantization.gguf import GGUFMethod
    from ironlm.quantization.gptq import GPTQMethod
    from ironlm.quantization.int4 import WeightOnlyInt4Method
    from ironlm.quantization.int8 import SmoothQuantMethod, WeightOnlyInt8Method

    for method in (
        WeightOnlyInt8Method,
        SmoothQuantMethod,
        WeightOnlyInt4Method,
        AWQMethod,
        GPTQMethod,
        Fp8Method,
        GGUFMethod,
    ):
        register(method)


@hookimpl
def register_models(register: Callable[[str, type], None]) -> None:
    from ironlm.models.gemma3 import Gemma3ForCausalLM, Gemma3TextForSequenceClassification
    from ironlm.models.llama import LlamaForCausalLM, LlamaForSequenceClassification

    for family in ("Llama", "Mistral", "Qwen2", "Qwen3"):
        register(f"{family}ForCausalLM", LlamaForCausalLM)
        register(f"{family}ForSequenceClassification", LlamaForSequenceClassification)
    register("Gemma3ForCausalLM", Gemma3ForCausalLM)
    register("Gemma3TextForSequenceClassification", Gemma3TextForSequenceClassification)


@hookimpl
def register_speculative_proposers(register: Callable[[type], None]) -> None:
    from ironlm.spec_decode.draft_model import DraftModelProposer
    from ironlm.spec_decode.ngram import NgramProposer

    register(NgramProposer)
    register(DraftModelProposer)


@hookimpl
def register_kv_connectors(register: Callable[[type], None]) -> None:
    from ironlm.distributed.kv_store import ExampleConnector, SharedStorageConnector

    register(ExampleConnector)
    register(SharedStorageConnector)
