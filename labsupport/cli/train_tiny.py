"""Train the tiny character model on the lecture text, so demos print lecture-flavoured text (§10.1 "Run").

    python -m labsupport.cli.train_tiny --out data/tiny_lecture.pt

The corpus is the lecture notes (by default ``../shared/seeds/000_5d5041c35860fb3d.txt`` next to
the repository); only the trained weights (fp16, about 1.6 MB) are shipped, in ``data/``.  About a
thousand steps take under ten minutes on one CPU core; on a busy machine the wall-clock budget
(``--max-minutes``) ends training early, with the learning rate decayed over that budget.  The
model memorises much of a 35 KB corpus, which is what a demo wants: recognisable sentences from
a real forward pass.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from labsupport.cli.parser import OneLineParser, UsageError, int_flag, real_flag, run_command
from labsupport.model import PRESETS, TINY_WEIGHTS, CharTokenizer, TinyTransformer, save_model

REPO = Path(__file__).resolve().parents[2]  # labsupport/cli/train_tiny.py -> the repository
DEFAULT_CORPUS = REPO.parent / "shared" / "seeds" / "000_5d5041c35860fb3d.txt"


def _batches(data: torch.Tensor, seq_len: int, batch: int, g: torch.Generator):
    while True:
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq_len] for s in starts])
        y = torch.stack([data[s + 1:s + seq_len + 1] for s in starts])
        yield x, y


@torch.no_grad()
def _eval_loss(model: TinyTransformer, data: torch.Tensor, seq_len: int) -> float:
    n = (data.numel() - 1) // seq_len
    if n == 0:
        return float("nan")
    x = data[: n * seq_len].view(n, seq_len)
    y = data[1: n * seq_len + 1].view(n, seq_len)
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def main(argv: list[str] | None = None) -> int:
    return run_command("train_tiny", _main, sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    ap = OneLineParser(prog="python -m labsupport.cli.train_tiny", description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--out", type=Path, default=TINY_WEIGHTS)
    ap.add_argument("--steps", type=int_flag(1, 10**7), default=1400)
    ap.add_argument("--batch", type=int_flag(1, 4096), default=16)
    ap.add_argument("--seq-len", type=int_flag(2, PRESETS["tiny"].max_seq_len), default=256)
    ap.add_argument("--lr", type=real_flag(maximum=10.0, above=0.0), default=3e-3)
    ap.add_argument("--seed", type=int_flag(0, 2**63 - 1), default=0)
    ap.add_argument("--threads", type=int_flag(1, 1024), default=1)
    ap.add_argument("--max-minutes", type=real_flag(maximum=10_000.0, above=0.0), default=9.0,
                    help="stop early (and still save) after this long")
    args = ap.parse_args(argv)
    if not args.corpus.is_file():
        raise UsageError(f"--corpus {args.corpus} is not a file")
    try:
        text = args.corpus.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"--corpus {args.corpus} is not UTF-8 text (byte {e.start:,}: {e.reason})") from None
    tok = CharTokenizer()
    data = torch.tensor(tok.encode(text, errors="replace"), dtype=torch.long)
    if data.numel() < 2 * args.seq_len + 2:  # a training window and a held-out one
        raise UsageError(f"--corpus {args.corpus} has {data.numel():,} characters, too few for --seq-len "
                         f"{args.seq_len} (at least {2 * args.seq_len + 2:,})")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    split = int(0.95 * data.numel())
    train, val = data[:split], data[split:]
    model = TinyTransformer(PRESETS["tiny"]).train()
    print(f"corpus {args.corpus.name}: {len(text):,} characters; model {model.cfg.num_params:,} parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 50)
    budget_s = 60 * args.max_minutes
    t0 = time.perf_counter()

    # Cosine decay over whichever runs out first, the steps or the wall-clock budget, so a busy
    # machine still ends with a decayed learning rate (at the cost of bit-exact reruns).
    def progress(step: int) -> float:
        return min(1.0, max(step / args.steps, (time.perf_counter() - t0) / budget_s))

    def set_lr(step: int) -> None:
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * progress(step)))
        for group in opt.param_groups:
            group["lr"] = lr
    g = torch.Generator().manual_seed(args.seed)
    step = 0
    for step, (x, y) in enumerate(_batches(train, args.seq_len, args.batch, g), start=1):
        set_lr(step - 1)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        elapsed = time.perf_counter() - t0
        if step % 50 == 0 or step == 1:
            print(f"step {step:5d}  loss {loss.item():.3f}  {elapsed:6.0f} s", flush=True)
        if step >= args.steps or elapsed > budget_s:
            break
    model.eval()
    val_loss = _eval_loss(model, val, args.seq_len)
    train_loss = _eval_loss(model, train[: 64 * args.seq_len + 1], args.seq_len)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"steps": step, "train_loss": train_loss, "val_loss": val_loss, "corpus": args.corpus.name,
            "seconds": round(time.perf_counter() - t0, 1), "seed": args.seed}
    save_model(model, args.out, tok, extra=meta)
    print(f"saved {args.out} ({args.out.stat().st_size:,} bytes): {step} steps, train loss {train_loss:.3f}, "
          f"held-out loss {val_loss:.3f} (nats/char)")
    prompt = "The block table"
    gen = model.generate_contiguous(tok.encode(prompt), 200)
    print("sample:", prompt + tok.decode(gen.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
