"""Figures: titles, axis labels with units, config legends, one colour per config across
figures, the "simulated" stamp, and Skip (never an empty figure) when data is missing."""

from __future__ import annotations

import copy

import pytest
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from synthetic_study import SyntheticSpec, write_study

from connector_tax.analysis import build
from connector_tax.contract.layout import FIGURES as CONTRACT_FIGURES
from connector_tax.plots import build_figure, make_figures
from connector_tax.plots.figures import FIGURES, Skip
from connector_tax.plots.style import Palette, describe

CONFIGS = ["plain", "noop_connector", "mooncake_both", "nixl_both", "lmcache_only", "multi_mooncake_lmcache"]


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    spec = SyntheticSpec(
        variants=CONFIGS, n_requests=200, n_steps=300, shapes=[(512, 64), (4096, 64), (512, 256)], seed=21
    )
    built = build(write_study(tmp_path_factory.mktemp("plots") / "s", spec))
    return built["aggregate"], built["hypotheses"]


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_figure_is_titled_and_labelled(docs, name):
    agg, hyp = docs
    fig = build_figure(name, agg, hyp)
    assert isinstance(fig, Figure)
    meta = describe(fig)
    plots = [a for a in meta["axes"] if not a.get("colorbar") and not a.get("legend_holder")]
    visible = [
        a
        for a, ax in zip(meta["axes"], fig.axes)
        if ax.get_visible() and not a.get("colorbar") and not a.get("legend_holder")
    ]
    assert plots and visible
    assert meta["suptitle"] or all(a["title"] for a in visible)
    assert "SIMULATED" in (meta["suptitle"] + " ".join(a["title"] for a in visible))
    assert "SIMULATED" in meta["texts"]  # drawn across the canvas
    for a in visible:
        assert a["xlabel"] and a["ylabel"], (name, a)
    units = " ".join(a["xlabel"] + a["ylabel"] for a in visible)
    assert any(u in units for u in ("(ms", "(req/s", "(%)", "(µs", "(tokens)", "CDF")), units
    legends = [t for a in meta["axes"] for t in a.get("legend", [])]
    titles = [a.get("title", "") for a in meta["axes"]]
    names_shown = set(legends) | set(titles) | {t.get_text() for ax in fig.axes for t in ax.get_xticklabels()}
    assert names_shown & set(CONFIGS), name


def test_one_colour_per_config_across_figures(docs):
    agg, hyp = docs
    palette = Palette(agg["variants"])
    fig1 = build_figure("fig1_ttft_p90_vs_rate", agg, hyp)
    line_colours = {c.get_label(): to_rgba(c.lines[0].get_color()) for c in fig1.axes[0].containers}
    assert set(line_colours) == set(CONFIGS)
    for name, colour in line_colours.items():
        assert colour == to_rgba(palette(name))
    fig6 = build_figure("fig6_step_latency_cdf", agg, hyp)
    for ln in fig6.axes[0].get_lines():
        assert to_rgba(ln.get_color()) == line_colours[ln.get_label()]
    assert len({palette(c) for c in CONFIGS}) == len(CONFIGS)


def test_not_simulated_says_what_served_it(docs):
    agg, hyp = copy.deepcopy(docs)
    agg["simulated"] = False
    agg["served_by"] = "vLLM 0.32.0 on CPU, dummy weights"
    for name in ("fig3_throughput_vs_requested", "fig6_step_latency_cdf"):
        meta = describe(build_figure(name, agg, hyp))
        assert "SIMULATED" not in meta["texts"] and "SIMULATED" not in meta["axes"][0]["title"]
        assert meta["texts"] == ["served by vLLM 0.32.0 on CPU, dummy weights"]


def test_missing_data_raises_skip_not_an_empty_figure(docs):
    agg, hyp = copy.deepcopy(docs)
    agg["step_cdf"]["variants"] = {}
    with pytest.raises(Skip, match="step"):
        build_figure("fig6_step_latency_cdf", agg, hyp)
    agg["rows"] = []
    with pytest.raises(Skip):
        build_figure("fig1_ttft_p90_vs_rate", agg, hyp)
    agg["taxes"] = None
    with pytest.raises(Skip, match="not applicable"):
        build_figure("fig5_tax_shape_heatmaps", agg, hyp)


