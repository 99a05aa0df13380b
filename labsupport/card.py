"""The course card: the one GPU and the one model the labs are posed on (every §; issue 37).

The lecture teaches on an H100 SXM with a 7B MHA model.  A course may teach the same lecture on another card
(next term's H200 with Llama 3 8B): `course.toml` at the repository's root names it, once, from the catalogue
in `specs.py`, and everything that says "the card" reads it here: the labs' givens, the panels', commands' and
benchmarks' defaults, the graders and the board.  What the lecture printed stays the lecture's
(`specs.LECTURE_7B`, `specs.LECTURE_GPU`, the errata in `ledger`).

The card is found at `$LABSUPPORT_COURSE` (a path to a TOML file) when set, else at `course.toml` beside the
package, else it is the lecture's own (an installed package with no file beside it).
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from labsupport.specs import (GB, LECTURE_7B, LECTURE_GPU, LECTURE_MFU, LECTURE_RESERVED_BYTES, MODELS, GPUSpec,
                              ModelSpec, get_gpu, get_model)

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10 takes the tomli backport (pyproject.toml)
    import tomli as tomllib

ENV = "LABSUPPORT_COURSE"
DEFAULT_PATH = Path(__file__).resolve().parent.parent / "course.toml"
PACKAGED_PATH = Path(__file__).resolve().parent / "course.toml"  # written into a sandbox's copy of the package
KEYS = ("gpu", "model")
# The lecture's GQA variant keeps 8 KV heads (§10.5, Exercise 1); an MHA card model is contrasted with that.
GQA_KV_HEADS = 8
# §10.2's long-context advertisement, in tokens: lab 02 asks what raising S_max to it costs the chat workload, so
# the card must hold at least one sequence of it in the MHA form (its givens' S_MAX_LONG reads it here).
LONG_CONTEXT = 32_768


class CardError(ValueError):
    """course.toml is unreadable or names what the catalogue lacks: one line, with file:line."""


@dataclass(frozen=True)
class Card:
    """The course's GPU and model.  The reserve (§10.2's 4 GB) and the MFU (§10.5's 50%) stay the lecture's."""

    gpu: GPUSpec
    model: ModelSpec
    source: str = "the lecture's card"

    @property
    def contrast(self) -> ModelSpec:
        """The same model with the other attention: an MHA model with 8 KV heads (the lecture's GQA-8), a GQA
        model with full KV heads (its MHA counterpart, named '-mha'); weights and query heads unchanged."""
        m = self.model
        if m.num_kv_heads == m.num_heads:
            kv = GQA_KV_HEADS if m.num_heads % GQA_KV_HEADS == 0 and m.num_heads > GQA_KV_HEADS else 1
            named = MODELS.get(f"{m.name}-gqa{kv}")
            return named if named is not None and named.num_kv_heads == kv else m.with_kv_heads(kv)
        return m.with_kv_heads(m.num_heads, f"{m.name}-mha")

    @property
    def mha(self) -> ModelSpec:
        """Of the model and its contrast, the one with more KV heads."""
        return self.model if self.model.num_kv_heads >= self.contrast.num_kv_heads else self.contrast

    @property
    def gqa(self) -> ModelSpec:
        """Of the model and its contrast, the one with fewer KV heads."""
        return self.contrast if self.mha is self.model else self.model

    @property
    def is_lecture(self) -> bool:
        """True on the lecture's own card, where the labs' numbers are the lecture's printed ones."""
        return self.gpu == LECTURE_GPU and self.model == LECTURE_7B

    @property
    def slow_link_bandwidth(self) -> float:
        """§10.5 Exercise 4's slower host link, B/s per direction: the fastest PCIe rate (32, 16, 8, 4, 2, 1 GB/s)
        below the card's own link and below 90% of the link at which the MHA form's swap costs what recomputing
        its weights does (kv·F/N, F the achieved FLOP/s), so that swapping stops winning at a positive length
        (the lecture's card: 32 GB/s, under its 38.5)."""
        m = self.mha
        edge = m.kv_bytes_per_token * LECTURE_MFU * self.gpu.peak_flops / m.num_params
        return next((gb * GB for gb in (32, 16, 8, 4, 2, 1) if gb * GB < min(self.gpu.link_bandwidth, 0.9 * edge)),
                    0.5 * GB)

    @property
    def long_context(self) -> int:
        """§10.2's long-context S_max in tokens (lab 02's S_MAX_LONG), the same on every card."""
        return LONG_CONTEXT

    def models(self) -> dict[str, ModelSpec]:
        """The card's model and its contrast by name: what a panel's model menu offers first."""
        return {self.model.name: self.model, self.contrast.name: self.contrast}


def path() -> Path | None:
    """Where the card is read from: $LABSUPPORT_COURSE, else course.toml beside the package, else the copy inside
    it (the one a grading sandbox's copy of the package carries), else none."""
    named = os.environ.get(ENV, "").strip()
    if named:
        return Path(named)
    return next((p for p in (DEFAULT_PATH, PACKAGED_PATH) if p.is_file()), None)


def _line(text: str, key: str) -> int:
    """The line of `key = …` in the file, for the error (1 when it is not there)."""
    found = re.search(rf"^\s*{re.escape(key)}\s*=", text, flags=re.M)
    return text.count("\n", 0, found.start()) + 1 if found else 1


def parse(text: str, where: str) -> Card:
    """A card from course.toml's text; CardError naming where:line and the bad value otherwise."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CardError(f"{where}: not TOML: {exc}") from None
    table = doc.get("card")
    if not isinstance(table, dict):
        raise CardError(f"{where}:1: no [card] table (it names gpu = \"…\" and model = \"…\")")
    extra = sorted(set(table) - set(KEYS))
    if extra:
        raise CardError(f"{where}:{_line(text, extra[0])}: unknown key {extra[0]!r} in [card]; it takes "
                        f"{' and '.join(KEYS)}")
    for key in KEYS:
        if not isinstance(table.get(key), str):
            raise CardError(f"{where}:{_line(text, key)}: [card] {key} must be a catalogue name in quotes")
    try:
        gpu = get_gpu(table["gpu"])
    except ValueError as exc:
        raise CardError(f"{where}:{_line(text, 'gpu')}: {exc}") from None
    try:
        model = get_model(table["model"])
    except ValueError as exc:
        raise CardError(f"{where}:{_line(text, 'model')}: {exc}") from None
    budget = gpu.hbm_bytes - model.weight_bytes - LECTURE_RESERVED_BYTES
    if budget <= 0:
        raise CardError(f"{where}:{_line(text, 'model')}: {model.name}'s weights ({model.weight_bytes / 1e9:.2f} GB) "
                        f"and the reserve leave no KV budget on {gpu.name} ({gpu.hbm_bytes / 1e9:g} GB)")
    card = Card(gpu, model, where)
    long = LONG_CONTEXT * card.mha.kv_bytes_per_token
    if budget < long:
        raise CardError(f"{where}:{_line(text, 'model')}: one {LONG_CONTEXT:,}-token sequence of {card.mha.name} "
                        f"(lab 02's long context, §10.2) needs {long / 1e9:.2f} GB of KV and {gpu.name} leaves "
                        f"{budget / 1e9:.2f} GB beside the weights and the reserve: choose a larger GPU or a "
                        f"smaller model")
    return card


@functools.lru_cache(maxsize=None)
def _load(where: str | None) -> Card:
    if where is None:
        return Card(LECTURE_GPU, LECTURE_7B)
    p = Path(where)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CardError(f"{where}: cannot read the course card: {exc.strerror or exc}") from None
    return parse(text, p.name if p in (DEFAULT_PATH, PACKAGED_PATH) else str(p))


def card() -> Card:
    """The course card (read once per path; see the module's docstring for where it is found)."""
    found = path()
    return _load(None if found is None else str(found))


def card_text() -> str:
    """The card as course.toml states it (the lecture's, written out, where no file names one): what a copy of the
    package carries into a grading sandbox, so that student code there sees the card the graders use."""
    found = path()
    if found is not None:
        return found.read_text(encoding="utf-8")
    c = card()
    return f'[card]\ngpu = "{c.gpu.name}"\nmodel = "{c.model.name}"\n'


def model(name: str | None = None) -> ModelSpec:
    """A catalogue model by name (or the card's contrast by its name), or the card's model."""
    if name is None:
        return card().model
    own = card().models()
    key = name.strip().lower() if isinstance(name, str) else None
    return own[key] if key in own else get_model(name)


def gpu(name: str | None = None) -> GPUSpec:
    """A catalogue GPU by name, or the card's GPU."""
    return card().gpu if name is None else get_gpu(name)

