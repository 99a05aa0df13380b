"""Outputs a screen reader can read and anyone can see (WCAG 2.1 AA; every lab's panels and figures).

Three things, applied where every figure and panel is made so no lab has to remember them:

* `legible(fig)`: chart text meets WCAG's contrast against what it sits on (4.5:1; 3:1 for large
  text: 24 px, or 18.66 px bold).  Marks keep the Okabe–Ito colours; text in one of them is drawn
  in a darker shade of the same hue (`ink`), and text inside a bar takes white or near-black, whichever
  reads on that bar.
* `describe(fig)`: a one-sentence text alternative, the chart's takeaway (its title) and what it draws,
  kept in ``layout.meta["alt"]`` so it travels and updates with the figure.
* `Namer`: a hidden widget in every panel whose script names what ipywidgets leaves unnamed (slider
  handles: their label, with its unit, and their readout as the value; the Play widget's icon buttons)
  and gives each chart on the page ``role="img"`` with its ``meta.alt`` as the accessible name.  It
  watches the page, so names follow every redraw.
"""
from __future__ import annotations

import html
import re

import plotly.graph_objects as go

NORMAL_TEXT = 4.5  # WCAG 2.1 AA, 1.4.3
LARGE_TEXT = 3.0
LARGE_PX, LARGE_BOLD_PX = 24, 18.66
WHITE, DARK = "#FFFFFF", "#111111"

_NAMED = {"white": "#FFFFFF", "black": "#000000"}


def rgba(colour) -> tuple[int, int, int, float] | None:
    """#RGB, #RRGGBB, rgb()/rgba() or white/black as (r, g, b, alpha); None for what cannot be judged here."""
    c = _NAMED.get(str(colour).strip().lower(), str(colour).strip())
    if re.fullmatch(r"#[0-9a-fA-F]{3}", c):
        return (*(int(ch * 2, 16) for ch in c[1:]), 1.0)
    if re.fullmatch(r"#[0-9a-fA-F]{6}", c):
        return (*(int(c[i:i + 2], 16) for i in (1, 3, 5)), 1.0)
    m = re.fullmatch(r"rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*(?:,\s*([\d.]+)\s*)?\)", c)
    if m:
        return (*(round(float(v)) for v in m.groups()[:3]), 1.0 if m[4] is None else float(m[4]))
    return None


def rgb(colour) -> tuple[int, int, int] | None:
    """An opaque colour as (r, g, b); None for a translucent one or one that cannot be judged here."""
    c = rgba(colour)
    return c[:3] if c is not None and c[3] == 1 else None


def over(colour, alpha: float, ground: str) -> str:
    """`colour` painted at `alpha` over the opaque `ground`, as #RRGGBB."""
    top, under = rgba(colour), rgb(ground)
    a = alpha * top[3]
    return "#" + "".join(f"{int(t * a + u * (1 - a) + 0.5):02X}" for t, u in zip(top[:3], under))  # half up, as browsers blend


def luminance(colour: str) -> float:
    """WCAG 2.1's relative luminance of an sRGB colour."""
    def channel(v: int) -> float:
        s = v / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = rgb(colour)
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio, 1 to 21."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def needed(size_px: float, bold: bool = False) -> float:
    return LARGE_TEXT if size_px >= LARGE_PX or (bold and size_px >= LARGE_BOLD_PX) else NORMAL_TEXT


def ink(colour: str, on: str = WHITE, ratio: float = NORMAL_TEXT) -> str:
    """`colour` as text on `on`: itself when it reads, else the same hue mixed toward black (or white,
    on a dark ground) in 1% steps until it does.  Colours this module cannot parse are returned as given."""
    base = rgb(colour)
    if base is None or rgb(on) is None or contrast(colour, on) >= ratio:
        return colour
    toward = 255 if luminance(on) < 0.18 else 0
    for step in range(1, 101):
        t = step / 100
        mixed = "#" + "".join(f"{round(v + (toward - v) * t):02X}" for v in base)
        if contrast(mixed, on) >= ratio:
            return mixed
    return "#000000" if toward == 0 else WHITE


def on_fill(fill: str, wanted: str | None = None, ratio: float = NORMAL_TEXT) -> str | None:
    """Text colour for text drawn on `fill` (inside a bar): `wanted` if it reads, else white or near-black,
    whichever contrasts more.  None when `fill` cannot be judged."""
    if rgb(fill) is None:
        return wanted
    if wanted and rgb(wanted) and contrast(wanted, fill) >= ratio:
        return wanted
    return max((WHITE, DARK), key=lambda c: contrast(c, fill))


def _bold(text) -> bool:
    t = str(text or "").strip()
    return t.startswith("<b>") and t.endswith("</b>")


def _font_px(font, default: float) -> float:
    return font.size if font is not None and font.size is not None else default