def test_make_figures_writes_png_and_pdf_and_records_skips(docs, tmp_path):
    agg, hyp = copy.deepcopy(docs)
    agg["rows"] = [r for r in agg["rows"] if r["phase"] == "phase_a"]
    agg["taxes"] = None
    agg["step_cdf"]["variants"] = {}
    out = make_figures(agg, hyp, tmp_path)
    assert set(out["made"]) == {"fig1_ttft_p90_vs_rate", "fig2_tpot_p90_vs_rate", "fig3_throughput_vs_requested"}
    for paths in out["made"].values():
        assert sorted(p.rsplit(".", 1)[1] for p in paths) == ["pdf", "png"]
    assert set(out["skipped"]) == set(FIGURES) - set(out["made"])
    assert all(out["skipped"].values())
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_the_contract_names_every_figure_the_plots_draw():
    assert tuple(FIGURES) == CONTRACT_FIGURES


def _data_boxes(ax):
    """Display-space boxes of what an axes plots: bars, markers and line vertices, error bars."""
    import numpy as np
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle
    from matplotlib.transforms import Bbox

    boxes = []
    for artist in ax.get_children():
        if not artist.get_visible():
            continue
        if isinstance(artist, Rectangle) and artist is not ax.patch and artist.get_width() and artist.get_height():
            boxes.append(artist.get_window_extent())
        elif isinstance(artist, Line2D) and artist.get_xydata().size:
            if artist.get_linestyle() in ("None", "") and artist.get_marker() in (None, "None", ""):
                continue
            xy = artist.get_transform().transform(artist.get_xydata())
            boxes += [Bbox.from_extents(x - 1, y - 1, x + 1, y + 1) for x, y in xy if np.isfinite([x, y]).all()]
        elif isinstance(artist, Collection):
            offsets = artist.get_offsets()
            if len(offsets):
                xy = artist.get_offset_transform().transform(offsets)
                boxes += [Bbox.from_extents(x - 2, y - 2, x + 2, y + 2) for x, y in xy if np.isfinite([x, y]).all()]
    return boxes


@pytest.mark.parametrize("name", list(FIGURES))
def test_no_legend_covers_plotted_data(docs, name):
    agg, hyp = docs
    fig = build_figure(name, agg, hyp)
    fig.canvas.draw()
    legends = [lg for ax in fig.axes for lg in ax.get_children() if lg.__class__.__name__ == "Legend"] + list(
        fig.legends
    )
    for legend in legends:
        box = legend.get_window_extent()
        for ax in fig.axes:
            covered = [b for b in _data_boxes(ax) if box.overlaps(b)]
            assert not covered, (
                f"{name}: legend {[t.get_text() for t in legend.get_texts()][:2]} covers {len(covered)} plotted items"
            )


def test_figure_1_states_the_thresholds_the_study_used(docs):
    """Its saturation legend is written from the analysis's thresholds, not from the study's
    defaults: a study with TTFT growth 2.0 must not be labelled x1.5."""
    agg, hyp = docs
    agg = copy.deepcopy(agg)
    agg["saturation"]["thresholds"].update(ttft_p90_ratio_max=2.0, throughput_ratio_min=0.9, waiting_p50_max=3)
    legends = [
        t for a in describe(build_figure("fig1_ttft_p90_vs_rate", agg, hyp))["axes"] for t in a.get("legend", [])
    ]
    assert "saturated: TTFT p90 x2 vs r/2" in legends
    assert "saturated: throughput < 0.9 x offered" in legends and "saturated: waiting p50 > 3" in legends
    assert not any("x1.5" in text for text in legends)


# --------------------------------------------------------------------------- legibility

SERVED_BY = "vLLM 0.32.0 on CPU, dummy weights (results/models/tiny-llama); connectors: nixl 1.5.1, nixl-cu12 1.5.1"


