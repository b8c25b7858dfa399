"""/v1/models and the LoRA adapters a server serves: ``--lora-modules`` at start-up and, when
``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` is true, ``POST /v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (vLLM's endpoints, bodies and answers).

Adapters are checked by the engine (on its thread, between steps: running requests go on) and
registered here by name; requests pick one with ``"model": name``. Unloading takes the name
away at once; requests already running with the adapter finish with it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ironlm.entrypoints.openai.errors import APIError
from ironlm.entrypoints.openai.lora_modules import LoRAModulePath
from ironlm.entrypoints.openai.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from ironlm.entrypoints.openai.startup import StartupError
from ironlm.entrypoints.openai.state import ServerState, log, random_id
from ironlm.lora.request import LoRARequest

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_lora_updating() -> bool:
    """vLLM's switch for the load / unload endpoints: "1" or "true", any case and spacing."""
    return os.environ.get(RUNTIME_LORA_ENV, "0").strip().lower() in ("1", "true")


def _permission(created: int) -> list[dict[str, Any]]:
    """vLLM's model card permission entry (the OpenAI legacy shape, with its defaults)."""
    return [{"id": random_id("modelperm"), "object": "model_permission", "created": created,
             "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
             "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
             "organization": "*", "group": None, "is_blocking": False}]


def model_cards(s: ServerState) -> list[dict[str, Any]]:
    """The served names, then every adapter with ``parent`` set to its base model."""
    cards = [
        {"id": name, "object": "model", "created": s.created, "owned_by": "ironlm",
         "root": s.model_path, "parent": None, "max_model_len": s.max_model_len,
         "permission": _permission(s.created)}
        for name in s.options.served_model_names
    ]
    cards += [
        {"id": lora.lora_name, "object": "model", "created": s.created, "owned_by": "ironlm",
         "root": lora.lora_path, "parent": lora.base_model_name or s.model_name,
         "max_model_len": s.max_model_len, "permission": _permission(s.created)}
        for lora in s.loras.values()
    ]
    return cards


async def load_lora_adapter(s: ServerState, req: LoadLoRAAdapterRequest,
                            base_model_name: str | None = None) -> str:
    """Check and register one adapter; APIError 400 naming the problem."""
    if not req.lora_name or not req.lora_path:
        raise APIError("Both 'lora_name' and 'lora_path' must be provided.", 400,
                       type="InvalidUserInput")
    if req.lora_name in s.loras:
        raise APIError(f"The lora adapter '{req.lora_name}' has already been loaded.", 400,
                       param="lora_name", type="InvalidUserInput")
    if req.lora_name in s.options.served_model_names:
        raise APIError(f"The lora adapter name '{req.lora_name}' is a served model's name.",
                       400, param="lora_name", type="InvalidUserInput")
    base = base_model_name if base_model_name in s.options.served_model_names else None
    lora = LoRARequest(req.lora_name, next(s.lora_ids), req.lora_path, base_model_name=base)
    try:
        await asyncio.wrap_future(s.engine.call_all(lambda engine: engine.add_lora(lora)))
    except ValueError as exc:
        # data-parallel engines that took it forget it (the others refused it: a no-op)
        await asyncio.wrap_future(s.engine.call_all(
            lambda engine: engine.remove_lora(lora.lora_int_id)))
        raise APIError(str(exc), 400, param="lora_path", type="BadRequestError") from None
    s.loras[lora.lora_name] = lora
    log.info("Loaded new LoRA adapter: name '%s', path '%s'", lora.lora_name, lora.lora_path)
    return f"Success: LoRA adapter '{lora.lora_name}' added successfully."


async def unload_lora_adapter(s: ServerState, req: UnloadLoRAAdapterRequest) -> str:
    """Stop serving an adapter by name (or id); 404 when no such adapter is served."""
    if not req.lora_name and not req.lora_int_id:
        raise APIError("either 'lora_name' and 'lora_int_id' needs to be provided.", 400,
                       type="InvalidUserInput")
    lora = s.loras.get(req.lora_name or "") or next(
        (x for x in s.loras.values() if req.lora_int_id and x.lora_int_id == req.lora_int_id),
        None,
    )
    if lora is None:
        raise APIError(f"The lora adapter '{req.lora_name}' cannot be found.", 404,
                       param="lora_name", type="NotFoundError")
    del s.loras[lora.lora_name]  # new requests can no longer name it
    lora_id = lora.lora_int_id
    await asyncio.wrap_future(s.engine.call_all(lambda engine: engine.remove_lora(lora_id)))
    log.info("Removed LoRA adapter: name '%s'", lora.lora_name)
    return f"Success: LoRA adapter '{lora.lora_name}' removed successfully."


def load_static_loras(s: ServerState, modules: list[LoRAModulePath]) -> None:
    """--lora-modules, before the server accepts requests (StartupError naming the module)."""
    for module in modules:
        if module.name in s.loras or module.name in s.options.served_model_names:
            raise StartupError(f"--lora-modules: the name {module.name!r} is used twice")
        base = module.base_model_name if module.base_model_name in \
            s.options.served_model_names else None
        lora = LoRARequest(module.name, next(s.lora_ids), module.path, base_model_name=base)
        try:
            s.engine.call_all(lambda engine, lora=lora: engine.add_lora(lora)).result()
        except ValueError as exc:
            raise StartupError(f"--lora-modules {module.name}={module.path}: {exc}") from None
        s.loras[lora.lora_name] = lora
        log.info("Loaded LoRA adapter %r from %s", lora.lora_name, lora.lora_path)
