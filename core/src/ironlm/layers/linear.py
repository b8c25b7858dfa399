"""Linear layers whose weights belong to the quantization method.

The layer owns the shapes, the tensor-parallel sharding and the bias; ``ctx.quantization``
(a QuantizationMethod) registers the weight tensors (``weight``, ``weight_scale``, ...) and
applies them. Checkpoint tensors arrive through ``load_weight`` in their full (unsharded)
shape; the layer slices this rank's shard and, for merged layers, the sub-matrix a
checkpoint tensor fills.

Sharding rule for every tensor the method registers: per-row tensors are split proportionally
(column parallel: along dim 0; row parallel: along the last dim when it has more than one
column), which keeps packed or grouped quantized layouts correct (4 bits per byte, one scale per
group). Per-tensor quantities (0-dim, or a single row) are never split; in a merged layer the
parts share them and must agree on their value.

Tensor parallelism: ColumnParallelLinear splits the output features over ranks (no
communication; QKV and gate/up are column parallel); RowParallelLinear splits the input features
and all-reduces the partial outputs (o_proj, down_proj). With tp_size 1 both are plain linears.

LoRA: a layer may carry adapter slots (``lora``, set by the worker when LoRA is enabled) whose
delta is added to its output. Adapter weights shard like the layer: ``lora_parts`` names the
output parts and their rows on this rank, ``shard_output_rows`` cuts a part's B (out, r) as the
part's weight rows are cut (column parallel), ``shard_input_columns`` cuts A (r, in) as the
weight's columns are cut (row parallel, where B stays whole and the all-reduce sums the ranks'
partial deltas along with the partial outputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ironlm.interfaces.model import ModelContext

if TYPE_CHECKING:  # the adapter slots the worker attaches (same layer: the model's)
    from ironlm.lora.layer import LinearLoRA


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by tensor-parallel size {denominator}")
    return numerator // denominator


def _slice_rows(full: torch.Tensor, index: int, count: int, total: int) -> torch.Tensor:
    """Rows [index/total, (index+count)/total) of ``full`` along dim 0, proportionally."""
    rows = full.shape[0]
    return full.narrow(0, rows * index // total, rows * count // total)


class LinearBase(torch.nn.Module):
    """y = x @ W^T + b over this rank's shard of W.

    ``in_features`` / ``out_features`` are the full (unsharded) sizes; ``input_size`` /
    ``output_size`` this rank's shard.
    """

    # checkpoint tensors one parameter is assembled from (None: a single whole tensor)
    shard_ids: tuple[str | int | None, ...] = (None,)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        ctx: ModelContext,
        bias: bool,
        input_size: int,
        output_size: int,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.input_size = input_size
        self.output_size = output_size
        self.quant_method = ctx.quantization
        self.layer_ops = ctx.layer_ops  # the platform's matmul for float weights
        self.tp_rank = ctx.tp_rank
        self.tp_size = ctx.tp_size
        self.tp_group = ctx.tp_group
        self.shared_loaded: set[str] = set()  # per-tensor params already set by a merged part
        self.lora: LinearLoRA | None = None  # adapter slots, when LoRA is enabled
        self.quant_method.create_weights(self, input_size, output_size, ctx.dtype)
        if bias:
            self.bias: torch.nn.Parameter | None = torch.nn.Parameter(
                torch.empty(output_size, dtype=ctx.dtype), requires_grad=False
            )
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (num_tokens, input_size) -> (num_tokens, output_size)
        y = self.quant_method.apply(self, x, self.bias)
        return y if self.lora is None else self.lora(x, y)

    # -- how adapter weights shard (see the module docstring) ---------------------------------
    def lora_parts(self) -> list[tuple[str | int | None, int]]:
        """(shard id, rows of this rank's output) per output part, in output order."""
        return [(None, self.output_size)]

    def shard_output_rows(self, full: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        """This rank's rows of a (part out_features, ...) tensor of part ``shard_id``."""
        return full

    def shard_input_columns(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's columns of a (..., in_features) tensor."""
        return full

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        """Copy one checkpoint tensor (full, unsharded shape) into parameter ``name``."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard_id!r}")
        param = self._param(name)
        _copy_checked(param, loaded, name)

    def _param(self, name: str) -> torch.Tensor:
        tensor = getattr(self, name, None)
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{type(self).__name__} has no weight tensor {name!r}")
        return tensor

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, tp_size={self.tp_size}"
        )


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank."""

    def __init__(
        self, in_features: int, out_features: int, ctx: ModelContext, bias: bool = False
    ) -> None:
        super().__init__(in_features, out_features, ctx, bias, in_features, out_features)


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; each rank returns its slice of y."""

    def __init__(
        self, in_features: int, out_features: int, ctx: ModelContext, bias: bool = False
    ) -> None:
        super().__init__(
            in_features, out_features, ctx, bias, in_features, divide(out_features, ctx.tp_size)
        )

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard_id!r}")
        param = self._param(name)
        if self.tp_size > 1 and not _is_per_tensor(loaded):
            loaded = _slice_rows(loaded, self.tp_rank, 1, self.tp_size)
        _copy_checked(param, loaded, name)

    def shard_output_rows(self, full: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        return _slice_rows(full, self.tp_rank, 1, self.tp_size) if self.tp_size > 1 else full

    def _copy_shared(self, name: str, param: torch.Tensor, loaded: torch.Tensor) -> None:
        """A per-tensor quantity of one part of a merged layer: the first part sets it, the
        others must carry the same value."""
        if name in self.shared_loaded:
            if not torch.equal(param, loaded.to(param.device, param.dtype)):
                raise ValueError(
                    f"{type(self).__name__}: per-tensor {name!r} differs between the merged "
                    "checkpoint tensors; this quantization cannot be merged"
                )
            return
        _copy_checked(param, loaded, name)
        self.shared_loaded.add(name)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel linears over the same input stacked into one matmul
    (gate_proj + up_proj -> gate_up_proj). Each rank holds its slice of every part:
    [gate_r | up_r]. ``load_weight`` takes the part index as ``shard_id``."""

    def __init__(
        self, in_features: int, output_sizes: list[int], ctx: ModelContext, bias: bool = False
    ) -> None:
        self.output_sizes = list(output_sizes)
        self.shard_ids = tuple(range(len(output_sizes)))
        super().__init__(in_features, sum(output_sizes), ctx, bias)

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"{type(self).__name__}: shard id must be a part index, got {shard_id!r}"
            )
        param = self._param(name)
        if _is_per_tensor(loaded):
            self._copy_shared(name, param, loaded)
            return
        # this rank's rows of part ``shard_id`` inside the stacked weight
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        part = _slice_rows(loaded, self.tp_rank, 1, self.tp_size) if self.tp_size > 1 else loaded
        target = _slice_rows(param, offset, size, self.output_size)
        _copy_checked(target, part, f"{name}[{shard_id}]")

    def lora_parts(self) -> list[tuple[str | int | None, int]]:
        return [(i, size // self.tp_size) for i, size in enumerate(self.output_sizes)]


class QKVParallelLinear(ColumnParallelLinear):
    """q_proj, k_proj and v_proj in one matmul. Output rows: [q heads | k heads | v heads] of
    this rank. KV heads are split over ranks, or replicated when there are fewer KV heads than
    ranks. ``load_weight`` takes ``shard_id`` in {"q", "k", "v"}."""

    shard_ids = ("q", "k", "v")

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        total_num_heads: int,
        total_num_kv_heads: int,
        ctx: ModelContext,
        bias: bool = False,
    ) -> None:
        tp = ctx.tp_size
        self.head_dim = head_dim
        self.total_num_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp)
        if total_num_kv_heads >= tp:
            self.num_kv_heads = divide(total_num_kv_heads, tp)
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp, total_num_kv_heads)
        # The full output this layer pretends to have, so that ColumnParallelLinear's shard is
        # exactly this rank's (num_heads + 2 * num_kv_heads) heads.
        out_features = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out_features, ctx, bias)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if shard_id not in self.shard_ids:
            raise ValueError(
                f"QKVParallelLinear: shard id must be 'q', 'k' or 'v', got {shard_id!r}"
            )
        param = self._param(name)
        if _is_per_tensor(loaded):
            self._copy_shared(name, param, loaded)
            return
        if shard_id == "q":
            offset, size = 0, self.q_size
            part = _slice_rows(loaded, self.tp_rank, 1, self.tp_size)
        elif shard_id in ("k", "v"):
            offset = self.q_size + (0 if shard_id == "k" else self.kv_size)
            size = self.kv_size
            # ranks sharing one KV head (kv_replicas > 1) load the same slice
            kv_rank = self.tp_rank // self.kv_replicas
            part = _slice_rows(loaded, kv_rank, 1, self.total_num_kv_heads // self.num_kv_heads)
        target = _slice_rows(param, offset, size, self.output_size)
        _copy_checked(target, part, f"{name}[{shard_id}]")

    def lora_parts(self) -> list[tuple[str | int | None, int]]:
        return [("q", self.q_size), ("k", self.kv_size), ("v", self.kv_size)]

    def shard_output_rows(self, full: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        if shard_id == "q":
            return _slice_rows(full, self.tp_rank, 1, self.tp_size)
        # ranks sharing one KV head (kv_replicas > 1) take the same rows
        kv_rank = self.tp_rank // self.kv_replicas
        return _slice_rows(full, kv_rank, 1, self.total_num_kv_heads // self.num_kv_heads)


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial outputs are summed with an all-reduce. The bias
    is added once, after the reduction."""

    def __init__(
        self, in_features: int, out_features: int, ctx: ModelContext, bias: bool = False
    ) -> None:
        super().__init__(
            in_features, out_features, ctx, bias, divide(in_features, ctx.tp_size), out_features
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (num_tokens, input_size) -> (num_tokens, out_features)
        if self.tp_size == 1:
            return super().forward(x)
        out = self.quant_method.apply(self, x, None)
        if self.lora is not None:  # this rank's partial delta: A's columns, B whole
            out = self.lora(x, out)
        dist.all_reduce(out, group=self.tp_group)
        return out if self.bias is None else out + self.bias

    def shard_input_columns(self, full: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return full
        cols = full.shape[-1]
        return full.narrow(-1, cols * self.tp_rank // self.tp_size, cols // self.tp_size)

    def load_weight(
        self, name: str, loaded: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard_id!r}")
        param = self._param(name)
        if self.tp_size > 1 and loaded.dim() > 1 and loaded.shape[-1] > 1:
            cols = loaded.shape[-1]
            loaded = loaded.narrow(-1, cols * self.tp_rank // self.tp_size, cols // self.tp_size)
        _copy_checked(param, loaded, name)


def _is_per_tensor(tensor: torch.Tensor) -> bool:
    """A scalar-like quantity (e.g. a per-tensor scale): 0-dim or a single row."""
    return tensor.dim() == 0 or tensor.shape[0] == 1


def _copy_checked(target: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if target.shape != loaded.shape:
        raise ValueError(
            f"weight {name!r}: checkpoint shape {tuple(loaded.shape)} does not fit "
            f"parameter shape {tuple(target.shape)}"
        )
    with torch.no_grad():
        target.copy_(loaded)
