"""Figures and measurements of lab 05: copy-on-write fan-out and prefix sharing (§10.4).

Every picture is read off the real `BlockAllocator` (or the ledger's closed form, which tests prove
equal to it), never re-typed:

* §10.4's board: branches on the left, the physical blocks they name on the right, each block
  labelled with its reference count — one prompt's blocks with eight arrows and refcount 8, then
  one branch writes and its tail becomes a new block: refcount 7 + 1 (`refcount_board_figure`);
* the fan-out bars: n completions off one prompt, unshared against shared, in bytes against the
  KV budget, with the block counts measured on the allocator (`measure_fanout`, `fanout_figure`,
  `fanout_panel`), and the same fan-out pushed into a finite pool (`fanout_in_pool`);
* block size against fork cost: the copy on divergence is a whole block (`measure_fork_cost`,
  `fork_cost_figure`);
* cross-request sharing on the Mooncake conversation trace: its `hash_ids` replayed through the
  allocator's prefix index (`replay_prefix_cache`, `prefix_sharing_figure`, `prefix_capacity_figure`).
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from labsupport import ledger
from labsupport.block_allocator import BlockAllocator
from labsupport.checks import as_count as _count
from labsupport.memory_stats import OutOfBlocks
from labsupport.specs import LECTURE_GPU, get_model
from labsupport.units import fmt_int, log_axis_ticks
from labsupport.viz import (FONT_SIZE, PALETTE, Panel, bytes_axis_title, dropdown, in_unit, number_slider,
                            selection_slider, styled)

SEQ_COLOURS = ("#0072B2", "#882255", "#56B4E9", "#CC79A7", "#009E73", "#D55E00", "#E69F00", "#444444")
FANOUT_MODELS = (("lecture-7b (MHA, 512 KiB/token)", "lecture-7b"), ("lecture-7b-gqa8 (128 KiB/token)", "lecture-7b-gqa8"))
PROMPT_OPTIONS = [(f"{v:,}", v) for v in (256, 512, 1000, 1024, 2048, 4096, 8192, 16_384, 32_768)]
OUTPUT_OPTIONS = [(f"{v:,}", v) for v in (1, 16, 64, 128, 256, 512, 1024, 2048, 4096)]
BLOCK_OPTIONS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


# =============================================================================================
# The board: who points at which block, and how many do
# =============================================================================================

@dataclass(frozen=True)
class BoardBlock:
    """One physical block on the board: its id, reference count, tokens held, and who names it."""

    block_id: int
    ref_count: int
    filled: int  # tokens of the longest holder that live in this block
    holders: tuple  # sequence ids whose block table names this block
    position: int  # logical index at which a holder first names it

    @property
    def shared(self) -> bool:
        return self.ref_count > 1


def board_blocks(allocator: BlockAllocator, seq_ids: Sequence[Hashable]) -> list[BoardBlock]:
    """The physical blocks `seq_ids` hold, in logical order, with the allocator's reference counts."""
    bs = allocator.block_size
    found: dict[int, dict] = {}
    for s in seq_ids:
        table = allocator.block_tables.get(s)
        if table is None:
            raise ValueError(f"sequence {s!r} is not resident in the allocator")
        n = allocator.seq_lens[s]
        for i, b in enumerate(table):
            entry = found.setdefault(b, {"holders": [], "position": i, "filled": 0})
            entry["holders"].append(s)
            entry["filled"] = max(entry["filled"], min(bs, n - i * bs))
    blocks = [BoardBlock(b, allocator.ref_count(b), e["filled"], tuple(e["holders"]), e["position"])
              for b, e in found.items()]
    return sorted(blocks, key=lambda x: (x.position, -x.ref_count, x.block_id))


