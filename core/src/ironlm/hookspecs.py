"""The whole IronLM plugin contract.

A plugin is any module (or object) with functions decorated by ``ironlm.hookimpl`` whose names
match the hooks below. Installed distributions expose such a module through the entry-point group
``ironlm``::

    [project.entry-points.ironlm]
    my_plugin = "my_plugin"

Every hook here is a *collection hook*: it receives a ``register`` callback and calls it once per
item it contributes. All hooks are called with ``firstresult=False`` (every implementation runs) and
their return values are ignored. The host (``ironlm.plugin_manager.PluginManager``) owns policy:
registries are keyed by name, a name registered twice is an error naming both plugins, and each
item records its provenance (plugin name, distribution, version).

The contract is versioned (``CONTRACT_VERSION``, "MAJOR.MINOR"). A plugin module declares the
version it was written against as a module constant::

    IRONLM_CONTRACT_VERSION = "1.0"

It loads when the major versions are equal and its minor version is at most the core's (a minor
version only adds hooks or optional interface methods; a major version changes or removes
them). A plugin distribution that declares no version, or another major version, or a newer
minor version, is not loaded: ``ironlm plugins`` shows it as incompatible with the reason, and
the engine and server refuse to start, naming the plugin. Objects registered in-process
(``PluginManager.register``, tests, ``--tool-parser-plugin`` files) are written against the
running core; a declared version is checked for them too, a missing one is accepted.

Hooks run in every process that needs the registry: the CLI / server front end, the engine, and
each executor worker. They must therefore be cheap and free of side effects: register classes, do
not import heavy or hardware libraries (torch_npu, triton, ...) at module import time, and do not
touch devices. Availability is asked later through the registered class (``Platform.is_available``).
"""

from __future__ import annotations

from typing import Callable

import pluggy

PROJECT = "ironlm"
# The contract's version, "MAJOR.MINOR". 1.0: executors drive WorkerBase workers
# (``ironlm.interfaces.worker``) and are built as Executor(config, plugins, worker_cls);
# speculative proposers (``register_speculative_proposers``, ``ironlm.interfaces.spec_decode``).
# 1.1: reasoning parsers (``register_reasoning_parsers``, ``ironlm.interfaces.reasoning_parser``).
# 1.2: weight updates after loading (``LayerOps.unpack_linear_weight`` / ``repack_linear_weight``,
# ``QuantizationMethod.unpack_weights`` / ``repack_weights``), sleep mode
# (``Platform.release_memory``), and ``Executor.collective_rpc`` taking a callable too, run as
# ``WorkerBase.execute_method`` (a 1.1 executor that calls methods by name serves names only).
# 1.3: prompt embeddings (``ModelArchitecture.supports_prompt_embeds``, ``embed_input_ids`` and
# ``forward(..., inputs_embeds=)``); custom logits processors (``register_logits_processors``,
# ``ironlm.interfaces.logits_processor``).
# 1.4: sequence classifiers (``ModelArchitecture.classifies`` and ``classify``).
# 1.5: KV connectors (``register_kv_connectors``, ``ironlm.interfaces.kv_connector``).
# 1.6: token pooling tasks (``NewRequestData.pool_every_row``: a row per prompt token).
# 1.7: data parallelism (``EngineConfig.data_parallel_size`` / ``data_parallel_rank``: an
#      executor runs every rank out of the engine's process, local ranks after the lower
#      engines' ranks).
CONTRACT_VERSION = "1.7"
# The module constant a plugin declares its contract version in.
CONTRACT_ATTRIBUTE = "IRONLM_CONTRACT_VERSION"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_platforms(register: Callable[[type], None]) -> None:
    """Register device platforms.

    :param register: call ``register(PlatformSubclass)`` once per platform. The class must subclass
        :class:`ironlm.interfaces.platform.Platform`; its ``name`` (``"cpu"``, ``"cuda"``,
        ``"npu"``, ...) is the key users select with ``device=...`` / ``--device``.
    :return: ignored.

    Call mode: all implementations. Process: front end, engine and every worker. The class is
    instantiated lazily; ``is_available()`` must answer without raising (import the vendor
    library inside it and return the reason when that fails).
    """


@hookspec
def register_attention_backends(register: Callable[[type], None]) -> None:
    """Register attention backends over the paged KV cache.

    :param register: call ``register(AttentionBackendSubclass)`` once per backend. The class must
        subclass :class:`ironlm.interfaces.attention.AttentionBackend`; ``name`` is the key for
        ``attention_backend=...`` / ``--attention-backend``; ``supported_platforms`` lists the
        platform names it runs on. Any number of backends may coexist.
    :return: ignored.

    Call mode: all implementations. Process: engine and every worker (the model runner builds the
    backend's metadata and calls its ``forward`` from each attention layer).
    """


@hookspec
def register_quantization_methods(register: Callable[[type], None]) -> None:
    """Register weight quantization methods.

    :param register: call ``register(QuantizationMethodSubclass)`` once per method. The class must
        subclass :class:`ironlm.interfaces.quantization.QuantizationMethod`; ``name`` is the key for
        ``quantization=...`` / ``--quantization`` and the ``quant_method`` of an HF
        ``quantization_config``.
    :return: ignored.

    Call mode: all implementations. Process: engine and every worker (linear layers ask the method
    to create, load, post-process and apply their weights).
    """


