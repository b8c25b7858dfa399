"""Platform: one kind of device (cpu, cuda, npu, ...) as the engine sees it."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ironlm.interfaces.categorical import reference_categorical
from ironlm.interfaces.lora import reference_lora_linear
from ironlm.interfaces.quant import QuantLayout, reference_embedding, reference_linear
from ironlm.interfaces.truncation import truncated_logits

if TYPE_CHECKING:  # the model context names this module's LayerOps
    from ironlm.interfaces.graphs import GraphCapture
    from ironlm.interfaces.model import ModelContext


def scaled_rows(rows: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Embedding rows times ``scale`` rounded to their dtype, the product rounded once more,
    as Gemma's reference multiplies its looked-up rows; None: the rows as they are."""
    return rows if scale is None else rows * torch.tensor(scale, dtype=rows.dtype)


@dataclass(frozen=True)
class Availability:
    """Whether a platform (or backend) can run here, and if not, why."""

    available: bool
    reason: str = ""

    @classmethod
    def yes(cls, detail: str = "") -> Availability:
        return cls(True, detail)

    @classmethod
    def no(cls, reason: str) -> Availability:
        return cls(False, reason)


class LayerOps:
    """Layer ops the model layers call. The core's pure-torch versions are the reference; a
    platform may return a subclass with its own kernels from ``Platform.layer_ops``.

    Shapes: ``x`` is (num_tokens, hidden); ``residual`` the same; ``positions`` (num_tokens,).
    ``rms_norm`` also takes (num_tokens, heads, head_dim) views with heads contiguous inside a
    token (per-head q/k norms on a slice of the fused qkv output), without a residual.

    Float weights of linear layers and an untied LM head are handed to ``pack_linear_weight``
    once after loading, an LM head tied to the input embedding to ``pack_tied_weight``;
    whatever layout they return is what ``linear`` / ``lm_head`` (and, tied, ``embedding``)
    receive (the reference keeps the checkpoint's (out, in) rows).
    """

    def pack_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """(out, in) float weight -> the layout ``linear`` and ``lm_head`` read."""
        return weight

    def pack_tied_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """(vocab, hidden) weight shared by the LM head and the input embedding (tied): a
        layout that both ``lm_head`` and ``embedding`` read. By default the linear layout; a
        platform whose linear layouts include one without rows to look up (an opaque
        library format) picks among the others here."""
        return self.pack_linear_weight(weight)

    def unpack_linear_weight(self, stored: torch.Tensor) -> torch.Tensor:
        """A ``pack_linear_weight`` or ``pack_tied_weight`` result -> its (out, in) weight
        (weight updates after loading: new checkpoint tensors are copied into it, then
        ``repack_linear_weight`` writes it back). May be ``stored`` itself where the layout is
        the rows'. The default is for the rows as loaded: it refuses (ValueError) where a
        subclass packs weights its own way without saying how to unpack them."""
        cls = type(self)
        if cls.unpack_linear_weight is LayerOps.unpack_linear_weight and (
            cls.pack_linear_weight is not LayerOps.pack_linear_weight
            or cls.pack_tied_weight is not LayerOps.pack_tied_weight
        ):
            raise ValueError(f"{cls.__name__} packs weights its own way and does not unpack "
                             "them: weight updates are not supported on this platform")
        return stored

    def repack_linear_weight(self, stored: torch.Tensor, weight: torch.Tensor) -> None:
        """Write the (out, in) ``weight`` into ``stored``, in ``stored``'s layout and storage
        (captured graphs that read ``stored`` see the new values)."""
        if weight.data_ptr() != stored.data_ptr():
            stored.copy_(weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """(T, in) -> (T, out): x @ W^T + bias over a ``pack_linear_weight`` result."""
        return torch.nn.functional.linear(x, weight, bias)

    def lm_head(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """(T, hidden) -> (T, vocab rows of ``weight``) float32 logits: ``linear`` without
        bias, its result (rounded to the activations' dtype) as float32. A platform may write
        the float32 values directly instead of converting ``linear``'s output."""
        return self.linear(x, weight, None).float()

    def embedding(
        self, ids: torch.Tensor, weight: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        """(T,) ids -> (T, hidden): rows of a (vocab, hidden) weight, packed or not, times
        ``scale`` when given (``scaled_rows``: Gemma's sqrt(hidden))."""
        return scaled_rows(torch.nn.functional.embedding(ids, weight), scale)

    # -- quantized weights (layouts: ironlm.interfaces.quant) ---------------------------------
    def quantized_support(self, layout: QuantLayout) -> Availability:
        """Whether ``quantized_linear`` / ``quantized_embedding`` can run ``layout`` here, with
        the reason when not (a method whose layout is unsupported is refused at start-up).
        The core's ops run every layout through the pure-torch reference."""
        return Availability.yes("pure-torch reference")

    def pack_quantized(
        self, layout: QuantLayout, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The canonical tensors of ``layout`` -> whatever ``quantized_linear`` reads (called
        once after loading; the reference keeps them as they are)."""
        return tensors

    def quantized_linear(
        self,
        layout: QuantLayout,
        x: torch.Tensor,  # (T, K)
        packed: dict[str, torch.Tensor],  # what pack_quantized returned
        bias: torch.Tensor | None,  # (N,)
    ) -> torch.Tensor:  # (T, N) in x.dtype
        """x @ W^T + bias for a quantized weight."""
        return reference_linear(layout, x, packed, bias)

    def quantized_embedding(
        self, layout: QuantLayout, ids: torch.Tensor, packed: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """(T,) ids -> (T, hidden) float32 rows of a quantized (vocab, hidden) table."""
        return reference_embedding(layout, ids, packed)

    # -- LoRA adapters (layout: ironlm.interfaces.lora) -----------------------------------------
    def lora_linear(
        self,
        y: torch.Tensor,  # (T, N) the layer's output, updated in place
        x: torch.Tensor,  # (T, K) the layer's input
        lora_a: torch.Tensor,  # (S, P * R, K) stacked A of every slot and part
        lora_b: torch.Tensor,  # (S, R, N) stacked B.T (scaled) of every slot
        slices: tuple[int, ...],  # output rows of each of the P parts
        token_slots: torch.Tensor,  # (T,) int32 slot per token, -1 = no adapter
        slot_ranks: torch.Tensor,  # (S,) int32 rank of each slot's adapter (0: empty)
    ) -> torch.Tensor:  # y
        """Add each token's adapter delta to y (the segmented LoRA matmul of a mixed batch).
        Called while a decode graph is captured too: kernels must read ``token_slots`` and
        ``slot_ranks`` when they run (the tensors stay in place; their contents change)."""
        return reference_lora_linear(y, x, lora_a, lora_b, slices, token_slots, slot_ranks)

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns (normed, new_residual). With a residual, normalises ``x + residual`` and
        returns that sum as the new residual (the pre-norm transformer's running stream)."""
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        out = (xf * torch.rsqrt(var + eps)).to(x.dtype) * weight
        return out, residual

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """(T, 2*I) -> (T, I): silu(gate) * up, gate first."""
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """(T, 2*I) -> (T, I): gelu_tanh(gate) * up (Gemma)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.gelu(gate, approximate="tanh") * up

    def logsumexp_argmax(
        self, logits: torch.Tensor, argmax: bool = True, logsumexp: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(B, V) float32 logits -> (logsumexp (B,) float32, argmax (B,) int64), each None when
        not asked for: what the sampler reads from every row (a token's log-probability is its
        logit minus the row's logsumexp, wanted when a request asks for log-probabilities;
        greedy rows take the argmax). torch's semantics: the first maximal index, NaN counts
        as the maximum. A kernel that gets one for free may return it anyway."""
        lse = torch.logsumexp(logits, dim=-1) if logsumexp else None
        return lse, logits.argmax(dim=-1) if argmax else None

    def categorical(
        self,
        logits: torch.Tensor,  # (B, V) float32, -inf where a token is ruled out
        scale: torch.Tensor,  # (B, 1) float32, each row's inverse temperature
        u: torch.Tensor,  # (B, 1) float64 uniforms on [0, 1)
    ) -> torch.Tensor:  # (B,) int64
        """One draw per row from softmax(logits * scale): the first token whose running total
        of probability passes u times the row's total (never a token of probability 0). The
        sampler's draw at a temperature; same u, same token up to the rounding of the sums."""
        return reference_categorical(logits, scale, u)

    def truncated_categorical(
        self,
        logits: torch.Tensor,  # (B, V) float32, -inf where a token is ruled out
        scale: torch.Tensor,  # (B, 1) float32, each row's inverse temperature
        top_k: torch.Tensor,  # (B, 1) int64, V where a row has no top-k
        top_p: torch.Tensor,  # (B, 1) float32, 1 where a row has no top-p
        min_p: torch.Tensor,  # (B, 1) float32, 0 where a row has no min-p
        u: torch.Tensor,  # (B, 1) float64 uniforms on [0, 1)
    ) -> torch.Tensor:  # (B,) int64
        """``categorical`` from softmax(logits * scale) cut, in vLLM's order, to each row's
        top_k largest, then the top-p nucleus under the softmax of what top-k kept, then the
        tokens whose probability is at least min_p times the largest
        (``ironlm.interfaces.truncation``): same u, same token up to the rounding of the sums
        and of a cut that lands within rounding of a boundary. By default: this platform's
        ``truncated_logits``, then its ``categorical``."""
        x = self.truncated_logits(logits, scale, top_k, top_p, min_p)
        return self.categorical(x, torch.ones_like(scale), u)

    def truncated_logits(
        self,
        logits: torch.Tensor,  # (B, V) float32, -inf where a token is ruled out
        scale: torch.Tensor,  # (B, 1) float32, each row's inverse temperature
        top_k: torch.Tensor,  # (B, 1) int64, V where a row has no top-k
        top_p: torch.Tensor,  # (B, 1) float32, 1 where a row has no top-p
        min_p: torch.Tensor,  # (B, 1) float32, 0 where a row has no min-p
    ) -> torch.Tensor:  # (B, V) float32
        """logits * scale with every token outside each row's top-k / top-p / min-p set
        (``truncated_categorical``'s) at -inf: the distributions speculative decoding verifies
        drafts against, whole. Same set up to a cut within rounding of a boundary; ties at a
        cut keep as many tokens, not necessarily the same ones."""
        return truncated_logits(logits, scale, top_k, top_p, min_p)

    def rotary(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Neox-style rotary on q (T, H, D) and k (T, Hkv, D) with cos/sin (T, D/2)."""
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this OS
        return os.cpu_count() or 1


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos.unsqueeze(1).to(x.dtype), sin.unsqueeze(1).to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Platform(ABC):
    """A device platform. Registered through ``register_platforms``; instantiated by the host
    with no arguments, so ``__init__`` must not touch the device.

    Class attributes a subclass sets:
      name: key users select with ``device=`` (e.g. ``"cuda"``).
      device_type: torch device type string (``"cuda"``, ``"cpu"``, ``"npu"``).
      priority: higher wins when ``device="auto"`` picks among available platforms.
      dist_backend: torch.distributed backend for tensor parallelism (gloo, nccl, hccl).
      supported_dtypes: dtypes the platform computes in.
      default_attention_backend: name of the attention backend used when none is selected.
      supported_block_sizes: KV block sizes the platform's kernels accept (None: any).
      default_block_size: the KV block size when the user names none (16 on GPUs and the CPU,
        128 on Ascend, the only size its kernels take; vLLM's CPU backend takes 128).
      kv_run_tokens: how many of a sequence's cached tokens the platform's attention wants
        side by side in memory: the block manager hands a request its blocks in runs of
        ``kv_run_tokens // block_size`` neighbouring blocks where free (0: no runs).
      visible_devices_env: environment variable that masks devices (e.g. CUDA_VISIBLE_DEVICES).
      supports_graph_capture: whether ``graph_capture`` can return a capture (decode graphs:
        CUDA graphs, recorded kernel calls, ...).
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    priority: ClassVar[int] = 0
    dist_backend: ClassVar[str] = "gloo"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    default_attention_backend: ClassVar[str]
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = None
    default_block_size: ClassVar[int] = 16
    kv_run_tokens: ClassVar[int] = 0
    visible_devices_env: ClassVar[str | None] = None
    supports_graph_capture: ClassVar[bool] = False

    @abstractmethod
    def is_available(self) -> Availability:
        """Whether this platform can run in this process, with the reason when not. Never raises;
        imports vendor libraries lazily, here."""

    @abstractmethod
    def memory_info(self, device_index: int = 0) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the device's memory."""

    def release_memory(self) -> None:
        """Hand memory the process freed back to the device or the system, where an
        allocator keeps it cached (sleep mode, after the KV cache and weights are freed).
        Default: nothing is kept."""

    def default_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype ``dtype="auto"`` resolves to for a checkpoint stored in ``model_dtype``."""
        return model_dtype if model_dtype in self.supported_dtypes else self.supported_dtypes[0]

    def check_block_size(self, block_size: int) -> None:
        """Raises ValueError when the platform's kernels cannot use ``block_size``."""
        if self.supported_block_sizes is not None and block_size not in self.supported_block_sizes:
            raise ValueError(
                f"block_size={block_size} is not supported on platform {self.name!r}; "
                f"supported: {list(self.supported_block_sizes)}"
            )

    def scheduler_defaults(self, serving: bool, world_size: int) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) where the user sets neither: one step's token
        budget (with chunked prefill) and the most sequences in a batch, for the OpenAI server
        (``serving``) or the offline ``LLM``, with ``world_size`` ranks. vLLM picks these per
        device and usage; default: 2048 tokens and 256 sequences for both (what the npu keeps)."""
        return 2048, 256

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index) if self.device_type != "cpu" else torch.device("cpu")

    def set_device(self, index: int) -> None:
        """Make ``index`` the current device of this process (no-op where there is one device)."""

    def synchronize(self) -> None:
        """Wait for queued device work (no-op on synchronous devices)."""

    def configure_process(self, local_world_size: int = 1) -> None:
        """Called once in each worker process before the model loads (threads, env, ...).
        ``local_world_size`` ranks run on this machine: they share its cores, so the default
        gives each ``cores // local_world_size`` torch threads (at least one) when it is > 1."""
        if local_world_size > 1:
            torch.set_num_threads(max(1, usable_cores() // local_world_size))

    def before_engine_thread(self) -> None:
        """Called once on the OpenAI server's main thread before it starts the thread that
        builds and runs the engine (``configure_process`` then runs on that thread, in the
        worker): for process settings that a thread takes when it starts. Default: none."""

    def device_count(self) -> int | None:
        """Devices of this platform on this machine, each of which holds one rank; None when
        ranks are not bound to devices (any number of ranks can share the host, as on cpu).
        A single-machine executor refuses more ranks than this."""
        return 1

    # Ray's resource name for one device of this platform (``"GPU"``, ``"NPU"``): each Ray
    # worker asks for one; ``"CPU"`` where ranks are not bound to devices.
    ray_device_key: ClassVar[str] = "CPU"

    def layer_ops(self) -> LayerOps:
        """The element-wise layer ops for this platform (fused kernels where they pay)."""
        return LayerOps()

    def describe(self) -> dict[str, Any]:
        """Platform-specific details for ``ironlm plugins`` (and ``GET /v1/plugins``): e.g. the
        ISA its kernels were built for and which kernel runs each op. JSON-serialisable values;
        cheap (no device work, no measuring); never raises. Default: none."""
        return {}

    def graph_capture(self, ctx: ModelContext) -> GraphCapture | None:
        """A capture of decode forwards for the model built with ``ctx`` (its layer ops and
        attention backend), or None when this platform, or that combination, has none; the
        engine then runs every step eagerly. See ``ironlm.interfaces.graphs``."""
        return None