@pytest.fixture(scope="module")
def outlier_docs(tmp_path_factory):
    """A real (not simulated) study whose NIXL taxes dwarf the others', as on the CPU study."""
    variants = [
        "plain",
        "noop_connector",
        "mooncake_producer",
        "mooncake_consumer",
        "mooncake_both",
        "nixl_both",
        "lmcache_only",
        "multi_mooncake_lmcache",
    ]
    spec = SyntheticSpec(
        variants=variants, n_requests=200, n_steps=300, shapes=[(64, 16), (512, 16), (64, 64), (512, 64)], seed=21
    )
    spec.ttft_tax["nixl_both"], spec.tpot_tax["nixl_both"], spec.step_tax_us["nixl_both"] = 1.6, 1.2, 20000.0
    # A build_meta (a third of the callbacks here) longer than the step tax it is part of: a
    # negative unattributed segment.
    spec.callback_us["mooncake_both"] = 1200.0
    built = build(write_study(tmp_path_factory.mktemp("outlier") / "s", spec))
    agg, hyp = built["aggregate"], built["hypotheses"]
    agg["simulated"], agg["served_by"] = False, SERVED_BY
    return agg, hyp


def _drawn(name, agg, hyp):
    fig = build_figure(name, agg, hyp)
    fig.canvas.draw()
    return fig, fig.canvas.get_renderer()


def _drawn_or_skip(request, study, name):
    """`name` drawn from the `study` fixture's documents; the test skipped where it is not drawn."""
    agg, hyp = request.getfixturevalue(study)
    try:
        return _drawn(name, agg, hyp)
    except Skip:
        pytest.skip(f"{name} is not drawn for this study")


def _text_boxes(fig, renderer):
    """Every visible piece of text but the footer: titles, axis and tick labels, legends, bar labels."""
    from matplotlib.text import Text

    out = []
    for artist in fig.findobj(Text):
        if not artist.get_visible() or not artist.get_text().strip() or artist.get_gid() == "served-by-stamp":
            continue
        out.append((artist.get_text()[:40], artist.get_window_extent(renderer)))
    return out


@pytest.mark.parametrize("name", list(FIGURES))
def test_the_footer_overlaps_no_text_and_no_axes(outlier_docs, name):
    """The "served by" line once sat over the x-axis label (figs 4, 6) and the legend (fig 7)."""
    agg, hyp = outlier_docs
    try:
        fig, renderer = _drawn(name, agg, hyp)
    except Skip:
        pytest.skip(f"{name} is not drawn for this study")
    [footer] = [t for t in fig.texts if t.get_gid() == "served-by-stamp"]
    box = footer.get_window_extent(renderer)
    assert box.x1 <= fig.bbox.x1 + 1, f"{name}: the footer runs off the figure"
    hit = [text for text, other in _text_boxes(fig, renderer) if box.overlaps(other)]
    assert not hit, f"{name}: the footer overlaps {hit}"
    for ax in fig.axes:
        if ax.get_visible() and ax.axison:
            assert not box.overlaps(ax.get_window_extent(renderer)), f"{name}: the footer overlaps an axes"


@pytest.mark.parametrize("study", ["docs", "outlier_docs"])
@pytest.mark.parametrize("name", list(FIGURES))
def test_no_bar_leaves_its_axes(request, study, name):
    """Fig. 7's right panel once cut a bar at the top; an outlier is cut on purpose, within the axes."""
    from matplotlib.patches import Rectangle

    fig, _ = _drawn_or_skip(request, study, name)
    for ax in fig.axes:
        lo, hi = sorted(ax.get_ylim())
        slack = 1e-9 * (hi - lo)
        for bar in ax.patches:
            if not isinstance(bar, Rectangle) or not bar.get_height():
                continue
            y0, y1 = sorted((bar.get_y(), bar.get_y() + bar.get_height()))
            assert lo - slack <= y0 and y1 <= hi + slack, (name, ax.get_title(), (y0, y1), (lo, hi))