def refcount_board_figure(allocator: BlockAllocator, seq_ids: Sequence[Hashable],
                          names: Mapping[Hashable, str] | None = None, highlight: Iterable[int] = (),
                          title: str | None = None) -> go.Figure:
    """§10.4's board from a live allocator: one line per block-table entry, each block with its refcount.

    Shared blocks (ref_count > 1) are pink, private ones green; `highlight` outlines blocks (the
    copy a write just made, and the block it was copied from).
    """
    seq_ids = list(seq_ids)
    if not seq_ids:
        raise ValueError("the board needs at least one sequence")
    blocks = board_blocks(allocator, seq_ids)
    lit = set(highlight)
    bs = allocator.block_size
    height_units = max(len(seq_ids), len(blocks)) - 1 or 1
    seq_y = {s: k * height_units / max(1, len(seq_ids) - 1) for k, s in enumerate(seq_ids)}
    blk_y = {b.block_id: k * height_units / max(1, len(blocks) - 1) for k, b in enumerate(blocks)}
    shared_xy, private_xy = ([], []), ([], [])
    for s in seq_ids:
        for b in allocator.block_tables[s]:
            target = shared_xy if allocator.ref_count(b) > 1 else private_xy
            target[0].extend([0.0, 1.0, None])
            target[1].extend([seq_y[s], blk_y[b], None])
    fig = go.Figure()
    for (xs, ys), name, colour, width in ((shared_xy, "names a shared block", PALETTE["shared"], 3),
                                          (private_xy, "names a private block", PALETTE["used"], 3)):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=name, line=dict(color=colour, width=width),
                                 hoverinfo="skip"))
    def label(s) -> str:  # a named sequence keeps its name ("branch 3" is not "branch branch 3")
        if names:
            return str(names.get(s, s))
        return s if isinstance(s, str) else f"branch {s}"

    fig.add_trace(go.Scatter(
        x=[0.0] * len(seq_ids), y=[seq_y[s] for s in seq_ids], mode="markers+text", name="sequences",
        marker=dict(size=22, color=[SEQ_COLOURS[k % len(SEQ_COLOURS)] for k in range(len(seq_ids))]),
        text=[f"<b>{html.escape(label(s))}</b>  " for s in seq_ids], textposition="middle left",
        customdata=[[allocator.seq_lens[s]] for s in seq_ids],
        hovertemplate="%{text}: %{customdata[0]} tokens<extra></extra>", showlegend=False))
    fig.add_trace(go.Scatter(
        x=[1.0] * len(blocks), y=[blk_y[b.block_id] for b in blocks], mode="markers+text", name="blocks",
        marker=dict(symbol="square", size=34,
                    color=[PALETTE["shared"] if b.shared else PALETTE["used"] for b in blocks],
                    line=dict(color=[PALETTE["limit"] if b.block_id in lit else "white" for b in blocks],
                              width=[5 if b.block_id in lit else 1 for b in blocks])),
        text=[f"  <b>ref {b.ref_count}</b>  #{b.block_id} ({b.filled}/{bs} tokens)" for b in blocks],
        textposition="middle right", customdata=[[b.block_id, b.ref_count, b.filled] for b in blocks],
        hovertemplate="block #%{customdata[0]}: ref_count %{customdata[1]}, %{customdata[2]} tokens<extra></extra>",
        showlegend=False))
    shared = [b for b in blocks if b.shared]
    default = (f"{len(seq_ids)} sequences name {len(blocks)} physical blocks"
               + (f"; {len(shared)} shared (refcount {', '.join(str(r) for r in sorted({b.ref_count for b in shared}, reverse=True))})"
                  if shared else "; none shared"))
    # the column headers sit a full row above the first row (closer, they touched its labels)
    fig.add_annotation(x=0.0, y=-1.1, text="block tables", showarrow=False, font=dict(size=FONT_SIZE))
    fig.add_annotation(x=1.0, y=-1.1, text=f"physical blocks ({allocator.num_used_blocks} in use)",
                       showarrow=False, font=dict(size=FONT_SIZE))
    return styled(fig, title or default, height=max(420, 120 + 44 * (height_units + 1)),
                  xaxis=dict(visible=False, range=[-0.75, 2.0]),
                  yaxis=dict(visible=False, autorange="reversed"),
                  legend=dict(orientation="h", yanchor="top", y=-0.02, x=0.0),
                  margin=dict(l=20, r=20, t=90, b=60))


