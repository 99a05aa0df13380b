"""`python -m labsupport bench smollm2`: SmolLM2-135M through the labs' engine and through transformers, side by side.

A mixed batch (default 32 requests) whose prompt and output lengths are the first requests of the Azure
conversation trace, scaled to fit a CPU: each length is multiplied by one factor per kind (prompts by
``--max-prompt / the longest prompt``, outputs by ``--max-output / the longest output``, never above 1) and
rounded, at least one token; the skew of the trace is kept.  The prompts' tokens are windows of this
repository's README (distinct, none a prefix of another).  The same requests run, in one process, at the same
dtype and torch threads, greedy, with no stop token (each request writes exactly its own output length):

(a) the labs' ``Engine`` on a ``PagedKVCache``: every request added at once, the engine's admission decides
    (a pool that holds them all; the watermark at its default); on a CPU, decode attention reads through the
    block table with the kernel's torch path (`kernels.paged_decode_attention_torch`);
(b) Hugging Face transformers' batched ``generate`` on the same GGUF (``AutoModelForCausalLM.from_pretrained(
    folder, gguf_file=name)``): the prompts left-padded to the longest, the whole batch generated to the longest
    output (``max_new_tokens`` is one number for the batch), and only each request's own output tokens counted.

Figures, side by side: output tokens per second (each request's own tokens over the wall time of the whole
run), peak KV memory (engine: the most blocks held during a step's forward pass x block bytes; transformers:
the DynamicCache's
K/V tensors at the end of generate, the largest they get: padded batch x longest sequence), time to the first
token (engine: each request's own, from its records; transformers: the first step, prefill of the whole
padded batch, which every row waits for), and whether both sides wrote the same tokens.  A warm-up run of
each side (two requests, two tokens) comes first and is not counted.  Results go to
``data/smollm2_bench.json`` (strict JSON).  transformers and accelerate are benchmark dependencies
(``pip install -e .[test]``).
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

from labsupport.cli.parser import OneLineParser, UsageError, dumps_strict, int_flag, strict_json
from labsupport.cli.traces import load_trace_reporting

PROG = "python -m labsupport bench smollm2"
DEFAULT_JSON = Path(__file__).resolve().parents[2] / "data" / "smollm2_bench.json"
TEXT = Path(__file__).resolve().parents[2] / "README.md"  # the prompts' words
DTYPES = ("float32", "bfloat16")
CONTEXT = 8192  # SmolLM2's context: prompt + output must fit
GOAL = ("the paged engine at least matches transformers' output tokens/s at batch 32 on CPU and holds at most "
        "half its KV memory (issue 38)")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description="SmolLM2-135M on a mixed batch from the Azure conversation trace: "
                                             "the labs' paged engine beside transformers' batched generate.")
    p.add_argument("--requests", type=int_flag(1, 4096), default=32, help="requests in the batch (default 32)")
    p.add_argument("--max-prompt", type=int_flag(1, CONTEXT - 1), default=256,
                   help="the longest prompt after scaling, in tokens (default 256)")
    p.add_argument("--max-output", type=int_flag(1, CONTEXT - 1), default=64,
                   help="the longest output after scaling, in tokens (default 64)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="weights, activations and KV cache on both sides (default bfloat16)")
    p.add_argument("--threads", type=int_flag(1, 1024), default=None,
                   help="torch threads for both sides (default: torch's own)")
    p.add_argument("--block-size", type=int_flag(1, 4096), default=16,
                   help="the engine's tokens per KV block, a power of two (default 16)")
    p.add_argument("--json", metavar="PATH", default=str(DEFAULT_JSON),
                   help="where the results go (default data/smollm2_bench.json)")
    return p


# --- the workload -----------------------------------------------------------------------------------

def scaled_lengths(pairs: list[tuple[int, int]], max_prompt: int, max_output: int):
    """(prompt, output) pairs scaled by one factor per kind so the longest fits; returns (pairs, factors)."""
    top_p = max(p for p, _ in pairs)
    top_o = max(max(o, 1) for _, o in pairs)
    fp, fo = min(1.0, max_prompt / top_p), min(1.0, max_output / top_o)
    return [(max(1, min(max_prompt, round(p * fp))), max(1, min(max_output, round(o * fo)))) for p, o in pairs], \
        (fp, fo)


def prompt_ids(tok, lengths: list[int]) -> list[list[int]]:
    """Distinct windows of README.md's tokens, one per length (the text is repeated if it is too short)."""
    ids = tok.encode(TEXT.read_text(encoding="utf-8"))
    need = max(lengths) + 7 * len(lengths) + 1
    while len(ids) < need:
        ids = ids + ids
    return [ids[(7 * i) % (len(ids) - n): (7 * i) % (len(ids) - n) + n] for i, n in enumerate(lengths)]


