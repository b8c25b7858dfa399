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
parts share them and must agree on their value, except where the method registered the
parameter per output row ((output_size,) or (output_size, 1)): a per-tensor checkpoint value then
fills the rows of its part (fp8 q/k/v with three different per-tensor scales).

Loading one checkpoint tensor: the method rewrites it into this convention
(``checkpoint_tensor``), the layer takes this rank's share (``_rank_share``), the method may keep
it its own way (``load_part``), else it is copied into the parameter's rows of its part.

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

from typing import TYPE_CHECKING, Any

import torch

from ironlm.interfaces.model import ModelContext

if TYPE_CHECKING:  # the adapter slots the worker attaches (same layer: the model's)
    from ironlm.lora.layer import LinearLoRA


def divide(numerator: int, denominator: int, what: str = "size") -> int:
    if numerator % denominator != 0:
        raise ValueError(
            f"{what} {numerator} is not divisible by tensor_parallel_size {denominator}"
        )
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
        self.device = ctx.device
        self.dtype = ctx.dtype  # activations' dtype
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

    # -- weight updates after loading (layers/weight_update.py) -------------------------------
    def unpack_weights(self) -> Any:
        """The loaded parameters back, ready for ``load_weight``; what ``repack_weights``
        takes to process them into the tensors the forward reads."""
        return self.quant_method.unpack_weights(self)

    def repack_weights(self, kept: Any) -> None:
        self.quant_method.repack_weights(self, kept)

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
        """Copy one checkpoint tensor (full, unsharded shape) into parameter ``name`` (the rows
        of part ``shard_id`` in a merged layer)."""
        self._check_shard_id(shard_id)
        loaded = self.quant_method.checkpoint_tensor(name, loaded)
        share = self._rank_share(loaded, shard_id)
        if self.quant_method.load_part(self, name, share, shard_id):
            return
        param = self._param(name)
        rows = self._part_rows(shard_id)
        label = name if shard_id is None else f"{name}[{shard_id}]"
        if _is_per_tensor(share) and self._is_per_row(param):
            target = param if rows is None else _slice_rows(param, *rows, self.output_size)
            _fill(target, share, label)
        elif rows is None:
            _copy_checked(param, share, label)
        elif _is_per_tensor(share):
            self._copy_shared(name, param, share)
        else:
            _copy_checked(_slice_rows(param, *rows, self.output_size), share, label)

    # -- sharding, per layer kind ----------------------------------------------------------
    def _check_shard_id(self, shard_id: str | int | None) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shard {shard_id!r}")

    def _rank_share(self, loaded: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        """This rank's share of a full checkpoint tensor (layer convention)."""
        return loaded

    def _part_rows(self, shard_id: str | int | None) -> tuple[int, int] | None:
        """(offset, size) in output features of the rows part ``shard_id`` fills; None: all."""
        return None

    def _is_per_row(self, param: torch.Tensor) -> bool:
        """A parameter holding one value per output feature: (output_size,) or
        (output_size, 1)."""
        return (
            self.output_size > 1
            and param.dim() in (1, 2)
            and param.shape[0] == self.output_size
            and param[0].numel() == 1
        )

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

    def _rank_share(self, loaded: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        if self.tp_size > 1 and not _is_per_tensor(loaded):
            return _slice_rows(loaded, self.tp_rank, 1, self.tp_size)
        return loaded

    def shard_output_rows(self, full: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        return self._rank_share(full, shard_id)  # B's rows as the weight's rows


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

    def _check_shard_id(self, shard_id: str | int | None) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"{type(self).__name__}: shard id must be a part index, got {shard_id!r}"
            )

    def _part_rows(self, shard_id: str | int | None) -> tuple[int, int]:
        # this rank's rows of part ``shard_id`` inside the stacked weight
        assert isinstance(shard_id, int)
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        return offset, self.output_sizes[shard_id] // self.tp_size

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
        self.num_heads = divide(total_num_heads, tp, "number of attention heads")
        if total_num_kv_heads >= tp:
            self.num_kv_heads = divide(total_num_kv_heads, tp, "number of key/value heads")
            self.kv_replicas = 1
        else:  # fewer KV heads than ranks: each rank holds one, shared by tp / kv ranks
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp, total_num_kv_heads, "tensor_parallel_size")
        # The full output this layer pretends to have, so that ColumnParallelLinear's shard is
        # exactly this rank's (num_heads + 2 * num_kv_heads) heads.
        out_features = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp
        super().__init__(hidden_size, out_features, ctx, bias)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim

    def _check_shard_id(self, shard_id: str | int | None) -> None:
        if shard_id not in self.shard_ids:
            raise ValueError(
                f"QKVParallelLinear: shard id must be 'q', 'k' or 'v', got {shard_id!r}"
            )

    def _rank_share(self, loaded: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        if _is_per_tensor(loaded):
            return loaded
        if shard_id == "q":
            return _slice_rows(loaded, self.tp_rank, 1, self.tp_size)
        # ranks sharing one KV head (kv_replicas > 1) load the same slice
        kv_rank = self.tp_rank // self.kv_replicas
        return _slice_rows(loaded, kv_rank, 1, self.total_num_kv_heads // self.num_kv_heads)

    def _part_rows(self, shard_id: str | int | None) -> tuple[int, int]:
        if shard_id == "q":
            return 0, self.q_size
        return self.q_size + (0 if shard_id == "k" else self.kv_size), self.kv_size

    def lora_parts(self) -> list[tuple[str | int | None, int]]:
        return [("q", self.q_size), ("k", self.kv_size), ("v", self.kv_size)]


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
        self.tp_group.all_reduce(out)  # sum of the ranks' partial products (and deltas)
        return out if self.bias is None else out + self.bias

    def shard_input_columns(self, full: torch.Tensor) -> torch.Tensor:
        return self._rank_share(full, None)  # A's columns as the weight's columns

    def _rank_share(self, loaded: torch.Tensor, shard_id: str | int | None) -> torch.Tensor:
        if self.tp_size > 1 and loaded.dim() > 1 and loaded.shape[-1] > 1:
            cols = loaded.shape[-1]
            return loaded.narrow(-1, cols * self.tp_rank // self.tp_size, cols // self.tp_size)
        return loaded


def _is_per_tensor(tensor: torch.Tensor) -> bool:
    """A scalar-like quantity (e.g. a per-tensor scale): 0-dim or a single row."""
    return tensor.dim() == 0 or tensor.shape[0] == 1


def _copy_checked(target: torch.Tensor, loaded: torch.Tensor, name: str) -> None:
    if target.shape != loaded.shape:
        raise ValueError(
            f"weight {name!r}: checkpoint shape {tuple(loaded.shape)} does not fit "
            f"parameter shape {tuple(target.shape)}"
        )
    if _exact_dtype(target.dtype) and loaded.dtype != target.dtype or (
        target.dtype.is_floating_point and not loaded.dtype.is_floating_point
    ):
        raise ValueError(
            f"weight {name!r}: checkpoint dtype {loaded.dtype} where {target.dtype} is "
            "expected (a corrupt checkpoint, or one of another quantization format)"
        )
    with torch.no_grad():
        target.copy_(loaded)


def _exact_dtype(dtype: torch.dtype) -> bool:
    """Quantized storage (integer codes, float8) is copied only from its own dtype; plain
    float weights cast from any float dtype."""
    return not dtype.is_floating_point or dtype.itemsize == 1


def _fill(target: torch.Tensor, value: torch.Tensor, name: str) -> None:
    """A per-row parameter's rows set from one per-tensor checkpoint value."""
    if value.numel() != 1:
        raise ValueError(
            f"weight {name!r}: checkpoint shape {tuple(value.shape)} does not fit the per-row "
            f"parameter shape {tuple(target.shape)}"
        )
    with torch.no_grad():
        target.fill_(value.reshape(()).item())