# =============================================================================================
# Fan-out: n completions off one prompt, counted on the allocator
# =============================================================================================

@dataclass(frozen=True)
class FanoutCount:
    """Blocks n branches hold after each wrote `output` tokens past a shared `prompt`, both ways."""

    n: int
    prompt: int
    output: int
    block_size: int
    unshared_blocks: int  # n independent copies of prompt + output
    shared_blocks: int  # one prompt, forked n ways, copy-on-write on divergence
    cow_copies: int  # block copies the shared run made

    @property
    def factor(self) -> float:
        return self.unshared_blocks / self.shared_blocks

    def bytes(self, kv_bytes_per_token: int) -> tuple[int, int]:
        per_block = self.block_size * kv_bytes_per_token
        return self.unshared_blocks * per_block, self.shared_blocks * per_block


def measure_fanout(n: int, prompt: int, output: int, block_size: int) -> FanoutCount:
    """Run the fan-out on two real allocators and count the blocks in use at the end.

    Shared: allocate the prompt once, fork it n - 1 times, then every branch appends `output`
    tokens one decode step at a time (the first append copies a shared, partly filled tail).
    Unshared: n sequences, each with its own prompt, append the same tokens.
    """
    n, prompt, output = _count("n", n, 1), _count("prompt", prompt, 1), _count("output", output, 0)
    block_size = _count("block_size", block_size, 1)
    per_branch = -(-(prompt + output) // block_size)
    branches = list(range(n))
    shared = BlockAllocator(n * per_branch, block_size)
    shared.allocate(0, prompt)
    for b in branches[1:]:
        shared.fork(0, b)
    copies = 0
    for _ in range(output):
        copies += sum(r.cow is not None for r in shared.append_slots(branches))
    unshared = BlockAllocator(n * per_branch, block_size)
    for b in branches:
        unshared.allocate(b, prompt)
    for _ in range(output):
        unshared.append_slots(branches)
    shared.check_invariants()
    unshared.check_invariants()
    return FanoutCount(n, prompt, output, block_size, unshared.num_used_blocks, shared.num_used_blocks, copies)


@dataclass(frozen=True)
class PoolRun:
    """A fan-out pushed into a pool of `num_blocks`: how far it got before the pool said no."""

    share: bool
    num_blocks: int
    used_blocks: int
    branches_admitted: int
    tokens_written: int  # output tokens appended per branch before the end or the refusal
    refusal: str | None

    @property
    def fits(self) -> bool:
        return self.refusal is None


def fanout_in_pool(n: int, prompt: int, output: int, block_size: int, num_blocks: int, share: bool) -> PoolRun:
    """Prefill the n branches (once and forked, or n times) into a finite pool, then decode `output` steps.

    Stops at the first `OutOfBlocks` and reports it: the allocator's state is unchanged by the
    refused call, so `used_blocks` is what the pool held at that moment.
    """
    n, prompt, output = _count("n", n, 1), _count("prompt", prompt, 1), _count("output", output, 0)
    alloc = BlockAllocator(_count("num_blocks", num_blocks, 1), _count("block_size", block_size, 1))
    admitted, written = 0, 0
    try:
        if share:
            alloc.allocate(0, prompt)
            admitted = 1
            for b in range(1, n):
                alloc.fork(0, b)
                admitted += 1
        else:
            for b in range(n):
                alloc.allocate(b, prompt)
                admitted += 1
        for _ in range(output):
            alloc.append_slots(range(n))
            written += 1
    except OutOfBlocks as exc:
        return PoolRun(share, num_blocks, alloc.num_used_blocks, admitted, written, str(exc))
    return PoolRun(share, num_blocks, alloc.num_used_blocks, admitted, written, None)


def fanout_figure(n: int, prompt: int, output: int, block_size: int, kv_bytes_per_token: int,
                  budget_bytes: float | None = None, unit: str = "GB", title: str | None = None) -> go.Figure:
    """The fan-out bars: what n branches hold unshared and shared, split into prompt and own blocks.

    Block counts are the ledger's `fanout_blocks` (tests prove them equal to `measure_fanout`).
    """
    n, prompt, output = _count("n", n, 1), _count("prompt", prompt, 1), _count("output", output, 1)
    block_size = _count("block_size", block_size, 1)
    unshared, shared = ledger.fanout_blocks(n, prompt, output, block_size)
    prompt_blocks = prompt // block_size  # full prompt blocks: the part forks share for ever
    own = shared - prompt_blocks  # each branch's copied tail and output blocks, all branches
    per_block = block_size * kv_bytes_per_token
    cols = ["unshared: n copies", "shared: copy-on-write"]
    parts = [  # (name, x, block counts, colour)
        ("full prompt blocks, one copy per branch", [cols[0]], [n * prompt_blocks], PALETTE["waste"]),
        ("full prompt blocks, shared by every branch", [cols[1]], [prompt_blocks], PALETTE["shared"]),
        ("each branch's own blocks (tail copy + output)", cols, [unshared - n * prompt_blocks, own], PALETTE["used"]),
    ]
    traces = [go.Bar(x=xs, y=[in_unit(c * per_block, unit) for c in counts], name=name, marker_color=colour,
                     customdata=[[c] for c in counts], width=0.55,
                     hovertemplate=f"{name}: %{{customdata[0]:,}} blocks = %{{y:,.3f}} {unit}<extra></extra>")
              for name, xs, counts, colour in parts]
    totals = [unshared * per_block, shared * per_block]
    top = in_unit(max(totals + ([budget_bytes] if budget_bytes else [])), unit)
    notes = [dict(x=x, y=in_unit(t, unit), text=f"<b>{in_unit(t, unit):,.2f} {unit}</b><br>{blocks:,} blocks",
                  showarrow=False, yanchor="bottom", font=dict(size=FONT_SIZE))
             for x, t, blocks in zip(cols, totals, (unshared, shared))]
    notes.append(dict(x=0.5, xref="paper", y=top * 1.28, text=f"<b>×{unshared / shared:,.2f} from sharing</b>",
                      showarrow=False, font=dict(size=FONT_SIZE + 4, color=PALETTE["shared"])))
    shapes = []
    if budget_bytes:
        b = in_unit(budget_bytes, unit)
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, y0=b, y1=b,
                           line=dict(color=PALETTE["limit"], dash="dash", width=3)))
        notes.append(dict(x=1, xref="paper", y=b, text=f"KV budget {b:,.2f} {unit}", showarrow=False, yanchor="bottom",
                          xanchor="right", font=dict(color=PALETTE["limit"])))
    fig = go.Figure(data=traces, layout=dict(annotations=notes, shapes=shapes))
    return styled(fig, title or f"n = {n} off a {prompt:,}-token prompt, {output:,} tokens each, b = {block_size}",
                  barmode="stack", yaxis=dict(title=bytes_axis_title("KV held", unit, note=False), range=[0, top * 1.4]),
                  legend=dict(orientation="h", yanchor="top", y=-0.12, x=0.0), bargap=0.35, height=520,
                  margin=dict(l=90, r=40, t=90, b=130))


