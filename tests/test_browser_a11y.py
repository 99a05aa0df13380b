"""Accessibility of what labsupport draws, after Run All in Chromium (issue 21, item 8; WCAG 2.1 AA).

For every student notebook, on the page test_browser.py ran (Run All, then a keyboard move of each
panel's first slider, so what is audited has redrawn at least once):

* axe-core (bundled by axe-playwright-python) over the output areas, the panels, tables, scoreboard
  and feedback labsupport draws: no violation of serious or critical impact.  axe over the rest of
  the page, JupyterLab's own chrome, is printed and not failed on: it is not ours to fix;
* axe does not look at SVG text, so the contrast of every piece of chart text is measured here: its
  computed fill against what is painted beneath its centre (the plot's background, a bar, a heatmap
  cell, an annotation's box), at least 4.5:1, or 3:1 for large text (24 px, or 18.66 px bold);
* every chart carries a text alternative in the page (an accessible name, its takeaway).

The audit runs inside test_browser.py's test, on its page, before the page closes (one Run All for
both files); a notebook that test did not audit (run alone, `-k`) gets its own Run All here.
With $LABSUPPORT_A11Y_REPORT naming a file, the counts per notebook and rule are written there (JSON).
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest

import test_browser as tb  # the module pytest collected: its hook list is the one its test reads
from browser_support import browser  # noqa: F401  (a fixture)
from test_browser import jupyterlab, runs  # noqa: F401  (fixtures for a Run All of our own)

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

OUTPUTS = ".jp-Notebook .jp-OutputArea-output"
FAILING_IMPACTS = ("serious", "critical")
AUDITS: dict[str, dict] = {}

# WCAG 2.1 contrast, measured on what the browser drew.  The background of a piece of text is found
# by painting, in document order (SVG's paint order), every shape of the chart whose fill covers the
# text's centre; a heatmap is an <image>, so its pixel there is read back through a canvas.
_CHART_TEXT_CONTRAST = """async () => {
    const parse = c => {
        const m = /rgba?\\(([^)]+)\\)/.exec(c || '');
        if (!m) return null;
        const p = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
        return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
    };
    const lin = v => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    const lum = c => 0.2126 * lin(c[0]) + 0.7152 * lin(c[1]) + 0.0722 * lin(c[2]);
    const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
    const over = (top, alpha, under) => [0, 1, 2].map(i => Math.round(top[i] * alpha + under[i] * (1 - alpha)));  // 8-bit, as composited
    const hex = c => '#' + c.slice(0, 3).map(v => Math.round(v).toString(16).padStart(2, '0')).join('');
    const pixels = new Map();
    async function pixel(img, x, y) {
        const href = img.getAttribute('href') || img.getAttribute('xlink:href');
        if (!pixels.has(href)) {
            const im = new Image();
            im.src = href;
            await im.decode();
            const canvas = document.createElement('canvas');
            canvas.width = im.naturalWidth; canvas.height = im.naturalHeight;
            const ctx = canvas.getContext('2d');
            ctx.drawImage(im, 0, 0);
            pixels.set(href, ctx);
        }
        const ctx = pixels.get(href), r = img.getBoundingClientRect();
        const px = Math.floor((x - r.left) / r.width * ctx.canvas.width);
        const py = Math.floor((y - r.top) / r.height * ctx.canvas.height);
        const d = ctx.getImageData(Math.max(0, px), Math.max(0, py), 1, 1).data;
        return [d[0], d[1], d[2], d[3] / 255];
    }
    function fillOf(e, svg) {
        const cs = getComputedStyle(e);
        if (cs.visibility === 'hidden' || cs.display === 'none') return null;
        let fill = cs.fill;
        const url = /url\\(["']?#([^"')]+)/.exec(fill || '');
        if (url) {  // a patterned bar: the pattern's own background is what the text sits on
            const pattern = svg.ownerDocument.getElementById(url[1]);
            const back = pattern && pattern.querySelector('rect');
            fill = back ? getComputedStyle(back).fill : 'none';
        }
        const c = parse(fill);
        if (!c) return null;
        const alpha = c[3] * Number(cs.fillOpacity) * Number(cs.opacity);
        return alpha > 0 ? [c, alpha] : null;
    }
    const out = [];
    for (const [k, p] of [...document.querySelectorAll('.jp-Notebook .js-plotly-plot')].entries()) {
        const svgs = [...p.querySelectorAll('svg.main-svg')];
        if (!svgs.length) continue;
        const title = (((p.layout || {}).title || {}).text || `chart ${k}`).replace(/<[^>]+>/g, ' ').slice(0, 60);
        const paper = parse(getComputedStyle(svgs[0]).backgroundColor) || [255, 255, 255, 1];
        const shapes = svgs.flatMap(s => [...s.querySelectorAll('rect, path, image')].map(e => [e, s]))
            .map(([e, s]) => [e, e.getBoundingClientRect(), e.tagName === 'image' ? 'image' : fillOf(e, s)])
            .filter(([, r, f]) => f && r.width > 0 && r.height > 0);
        for (const svg of svgs) for (const t of svg.querySelectorAll('text')) {
            const words = (t.textContent || '').trim();
            const cs = getComputedStyle(t);
            const box = t.getBoundingClientRect();
            if (!words || !box.width || cs.visibility === 'hidden' || cs.display === 'none') continue;
            if (t.closest('.hoverlayer, .modebar, [style*="opacity: 0"]')) continue;
            const x = box.left + box.width / 2, y = box.top + box.height / 2;
            let bg = paper.slice(0, 3);
            for (const [e, r, f] of shapes) {
                if (!(e.compareDocumentPosition(t) & Node.DOCUMENT_POSITION_FOLLOWING)) continue;  // painted above
                if (x < r.left || x > r.right || y < r.top || y > r.bottom) continue;
                if (f === 'image') {
                    const c = await pixel(e, x, y);
                    if (c[3] > 0) bg = over(c, c[3], bg);
                } else {
                    const m = e.getScreenCTM();
                    const local = m ? new DOMPoint(x, y).matrixTransform(m.inverse()) : null;
                    if (local && e.isPointInFill(local)) bg = over(f[0], f[1], bg);
                }
            }
            // the text itself and any tspan that sets its own fill (a coloured <span> in plotly's text)
            const pieces = [t, ...[...t.querySelectorAll('tspan')].filter(s => /fill/.test(s.getAttribute('style') || ''))];
            for (const piece of pieces) {
                const ps = getComputedStyle(piece);
                const c = parse(ps.fill);
                if (!c || !(piece.textContent || '').trim()) continue;
                const alpha = c[3] * Number(ps.fillOpacity) * Number(cs.opacity);
                const fg = over(c, alpha, bg);
                const size = parseFloat(ps.fontSize);
                const tspans = [...piece.querySelectorAll('tspan')].filter(s => (s.textContent || '').trim());
                const bold = Number(ps.fontWeight) >= 700 ||
                    (tspans.length > 0 && tspans.every(s => Number(getComputedStyle(s).fontWeight) >= 700));
                const large = size >= 24 || (bold && size >= 18.66);
                out.push({chart: title, text: (piece.textContent || '').trim().slice(0, 40), fg: hex(fg), bg: hex(bg),
                          ratio: ratio(fg, bg), need: large ? 3 : 4.5, size, bold});
            }
        }
    }
    return out;
}"""

# A chart's text alternative: an accessible name on the chart (role img) or a description tied to it.
_CHART_ALTERNATIVES = """() => [...document.querySelectorAll('.jp-Notebook .js-plotly-plot')].map((p, k) => {
    const named = p.matches('[aria-label]') ? p : p.querySelector('[role="img"][aria-label]');
    const described = (p.getAttribute('aria-describedby') || '').split(' ').filter(Boolean)
        .map(id => (document.getElementById(id) || {}).textContent || '').join(' ');
    return {chart: (((p.layout || {}).title || {}).text || `chart ${k}`).replace(/<[^>]+>/g, ' ').slice(0, 60),
            role: named ? named.getAttribute('role') : null,
            alternative: ((named ? named.getAttribute('aria-label') : '') + ' ' + described).trim()};
})"""


def _violations(page, context) -> list[dict]:
    from axe_playwright_python.sync_playwright import Axe

    return Axe().run(page, context=context).response["violations"]


def _counts(violations) -> dict[str, int]:
    """Nodes per rule, keyed 'rule (impact)'."""
    return dict(Counter({f"{v['id']} ({v['impact']})": len(v["nodes"]) for v in violations}))


def audit(page, name: str) -> dict:
    """axe over our outputs and over the rest, the contrast of every chart text, each chart's alternative."""
    page.wait_for_timeout(300)  # one frame for the names set after the last redraw
    started = time.perf_counter()
    ours = _violations(page, {"include": [[OUTPUTS]]}) if page.locator(OUTPUTS).count() else []
    # JupyterLab's own page is the same around every notebook: audited once a session unless a report is asked for
    report = bool(os.environ.get("LABSUPPORT_A11Y_REPORT"))
    chrome = _violations(page, {"exclude": [[OUTPUTS]]}) if report or not AUDITS else None
    texts = page.evaluate(_CHART_TEXT_CONTRAST)
    alternatives = page.evaluate(_CHART_ALTERNATIVES)
    return {"ours": ours, "chrome": chrome, "texts": texts, "alternatives": alternatives,
            "seconds": time.perf_counter() - started}


def _record(page, name: str) -> None:
    try:
        AUDITS[name] = audit(page, name)
    except Exception as exc:  # reported by this file's test, never a failure of the page's own test
        AUDITS[name] = {"error": f"{type(exc).__name__}: {exc}"}


tb.AFTER_CHECKS.append(_record)


def _write_report(name: str, result: dict) -> None:
    path = os.environ.get("LABSUPPORT_A11Y_REPORT")
    if not path:
        return
    report = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    low = [t for t in result["texts"] if t["ratio"] < t["need"]]
    report[name[:-6]] = {
        "axe, outputs": _counts(result["ours"]), "axe, JupyterLab": _counts(result["chrome"] or []),
        "axe, outputs, where": {v["id"]: [n["target"] for n in v["nodes"][:3]] for v in result["ours"]},
        "chart texts": len(result["texts"]), "chart texts below WCAG": len(low),
        "lowest": sorted(({k: t[k] for k in ("chart", "text", "fg", "bg", "ratio")} for t in low),
                         key=lambda t: t["ratio"])[:8],
        "charts": len(result["alternatives"]),
        "charts without an alternative": sum(not a["alternative"] for a in result["alternatives"])}
    Path(path).write_text(json.dumps(report, indent=1, ensure_ascii=False))


@pytest.mark.parametrize("name", tb.STUDENT_NOTEBOOKS, ids=lambda n: n[:-6])
def test_outputs_accessible(request, name):
    if name not in AUDITS:  # test_browser.py did not audit it: a Run All of our own
        run = request.getfixturevalue("runs")
        run.start(name)
        page, _, _ = run.finish(name)
        try:
            page.wait_for_function(tb._ALL_RENDERED, timeout=180_000, polling=100)
            _record(page, name)
        finally:
            run.close(name, page)
    result = AUDITS[name]
    assert "error" not in result, f"{name}: the audit did not run: {result.get('error')}"
    _write_report(name, result)
    print(f"{name}: axe over the outputs {_counts(result['ours']) or 'clean'}; over JupyterLab's own page "
          f"(not ours, not failed on) {'as before' if result['chrome'] is None else _counts(result['chrome']) or 'clean'}; {len(result['texts'])} chart texts, "
          f"{len(result['alternatives'])} charts; audit {result['seconds']:.1f} s")
    problems = [f"axe {v['id']} ({v['impact']}): {v['help']}; {len(v['nodes'])} element(s), e.g. "
                f"{v['nodes'][0]['target']} {v['nodes'][0].get('failureSummary', '')[:160]!r}"
                for v in result["ours"] if v["impact"] in FAILING_IMPACTS]
    problems += [f"chart {t['chart']!r}: text {t['text']!r} {t['fg']} on {t['bg']} is {t['ratio']:.2f}:1 "
                 f"< {t['need']}:1 ({t['size']:.0f} px{' bold' if t['bold'] else ''})"
                 for t in result["texts"] if t["ratio"] < t["need"]]
    problems += [f"chart {a['chart']!r} has no text alternative" for a in result["alternatives"]
                 if len(a["alternative"].split()) < 3]
    assert not problems, f"{name}:\n" + "\n".join(problems[:60])