@hookspec
def register_guided_backends(register: Callable[[type], None]) -> None:
    """Register guided (structured-output) decoding backends.

    :param register: call ``register(GuidedBackendSubclass)`` once per backend. The class must
        subclass :class:`ironlm.interfaces.guided.GuidedBackend` (engine level: compiles a
        :class:`~ironlm.interfaces.guided.GuidedSpec`) and produce
        :class:`~ironlm.interfaces.guided.Grammar` objects (request level: token masks).
        ``name`` is the key for ``guided_decoding_backend``.
    :return: ignored.

    Call mode: all implementations. Process: front end (to validate a request early and answer
    400) and engine (to build masks for the sampler).
    """


@hookspec
def register_tool_parsers(register: Callable[[type], None]) -> None:
    """Register tool-call parsers for chat completions.

    :param register: call ``register(ToolParserSubclass)`` once per parser. The class must subclass
        :class:`ironlm.interfaces.tool_parser.ToolParser`; ``name`` is the key for
        ``--tool-call-parser``.
    :return: ignored.

    Call mode: all implementations. Process: front end (server / ``LLM.chat``) only.
    """


@hookspec
def register_reasoning_parsers(register: Callable[[type], None]) -> None:
    """Register reasoning parsers: they split a thinking model's output into its reasoning
    and its answer (contract 1.1).

    :param register: call ``register(ReasoningParserSubclass)`` once per parser. The class must
        subclass :class:`ironlm.interfaces.reasoning_parser.ReasoningParser`; ``name`` is the
        key for ``--reasoning-parser``.
    :return: ignored.

    Call mode: all implementations. Process: front end (the chat endpoint splits each choice)
    and engine (a request's structured-output grammar starts after the parser's
    ``end_marker``).
    """


@hookspec
def register_logits_processors(register: Callable[[type], None]) -> None:
    """Register custom logits processors, vLLM's batch-level ``LogitsProcessor`` (contract
    1.3).

    :param register: call ``register(LogitsProcessorSubclass)`` once per processor. The class
        must subclass :class:`ironlm.interfaces.logits_processor.LogitsProcessor`; ``name`` is
        the key for ``--logits-processors NAME`` (a registered processor runs only where it
        is named; vLLM runs every installed one).
    :return: ignored.

    Call mode: all implementations. Process: engine (``validate_params`` on each request) and
    the worker that samples (the processor is built there).
    """


@hookspec
def register_executors(register: Callable[[type], None]) -> None:
    """Register model executors (how workers are laid out across processes and machines).

    :param register: call ``register(ExecutorSubclass)`` once per executor. The class must subclass
        :class:`ironlm.interfaces.executor.Executor`; ``name`` is the key for
        ``distributed_executor_backend=...`` (``"uni"``, ``"mp"``, ``"ray"``, ...).
    :return: ignored.

    Call mode: all implementations. Process: engine.
    """


@hookspec
def register_models(register: Callable[[str, type], None]) -> None:
    """Register model architectures.

    :param register: call ``register(architecture_name, ModelClass)`` once per architecture, with
        the name as it appears in an HF ``config.json`` ``architectures`` list (for example
        ``"LlamaForCausalLM"``). The class must subclass
        :class:`ironlm.interfaces.model.ModelArchitecture`.
    :return: ignored.

    Call mode: all implementations. Process: engine and every worker.
    """


@hookspec
def register_speculative_proposers(register: Callable[[type], None]) -> None:
    """Register speculative-decoding proposers (what drafts tokens for the target to verify).

    :param register: call ``register(ProposerSubclass)`` once per proposer. The class must
        subclass :class:`ironlm.interfaces.spec_decode.SpeculativeProposer`; ``name`` is the key
        for ``speculative_model="[name]"`` (the core registers ``ngram`` and ``draft_model``);
        a proposer that loads a model (``needs_model``) is chosen for a
        ``speculative_model`` path whose config.json ``model_type`` is in its ``model_types``
        (Medusa / EAGLE heads), else the built-in ``draft_model`` takes the path.
    :return: ignored.

    Call mode: all implementations. Process: engine (selection, start-up checks, KV lookahead)
    and the worker that samples (the proposer is built there, next to the target model).
    """


@hookspec
def register_kv_connectors(register: Callable[[type], None]) -> None:
    """Register KV connectors: stores of KV blocks that engines share (vLLM's
    ``--kv-transfer-config``, contract 1.5).

    :param register: call ``register(ConnectorSubclass)`` once per connector. The class must
        subclass :class:`ironlm.interfaces.kv_connector.KVConnector`; ``name`` is the key for
        ``kv_transfer_config``'s ``kv_connector`` (the core registers ``ExampleConnector``,
        also under vLLM's older name ``SharedStorageConnector``).
    :return: ignored.

    Call mode: all implementations. Process: engine (which blocks the store holds) and every
    worker (its rank's blocks in and out).
    """