def fanout_readout(n: int, prompt: int, output: int, block_size: int, model: str) -> str:
    m = get_model(model)
    kv = m.kv_bytes_per_token
    budget = ledger.kv_budget_bytes(m, LECTURE_GPU)
    tok_u, tok_s = ledger.fanout_tokens(n, prompt, output)
    blk_u, blk_s = ledger.fanout_blocks(n, prompt, output, block_size)
    per_block = block_size * kv
    fits = lambda blocks: "fits" if blocks * per_block <= budget else "does NOT fit"
    return (f"tokens: unshared n × (P + O) = {n} × {prompt + output:,} = {tok_u:,}; shared P + n × O = "
            f"{tok_s:,}; factor {tok_u / tok_s:.4g}×\n"
            f"blocks (b = {block_size}): unshared {blk_u:,} = {blk_u * per_block / 1e9:,.3f} GB ({fits(blk_u)}); "
            f"shared {blk_s:,} = {blk_s * per_block / 1e9:,.3f} GB ({fits(blk_s)}); factor {blk_u / blk_s:.4g}×\n"
            f"{m.name}: {fmt_int(kv)} B per token, one block = {fmt_int(per_block)} B; KV budget on "
            f"{LECTURE_GPU.name} = {budget / 1e9:,.2f} GB")


