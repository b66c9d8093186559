//! The scale benches' figures: cost against scale as an SVG file of panels (two a row),
//! the scale on a log axis, one line per policy or operation. Used by `master-scale`
//! (store-bench) and `gateway-scale` (sim); each writes its rows as CSV beside it.
//!
//! Drawn by `plotters`' SVG backend with its naive text layout: no font library, the text
//! is left to the viewer.
//!
//! # Layout
//! - [`Series`] and [`Panel`]: what to draw.
//! - [`write_svg`]: draws the panels to a file.
//! - [`si`]: the axis labels (1k, 10M).

use std::path::Path;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;

/// One line: its name and its points `(scale, value)`.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, in increasing scale.
    pub points: Vec<(f64, f64)>,
}

/// One chart of the figure.
pub struct Panel {
    /// Title above the chart.
    pub title: String,
    /// Label of the value axis.
    pub y_label: String,
    /// Whether the value axis is logarithmic (costs that grow with scale; the legend sits
    /// upper left, where such curves leave room) or linear from 0 (legend middle right).
    pub log_y: bool,
    /// Its lines.
    pub series: Vec<Series>,
}

const COLUMNS: usize = 2;
const PANEL_W: u32 = 640;
const PANEL_H: u32 = 420;

/// Writes `panels` (two a row) against the shared scale axis `x_label` to `path`.
pub fn write_svg(path: &Path, x_label: &str, panels: &[Panel]) -> Result<(), String> {
    let rows = panels.len().div_ceil(COLUMNS).max(1);
    let size = (PANEL_W * COLUMNS as u32, PANEL_H * rows as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((rows, COLUMNS));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        draw(area, x_label, panel).map_err(|e| format!("{}: {e}", panel.title))?;
    }
    root.present().map_err(|e| e.to_string())
}

/// The range of `values` widened a little, or `fallback` when there are none.
fn span(values: impl Iterator<Item = f64>, fallback: (f64, f64)) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi { fallback } else { (lo, hi) }
}

type Drawn = Result<(), Box<dyn std::error::Error + 'static>>;

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    x_label: &str,
    panel: &Panel,
) -> Drawn
where
    DB::ErrorType: 'static,
{
    let points = || panel.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(points().map(|p| p.0), (1.0, 10.0));
    let x = (x0 / 1.5..x1 * 1.5).log_scale();
    let mut chart = ChartBuilder::on(area);
    chart
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    if panel.log_y {
        let (y0, y1) = span(points().map(|p| p.1).filter(|&v| v > 0.0), (1.0, 10.0));
        let c = chart.build_cartesian_2d(x, (y0 / 2.0..y1 * 2.0).log_scale())?;
        lines(
            c,
            x_label,
            panel,
            |v| v > 0.0,
            SeriesLabelPosition::UpperLeft,
        )
    } else {
        let (_, y1) = span(points().map(|p| p.1), (0.0, 1.0));
        let c = chart.build_cartesian_2d(x, 0.0..y1 * 1.15)?;
        lines(
            c,
            x_label,
            panel,
            |_| true,
            SeriesLabelPosition::MiddleRight,
        )
    }
}

/// Draws the mesh, `panel`'s lines (points where `keep` holds) and the legend at `legend`.
fn lines<'a, DB, Y>(
    mut c: ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, Y>>,
    x_label: &str,
    panel: &Panel,
    keep: fn(f64) -> bool,
    legend: SeriesLabelPosition,
) -> Drawn
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    c.configure_mesh()
        .x_desc(x_label)
        .y_desc(&panel.y_label)
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| si(*v))
        .draw()?;
    let style = |i: usize| Palette99::pick(i).stroke_width(2);
    for (i, s) in panel.series.iter().enumerate() {
        let pts = s.points.iter().copied().filter(|p| keep(p.1));
        c.draw_series(LineSeries::new(pts.clone(), style(i)))?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style(i)));
        c.draw_series(pts.map(|p| Circle::new(p, 3, style(i).filled())))?;
    }
    c.configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// `v` with an SI suffix: 1k, 10M, 2.5G.
pub fn si(v: f64) -> String {
    let (d, suffix) = match v.abs() {
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let x = v / d;
    if (x - x.round()).abs() < 0.05 {
        format!("{}{suffix}", x.round())
    } else {
        format!("{x:.1}{suffix}")
    }
}
