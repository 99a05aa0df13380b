"""Model and GPU presets: the inputs to every number in the lecture (§10.1–§10.7).

All fields are in base units: bytes, bytes/s, FLOP/s, counts.  GB means 1e9
bytes, GiB means 2**30 bytes; a preset's comment says which one the vendor
used and where the figure comes from.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from labsupport.checks import as_count, as_real

GB = 10**9
GiB = 2**30
KiB = 2**10
MiB = 2**20
TFLOP = 10**12


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as the KV cache cares."""

    name: str
    num_layers: int
    num_heads: int  # query heads
    num_kv_heads: int  # == num_heads for MHA, fewer for GQA
    head_dim: int
    num_params: float
    dtype_bytes: int = 2  # bf16

    def __post_init__(self):
        for field in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "dtype_bytes"):
            as_count(f"ModelSpec {self.name!r}: {field}", getattr(self, field), 1)
        as_real(f"ModelSpec {self.name!r}: num_params", self.num_params, above=0)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelSpec {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V, every layer, every KV head: 2 * L * n_kv * d_head * b (§10.2)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_kib_per_token(self) -> float:
        """The same in KiB (2**10 B): 512 for the lecture's 7B."""
        return self.kv_bytes_per_token / KiB

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes

    @property
    def attention(self) -> str:
        """'MHA', or 'GQA-n' for n KV heads (the lecture's 'GQA-8' keeps 8 KV heads)."""
        return "MHA" if self.num_kv_heads == self.num_heads else f"GQA-{self.num_kv_heads}"

    @property
    def gqa_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def with_kv_heads(self, num_kv_heads: int, name: str | None = None) -> "ModelSpec":
        return replace(self, num_kv_heads=num_kv_heads, name=name or f"{self.name}-gqa{num_kv_heads}")


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator: memory, its bandwidth, dense bf16 peak, and the host link."""

    name: str
    hbm_bytes: float
    hbm_bandwidth: float  # bytes/s
    peak_flops: float  # dense bf16 (fp16 where the card has no bf16), FLOP/s
    link_bandwidth: float  # host<->device, one direction, bytes/s
    bf16: bool = True

    def __post_init__(self):
        for field in ("hbm_bytes", "hbm_bandwidth", "peak_flops", "link_bandwidth"):
            as_real(f"GPUSpec {self.name!r}: {field}", getattr(self, field), above=0)


# The lecture's model (Lecture 2): a 7B-class MHA transformer, 32 layers x 32 heads x 128,
# 6.74e9 parameters (the LLaMA-7B count, Touvron et al. 2023, Table 2), bf16.
# Weights 13.48 GB, KV 2*32*32*128*2 = 524,288 B = 512 KiB per token.
LECTURE_7B = ModelSpec("lecture-7b", 32, 32, 32, 128, 6.74e9)
# The lecture's GQA-8 variant (§10.5, Exercises 1, 4, 5).  The lecture keeps N = 6.74e9 so that
# only the cache changes; a real GQA-8 model of this shape has ~5.93e9 parameters (smaller K/V
# projections).  We follow the lecture: this preset isolates the KV effect.
LECTURE_7B_GQA8 = LECTURE_7B.with_kv_heads(8, "lecture-7b-gqa8")
# Meta Llama 3 8B: 32 layers, 32 query heads, 8 KV heads, head dim 128, 8.03e9 parameters
# (meta-llama/Meta-Llama-3-8B config.json; Llama 3 model card).
LLAMA3_8B = ModelSpec("llama-3-8b", 32, 32, 8, 128, 8.03e9)
# Meta Llama 3 70B: 80 layers, 64 query heads, 8 KV heads, head dim 128, 70.6e9 parameters.
LLAMA3_70B = ModelSpec("llama-3-70b", 80, 64, 8, 128, 70.6e9)
# Mistral 7B v0.1: 32 layers, 32 query heads, 8 KV heads, head dim 128 (Jiang et al. 2023, "Mistral 7B",
# Table 1); 7.24e9 parameters (7,241,732,096 in mistralai/Mistral-7B-v0.1's safetensors index).
MISTRAL_7B = ModelSpec("mistral-7b", 32, 32, 8, 128, 7.24e9)
# Qwen2.5-7B: 28 layers, 28 query heads, 4 KV heads, hidden 3,584 = 28 x 128, 7.61e9 parameters
# (Qwen/Qwen2.5-7B model card and config.json; Qwen2.5 Technical Report, 2024, Table 1).
QWEN25_7B = ModelSpec("qwen2.5-7b", 28, 28, 4, 128, 7.61e9)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (LECTURE_7B, LECTURE_7B_GQA8, LLAMA3_8B, LLAMA3_70B, MISTRAL_7B,
                                                     QWEN25_7B)}
MODELS["mha"] = LECTURE_7B
MODELS["gqa8"] = LECTURE_7B_GQA8

# GPU figures from the vendors' datasheets (dense, i.e. without 2:4 sparsity).  Memory sizes are
# the marketed "GB" figure taken as 1e9 bytes, which is what the lecture's 80 - 13.5 - 4 = 62.5 GB
# budget does; the physical H100 carries 80 GiB, of which CUDA reports about 79.1 GiB usable.
GPUS: dict[str, GPUSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, 989 TFLOPS bf16 dense.
    # Host link PCIe Gen5 x16, 64 GB/s per direction (the lecture's swap link, §10.5).
    "h100-sxm-80gb": GPUSpec("h100-sxm-80gb", 80 * GB, 3350 * GB, 989 * TFLOP, 64 * GB),
    # NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, 989 TFLOPS bf16 dense; PCIe Gen5 x16.
    "h200": GPUSpec("h200", 141 * GB, 4800 * GB, 989 * TFLOP, 64 * GB),
    # NVIDIA DGX B200 datasheet: 8 B200 GPUs with 1,440 GB of HBM3e at 64 TB/s in all, so 180 GB and 8 TB/s
    # each; NVIDIA HGX B200 (1,000 W): 4.5 PFLOPS FP16/BF16 with sparsity per GPU, 2.25 dense.  The HGX
    # baseboard reaches its host through PCIe Gen5 x16 switches: 64 GB/s per direction.
    "b200": GPUSpec("b200", 180 * GB, 8000 * GB, 2250 * TFLOP, 64 * GB),
    # NVIDIA A100 datasheet: 80 GB HBM2e SXM at 2,039 GB/s; 40 GB HBM2 at 1,555 GB/s;
    # 312 TFLOPS bf16 dense; PCIe Gen4 x16, 32 GB/s per direction.
    "a100-80gb": GPUSpec("a100-80gb", 80 * GB, 2039 * GB, 312 * TFLOP, 32 * GB),
    "a100-40gb": GPUSpec("a100-40gb", 40 * GB, 1555 * GB, 312 * TFLOP, 32 * GB),
    # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 121 TFLOPS bf16 dense (242 sparse); PCIe Gen4 x16.
    "l4": GPUSpec("l4", 24 * GB, 300 * GB, 121 * TFLOP, 32 * GB),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, 362.05 TFLOPS bf16 dense (733 with sparsity);
    # PCIe Gen4 x16, 64 GB/s bidirectional = 32 GB/s per direction.
    "l40s": GPUSpec("l40s", 48 * GB, 864 * GB, 362.05 * TFLOP, 32 * GB),
    # NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TFLOPS fp16 mixed precision; no bf16
    # (sm_75); PCIe Gen3 x16, 16 GB/s per direction.
    "t4": GPUSpec("t4", 16 * GB, 320 * GB, 65 * TFLOP, 16 * GB, bf16=False),
}
GPUS["h100"] = GPUS["h100-sxm-80gb"]

LECTURE_GPU = GPUS["h100-sxm-80gb"]
LECTURE_MFU = 0.5  # "at 50% of peak" (§10.5, Lecture 2 §2.16)
LECTURE_RESERVED_BYTES = 4 * GB  # activations and workspace: 80 - 13.5 - 4 = 62.5 GB (§10.2)


def _lookup(table: dict, kind: str, name: str):
    if not isinstance(name, str):
        raise ValueError(f"a {kind} preset is named by a string, got {type(name).__name__}")
    key = name.strip().lower()
    if key not in table:
        raise ValueError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(table))}")
    return table[key]


def get_model(name: str) -> ModelSpec:
    return _lookup(MODELS, "model", name)


def get_gpu(name: str) -> GPUSpec:
    return _lookup(GPUS, "GPU", name)