def fanout_panel(n: int = 8, prompt: int = 4096, output: int = 256, block_size: int = 16,
                 model: str = "lecture-7b") -> Panel:
    """§10.4 / lab 05: sliders over n, prompt, output, block size and model; bars against the H100's KV budget."""
    controls = {
        "n": number_slider("n (branches)", n, 1, 64, 1, integer=True),
        "prompt": selection_slider(PROMPT_OPTIONS, prompt, "prompt (tokens)"),
        "output": selection_slider(OUTPUT_OPTIONS, output, "output (tokens)"),
        "block_size": selection_slider(BLOCK_OPTIONS, block_size, "block size (tokens)"),
        "model": dropdown(list(FANOUT_MODELS), model, "model"),
    }

    def figure(n, prompt, output, block_size, model):
        m = get_model(model)
        return fanout_figure(n, prompt, output, block_size, m.kv_bytes_per_token,
                             ledger.kv_budget_bytes(m, LECTURE_GPU))

    return Panel(figure, controls, fanout_readout, title="Fan-out: n completions off one prompt")


# =============================================================================================
# Block size against fork cost
# =============================================================================================

@dataclass(frozen=True)
class ForkCost:
    """What one divergence of n branches copies at one block size, averaged over prompt lengths."""

    block_size: int
    n: int
    prompts: tuple[int, ...]  # the prompt lengths measured (one run each)
    copies: float  # blocks copied by copy-on-write, mean per divergence
    new_blocks: float  # blocks taken in that step (copies, or fresh blocks when the tail was full)
    copied_tokens: float  # token slots moved: a copy moves the whole block
    filled_tokens: float  # of those, slots holding prompt tokens (the rest is the block's empty tail)

    def copied_bytes(self, kv_bytes_per_token: int) -> float:
        return self.copied_tokens * kv_bytes_per_token

    def filled_bytes(self, kv_bytes_per_token: int) -> float:
        return self.filled_tokens * kv_bytes_per_token


def measure_fork_cost(block_size: int, n: int = 8, prompts: int | Iterable[int] | None = None) -> ForkCost:
    """Allocate a prompt, fork it n - 1 times, let every branch write one token; count the copies.

    The allocator reports each copy-on-write as (src, dst); a copy moves a whole block, of which
    `prompt % block_size` slots hold prompt tokens (a prompt ending on a block boundary copies
    nothing: every branch starts a fresh block).  `prompts` defaults to 4,096 ... 4,096 + b - 1,
    every tail fill once, so the means are over prompt lengths uniform modulo b.
    """
    n = _count("n", n, 1)
    block_size = _count("block_size", block_size, 1)
    if prompts is None:
        prompts = range(4096, 4096 + block_size)
    prompts = (prompts,) if isinstance(prompts, (int, np.integer)) else tuple(prompts)
    if not prompts:
        raise ValueError("measure_fork_cost needs at least one prompt length")
    copies = new = moved = filled = 0
    for prompt in prompts:
        prompt = _count("prompt", prompt, 1)
        alloc = BlockAllocator(-(-prompt // block_size) + n, block_size)
        alloc.allocate(0, prompt)
        for b in range(1, n):
            alloc.fork(0, b)
        before = alloc.num_used_blocks
        c = sum(r.cow is not None for r in alloc.append_slots(range(n)))
        alloc.check_invariants()
        copies += c
        new += alloc.num_used_blocks - before
        moved += c * block_size
        filled += c * (prompt % block_size)
    k = len(prompts)
    return ForkCost(block_size, n, prompts, copies / k, new / k, moved / k, filled / k)


def fork_cost_figure(costs: Sequence[ForkCost], kv_bytes_per_token: int, unit: str = "MB",
                     title: str | None = None) -> go.Figure:
    """Bytes one divergence copies against block size: whole blocks moved, and the prompt tokens in them."""
    if not costs:
        raise ValueError("no fork costs to draw")
    xs = [str(c.block_size) for c in costs]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=xs, y=[in_unit(c.copied_bytes(kv_bytes_per_token), unit) for c in costs],
                         name="copied (whole blocks)", marker_color=PALETTE["memory"],
                         customdata=[[c.copies, c.copied_tokens] for c in costs],
                         hovertemplate="b = %{x}: %{customdata[0]:.3g} copies, %{customdata[1]:,.1f} token slots, "
                                       f"%{{y:,.1f}} {unit}<extra></extra>"))
    fig.add_trace(go.Bar(x=xs, y=[in_unit(c.filled_bytes(kv_bytes_per_token), unit) for c in costs],
                         name="of which prompt tokens", marker_color=PALETTE["used"],
                         hovertemplate=f"b = %{{x}}: %{{y:,.1f}} {unit} of real tokens<extra></extra>"))
    c0 = costs[0]
    return styled(fig, title or f"One divergence of n = {c0.n} branches (mean over prompt lengths)",
                  barmode="overlay", xaxis=dict(title="block size b (tokens)", type="category"),
                  yaxis=dict(title=bytes_axis_title("copied", unit)),
                  legend=dict(yanchor="top", y=0.98, x=0.02, bgcolor="rgba(255,255,255,0.8)"),
                  margin=dict(l=110, r=40, t=90, b=80))