def test_an_outlier_does_not_flatten_the_other_bars(outlier_docs):
    """NIXL's TPOT tax (~+110 %) is cut at an axis sized for the others (<= ~40 %), and its value
    and interval are written on its bar."""
    agg, hyp = outlier_docs
    fig, _ = _drawn("fig4_tax_bars_ref_safe_ref_load", agg, hyp)
    tpot = fig.axes[1]
    nixl = agg["taxes"]["phase_a"]["ref_safe"]["variants"]["nixl_both"]["tpot_p90"]
    others = [
        v["tpot_p90"]["ci"][1]
        for name, v in agg["taxes"]["phase_a"]["ref_safe"]["variants"].items()
        if name != "nixl_both" and v["tpot_p90"].get("ci")
    ]
    assert tpot.get_ylim()[1] < 100 * nixl["value"] / 2 and tpot.get_ylim()[1] >= 100 * max(others)
    labels = [t.get_text() for t in tpot.texts if t.get_gid() == "bar-cut-label"]
    assert any(t.startswith(f"{100 * nixl['value']:,.0f} %") for t in labels), labels


def test_axis_cap_cuts_only_a_few_far_outliers():
    from connector_tax.plots.bars import HEADROOM, axis_cap

    assert axis_cap([5, 20, 150]) == pytest.approx(HEADROOM * 20)  # one variant far above the rest
    assert axis_cap([5, 20, 40, 60]) is None  # a spread, not an outlier
    assert axis_cap([2, 3, 300, 400]) == pytest.approx(HEADROOM * 3)  # two outliers of four
    assert axis_cap([2, 300, 400]) is None  # most bars are tall: the axis is for them
    assert axis_cap([float("nan"), -5, 10]) is None and axis_cap([]) is None


def test_no_text_leaves_the_figure_with_one_phase_b_prime_shape(tmp_path):
    """Fig. 4b is as wide as its shapes; at one shape its title ran off both sides."""
    spec = SyntheticSpec(
        variants=CONFIGS, n_requests=200, n_steps=100, shapes=[(512, 64), (4096, 64)], prime_shapes=[(512, 64)], seed=5
    )
    built = build(write_study(tmp_path / "s", spec))
    fig, renderer = _drawn("fig4b_tax_shapes_phase_b_prime", built["aggregate"], built["hypotheses"])
    width, height = fig.bbox.width, fig.bbox.height
    for text, box in _text_boxes(fig, renderer):
        assert box.x0 >= -1 and box.x1 <= width + 1 and box.y0 >= -1 and box.y1 <= height + 1, text


def test_figure_1_marks_a_cell_whose_saturation_is_unknown(docs):
    """An unknown cell (a criterion undecided, none judged, or the cell perturbed) is never a reference
    rate: fig. 1 marks it, so ref_safe stopping below it is visible, not an unsaturated-looking point,
    and its legend names all three ways a cell is unknown (the report's Phase A legend does)."""
    agg, hyp = docs
    agg = copy.deepcopy(agg)
    before = len(build_figure("fig1_ttft_p90_vs_rate", agg, hyp).axes[0].collections)
    row = next(r for r in agg["rows"] if r["phase"] == "phase_a" and r["saturated"] is False)
    row["saturated"] = None
    fig = build_figure("fig1_ttft_p90_vs_rate", agg, hyp)
    assert len(fig.axes[0].collections) == before + 1
    legends = [t for a in describe(fig)["axes"] for t in a.get("legend", [])]
    assert "unknown: undecided, unjudged or perturbed" in legends


def test_figure_3_marks_the_offered_rate_criterion_1_compares_with(docs):
    agg, hyp = docs
    legends = [t for a in describe(build_figure("fig3_throughput_vs_requested", agg, hyp))["axes"] for t in a["legend"]]
    assert "offered in the window (median)" in legends
    assert "0.95 x offered: criterion 1 fires below" in legends