def _grounds(fig: go.Figure, paper: str) -> list[str]:
    """What free text in the plot may sit on: its background and each light fill over it (a shaded
    band, a filled area); text is inked against all of them."""
    fills = [(s.fillcolor, 1 if s.opacity is None else s.opacity) for s in fig.layout.shapes or () if s.fillcolor]
    for t in fig.data:
        if getattr(t, "fill", None) in (None, "none") and not getattr(t, "stackgroup", None):
            continue
        # plotly's default fill: the line's (or marker's) colour at half opacity
        colour = t.fillcolor or t.line.color or t.marker.color
        if isinstance(colour, str):
            fills.append((colour, (1 if t.opacity is None else t.opacity) * (1 if t.fillcolor else 0.5)))
    grounds = [paper] + [over(c, a, paper) for c, a in fills if rgba(c) is not None]
    return [g for g in dict.fromkeys(grounds) if luminance(g) >= 0.18]  # text is not put on dark fills


def _ink_all(colour: str, grounds: list[str], ratio: float) -> str:
    for ground in grounds:
        colour = ink(colour, ground, ratio)
    return colour


def legible(fig: go.Figure) -> go.Figure:
    """Darken or swap every text colour of `fig` that would fall below WCAG's contrast on its ground."""
    layout = fig.layout
    base_px = _font_px(layout.font, 12) if layout.font.size else _font_px(layout.template.layout.font, 12)
    paper = layout.plot_bgcolor or layout.template.layout.plot_bgcolor or WHITE
    if rgb(paper) is None:
        paper = WHITE
    grounds = _grounds(fig, paper)

    for annotation in layout.annotations or ():
        colour = annotation.font.color
        boxed = [annotation.bgcolor] if annotation.bgcolor and rgb(annotation.bgcolor) else grounds
        if colour:
            annotation.font.color = _ink_all(colour, boxed, needed(_font_px(annotation.font, base_px),
                                                                   _bold(annotation.text)))
    if layout.title.font.color:
        layout.title.font.color = ink(layout.title.font.color, paper, needed(_font_px(layout.title.font, 24)))
    if layout.legend.font.color:
        layout.legend.font.color = ink(layout.legend.font.color, paper)
    for axis in [getattr(layout, k) for k in layout if re.fullmatch(r"[xy]axis\d*", k)]:
        if axis.color:  # an axis drawn in a series' colour: its ticks and title are text in it
            axis.color = ink(axis.color, paper)
        if axis.tickfont.color:
            axis.tickfont.color = ink(axis.tickfont.color, paper)
        if axis.title.font.color:
            axis.title.font.color = ink(axis.title.font.color, paper)

    for trace in fig.data:
        if getattr(trace, "text", None) is None and getattr(trace, "texttemplate", None) is None:
            continue
        font = getattr(trace, "textfont", None)
        if font is None:
            continue
        px = _font_px(font, base_px)
        wanted = font.color if isinstance(font.color, str) else None
        if trace.type == "bar":
            _bar_text(trace, wanted, px, paper)
        elif trace.type in ("scatter", "scattergl") and wanted:
            font.color = _ink_all(wanted, grounds, needed(px))
    return fig


def _bar_text(trace, wanted: str | None, px: float, paper: str) -> None:
    """Text inside a bar reads on that bar's colour; text outside it on the plot's background."""
    position = trace.textposition if isinstance(trace.textposition, str) else "auto"
    ratio = needed(px)
    if position in ("inside", "auto"):
        fill = trace.marker.color
        if isinstance(fill, str):
            colour = on_fill(fill, wanted, ratio)
        elif fill is not None:
            colour = [on_fill(f, wanted, ratio) if isinstance(f, str) else wanted for f in fill]
        else:
            colour = None
        if colour is not None:
            trace.insidetextfont = dict(color=colour, size=px)
    if position in ("outside", "auto"):
        trace.outsidetextfont = dict(color=ink(wanted or DARK, paper, ratio), size=px)


# --- text alternatives ---------------------------------------------------------------------------

_KINDS = {"bar": "bar chart", "scatter": "line chart", "heatmap": "grid", "pie": "pie chart",
          "histogram": "histogram"}


def plain(text) -> str:
    """Plotly's rich text as one plain line."""
    t = re.sub(r"<br\s*/?>", " ", str(text or ""))
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", t)).split())