# =============================================================================================
# Cross-request prefix sharing: Mooncake hash_ids through the allocator's prefix index
# =============================================================================================

@dataclass
class PrefixReplay:
    """A trace's prompt blocks replayed through a prefix-caching `BlockAllocator`.

    One allocator block stands for one trace block (Mooncake: 512 tokens), and its content is
    the trace's hash id: equal chained content is exactly an equal prefix.
    """

    name: str
    num_blocks: int  # the pool; None-bounded runs use one block per requested block
    requests: int
    skipped: int  # requests longer than the whole pool
    requested_blocks: int
    hit_blocks: int
    cum_requested: np.ndarray  # after each replayed request
    cum_hits: np.ndarray
    block_tokens: int = 512

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.requested_blocks if self.requested_blocks else 0.0

    @property
    def allocated_blocks(self) -> int:
        return self.requested_blocks - self.hit_blocks


def _hash_lists(workload) -> tuple[str, list[tuple[int, ...]]]:
    name = getattr(workload, "name", "requests")
    lists = []
    for r in workload:
        ids = tuple(r.hash_ids) if hasattr(r, "hash_ids") else tuple(r)
        if not ids:
            raise ValueError(f"request {len(lists)} of {name} has no hash ids (only Mooncake traces carry them)")
        lists.append(ids)
    return name, lists


def replay_prefix_cache(workload, num_blocks: int | None = None, block_tokens: int = 512,
                        progress: bool = False) -> PrefixReplay:
    """Replay requests' `hash_ids` (or plain id lists) in order through a prefix-caching allocator.

    Each request allocates its prompt blocks with `token_ids=hash_ids` (block size 1: one id per
    block), and frees them when done; freed blocks stay in the index until the pool needs them
    (least recently freed first).  `num_blocks=None` sizes the pool to hold every requested block:
    nothing is ever evicted, the unbounded cache.  Requests are replayed one at a time, so no
    two hold blocks at once: only the index and its capacity matter here.
    """
    name, lists = _hash_lists(workload)
    total = sum(len(h) for h in lists)
    pool = total if num_blocks is None else _count("num_blocks", num_blocks, 1)
    alloc = BlockAllocator(max(1, pool), 1, enable_prefix_caching=True)
    cum_req = np.zeros(len(lists), dtype=np.int64)
    cum_hit = np.zeros(len(lists), dtype=np.int64)
    requested = hits = skipped = 0
    items = enumerate(lists)
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, total=len(lists), desc=f"prefix replay ({name})", leave=False)
    for i, ids in items:
        if len(ids) > pool:
            skipped += 1
        else:
            alloc.allocate(i, len(ids), token_ids=ids)
            requested += len(ids)
            hits += alloc.num_cached_tokens[i]
            alloc.free(i)
        cum_req[i], cum_hit[i] = requested, hits
    alloc.check_invariants()
    return PrefixReplay(name, pool, len(lists), skipped, requested, hits, cum_req, cum_hit, block_tokens)


