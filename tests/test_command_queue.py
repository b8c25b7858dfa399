"""The engine thread's command queue: commands run in order on the engine thread; once that
thread has left its loop, what is queued and what comes later is refused, so a request or call
made around the engine's death fails at once instead of waiting forever."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path

import pytest

from ironlm.config import EngineConfig
from ironlm.engine.async_engine import AsyncEngine, EngineDeadError
from ironlm.engine.command_queue import CommandQueue, fail_future
from ironlm.engine.llm_engine import LLMEngine
from ironlm.plugin_manager import PluginManager
from ironlm.sampling_params import SamplingParams


def _dead() -> EngineDeadError:
    return EngineDeadError("gone")


def test_commands_run_in_order_and_a_failing_one_does_not_stop_the_rest() -> None:
    q = CommandQueue()
    ran: list[int] = []
    q.submit(lambda: ran.append(1), None, _dead)
    q.submit(lambda: 1 / 0, None, _dead)
    q.submit(lambda: ran.append(3), None, _dead)
    q.run_queued(block=False)
    assert ran == [1, 3]


def test_a_closed_queue_refuses_what_was_queued_and_what_comes_later() -> None:
    q = CommandQueue()
    queued: Future[None] = Future()
    q.submit(lambda: queued.set_result(None), fail_future(queued), _dead)
    q.close(EngineDeadError("the loop ended"))
    with pytest.raises(EngineDeadError, match="the loop ended"):
        queued.result(timeout=0)
    later: Future[None] = Future()
    q.submit(lambda: later.set_result(None), fail_future(later), _dead)
    with pytest.raises(EngineDeadError, match="gone"):
        later.result(timeout=0)
    q.run_queued(block=False)  # nothing left to run


def test_a_caller_that_gave_up_is_not_failed() -> None:
    q = CommandQueue()
    fut: Future[None] = Future()
    q.submit(lambda: None, fail_future(fut), _dead)
    fut.cancel()
    q.close(EngineDeadError("x"))
    assert fut.cancelled()


def test_a_call_after_the_engine_thread_stopped_fails_at_once(tiny_llama_dir: Path) -> None:
    config = EngineConfig(model=str(tiny_llama_dir), max_model_len=128,
                          kv_cache_memory_bytes=8 * 1024**2)
    engine = AsyncEngine(lambda: LLMEngine(config, PluginManager()))
    engine.start()
    assert engine.call(lambda e: e.config.max_model_len).result(timeout=30) == 128
    engine.shutdown()
    with pytest.raises(EngineDeadError, match="not running"):
        engine.call(lambda e: None).result(timeout=5)


def test_a_request_running_when_the_loop_stops_gets_an_error(tiny_llama_dir: Path) -> None:
    config = EngineConfig(model=str(tiny_llama_dir), max_model_len=256,
                          kv_cache_memory_bytes=8 * 1024**2)
    engine = AsyncEngine(lambda: LLMEngine(config, PluginManager()))
    engine.start()
    params = SamplingParams(max_tokens=240, ignore_eos=True)

    async def run() -> None:
        outputs = engine.generate("r", "Hello world", params)
        await outputs.__anext__()  # running
        stopping = asyncio.create_task(asyncio.to_thread(engine.shutdown))
        with pytest.raises(EngineDeadError, match="not running"):
            async for _ in outputs:
                pass
        await stopping

    asyncio.run(asyncio.wait_for(run(), timeout=60))