def describe(fig: go.Figure) -> str:
    """One sentence: the chart's takeaway (its title) and what it draws: the kind, axes, series."""
    title = plain(fig.layout.title.text)
    kinds = []
    for trace in fig.data:
        kind = _KINDS.get(trace.type, f"{trace.type} chart")
        if trace.type == "scatter" and trace.mode and "lines" not in trace.mode:
            kind = "labels" if trace.mode == "text" else "points"
        if any(trace.x or ()) or any(trace.y or ()) or trace.type in ("heatmap", "pie"):
            kinds.append(kind)
    kind = " and ".join(dict.fromkeys(kinds)) or "drawing"
    axes = []
    for letter in "xy":
        axis = getattr(fig.layout, f"{letter}axis")
        name = plain(axis.title.text)
        if name and axis.visible is not False:
            axes.append(name)
    names = [plain(t.name) for t in fig.data if t.name and t.showlegend is not False]
    what = f"{kind} of {' against '.join(reversed(axes))}" if axes else kind
    series = f"; series: {', '.join(dict.fromkeys(names))}" if names else ""
    return f"{title.rstrip('.')}. Shown as a {what}{series}." if title else f"A {what}{series}."


def alternative(fig: go.Figure) -> go.Figure:
    """Keep `describe(fig)` in the figure's meta, where the page's script reads it for the chart's name."""
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    fig.update_layout(meta={**meta, "alt": describe(fig)})
    return fig


# --- names in the page ---------------------------------------------------------------------------

# ipywidgets 8.1 draws a slider's handle as noUiSlider's <div role="slider"> with no name, and the
# Play widget's buttons as bare icons; plotly draws a chart as SVG with no role.  One observer per page
# (installed by the first Namer view) names them all, again after every change of the page.
# anywidget (0.9-0.11) gives every model a fixed 2 s to start, then ignores every message the kernel
# sends it: a chart whose start-up lost that race under Run All never redraws, and no error reaches
# the student.  The Namer is the page's first widget (made at import), so its module lengthens that
# one deadline, for the models made after it, to what a busy laptop or a loaded CI machine needs.
START_UP_DEADLINE_MS = 30_000
_ESM = r"""
if (!AbortSignal.__labsupportPatient) {
  const timeout = AbortSignal.timeout.bind(AbortSignal);
  AbortSignal.timeout = ms => timeout(ms === 2000 ? %d : ms);  // 2000: anywidget's start-up deadline
  AbortSignal.__labsupportPatient = true;
}
const ICONS = {"fa-play": "play", "fa-pause": "pause", "fa-stop": "stop", "fa-retweet": "repeat"};
const set = (e, k, v) => { if (v && e.getAttribute(k) !== v) e.setAttribute(k, v); };
const words = e => e ? (e.getAttribute("title") || e.textContent || "").trim() : "";

function nameAll() {
  for (const s of document.querySelectorAll(".lab-panel .widget-slider")) {
    const label = words(s.querySelector(".widget-label"));
    const readout = words(s.querySelector(".widget-readout"));
    for (const h of s.querySelectorAll('[role="slider"]')) {
      set(h, "aria-label", label);
      set(h, "aria-valuetext", readout);
    }
  }
  for (const p of document.querySelectorAll(".lab-panel .widget-play")) {
    const slider = words(p.closest(".lab-controls")?.querySelector(".widget-slider .widget-label"));
    for (const b of p.querySelectorAll("button")) {
      const icon = [...(b.querySelector("i")?.classList || [])].find(c => c in ICONS);
      const name = ICONS[icon] ? ICONS[icon] + (slider ? ` (${slider})` : "") : "";
      set(b, "aria-label", name);
      set(b, "title", name);
      if (icon === "fa-retweet") set(b, "aria-pressed", String(b.classList.contains("mod-active")));
    }
  }
  for (const plot of document.querySelectorAll(".js-plotly-plot")) {
    const alt = plot.layout?.meta?.alt;
    const svg = plot.querySelector("svg.main-svg");
    if (!alt || !svg) continue;
    set(svg, "role", "img");
    set(svg, "aria-label", alt);
  }
}

function install() {
  if (window.__labsupportNamer) return;
  let queued = false;
  const later = () => { if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; nameAll(); }); } };
  window.__labsupportNamer = new MutationObserver(later);
  window.__labsupportNamer.observe(document.body, {childList: true, subtree: true, characterData: true,
                                                   attributes: true, attributeFilter: ["aria-valuenow", "class"]});
  later();
}

export default { render() { install(); } };
""".replace("%d", str(START_UP_DEADLINE_MS))

_namer = None


def namer():
    """The page's one Namer widget (hidden); every panel shows it, the first view installs the observer."""
    global _namer
    if _namer is None:
        import anywidget
        import ipywidgets as widgets

        class Namer(anywidget.AnyWidget):
            _esm = _ESM

            def __repr__(self) -> str:  # the default repr holds a memory address, which a stored output must not
                return "Namer() (hidden: names every chart on the page)"

        _namer = Namer(layout=widgets.Layout(display="none"))
    return _namer


def start_early() -> bool:
    """In a kernel, create the Namer now (at ``import labsupport.viz``), before any chart: anywidget gives
    a model 2 s to start in the page, and a page busy drawing a panel's first FigureWidget can take longer.
    Elsewhere (tests, the command line) nothing happens.  True when it was created."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:
        return False
    namer()
    return True