def prefix_sharing_figure(replay: PrefixReplay, title: str | None = None, points: int = 400) -> go.Figure:
    """Cumulative prompt blocks requested against blocks the prefix index had to allocate."""
    idx = np.unique(np.linspace(0, replay.requests - 1, min(points, replay.requests)).astype(int))
    x = (idx + 1).tolist()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=replay.cum_requested[idx].tolist(), name="prompt blocks requested",
                             line=dict(color=PALETTE["neutral"], width=4)))
    fig.add_trace(go.Scatter(x=x, y=(replay.cum_requested[idx] - replay.cum_hits[idx]).tolist(),
                             name="blocks allocated (misses)", line=dict(color=PALETTE["used"], width=4),
                             fill="tonexty", fillcolor="rgba(204,121,167,0.35)"))
    fig.add_annotation(x=x[-1], y=replay.cum_requested[-1], xanchor="right", yanchor="bottom", showarrow=False,
                       text=f"<b>{100 * replay.hit_rate:.1f}% of {replay.requested_blocks:,} blocks shared</b>",
                       font=dict(size=FONT_SIZE + 2, color=PALETTE["shared"]))
    return styled(fig, title or f"Prefix index on {replay.name}",
                  xaxis=dict(title="requests replayed, in arrival order"),
                  yaxis=dict(title=f"prompt blocks ({replay.block_tokens} tokens)"),
                  legend=dict(orientation="h", yanchor="top", y=-0.3, x=0.0), height=520,
                  margin=dict(l=100, r=40, t=90, b=150))


def prefix_capacity_figure(replays: Sequence[PrefixReplay], unbounded: PrefixReplay | None = None,
                           title: str | None = None) -> go.Figure:
    """Hit rate against the index's capacity (bounded pools evict the least recently freed block)."""
    if not replays:
        raise ValueError("no replays to draw")
    rs = sorted(replays, key=lambda r: r.num_blocks)
    fig = go.Figure(go.Scatter(
        x=[r.num_blocks for r in rs], y=[100 * r.hit_rate for r in rs], mode="lines+markers+text",
        # labels below their points: clear of the axis at the left end and of the ceiling line at the right
        text=[f"{100 * r.hit_rate:.1f}%" for r in rs], textposition="bottom center", name="bounded index",
        line=dict(color=PALETTE["shared"], width=4), marker=dict(size=12),
        hovertemplate="%{x:,} blocks: %{y:.2f}% hit<extra></extra>"))
    if unbounded is not None:
        fig.add_hline(y=100 * unbounded.hit_rate, line=dict(color=PALETTE["limit"], dash="dash", width=3))
        fig.add_annotation(x=0.0, xref="paper", y=100 * unbounded.hit_rate, yanchor="bottom", xanchor="left",
                           showarrow=False, text=f"unbounded: {100 * unbounded.hit_rate:.1f}%",
                           font=dict(color=PALETTE["limit"]))
    top = max([100 * r.hit_rate for r in rs] + ([100 * unbounded.hit_rate] if unbounded else []))
    low, high = math.log10(rs[0].num_blocks), math.log10(rs[-1].num_blocks)
    pad = max(0.15, 0.08 * (high - low))  # room for the end points' labels inside the axes
    return styled(fig, title or f"Hit rate against index capacity ({rs[0].name})", showlegend=False,
                  xaxis=dict(title=f"index capacity ({rs[0].block_tokens}-token blocks, log scale)", type="log",
                             range=[low - pad, high + pad], **log_axis_ticks(rs[0].num_blocks, rs[-1].num_blocks)),
                  yaxis=dict(title="served by the index (%)", range=[0, top * 1.25]))
