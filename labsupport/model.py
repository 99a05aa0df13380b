"""A tiny real decoder-only transformer, so the engine runs real tokens (§10.1 "Run", §10.3, §10.5).

RMSNorm, rotary positions, grouped-query attention (query head h reads KV head h // group) and a
SwiGLU MLP, deterministic from a seed.  The same weights decode through two KV layouts:

* contiguous: each layer's keys and values for a sequence live in one tensor reserved for its
  final length (§10.2's layout), attended with plain torch — the reference;
* paged: keys and values live in a :class:`labsupport.kvcache.PagedKVCache`; every layer writes
  its new K/V through the slot mapping and decode attention reads through the block table, with
  :func:`labsupport.kernels.paged_decode_attention` (Triton) or, on a CPU, its torch path for the whole
  batch (:func:`labsupport.kernels.paged_decode_attention_torch`: one gather through the block table, then
  torch's fused attention).

Paging changes where bytes live, never the arithmetic (§10.3 step three), so greedy tokens from
both paths are identical and logits agree to float tolerance; tests/test_model.py checks it.

:func:`load_tiny_model` returns the character-level model trained on the lecture text by
``python -m labsupport.cli.train_tiny`` (``data/tiny_lecture.pt``), or random weights when that
file is absent.  :mod:`labsupport.pretrained` puts a real checkpoint (SmolLM2-135M-Instruct) on this same
class: a different shape, the same paged path.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from labsupport.checks import as_count, as_device, as_id, as_real, shown
from labsupport.specs import ModelSpec

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
TINY_WEIGHTS = DATA_DIR / "tiny_lecture.pt"

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1  # what a token id tensor can hold
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(dtype) -> torch.dtype:
    """A floating-point torch dtype, given as one or by name ('float32', 'float16', 'bfloat16')."""
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise ValueError(f"dtype must be a floating-point torch.dtype or one of {sorted(_DTYPES)}, got {dtype!r}")


# --- configuration -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model.  The defaults are the CPU-sized character model (about 0.8M parameters)."""

    vocab_size: int = 128
    dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    ffn_dim: int = 384  # SwiGLU hidden width
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 4096  # a policy limit on positions (RoPE itself has none)
    seed: int = 0
    init_std: float = 0.02  # larger values give random weights that do not just repeat one token
    tie_embeddings: bool = True  # the output projection is the embedding; False gives it its own weight

    def __post_init__(self):
        for f in ("vocab_size", "dim", "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn_dim",
                  "max_seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"ModelConfig.{f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelConfig: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        for f in ("rope_theta", "norm_eps", "init_std"):
            as_real(f"ModelConfig.{f}", getattr(self, f), above=0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"ModelConfig.seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"ModelConfig.tie_embeddings must be True or False, got {self.tie_embeddings!r}")

    @property
    def gqa_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def num_params(self) -> int:
        """Parameters; a tied output projection is the embedding and counts once."""
        attn = self.dim * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.dim * self.ffn_dim
        norms = 2 * self.dim
        embeddings = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return embeddings + self.num_layers * (attn + mlp + norms) + self.dim

    def spec(self, name: str = "tiny", dtype_bytes: int = 4) -> ModelSpec:
        """This shape as a :class:`ModelSpec`, so the ledger and the cost model can price it."""
        return ModelSpec(name, self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim,
                         float(self.num_params), dtype_bytes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"ModelConfig: unknown fields {sorted(unknown)}")
        return cls(**d)


# CPU-sized by default; the larger ones are for a GPU (the last has the lecture 7B's attention
# shape: 32 layers x 32 heads x 128, so its KV per token is the lecture's 512 KiB in bf16).
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    "tiny-mha": ModelConfig(num_kv_heads=4),
    "small": ModelConfig(vocab_size=128, dim=512, num_layers=8, num_heads=8, num_kv_heads=2, head_dim=64,
                         ffn_dim=1408),
    "medium": ModelConfig(vocab_size=128, dim=2048, num_layers=16, num_heads=16, num_kv_heads=4, head_dim=128,
                          ffn_dim=5632),
    "lecture-7b-shape": ModelConfig(vocab_size=32_000, dim=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                                    head_dim=128, ffn_dim=11_008),
}


# --- tokenizer -------------------------------------------------------------------------------------

# Printable ASCII plus tab, newline and the symbols the lecture uses (em dash, section sign, ...).
LECTURE_SYMBOLS = "—§×·÷→–≈−²≤≥∈’“”…"
DEFAULT_CHARS = "\t\n" + "".join(chr(c) for c in range(32, 127)) + LECTURE_SYMBOLS


class CharTokenizer:
    """One id per character.  Unknown characters raise (``errors="strict"``) or become ``?``."""

    def __init__(self, chars: str = DEFAULT_CHARS):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: the character set has duplicates")
        self.chars = chars
        self._ids = {c: i for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str, errors: str = "strict") -> list[int]:
        if errors not in ("strict", "replace"):
            raise ValueError(f"errors must be 'strict' or 'replace', got {errors!r}")
        out = []
        for pos, ch in enumerate(text):
            i = self._ids.get(ch)
            if i is None:
                if errors == "strict":
                    raise ValueError(f"character {ch!r} (U+{ord(ch):04X}) at position {pos} is not in the "
                                     f"tokenizer's {self.vocab_size}-character vocabulary; pass errors='replace'")
                i = self._ids["?"]
            out.append(i)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        # Ids past the character set exist when the model's vocab is padded; show them as a box.
        return "".join(self.chars[i] if 0 <= i < len(self.chars) else "\u25a1" for i in ids)


# --- building blocks ------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, D] of the rotary angles at integer positions [T]: the same for every layer and for
    q and k, so a forward pass computes them once."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32)
                                / head_dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    return cos, sin


def rope_rotate(x: torch.Tensor, positions: torch.Tensor, theta: float,
                tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Rotary embedding (rotate-half form) for x [T, heads, D] at integer positions [T] (``tables``: their
    `rope_tables`, when already computed)."""
    d = x.shape[-1]
    cos, sin = rope_tables(positions, d, theta) if tables is None else tables
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    rotated = torch.cat([-x2, x1], -1)
    return (xf * cos + rotated * sin).to(x.dtype)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor,
                    scale: float) -> torch.Tensor:
    """Causal attention of queries q [T, Hq, D] at q_positions over keys/values [S, Hkv, D] at 0..S-1.

    Plain torch in float32: the contiguous reference (the paged prefill attends several prompts at once with
    torch's fused attention, `causal_attention`).
    """
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # query head h reads KV head h // group
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), kf) * scale
    key_pos = torch.arange(k.shape[0], device=q.device)
    mask = key_pos[None, :] > q_positions[:, None]  # [T, S]: a query never sees its future
    scores = scores.masked_fill(mask[None], float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), vf).to(q.dtype)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention for a batch of prompts at positions 0..T-1: q [n, T, Hq, D] over k, v [n, T, Hkv, D].

    What `dense_attention` computes, for n prompts padded to one length T in one call of torch's fused attention
    (``scaled_dot_product_attention``, in float32 whatever the model's dtype).  Padding goes after a prompt's
    tokens, so the causal mask alone keeps it from every real query (its own rows are discarded).
    """
    group = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(group, dim=2)  # query head h reads KV head h // group
    v = v.repeat_interleave(group, dim=2)
    # in float32, as dense_attention and the kernels compute: bf16 scores flip near-tied tokens (a bf16 SmolLM2
    # answered "What is the capital of France?" with "L'Étoile" where float32 attention says Paris)
    out = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float().transpose(1, 2),
                                         v.float().transpose(1, 2), is_causal=True, scale=scale)
    return out.transpose(1, 2).to(q.dtype)


def prefill_groups(spans: Sequence[tuple[int, int]], device, waste: float = 2.0
                   ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The prompts of one step, at rows ``spans`` = [(start, end), ...] of its flat batch, in groups of similar
    length for `causal_attention`: one call per group rather than one per prompt.

    A prompt joins a group while the group's padded attention (prompts x the longest length squared) stays
    within ``waste`` times its prompts' own (`kernels.length_groups`).  Returns per group (index [n, T] of the
    rows to gather, a prompt's last row repeated as its padding; keep [n, T], False on padding; the rows
    [sum of lengths] the kept entries go back to).
    """
    from labsupport.kernels import length_groups

    out = []
    for g in length_groups([b - a for a, b in spans], power=2, waste=waste):
        starts = torch.tensor([spans[i][0] for i in g], device=device)
        lens = torch.tensor([spans[i][1] - spans[i][0] for i in g], device=device)
        t = torch.arange(int(lens.max()), device=device)
        keep = t[None, :] < lens[:, None]
        index = starts[:, None] + torch.minimum(t[None, :], lens[:, None] - 1)
        out.append((index, keep, index[keep]))
    return out


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.dim, cfg.num_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.dim, bias=False)

    def qkv(self, h: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None):
        c = self.cfg
        n = h.shape[0]
        q = self.wq(h).view(n, c.num_heads, c.head_dim)
        k = self.wk(h).view(n, c.num_kv_heads, c.head_dim)
        v = self.wv(h).view(n, c.num_kv_heads, c.head_dim)
        rope = rope_tables(positions, c.head_dim, c.rope_theta) if rope is None else rope
        return rope_rotate(q, positions, c.rope_theta, rope), rope_rotate(k, positions, c.rope_theta, rope), v


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w_down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg)


_RANDOM_FILLS = (torch.Tensor.normal_, torch.Tensor.uniform_)


class _SkipInit(TorchFunctionMode):
    """Modules built under it skip their random initialisation (torch.nn.init, in-place random fills), which a
    checkpoint replaces at once; 135M random numbers cost seconds on a small CPU.  A torch function mode is
    thread-local, so nothing else built meanwhile is touched.  (A "meta" device would do the same, but
    its first use imports a second or more of torch's Python meta kernels.)"""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init" or func in _RANDOM_FILLS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


# attend(layer, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq, D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Generation:
    """Output of a standalone decode: the new token ids and the logits that chose each one."""

    tokens: list[int]
    logits: torch.Tensor  # [max_new_tokens, vocab] float32


# --- the model ------------------------------------------------------------------------------------

class TinyTransformer(nn.Module):
    """Decoder-only transformer; the output projection is the embedding unless ``cfg.tie_embeddings`` is False.

    ``state_dict`` given: the weights are those tensors (a checkpoint, `labsupport.pretrained`), taken
    as they are when their device and dtype already match, and no random initialisation is spent on
    them.  ``name`` is what `spec` calls the model.
    """

    def __init__(self, cfg: ModelConfig = ModelConfig(), device: str | torch.device = "cpu",
                 dtype: torch.dtype | str = torch.float32, *, state_dict: dict | None = None, name: str = "tiny"):
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise ValueError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
        dtype, device = _dtype(dtype), as_device("device", device)
        self.cfg = cfg
        self.name = name
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        # with a checkpoint, the modules skip their random init: its tensors become their weights
        with _SkipInit() if state_dict is not None else contextlib.nullcontext():
            self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
            self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
            self.output = None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if state_dict is None:
            self.reset_parameters(cfg.seed)
            self.to(device=device, dtype=dtype)
        else:
            self.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}, assign=True)
        self.eval()

    # Initialise on the CPU from one generator in a fixed order, so a seed gives the same weights
    # on every machine; projections into the residual stream are scaled down by depth (GPT-2 style).
    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        std = self.cfg.init_std
        resid_std = std / math.sqrt(2 * self.cfg.num_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                s = resid_std if name.endswith(("wo.weight", "w_down.weight")) else std
                p.copy_(torch.randn(p.shape, generator=g) * s)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def spec(self, name: str | None = None) -> ModelSpec:
        return self.cfg.spec(self.name if name is None else name, dtype_bytes=torch.finfo(self.dtype).bits // 8)

    def _check_tokens(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.cfg.vocab_size)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.cfg.vocab_size})")

    def _run(self, ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn) -> torch.Tensor:
        """All layers over a flat batch of tokens [N]; attention is the caller's. Returns hidden [N, dim]."""
        x = self.embed(ids)
        rope = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)  # one table for every layer
        for i, blk in enumerate(self.layers):
            q, k, v = blk.attn.qkv(blk.attn_norm(x), positions, rope)
            o = attend(i, q, k, v)
            x = x + blk.attn.wo(o.reshape(x.shape[0], -1))
            x = x + blk.mlp(blk.mlp_norm(x))
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed.weight if self.output is None else self.output.weight
        return (hidden @ weight.t()).float()

    # -- training / full-sequence scoring: no cache at all ------------------------------------------
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Causal logits for tokens [B, T] -> [B, T, vocab] (used for training)."""
        b, t = tokens.shape
        self._check_tokens(tokens)
        c = self.cfg
        x = self.embed(tokens)
        pos = torch.arange(t, device=tokens.device)
        for blk in self.layers:
            h = blk.attn_norm(x).reshape(b * t, c.dim)
            q, k, v = blk.attn.qkv(h, pos.repeat(b))
            q = q.view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
            k = k.view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2).repeat_interleave(c.gqa_group, 1)
            v = v.view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2).repeat_interleave(c.gqa_group, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            x = x + blk.attn.wo(o.transpose(1, 2).reshape(b, t, -1))
            x = x + blk.mlp(blk.mlp_norm(x))
        return self.logits(self.norm(x))

    # -- contiguous KV: the reference decode ---------------------------------------------------------
    @torch.no_grad()
    def generate_contiguous(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Generation:
        """Greedy decode of one sequence with each layer's K/V held as one contiguous tensor."""
        _check_generate_args(prompt_ids, max_new_tokens, self.cfg.max_seq_len)
        c = self.cfg
        total = len(prompt_ids) + max_new_tokens
        ks = [torch.empty(total, c.num_kv_heads, c.head_dim, device=self.device, dtype=self.dtype)
              for _ in range(c.num_layers)]
        vs = [torch.empty_like(ks[0]) for _ in range(c.num_layers)]
        length = 0

        def attend(layer, q, k, v):
            n = k.shape[0]
            ks[layer][length:length + n] = k
            vs[layer][length:length + n] = v
            qpos = torch.arange(length, length + n, device=self.device)
            return dense_attention(q, ks[layer][:length + n], vs[layer][:length + n], qpos, self.scale)

        ids = torch.tensor(list(prompt_ids), device=self.device)
        self._check_tokens(ids)
        tokens, rows = [], []
        for _ in range(max_new_tokens):
            pos = torch.arange(length, length + ids.numel(), device=self.device)
            logits = self.logits(self._run(ids, pos, attend)[-1:])[0]
            length += ids.numel()
            nxt = int(torch.argmax(logits))
            tokens.append(nxt)
            rows.append(logits)
            ids = torch.tensor([nxt], device=self.device)
        return Generation(tokens, torch.stack(rows) if rows else torch.empty(0, c.vocab_size))

    # -- paged KV: what the engine runs ----------------------------------------------------------------
    @torch.no_grad()
    def forward_paged(self, cache, prefills: Sequence[tuple[object, Sequence[int]]] = (),
                      decodes: Sequence[tuple[object, int]] = (), attention: str = "auto") -> torch.Tensor:
        """One engine step over a paged cache; returns float32 logits [len(prefills) + len(decodes), vocab].

        prefills: (seq_id, token_ids) for sequences entering the cache now (their whole context);
        decodes: (seq_id, token_id) for resident sequences adding one token each.
        Row i of the result is the next-token distribution of the i-th sequence (prefills first).
        The cache must have room: the engine reserves blocks before calling this.
        """
        attn_fn = _decode_attention_fn(attention, self.device)
        prefills = [(seq_id, list(ids)) for seq_id, ids in prefills]
        dec_ids = [sid for sid, _ in decodes]
        n_dec = len(dec_ids)
        # Validate everything before the cache changes, so a rejected call leaves it as it was.
        seen = set()
        for seq_id in [sid for sid, _ in prefills] + dec_ids:
            if as_id("sequence id", seq_id) in seen:
                raise ValueError(f"sequence {seq_id!r} appears twice in one step")
            seen.add(seq_id)
        for seq_id, ids in prefills:
            if not ids:
                raise ValueError(f"prefill of sequence {shown(seq_id)} has no tokens")
            for t in ids:  # any integer: the vocabulary check below names one out of range
                as_count("prefill token id", t, _INT64_MIN, _INT64_MAX)
            if seq_id in cache.allocator.seq_lens:
                raise ValueError(f"prefill of sequence {seq_id!r}: it is already in the cache")
        for seq_id, t in decodes:
            cache.allocator.table(seq_id)  # raises for an unknown or swapped-out sequence
            as_count("decode token id", t, _INT64_MIN, _INT64_MAX)
        parts = [torch.tensor(ids, device=self.device) for _, ids in prefills]
        if n_dec:
            parts.append(torch.tensor([t for _, t in decodes], device=self.device))
        if not parts:
            return torch.empty(0, self.cfg.vocab_size)
        ids = torch.cat(parts)
        self._check_tokens(ids)

        positions, prefill_spans, slots, done = [], [], [], []
        offset = 0
        try:
            for seq_id, p_ids in prefills:
                slots.append(cache.prepare_prefill(seq_id, len(p_ids), token_ids=p_ids).to(self.device))
                done.append(seq_id)
                positions.append(torch.arange(len(p_ids), device=self.device))
                prefill_spans.append((offset, offset + len(p_ids)))
                offset += len(p_ids)
            if n_dec:
                # prepare_decode reserves one slot per sequence (copy-on-write included), all or
                # nothing; the new token's position is the sequence length before it.
                slots.append(cache.prepare_decode(dec_ids).to(self.device))
        except Exception:
            for seq_id in done:  # the pool ran dry part-way: release what this call allocated
                cache.free(seq_id)
            raise
        if n_dec:
            seq_lens = cache.seq_lens_tensor(dec_ids).to(self.device)
            block_tables = cache.block_table_tensor(dec_ids).to(self.device)
            positions.append(seq_lens.long() - 1)
        pos = torch.cat(positions)
        slot_mapping = torch.cat(slots)
        groups = prefill_groups(prefill_spans, self.device)  # prompts of similar length attend in one call

        def attend(layer, q, k, v):
            cache.write(layer, slot_mapping, k, v)
            out = torch.empty_like(q)
            # Prefill attends to its own fresh K/V (nothing of it was cached before this step).
            for index, keep, rows in groups:
                out[rows] = causal_attention(q[index], k[index], v[index], self.scale)[keep]
            if n_dec:
                out[offset:] = attn_fn(q[offset:].contiguous(), cache.k_cache[layer], cache.v_cache[layer],
                                       block_tables, seq_lens, scale=self.scale)
            return out

        hidden = self._run(ids, pos, attend)
        rows = [b - 1 for _, b in prefill_spans] + list(range(offset, offset + n_dec))
        return self.logits(hidden[rows])

    @torch.no_grad()
    def generate_paged(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, block_size: int = 16,
                       attention: str = "auto", num_blocks: int | None = None) -> list[Generation]:
        """Greedy decode of a batch of prompts through a fresh PagedKVCache (every step batched)."""
        from labsupport.kvcache import PagedKVCache

        for p in prompts:
            _check_generate_args(p, max_new_tokens, self.cfg.max_seq_len)
        c = self.cfg
        if num_blocks is None:
            num_blocks = sum(-(-(len(p) + max_new_tokens) // block_size) for p in prompts)
        cache = PagedKVCache(num_blocks, block_size, c.num_layers, c.num_kv_heads, c.head_dim,
                             dtype=self.dtype, device=self.device)
        ids = list(range(len(prompts)))
        logits = self.forward_paged(cache, prefills=list(zip(ids, prompts)), attention=attention)
        rows = [[r] for r in logits]
        tokens = [[int(torch.argmax(r))] for r in logits]
        for _ in range(max_new_tokens - 1):
            logits = self.forward_paged(cache, decodes=[(i, tokens[i][-1]) for i in ids], attention=attention)
            for i, r in zip(ids, logits):
                rows[i].append(r)
                tokens[i].append(int(torch.argmax(r)))
        for i in ids:
            cache.free(i)
        return [Generation(t, torch.stack(r)) for t, r in zip(tokens, rows)]


def _check_generate_args(prompt_ids: Sequence[int], max_new_tokens: int, max_seq_len: int) -> None:
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__len__"):
        raise ValueError(f"prompt_ids must be a sequence of integer token ids, got {shown(prompt_ids)}")
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: a decode needs at least one token to condition on")
    for t in prompt_ids:
        as_count("prompt token id", t, 0)
    as_count("max_new_tokens", max_new_tokens, 1)
    if len(prompt_ids) + max_new_tokens - 1 > max_seq_len:
        raise ValueError(f"{len(prompt_ids)} prompt + {max_new_tokens} new tokens exceed the model's "
                         f"max_seq_len={max_seq_len}")


def resolve_attention(attention: str, device: torch.device | str) -> str:
    """'auto' means the Triton kernel on CUDA and the torch reference on CPU (the interpreter is slow)."""
    if attention not in ("auto", "triton", "reference"):
        raise ValueError(f"attention must be 'auto', 'triton' or 'reference', got {attention!r}")
    if attention == "auto":
        return "triton" if torch.device(device).type == "cuda" else "reference"
    return attention


def _decode_attention_fn(attention: str, device):
    """The decode attention `forward_paged` calls per layer: the Triton kernel, or ("reference") the kernel's
    torch path for the whole batch (`kernels.paged_decode_attention_torch`: one gather through the block table
    per pool and torch's fused attention, fp32 softmax, where `kernels.paged_decode_attention_reference` loops
    over the sequences in Python; the tables come from the allocator, and torch's indexing refuses a block
    outside the pool, so the data checks are skipped)."""
    from labsupport import kernels

    if resolve_attention(attention, device) == "triton":
        return kernels.paged_decode_attention
    return functools.partial(kernels.paged_decode_attention_torch, validate=False)


# --- the shipped weights ----------------------------------------------------------------------------

def save_model(model: TinyTransformer, path: str | Path, tokenizer: CharTokenizer, extra: dict | None = None,
               dtype: torch.dtype = torch.float16) -> None:
    """Weights (fp16 by default, to keep data/ small), config and character set in one file."""
    state = {k: v.detach().to("cpu", dtype) for k, v in model.state_dict().items()}
    torch.save({"config": model.cfg.to_dict(), "chars": tokenizer.chars, "state_dict": state,
                "meta": extra or {}}, Path(path))


def load_model(path: str | Path, device: str | torch.device = "cpu",
               dtype: torch.dtype | str = torch.float32) -> tuple[TinyTransformer, CharTokenizer, dict]:
    path = Path(path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{path}: not a labsupport model file ({exc})") from exc
    for key in ("config", "chars", "state_dict"):
        if key not in blob:
            raise ValueError(f"{path}: model file lacks {key!r}")
    cfg = ModelConfig.from_dict(blob["config"])
    model = TinyTransformer(cfg, device="cpu", dtype=torch.float32)
    model.load_state_dict({k: v.float() for k, v in blob["state_dict"].items()})
    model.to(device=as_device("device", device), dtype=_dtype(dtype))
    return model, CharTokenizer(blob["chars"]), dict(blob.get("meta", {}))


def load_tiny_model(path: str | Path | None = None, device: str | torch.device = "cpu",
                    dtype: torch.dtype | str = torch.float32, seed: int = 0
                    ) -> tuple[TinyTransformer, CharTokenizer, bool]:
    """The lecture-trained character model, or random weights (same shape) when the file is missing.

    Returns (model, tokenizer, trained) where ``trained`` says which one you got.
    """
    path = TINY_WEIGHTS if path is None else Path(path)
    if path.exists():
        model, tok, _ = load_model(path, device=device, dtype=dtype)
        return model, tok, True
    tok = CharTokenizer()
    cfg = replace(PRESETS["tiny"], seed=seed)
    return TinyTransformer(cfg, device=device, dtype=dtype), tok, False
