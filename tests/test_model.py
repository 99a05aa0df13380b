"""The tiny transformer: paging changes where K/V live, never the tokens (§10.3 step three)."""
from __future__ import annotations

import math

import pytest
import torch

import labsupport  # noqa: F401  (sets TRITON_INTERPRET before anything imports triton)
from labsupport.model import (
    DEFAULT_CHARS,
    PRESETS,
    CharTokenizer,
    ModelConfig,
    TinyTransformer,
    causal_attention,
    dense_attention,
    load_model,
    load_tiny_model,
    prefill_groups,
    resolve_attention,
    save_model,
)
from labsupport.workloads import REPO_ROOT


pytestmark = pytest.mark.usefixtures("one_thread")


# Random weights at the default init (std 0.02) give near-uniform logits and a model that repeats
# one token, which would make "same tokens" vacuous; a larger init gives varied greedy outputs.
GQA = ModelConfig(num_heads=4, num_kv_heads=2, init_std=0.3, seed=1)
MHA = ModelConfig(num_heads=4, num_kv_heads=4, init_std=0.3, seed=2)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 57)), [3]]  # lengths 7, 37, 1: odd block offsets
NEW = 9
# fp32 logits of magnitude ~12 after 4 layers: the contiguous path itself is up to 1e-4 away from a
# float64 run of the same weights, so two fp32 paths that sum in different orders may differ by a
# few times that.  A wrong block, slot or position gives differences of order 1.
TOL = dict(atol=5e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def models():
    out = {}
    for name, cfg in (("gqa", GQA), ("mha", MHA)):
        m = TinyTransformer(cfg)
        out[name] = (m, [m.generate_contiguous(p, NEW) for p in PROMPTS])
    return out


def test_reference_outputs_are_not_degenerate(models):
    for m, ref in models.values():
        for g in ref:
            assert len(set(g.tokens)) >= 3, g.tokens  # otherwise "identical tokens" proves little


@pytest.mark.parametrize("kind", ["gqa", "mha"])
@pytest.mark.parametrize("block_size", [1, 2, 16, 256])
def test_paged_greedy_matches_contiguous(models, kind, block_size):
    m, ref = models[kind]
    got = m.generate_paged(PROMPTS, NEW, block_size=block_size, attention="reference")
    for r, g in zip(ref, got):
        assert g.tokens == r.tokens
        torch.testing.assert_close(g.logits, r.logits, **TOL)


def test_paged_through_triton_interpreter_matches_contiguous(models):
    m, ref = models["gqa"]
    got = m.generate_paged(PROMPTS[:2], 3, block_size=4, attention="triton")
    for r, g in zip(ref, got):
        assert g.tokens == r.tokens[:3]
        torch.testing.assert_close(g.logits, r.logits[:3], **TOL)


def test_paged_pool_with_scattered_blocks_matches(models):
    # a pool larger than needed, with blocks taken in an interleaved order, still gives the same tokens
    m, ref = models["mha"]
    got = m.generate_paged(PROMPTS, NEW, block_size=4, attention="reference", num_blocks=200)
    assert [g.tokens for g in got] == [r.tokens for r in ref]


def test_training_forward_agrees_with_cached_decode(models):
    # the full-sequence (SDPA) path and the cached path are different code; their logits agree
    m, ref = models["gqa"]
    prompt = PROMPTS[1]
    seq = prompt + ref[1].tokens[:-1]
    full = m(torch.tensor([seq]))[0]  # [T, V]
    torch.testing.assert_close(full[len(prompt) - 1:], ref[1].logits, **TOL)


def test_dense_attention_by_hand():
    # two keys, one query head per KV head (MHA), query at position 1 sees both keys
    q = torch.tensor([[[1.0, 0.0]]]).repeat(1, 1, 1)  # [T=1, H=1, D=2]
    k = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # [S=2, 1, 2]
    v = torch.tensor([[[10.0, 0.0]], [[0.0, 10.0]]])
    out = dense_attention(q, k, v, torch.tensor([1]), scale=1.0)
    w0 = math.e / (math.e + 1)  # softmax([1, 0])
    torch.testing.assert_close(out[0, 0], torch.tensor([10 * w0, 10 * (1 - w0)]))
    # at position 0 the second key is in the future
    out0 = dense_attention(q, k, v, torch.tensor([0]), scale=1.0)
    torch.testing.assert_close(out0[0, 0], torch.tensor([10.0, 0.0]))


def test_prompts_of_one_step_attend_in_groups_as_they_would_alone():
    """The paged prefill: prompts of similar length padded into one causal_attention call, each row's output
    the same as dense_attention over that prompt alone; every row lands once, the padding nowhere."""
    g = torch.Generator().manual_seed(3)
    lengths = [1, 7, 6, 37, 3, 8, 40, 2, 64]
    spans, start = [], 0
    for n in lengths:
        spans.append((start, start + n))
        start += n
    q, k, v = (torch.randn(start, h, 8, generator=g) for h in (4, 2, 2))
    groups = prefill_groups(spans, "cpu")
    assert 1 < len(groups) < len(lengths)  # grouped, not one call a prompt, nor one padded call for all
    rows = torch.cat([r for _, _, r in groups])
    assert sorted(rows.tolist()) == list(range(start))
    for index, keep, r in groups:  # within the waste bound: padded work <= 2x the group's own
        own = [int(x) for x in keep.sum(1)]
        assert keep.shape[0] * keep.shape[1] ** 2 <= 2 * sum(n * n for n in own)
        assert torch.equal(index[keep], r)
    out = torch.empty_like(q)
    for index, keep, r in groups:
        out[r] = causal_attention(q[index], k[index], v[index], 0.3)[keep]
    for a, b in spans:
        alone = dense_attention(q[a:b], k[a:b], v[a:b], torch.arange(b - a), 0.3)
        torch.testing.assert_close(out[a:b], alone, atol=1e-6, rtol=1e-5)


def test_many_prompts_in_one_step_match_contiguous(models):
    """One engine step prefills prompts of many lengths together; each continues as it would alone."""
    m, _ = models["gqa"]
    prompts = [list(range(3, 3 + n)) for n in (1, 2, 5, 9, 16, 17, 31, 33, 64)]
    got = m.generate_paged(prompts, 3, block_size=16, attention="reference")
    for p, gen in zip(prompts, got):
        ref = m.generate_contiguous(p, 3)
        assert gen.tokens == ref.tokens
        torch.testing.assert_close(gen.logits, ref.logits, **TOL)


def test_gqa_head_mapping_is_h_over_group():
    # 4 query heads, 2 KV heads: heads 0,1 read KV head 0 and heads 2,3 read KV head 1
    q = torch.ones(1, 4, 2)
    k = torch.zeros(1, 2, 2)
    v = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]])
    out = dense_attention(q, k, v, torch.tensor([0]), scale=1.0)
    assert out[0, :, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


def test_weights_are_deterministic_from_seed():
    a, b, c = TinyTransformer(GQA), TinyTransformer(GQA), TinyTransformer(ModelConfig(init_std=0.3, seed=99))
    for (na, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), na
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_param_count_by_hand():
    cfg = PRESETS["tiny"]
    # embedding 128x128 (tied output); per layer q,o 128x128, k,v 128x64, SwiGLU 3x128x384, 2 norms of 128
    per_layer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 384 + 2 * 128
    expected = 128 * 128 + 4 * per_layer + 128
    assert cfg.num_params == expected
    assert sum(p.numel() for p in TinyTransformer(cfg).parameters()) == expected
    spec = cfg.spec(dtype_bytes=4)
    assert spec.kv_bytes_per_token == 2 * 4 * 2 * 32 * 4  # K and V, 4 layers, 2 KV heads, d 32, fp32


def test_tokenizer_round_trip_and_errors():
    tok = CharTokenizer()
    text = "§10.5: 67 ms swap — 129 ms recompute ≈ 2× (b×S)\n\tok"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(DEFAULT_CHARS) <= PRESETS["tiny"].vocab_size
    with pytest.raises(ValueError, match=r"'é'.*position 3"):
        tok.encode("cafés")
    assert tok.decode(tok.encode("cafés", errors="replace")) == "caf?s"
    with pytest.raises(ValueError, match="duplicates"):
        CharTokenizer("aa")


def test_bad_inputs_are_rejected():
    m = TinyTransformer(GQA)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        m.generate_contiguous([1, 500], 2)
    with pytest.raises(ValueError, match="empty"):
        m.generate_contiguous([], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate_contiguous([1], 0)
    short = TinyTransformer(ModelConfig(max_seq_len=8))
    assert len(short.generate_contiguous([1] * 5, 4).tokens) == 4  # 5 + 4 - 1 = 8 positions: fits
    with pytest.raises(ValueError, match="max_seq_len=8"):
        short.generate_contiguous([1] * 5, 5)
    with pytest.raises(ValueError, match="attention"):
        resolve_attention("flash", "cpu")
    with pytest.raises(ValueError, match="multiple of"):
        ModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim"):
        ModelConfig(head_dim=31)
    assert resolve_attention("auto", "cpu") == "reference"
    assert resolve_attention("auto", "cuda") == "triton"


def test_forward_paged_rejects_bad_input_and_leaves_the_cache_as_it_was():
    from labsupport.kvcache import PagedKVCache
    from labsupport.memory_stats import OutOfBlocks, SwappedOut, UnknownSequence

    m = TinyTransformer(GQA)
    c = m.cfg
    cache = PagedKVCache(6, 4, c.num_layers, c.num_kv_heads, c.head_dim)  # 24 token slots
    m.forward_paged(cache, prefills=[("a", [1, 2, 3]), ("s", [4])], attention="reference")
    cache.swap_out("s")

    def state():
        snap = cache.allocator.snapshot()
        return snap, [t.clone() for t in cache.k_cache]

    before = state()
    cases = [
        (ValueError, "token id 500", dict(prefills=[("b", [1, 500])])),
        (ValueError, "token id 500", dict(decodes=[("a", 500)])),
        (ValueError, "token id -1", dict(prefills=[("b", [1])], decodes=[("a", -1)])),
        (UnknownSequence, "'zz'", dict(prefills=[("b", [1, 2])], decodes=[("zz", 3)])),
        (SwappedOut, "swapped out", dict(prefills=[("b", [1, 2])], decodes=[("s", 3)])),
        (ValueError, "already in the cache", dict(prefills=[("a", [1])])),
        (ValueError, "appears twice", dict(prefills=[("b", [1])], decodes=[("b", 2)])),
        (ValueError, "no tokens", dict(prefills=[("b", [])])),
        # 3 + 3 blocks for b and c but only 5 free: c fails after b was allocated, and b is undone
        (OutOfBlocks, "allocate 'c'", dict(prefills=[("b", [1] * 12), ("c", [2] * 12)])),
    ]
    for exc, match, kw in cases:
        with pytest.raises(exc, match=match):
            m.forward_paged(cache, attention="reference", **kw)
        after = state()
        assert after[0]["block_tables"] == before[0]["block_tables"], kw
        assert after[0]["seq_lens"] == before[0]["seq_lens"] and after[0]["ref_counts"] == before[0]["ref_counts"]
        assert all(torch.equal(x, y) for x, y in zip(after[1], before[1])), kw
        cache.check_invariants()


def test_save_load_round_trip(tmp_path):
    m = TinyTransformer(GQA)
    path = tmp_path / "m.pt"
    save_model(m, path, CharTokenizer(), extra={"note": "x"}, dtype=torch.float32)
    m2, tok, meta = load_model(path)
    assert meta == {"note": "x"} and tok.chars == DEFAULT_CHARS
    assert m2.generate_contiguous([1, 2, 3], 5).tokens == m.generate_contiguous([1, 2, 3], 5).tokens
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="not a labsupport model file"):
        load_model(bad)


def test_load_tiny_model_falls_back_to_random(tmp_path):
    m, tok, trained = load_tiny_model(tmp_path / "missing.pt")
    assert not trained and m.cfg == PRESETS["tiny"]
    assert len(tok.encode("paging")) == 6


SHIPPED = REPO_ROOT / "data" / "tiny_lecture.pt"


@pytest.mark.skipif(not SHIPPED.exists(), reason="data/tiny_lecture.pt not trained yet")
def test_shipped_weights_learned_the_lecture():
    m, tok, trained = load_tiny_model()
    assert trained
    assert SHIPPED.stat().st_size < 4 * 2**20
    text = ("Preemption is the interesting one, because it has two implementations and choosing between "
            "them is an arithmetic problem you can do from Lecture 2's numbers alone.")
    ids = torch.tensor([tok.encode(text)])
    with torch.no_grad():
        logits = m(ids[:, :-1])[0]
    nats = torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item()
    # uniform over the character set would be ln(114) = 4.7 nats/char; an untrained model is near that
    assert nats < 2.0, nats
    rand, _, _ = load_tiny_model(SHIPPED.parent / "absent.pt")
    with torch.no_grad():
        rand_nats = torch.nn.functional.cross_entropy(rand(ids[:, :-1])[0], ids[0, 1:]).item()
    assert rand_nats > 4.0