# --- the two sides ------------------------------------------------------------------------------------

def _progress(total: int, desc: str, unit: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr)


def run_engine(model, prompts, outputs, block_size: int, progress: bool = True) -> dict:
    """Every request added at once to a fresh Engine whose pool holds them all; returns the figures."""
    from labsupport.engine import Engine
    from labsupport.sampling import GREEDY

    need = sum(-(-(len(p) + o - 1) // block_size) for p, o in zip(prompts, outputs))
    engine = Engine(model, num_blocks=need + max(1, need // 50), block_size=block_size,
                    record_token_times=False)
    rids = [engine.add_request(p, o, sampling=GREEDY) for p, o in zip(prompts, outputs)]
    # a request's blocks at its last step: prompt + outputs - 1 tokens cached (its last token never is)
    last_blocks = {rid: -(-(len(p) + o - 1) // block_size) for rid, p, o in zip(rids, prompts, outputs)}
    bar = _progress(sum(outputs), "engine", "tok") if progress else None
    peak = 0
    t0 = time.perf_counter()
    for out, _ in engine.iterations():
        # the blocks held during the step's forward pass: those still held after it, and those of the
        # requests that finished in it (they leave at its end; the engine's own counter is taken after that)
        held = engine.allocator.num_used_blocks + sum(last_blocks[r] for r in out.finished)
        peak = max(peak, held)
        if bar is not None:
            bar.update(out.num_tokens)
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    res = engine.result()
    reqs = [res.requests[r] for r in rids]
    bad = [r for r in reqs if not r.finished]
    if bad:
        raise RuntimeError(f"the engine did not finish request {bad[0].request_id}: {bad[0].reason}")
    engine.allocator.check_invariants()
    if engine.allocator.num_used_blocks:
        raise RuntimeError(f"the engine leaked {engine.allocator.num_used_blocks} blocks")
    c = res.counters
    block_bytes = block_size * engine.cache.kv_bytes_per_token
    return dict(tokens=[r.outputs[0] for r in reqs], output_tokens=sum(r.total_output_tokens for r in reqs),
                wall_s=wall, steps=c.steps, ttft_s=[r.ttft_s for r in reqs],
                peak_blocks=peak, block_bytes=block_bytes, peak_kv_bytes=peak * block_bytes,
                pool_blocks=engine.num_blocks, pool_bytes=engine.cache.pool_bytes,
                kv_bytes_per_token=engine.cache.kv_bytes_per_token, preemptions=c.total_preemptions,
                peak_running=c.peak_running)


def load_transformers(dtype: str):
    """transformers' LlamaForCausalLM from the same GGUF, offline; a UsageError names the install when missing."""
    import importlib.util

    import torch

    from labsupport import pretrained

    for module in ("transformers", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"the {module} package is not installed: it is a benchmark dependency "
                             f"(pip install -e .[test])")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    path = pretrained.find_gguf()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=getattr(torch, dtype))
    hf.eval()
    hf.generation_config.eos_token_id = None  # every row runs to max_new_tokens: nothing stops early
    return hf


def run_transformers(hf, prompts, outputs, pad_id: int, progress: bool = True) -> dict:
    """One batched greedy generate: left padding, the batch generated to the longest output, each request's
    own first `outputs[i]` tokens counted; returns the figures."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    b, width, steps = len(prompts), max(len(p) for p in prompts), max(outputs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    stamps: list[float] = []
    bar = _progress(steps, "transformers", "step") if progress else None

    class Clock(LogitsProcessor):  # called once a step, right after the forward pass that gave the logits
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            if bar is not None:
                bar.update(1)
            return scores

    t0 = time.perf_counter()
    with torch.no_grad():
        g = hf.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                        pad_token_id=pad_id, logits_processor=LogitsProcessorList([Clock()]),
                        return_dict_in_generate=True)
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    new = g.sequences[:, width:]
    if new.shape[1] != steps or len(stamps) != steps:
        raise RuntimeError(f"transformers generated {new.shape[1]} tokens a row in {len(stamps)} steps, not {steps}")
    cache = g.past_key_values
    if getattr(cache, "layers", None):  # transformers 5: a DynamicLayer per layer, with .keys and .values
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    else:  # transformers 4: lists of tensors
        tensors = [*getattr(cache, "key_cache", []), *getattr(cache, "value_cache", [])]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not tensors:
        raise RuntimeError(f"cannot read the K/V tensors of transformers' {type(cache).__name__}")
    kv = sum(t.numel() * t.element_size() for t in tensors)
    shape = tuple(tensors[0].shape)
    return dict(tokens=[new[i, :o].tolist() for i, o in enumerate(outputs)], output_tokens=sum(outputs),
                computed_tokens=b * steps, wall_s=wall, steps=len(stamps), first_step_s=stamps[0] - t0,
                peak_kv_bytes=kv, cache_shape=shape, padded_prompt=width)


# --- the run --------------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _machine(threads: int) -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import transformers

    return dict(cpu=cpu, cores=os.cpu_count(), torch_threads=threads, torch=torch.__version__,
                transformers=transformers.__version__, python=platform.python_version(),
                load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)


def bench(argv: list[str] | None = None) -> int:
    """The engine and transformers on the same scaled Azure requests; figures side by side and a JSON file."""
    a = build_parser().parse_args(argv or [])
    if a.block_size & (a.block_size - 1):
        raise UsageError(f"--block-size {a.block_size}: a power of two")
    if a.max_prompt + a.max_output - 1 > CONTEXT:
        raise UsageError(f"--max-prompt {a.max_prompt} + --max-output {a.max_output} exceed SmolLM2's context of "
                         f"{CONTEXT:,} tokens")
    target = Path(a.json)
    if target.is_dir():
        raise UsageError(f"--json {a.json}: a folder, not a file")
    target.parent.mkdir(parents=True, exist_ok=True)  # a folder that cannot be made fails now, not after the run

    import torch

    from labsupport import pretrained

    if a.threads is not None:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    w = load_trace_reporting("azure-conv", limit=a.requests, prog="bench smollm2")
    if len(w.requests) < a.requests:
        raise UsageError(f"--requests {a.requests}: the trace has only {len(w.requests)}")
    original = [(r.prompt_tokens, r.output_tokens) for r in w.requests[: a.requests]]
    pairs, (fp, fo) = scaled_lengths(original, a.max_prompt, a.max_output)
    label = "SYNTHETIC" if w.synthetic else "real"
    print(f"bench smollm2: {a.requests} requests from {w.name} ({label}: {w.source}), lengths scaled: prompts "
          f"x {fp:.4f} (longest {max(p for p, _ in original):,} -> {max(p for p, _ in pairs)}), outputs x {fo:.4f} "
          f"(longest {max(o for _, o in original):,} -> {max(o for _, o in pairs)}), at least 1 token each", flush=True)
    if w.synthetic:
        print("bench smollm2: NOTE these lengths come from a SYNTHETIC stand-in fitted to the trace's statistics, "
              "not the trace itself (python -m labsupport traces azure-conv fetches it)", flush=True)

    t = time.perf_counter()
    model, tok = pretrained.load_smollm2(dtype=a.dtype)
    hf = load_transformers(a.dtype)
    print(f"  SmolLM2-135M-Instruct in {a.dtype}, {threads} torch thread(s), loaded on both sides in "
          f"{time.perf_counter() - t:.1f} s; greedy, no stop token", flush=True)
    prompts = prompt_ids(tok, [p for p, _ in pairs])
    outputs = [o for _, o in pairs]
    pad = tok.eos_id if tok.eos_id is not None else 0

    warm = [p[:8] for p in prompts[:2]]  # first calls pay one-off costs (allocations, kernel choice): not counted
    run_engine(model, warm, [2] * len(warm), a.block_size, progress=False)
    run_transformers(hf, warm, [2] * len(warm), pad, progress=False)

    eng = run_engine(model, prompts, outputs, a.block_size)
    print(f"  engine: {eng['output_tokens']:,} tokens in {eng['wall_s']:.2f} s, {eng['steps']} steps", flush=True)
    ref = run_transformers(hf, prompts, outputs, pad)
    print(f"  transformers: {ref['output_tokens']:,} tokens counted ({ref['computed_tokens']:,} computed) in "
          f"{ref['wall_s']:.2f} s, {ref['steps']} steps", flush=True)

    same = sum(x == y for x, y in zip(eng["tokens"], ref["tokens"]))
    agree = [next((k for k, (x, y) in enumerate(zip(ex, rx)) if x != y), len(ex))
             for ex, rx in zip(eng["tokens"], ref["tokens"])]
    counts_equal = [len(x) for x in eng["tokens"]] == [len(y) for y in ref["tokens"]] == outputs
    e_tps, r_tps = eng["output_tokens"] / eng["wall_s"], ref["output_tokens"] / ref["wall_s"]
    ttft = [x for x in eng["ttft_s"] if x is not None]
    e_ttft = dict(median_s=statistics.median(ttft), p90_s=_pct(ttft, 0.9), max_s=max(ttft), min_s=min(ttft))
    r_kv, e_kv = ref["peak_kv_bytes"], eng["peak_kv_bytes"]

    rows = [("output tokens/s", f"{e_tps:,.1f}", f"{r_tps:,.1f}", f"{e_tps / r_tps:.2f}x"),
            ("wall time (s)", f"{eng['wall_s']:.2f}", f"{ref['wall_s']:.2f}", ""),
            ("peak KV memory (MB)", f"{e_kv / 1e6:,.2f}", f"{r_kv / 1e6:,.2f}", f"{e_kv / r_kv:.2f}x"),
            ("TTFT median (s)", f"{e_ttft['median_s']:.2f}", f"{ref['first_step_s']:.2f}", ""),
            ("TTFT max (s)", f"{e_ttft['max_s']:.2f}", f"{ref['first_step_s']:.2f}", "")]
    print(f"  {'':<22}{'engine (paged)':>16}{'transformers':>16}{'engine/HF':>11}")
    for name, x, y, r in rows:
        print(f"  {name:<22}{x:>16}{y:>16}{r:>11}")
    print(f"  engine KV: peak {eng['peak_blocks']} blocks x {eng['block_bytes']:,} B (block of {a.block_size} x "
          f"{eng['kv_bytes_per_token']:,} B/token); its pool reserved {eng['pool_bytes'] / 1e6:,.2f} MB "
          f"({eng['pool_blocks']} blocks); {eng['preemptions']} preemptions")
    print(f"  transformers KV: DynamicCache K/V {ref['cache_shape']} x 2 x {model.cfg.num_layers} layers at the end "
          f"(padded batch x longest sequence); it computes {ref['computed_tokens']:,} output tokens to count "
          f"{ref['output_tokens']:,}")
    differ = [k for k, o in zip(agree, outputs) if k < o]
    tail = (f"; the other {len(differ)} share their first {statistics.median(differ):.0f} tokens (median), then part "
            f"where {a.dtype} rounds a near-tie the other way (another batch shape, another order of sums)"
            if differ else "")
    print(f"  same tokens: {same} of {len(outputs)} requests identical{tail}; counted tokens equal on both sides: "
          f"{counts_equal}")
    met_tps, met_kv = e_tps >= r_tps, e_kv <= r_kv / 2
    print(f"  goal: {GOAL}: tokens/s {'met' if met_tps else 'NOT met'}, KV {'met' if met_kv else 'NOT met'}")

    notes: list[str] = []
    payload = dict(
        bench="smollm2", command=" ".join(["python -m labsupport bench smollm2", *(argv or [])]),
        model=pretrained.MODEL_NAME, dtype=a.dtype, machine=_machine(threads),
        workload=dict(trace=w.name, synthetic=w.synthetic, source=w.source, requests=a.requests,
                      prompt_scale=fp, output_scale=fo, max_prompt=a.max_prompt, max_output=a.max_output,
                      original=[list(x) for x in original], scaled=[list(x) for x in pairs],
                      prompt_tokens=sum(p for p, _ in pairs), output_tokens=sum(outputs),
                      prompt_text=TEXT.name),
        engine=dict(output_tokens=eng["output_tokens"], wall_s=eng["wall_s"], tokens_per_s=e_tps,
                    steps=eng["steps"], ttft_s=eng["ttft_s"], ttft=e_ttft, peak_blocks=eng["peak_blocks"],
                    block_size=a.block_size, block_bytes=eng["block_bytes"], peak_kv_bytes=e_kv,
                    kv_bytes_per_token=eng["kv_bytes_per_token"], pool_blocks=eng["pool_blocks"],
                    pool_bytes=eng["pool_bytes"], preemptions=eng["preemptions"], peak_running=eng["peak_running"],
                    attention="kernels.paged_decode_attention_torch (through the block table)"
                    if model.device.type == "cpu" else "Triton kernel"),
        transformers=dict(output_tokens=ref["output_tokens"], computed_tokens=ref["computed_tokens"],
                          wall_s=ref["wall_s"], tokens_per_s=r_tps, steps=ref["steps"],
                          first_step_s=ref["first_step_s"], peak_kv_bytes=r_kv,
                          cache_shape=list(ref["cache_shape"] or []), padded_prompt=ref["padded_prompt"],
                          max_new_tokens=max(outputs)),
        comparison=dict(tokens_per_s_ratio=e_tps / r_tps, kv_ratio=e_kv / r_kv, identical_requests=same,
                        agreeing_prefix=agree, counts_equal=counts_equal,
                        goal=GOAL, tokens_per_s_met=met_tps, kv_half_met=met_kv),
        method=["each side's output tokens are each request's own outputs[i]; transformers generates the whole "
                "batch to max(outputs) (max_new_tokens is per batch, not per row) and the rest are not counted",
                "tokens/s = counted output tokens / wall time of the whole run (prefill included)",
                "engine TTFT per request from its records (all requests arrive at 0); transformers' TTFT is its "
                "first step (the padded batch's prefill), the same for every row",
                "transformers' KV is its DynamicCache's K/V tensors at the end of generate; the engine's is the "
                "most blocks held during a step's forward pass (before that step's finished requests leave) x block "
                "bytes (its pool, sized to hold every request at once, is pool_bytes)",
                "one warm-up run of each side (2 requests, 2 tokens) first, not counted"],
        notes=notes)
    clean = strict_json(payload, notes)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dumps_strict(clean, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {target}")
    return 0
