"""The board's live demo (lab 99): a real model's reply streamed through the labs' engine, on a button.

Below the deck, folded, and out of its staging: the deck's segments never run a model, and the demo is not
one of them.  Opened (the 46–58 segment, §10.5's loop, is where it fits), it holds a prompt (by default a
question about paging), a length and a button; the button loads SmolLM2-135M-Instruct
(`labsupport.pretrained`: about a second once its weights are cached on disk, a few seconds the first time) and
streams its reply through `Engine` and `PagedKVCache` as the labs do, one token a step: the text grows at the
room's text size, and the line under it says the step, the KV blocks the reply holds and their bytes (§10.2's
23,040 B a token in bf16).  Nothing loads or runs at Run All (the board stays fast); where the model is not
installed the line under the button names the install command instead.

A widget lives in the kernel, so beside it stand a note and a static copy (`labsupport.viz.reopen`): a
notebook reopened without its kernel shows what the demo is, not a widget error.
"""
from __future__ import annotations

import html
import time

from labsupport.viz import PALETTE
from labsupport.viz.board.views import TEXT_CSS

TITLE = "Live demo (46–58, the engine loop): SmolLM2-135M streams its reply through the engine"
DEFAULT_PROMPT = ("In two sentences: why does a serving engine keep its KV cache in fixed-size blocks, "
                  "like an operating system's pages?")
MAX_TOKENS = 64
BLOCK_SIZE = 16
_CSS = f"""<style>
.board-live, .board-live .widget-html-content, .board-live textarea, .board-live .widget-button,
.board-live .widget-label, .board-live input {{ font-size: {TEXT_CSS}; line-height: 1.3; }}
.board-live textarea {{ height: auto; min-height: 3.2em; }}
.board-live .widget-button {{ height: auto; padding: 2px 14px; border: 2px solid {PALETTE["compute"]};
    background: white; color: #1a1a1a; border-radius: 6px; }}
.board-live .board-live-reply {{ border-left: 8px solid {PALETTE["used"]}; padding: 2px 12px; margin: 4px 0;
    white-space: pre-wrap; min-height: 1.3em; }}
.board-live .board-live-status {{ color: #444444; }}
</style>"""


def _load():
    from labsupport import pretrained

    return pretrained.load_smollm2(dtype=pretrained.LAB_DTYPE)


class LiveDemo:
    """A prompt, a length and a button; pressing it streams the model's reply through the engine.

    `load` returns (model, tokenizer) as `labsupport.pretrained.load_smollm2` does; it is called on the first
    press, never before.  `run()` is what the button does, and returns the reply's text ("" when the model is
    not installed: the status line then names the install command).
    """

    def __init__(self, prompt: str = DEFAULT_PROMPT, max_tokens: int = MAX_TOKENS, load=None):
        import ipywidgets as widgets

        self._load = _load if load is None else load
        self._loaded = None
        self.prompt = widgets.Textarea(value=prompt, layout=widgets.Layout(width="100%"))
        self.max_tokens = widgets.BoundedIntText(value=max_tokens, min=1, max=512, description="new tokens",
                                                 layout=widgets.Layout(width="auto"))
        self.button = widgets.Button(description="Stream the reply", tooltip="load SmolLM2-135M (once) and stream")
        self.reply = widgets.HTML('<div class="board-live-reply"></div>')
        self.status = widgets.HTML(self._status_html("Nothing has run yet: the model loads on the first press."))
        self.button.on_click(lambda _button: self.run())
        body = widgets.VBox([widgets.HTML(_CSS), self.prompt, widgets.HBox([self.button, self.max_tokens]),
                             self.reply, self.status])
        body.add_class("board-live")
        self.widget = widgets.Accordion(children=[body], titles=(TITLE,), selected_index=None)

    @staticmethod
    def _status_html(text: str) -> str:
        return f'<div class="board-live-status">{html.escape(text)}</div>'

    def _say(self, text: str) -> None:
        self.status.value = self._status_html(text)

    def _show(self, text: str) -> None:
        self.reply.value = f'<div class="board-live-reply">{html.escape(text)}</div>'

    def run(self) -> str:
        """Load the model if need be, then stream the reply to the prompt box's text; returns the reply."""
        from labsupport.engine import Engine
        from labsupport.pretrained import TextStream
        from labsupport.sampling import SamplingParams

        self.button.disabled = True
        try:
            if self._loaded is None:
                self._say("Loading SmolLM2-135M-Instruct …")
                try:
                    self._loaded = self._load()
                except FileNotFoundError as exc:  # not installed: say how to install it, in one line
                    self._say(str(exc))
                    return ""
            model, tok = self._loaded
            text = self.prompt.value.strip() or DEFAULT_PROMPT
            ids = tok.chat(text)
            new = min(int(self.max_tokens.value), model.cfg.max_seq_len - len(ids) + 1)
            if new < 1:
                self._say(f"The prompt's {len(ids):,} tokens fill the model's context of {model.cfg.max_seq_len:,}.")
                return ""
            engine = Engine(model, num_blocks=-(-(len(ids) + new - 1) // BLOCK_SIZE), block_size=BLOCK_SIZE,
                            watermark=0.0, record_token_times=False)
            per_token = engine.cache.kv_bytes_per_token
            stream, shown = TextStream(tok), ""
            engine.add_request(ids, new, sampling=SamplingParams(temperature=0.0, stop_token_ids=tok.stop_ids))
            self._show("")
            asked, first, count = time.perf_counter(), None, 0
            for out, _ in engine.iterations():
                for event in out.tokens or ():
                    count += 1
                    if event.token not in tok.stop_ids:
                        shown += stream.push(event.token)
                first = time.perf_counter() - asked if first is None else first
                used = engine.allocator.num_used_blocks
                self._show(shown)
                self._say(f"step {engine.counters.steps}: {count} tokens; {used} KV blocks of {BLOCK_SIZE} in use "
                          f"= {used * BLOCK_SIZE * per_token / 1e6:.2f} MB ({per_token:,} B a token)")
            elapsed = time.perf_counter() - asked
            peak = engine.counters.peak_blocks
            rate = f", then {(count - 1) / (elapsed - first):.1f} tokens/s" if count > 1 and elapsed > first else ""
            self._say(f"{len(ids):,} prompt + {count} new tokens; first token after {first:.2f} s{rate}; the reply "
                      f"held at most {peak} KV blocks of {BLOCK_SIZE} = {peak * BLOCK_SIZE * per_token / 1e6:.2f} MB, "
                      f"all given back")
            return shown
        finally:
            self.button.disabled = False

    def text(self) -> str:
        return f"{TITLE} (press the button to stream; nothing runs before)"

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        return bundle

    def _ipython_display_(self):
        """The live demo; in JupyterLab beside it its note and a static copy (hidden while it is live; shown after a
        reopen).  Voila never saves a page: there it shows the demo alone."""
        from IPython.display import display

        from labsupport.viz import reopen
        from labsupport.viz.board.deck import in_voila

        if in_voila():
            display(self._repr_mimebundle_(), raw=True)
            return

        copy = reopen.Copy({"text/html": f"<b>{html.escape(TITLE)}</b><br>Default prompt: "
                                         f"<i>{html.escape(DEFAULT_PROMPT)}</i>",
                            "text/plain": f"{TITLE}. Default prompt: {DEFAULT_PROMPT}"})
        note = reopen.NoteCopy("Below, what the live demo streams (it runs only when its button is pressed).")
        reopen.show_live(self._repr_mimebundle_(), note, [copy])
