"""The cpu platform's layer ops: linears on panel-packed weights (``linear_kernel``, float32
and bfloat16), on oneDNN's reordered ones (``onednn_linear``) or on row-major ones (torch's
matmul; ``gemv_kernel`` for bf16 at few rows), whichever measured faster for the weight's shape
here (``op_choice``); quantized linears and embeddings on packed int8 / int4 / fp8 / GGUF weights
(``quant_kernels``); RMSNorm, rotary, the gated MLP activations and row lookups as single C
calls (``fused_kernels``, float32 and bfloat16), RMSNorm against torch by measurement too;
the segmented LoRA matmul of mixed-adapter batches (``lora_kernel``).

Weights no C kernel takes (float16, output size not a multiple of 16) stay row-major and use
torch, or oneDNN's layout where that measured faster (float32, bf16); quantized layouts without a C kernel use the core's torch reference (said in
``quantized_support``); so do inputs the fused ops do not fit, and everything when the C code
cannot be built here. Every implementation runs as a recordable call, so decode graphs record
whatever was chosen.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from ironlm.interfaces.platform import Availability, LayerOps, scaled_rows
from ironlm.interfaces.quant import QuantLayout

from ironlm_cpu.cbuild import Recordable
from ironlm_cpu.fused_kernels import FusedKernels
from ironlm_cpu.gemv_kernel import RowsGemvKernel
from ironlm_cpu.linear_kernel import PackedLinearKernel
from ironlm_cpu.logits_kernel import LogitsKernel
from ironlm_cpu.lora_kernel import LoRAKernel
from ironlm_cpu.onednn_linear import OneDnnLinear
from ironlm_cpu.op_choice import OpChooser, OpPlan, runs_on_rows
from ironlm_cpu.quant_kernels import QuantKernels
from ironlm_cpu.quant_packing import fits, is_packed, kernel_format, pack
from ironlm_cpu.torch_kernels import TorchKernels
from ironlm_cpu.tuner import KernelTuner


class CpuLayerOps(LayerOps):
    def __init__(
        self, kernel: PackedLinearKernel | None = None, fused: FusedKernels | None = None,
        tuner: KernelTuner | None = None, quant: QuantKernels | None = None,
        lora: LoRAKernel | None = None, gemv: RowsGemvKernel | None = None,
        logits: LogitsKernel | None = None, dual_budget: int | None = None,
    ) -> None:  # fmt: skip
        """``dual_budget``: bytes the row-major second copies of weights may take (plans that
        keep a packed layout for some row counts and the rows for others); default 1/8 of the
        physical memory. Past it a weight keeps one layout (the rows, never slower than
        torch)."""
        self.kernel = kernel if kernel is not None else PackedLinearKernel()
        self.fused = fused if fused is not None else FusedKernels()
        self.quant = quant if quant is not None else QuantKernels()
        self.lora = lora if lora is not None else LoRAKernel()
        self.gemv = gemv if gemv is not None else RowsGemvKernel(self.kernel.target)
        self.logits = logits if logits is not None else LogitsKernel(self.kernel.target)
        self.torch_ops = TorchKernels()
        self.onednn = OneDnnLinear()
        self.tuner = tuner if tuner is not None else KernelTuner(self.kernel.target)
        self.chooser = OpChooser(self.tuner, self.kernel, self.fused, self.torch_ops, self.gemv,
                                 self.onednn)  # fmt: skip
        # (weight shape, dtype and layout as stored) -> plan, for every weight packed here
        self._linear: dict[tuple[torch.Size, torch.dtype, torch.layout], OpPlan] = {}
        self.dual_budget = dual_budget if dual_budget is not None else _physical_memory() // 8
        self.dual_bytes = 0  # bytes of the row-major copies made here (``with_rows``)
        # (hidden, residual, dtype) -> RMSNorm plan
        self._norm: dict[tuple[int, bool, torch.dtype], OpPlan | None] = {}

    def libraries(self) -> list[Recordable]:
        """What these ops call through (what a decode-graph capture records)."""
        libs: list[Recordable] = [
            lib for lib in (self.kernel, self.fused, self.quant, self.lora, self.gemv)
            if lib.available
        ]
        return libs + [self.torch_ops] + ([self.onednn] if self.onednn.available else [])

    # -- quantized weights --------------------------------------------------------------------
    def quantized_support(self, layout: QuantLayout) -> Availability:
        fmt, why = kernel_format(layout)
        if not self.quant.available:
            return Availability.yes(f"pure-torch reference ({self.quant.reason})")
        if fmt is None:
            return Availability.yes(f"pure-torch reference: {why}")
        return Availability.yes(f"C kernel {fmt.name} ({self.quant.isa})")

    def pack_quantized(
        self, layout: QuantLayout, tensors: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        fmt, _ = kernel_format(layout)
        if fmt is None or not self.quant.available or not fits(fmt, tensors):
            return tensors  # the reference reads the canonical tensors
        return pack(fmt, layout, tensors, amx_int8=self.quant.amx_int8())

    def quantized_linear(
        self, layout: QuantLayout, x: torch.Tensor, packed: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        if is_packed(packed):
            fmt, _ = kernel_format(layout)
            assert fmt is not None
            return self.quant.linear(fmt, x, packed, layout.group_size or 0, bias)
        return super().quantized_linear(layout, x, packed, bias)

    def quantized_embedding(
        self, layout: QuantLayout, ids: torch.Tensor, packed: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        if is_packed(packed):
            fmt, _ = kernel_format(layout)
            assert fmt is not None
            return self.quant.rows(fmt, ids, packed, layout.group_size or 0)
        return super().quantized_embedding(layout, ids, packed)

    # -- LoRA adapters ------------------------------------------------------------------------
    def lora_linear(
        self, y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
        slices: tuple[int, ...], token_slots: torch.Tensor, slot_ranks: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        if self.lora.fits(y, x, lora_a, lora_b, slices, token_slots, slot_ranks):
            return self.lora(y, x, lora_a, lora_b, slices, token_slots, slot_ranks)
        return super().lora_linear(y, x, lora_a, lora_b, slices, token_slots, slot_ranks)

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.fused.rms_norm_fits(x, residual, weight):
            key = (x.shape[-1], residual is not None, x.dtype)
            if key not in self._norm and self.fused.recorder is None:  # never inside a capture
                self._norm[key] = self.chooser.norm_plan(*key)
            plan = self._norm.get(key)
            if plan is not None and plan.impl_for(x.numel() // x.shape[-1]) == "torch":
                return self.torch_ops.rms_norm(x, weight, eps, residual)
            return self.fused.rms_norm(x, weight, eps, residual)
        return super().rms_norm(x, weight, eps, residual)

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused.rotary_fits(q, k, cos):
            return self.fused.rotary(q, k, cos, sin)
        return super().rotary(q, k, cos, sin)

    def logsumexp_argmax(
        self, logits: torch.Tensor, argmax: bool = True, logsumexp: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self.logits.fits(logits) and (argmax or logsumexp):
            done = self.logits(logits, logsumexp)  # the argmax comes with the same pass
            if done is not None:  # else a row holds NaN: torch's ops decide it
                return done
        return super().logsumexp_argmax(logits, argmax, logsumexp)

    def categorical(
        self, logits: torch.Tensor, scale: torch.Tensor, u: torch.Tensor
    ) -> torch.Tensor:
        if not (self.logits.fits(logits) and bool((scale > 0).all())):
            return super().categorical(logits, scale, u)
        drawn = self.logits.categorical(logits, scale, u)
        bad = drawn < 0  # rows holding NaN: the reference decides them, row by row
        if bool(bad.any()):
            drawn[bad] = super().categorical(logits[bad], scale[bad], u[bad])
        return drawn

    def truncated_categorical(
        self, logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor,
        top_p: torch.Tensor, min_p: torch.Tensor, u: torch.Tensor,
    ) -> torch.Tensor:
        if not (self.logits.fits(logits) and bool((scale > 0).all())):
            return super().truncated_categorical(logits, scale, top_k, top_p, min_p, u)
        drawn = self.logits.truncated_categorical(logits, scale, top_k, top_p, min_p, u)
        left = drawn < 0  # NaN rows, rows with too wide a set: the reference, row by row
        if bool(left.any()):
            drawn[left] = super().truncated_categorical(
                logits[left], scale[left], top_k[left], top_p[left], min_p[left], u[left])
        return drawn

    def truncated_logits(
        self, logits: torch.Tensor, scale: torch.Tensor, top_k: torch.Tensor,
        top_p: torch.Tensor, min_p: torch.Tensor,
    ) -> torch.Tensor:
        if not (self.logits.fits(logits) and bool((scale > 0).all())):
            return super().truncated_logits(logits, scale, top_k, top_p, min_p)
        out, left = self.logits.truncated_logits(logits, scale, top_k, top_p, min_p)
        if bool(left.any()):  # NaN / infinite rows, too wide a set: the reference, row by row
            out[left] = super().truncated_logits(
                logits[left], scale[left], top_k[left], top_p[left], min_p[left])
        return out

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused.gated_act_fits(gate_up):
            return self.fused.gated_act(gate_up, gelu=False)
        return super().silu_and_mul(gate_up)

    def gelu_tanh_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused.gated_act_fits(gate_up):
            return self.fused.gated_act(gate_up, gelu=True)
        return super().gelu_tanh_and_mul(gate_up)

    def pack_linear_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """Measures (or reads the cached choice for) the weight's shape, then lays it out for
        the winner: panels (a C kernel), oneDNN's blocked format, or the rows (torch, gemv)."""
        return self._pack(weight, looked_up=False)

    def pack_tied_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """The same, among the layouts ``embedding`` can look rows up in (not oneDNN's)."""
        return self._pack(weight, looked_up=True)

    def _pack(self, weight: torch.Tensor, looked_up: bool) -> torch.Tensor:
        if weight.dim() != 2 or weight.device.type != "cpu":
            return weight
        n, k = weight.shape
        plan = self.chooser.linear_plan(n, k, weight.dtype, looked_up)
        copy = weight.numel() * weight.element_size()
        if plan.single is not None and self.dual_bytes + copy > self.dual_budget:
            plan = plan.single
        if plan.packed_layout == "panel":
            stored = self.kernel.pack(weight)
        elif plan.packed_layout == "onednn":
            stored = self.onednn.pack(weight)
        else:
            stored = weight.contiguous()
        if plan.single is not None:
            stored = with_rows(stored, weight)
            self.dual_bytes += copy
        self._linear[(stored.shape, stored.dtype, stored.layout)] = plan
        return stored

    def unpack_linear_weight(self, stored: torch.Tensor) -> torch.Tensor:
        """(N, K) rows from any layout ``_pack`` stores: oneDNN's reordered back, panels
        unpacked (a ``panel+rows`` plan's rows copy is that weight already), rows as stored."""
        if self.onednn.is_packed(stored):
            return stored.to_dense()
        if stored.dim() > 2:
            rows = rows_copy(stored)
            return rows if rows is not None else self.kernel.unpack(stored)
        return stored

    def repack_linear_weight(self, stored: torch.Tensor, weight: torch.Tensor) -> None:
        """``weight`` into ``stored``'s layout and storage (the measured plan stays: same
        shape, dtype and layout)."""
        if self.onednn.is_packed(stored):
            stored.copy_(self.onednn.pack(weight))
        elif stored.dim() > 2:
            stored.copy_(self.kernel.pack(weight))
            rows = rows_copy(stored)
            if rows is not None and rows.data_ptr() != weight.data_ptr():
                rows.copy_(weight)
        elif stored.data_ptr() != weight.data_ptr():
            stored.copy_(weight)

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        plan = self._linear.get((weight.shape, weight.dtype, weight.layout))
        if plan is not None:
            impl = plan.impl_for(x.shape[0])
            if plan.single is not None and runs_on_rows(impl):
                rows = rows_copy(weight)
                if rows is None:  # packed without a copy (by other layer ops): the panels'
                    impl = next(i for i in reversed(plan.impls) if not runs_on_rows(i))
                else:
                    weight = rows
            return self.chooser.run_linear(impl, x, weight, bias)
        if weight.dim() > 2:  # packed by another instance of these ops
            return self.kernel(x, weight, bias)
        if self.onednn.is_packed(weight):
            return self.onednn(x, weight, bias)
        return super().linear(x, weight, bias)

    def lm_head(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # a bf16 LM head on the panel tile writes its float32 logits itself (the values
        # linear().float() gives, without the separate widening pass over (T, vocab))
        plan = self._linear.get((weight.shape, weight.dtype, weight.layout))
        if (
            plan is not None and plan.impl_for(x.shape[0]) == "c_bf16"
            and self.kernel.f32_out_fits(x, weight)
        ):  # fmt: skip
            return self.kernel.f32_out(x, weight)
        return super().lm_head(x, weight)

    def embedding(
        self, ids: torch.Tensor, weight: torch.Tensor, scale: float | None = None
    ) -> torch.Tensor:
        if self.fused.gather_fits(ids, weight):
            return self.fused.gather_rows(ids, weight, scale)  # (T, hidden), packed or not
        if weight.dim() > 2:
            return scaled_rows(self.kernel.rows(weight, ids), scale)  # (T, hidden) from panels
        return super().embedding(ids, weight, scale)

    def describe(self) -> dict[str, object]:
        """The ISA target and the choices made in this process (for logs and profiles)."""
        return {"isa_target": self.kernel.target.describe(), "choices": self.tuner.decisions,
                "second_copy_bytes": self.dual_bytes}


def with_rows(panels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The panels in one allocation with the (N, K) row-major weight after them: the second
    copy of a ``panel+rows`` plan lives and dies with the storage, whatever tensor object the
    model ends up holding (a parameter wrapping the returned view is a new object; a copy kept
    by the old object's address or lifetime was lost with it)."""
    both = torch.cat([panels.reshape(-1), weight.reshape(-1)])
    return both[: panels.numel()].view(panels.shape)


def rows_copy(panels: torch.Tensor) -> torch.Tensor | None:
    """The row-major (N, K) copy ``with_rows`` put after these panels ((N / 16, K, 16) float32
    or (N / 16, K / 2, 16, 2) bf16), or None where their storage is not ``with_rows``'s: the
    panels from its start and the copy, exactly (not panels alone, nor a slice of them)."""
    size = panels.numel()
    if panels.storage_offset() != 0 or panels.untyped_storage().nbytes() != (
        2 * size * panels.element_size()
    ):
        return None
    n = panels.shape[0] * panels.shape[2]
    return panels.as_strided((n, size // n), (size // n, 1), size)


def _physical_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit where lower
    (a container on a larger host); 0 where the platform does not say."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total