def test_figure_5_draws_the_tpot_tax_h6_reads_each_cell_with_its_interval(outlier_docs):
    """Fig. 5 once drew only the TTFT tax (H5's), though its caption promised TPOT too, and no cell
    said how sure it was: H6's TPOT tax along output had no figure and a +30 % could not be told
    from noise."""
    agg, hyp = outlier_docs
    fig, _ = _drawn("fig5_tax_shape_heatmaps", agg, hyp)
    panels = {
        (ax.get_title(), ax.get_ylabel().split(" tax")[0]): ax for ax in fig.axes if ax.get_visible() and ax.get_title()
    }
    assert {("mooncake_both", "TTFT p90"), ("mooncake_both", "TPOT p90")} <= set(panels)
    cells = agg["taxes"]["phase_b"]["cells"]
    inputs = sorted({c["input"] for c in cells.values()})
    outputs = sorted({c["output"] for c in cells.values()})
    checked = 0
    for metric, label in (("ttft_p90", "TTFT p90"), ("tpot_p90", "TPOT p90")):
        texts = {
            (round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
            for t in panels[("mooncake_both", label)].texts
        }
        for cell in cells.values():
            est = cell["variants"]["mooncake_both"][metric]
            lo, hi = est["ci"]
            want = f"{est['value'] * 100:+.0f}%\n[{lo * 100:+.0f}, {hi * 100:+.0f}]"
            assert texts[(inputs.index(cell["input"]), outputs.index(cell["output"]))] == want
            checked += 1
    assert checked == 2 * len(cells) == 8  # its text stays on the page: test_no_text_leaves_any_figure


@pytest.mark.parametrize("name", ["fig1_ttft_p90_vs_rate", "fig2_tpot_p90_vs_rate", "fig6_step_latency_cdf"])
def test_a_latency_log_axis_reads_in_plain_numbers(docs, name):
    """Fig. 2 labelled its TPOT axis "6x10^0" and figs 1 and 6 only at the decades, so a p90 of
    20 ms or a 150 µs step could not be read off: at least two plain-number labels in view."""
    agg, hyp = docs
    fig, _ = _drawn(name, agg, hyp)
    ax = fig.axes[0]
    axis, (lo, hi) = (ax.yaxis, ax.get_ylim()) if ax.get_yscale() == "log" else (ax.xaxis, ax.get_xlim())
    assert axis.get_scale() == "log"
    shown = [t.get_text() for t in axis.get_ticklabels() if lo <= t.get_position()[axis is ax.yaxis] <= hi]
    assert len([t for t in shown if t]) >= 2, shown
    assert all("$" not in t and "^" not in t for t in shown), shown


@pytest.mark.parametrize("study", ["docs", "outlier_docs"])
@pytest.mark.parametrize("name", list(FIGURES))
def test_no_text_leaves_any_figure(request, study, name):
    """A title that grew (fig. 8's, once it carried H4's interval) must wrap, not run off the page."""
    fig, renderer = _drawn_or_skip(request, study, name)
    drawn, page = fig.get_tightbbox(renderer), fig.bbox_inches  # what is drawn, in inches
    slack = 0.02
    assert drawn.x0 >= -slack and drawn.y0 >= -slack, (name, drawn, page)
    assert drawn.x1 <= page.x1 + slack and drawn.y1 <= page.y1 + slack, (name, drawn, page)


def test_figure_8_bounds_the_sum_h4_compares_with_multi(outlier_docs):
    """The sum of mooncake_both's and lmcache_only's taxes is what H4 reads against multi; it had
    no interval in fig. 8, and the title gave H4's deviation without its own."""
    from connector_tax.analysis.quantiles import tax_combination

    agg, hyp = outlier_docs
    fig, _ = _drawn("fig8_h4_additivity", agg, hyp)
    safe = agg["taxes"]["phase_a"]["ref_safe"]["variants"]
    h4 = next(h for h in hyp["hypotheses"] if h["id"] == "H4")
    lo, hi = h4["numbers"]["rel_dev"]["ci"]
    assert f"[{lo:+.2f}, {hi:+.2f}]" in fig._suptitle.get_text()
    for ax, metric in zip(fig.axes[:2], ("ttft_p90", "tpot_p90")):
        summed = tax_combination([(1.0, safe["mooncake_both"][metric]), (1.0, safe["lmcache_only"][metric])])
        caps = sorted(
            round(y, 6) for line in ax.lines for x, y in line.get_xydata() if line.get_marker() == "_" and x == 2
        )
        assert caps == pytest.approx(sorted(100 * v for v in summed["ci"])), (metric, caps)
