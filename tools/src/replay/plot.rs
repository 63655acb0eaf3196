//! The `--plot` SVG: footprint over one iteration, the budget, and what each simulated policy
//! keeps on the device and on the host. Hand-written SVG (no plotting dependency); the x axis is
//! the iteration's GPU compute time (each op at its start without swapping), so curves of
//! policies that stall are drawn against the same ops as the native footprint.

use std::fmt::Write as _;
use std::path::Path;

use tensile_analyzer::{Analysis, Budget, Evaluation, PolicyKind};

const WIDTH: f64 = 1060.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

struct Frame {
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn x(&self, ms: f64) -> f64 {
        LEFT + ms / self.x_max * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, gib: f64) -> f64 {
        HEIGHT - BOTTOM - gib / self.y_max * (HEIGHT - TOP - BOTTOM)
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A "nice" tick step for a range.
fn tick_step(range: f64) -> f64 {
    let raw = range / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw)
        .unwrap_or(raw)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn polyline(points: &[(f64, f64)], color: &str, width: f64, dash: Option<&str>) -> String {
    let pts: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    format!(
        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\"{} points=\"{}\"/>\n",
        dash.map(|d| format!(" stroke-dasharray=\"{d}\""))
            .unwrap_or_default(),
        pts.join(" ")
    )
}

fn area(points: &[(f64, f64)], base: f64, color: &str, opacity: f64) -> String {
    let mut pts: Vec<String> = Vec::with_capacity(points.len() + 2);
    if let (Some(first), Some(last)) = (points.first(), points.last()) {
        pts.push(format!("{:.1},{base:.1}", first.0));
        pts.extend(points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")));
        pts.push(format!("{:.1},{base:.1}", last.0));
    }
    format!(
        "<polygon fill=\"{color}\" fill-opacity=\"{opacity}\" stroke=\"none\" points=\"{}\"/>\n",
        pts.join(" ")
    )
}

/// Step-shaped points: the value of op `i` holds from its start to the next op's start.
fn steps(xs: &[f64], ys: &[f64], end_x: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(xs.len() * 2);
    for i in 0..xs.len() {
        let next = xs.get(i + 1).copied().unwrap_or(end_x);
        out.push((xs[i], ys[i]));
        out.push((next, ys[i]));
    }
    out
}

/// Renders the plot.
pub fn footprint_svg(
    analysis: &Analysis,
    budget: Budget,
    results: &[Evaluation],
    trace: &Path,
) -> String {
    let fp = &analysis.footprint;
    let compute_ms = fp.compute_ns as f64 / 1e6;
    let y_top = gib(fp.peak_allocated.max(budget.bytes)) * 1.1;
    let frame = Frame {
        x_max: compute_ms.max(1e-6),
        y_max: y_top.max(1e-6),
    };
    let xs: Vec<f64> = fp
        .points
        .iter()
        .map(|p| frame.x(p.t_ns as f64 / 1e6))
        .collect();
    let end_x = frame.x(compute_ms);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"13\">"
    );
    let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let name = trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{} — one iteration, \
         budget {:.2} GiB ({:.0}% of peak)</text>",
        escape(&name),
        gib(budget.bytes),
        budget.bytes as f64 * 100.0 / fp.peak_allocated.max(1) as f64
    );

    // Grid and axes.
    let x_step = tick_step(compute_ms);
    let mut t = 0.0;
    while t <= compute_ms + 1e-9 {
        let x = frame.x(t);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            HEIGHT - BOTTOM,
            HEIGHT - BOTTOM + 18.0,
            trim(t)
        );
        t += x_step;
    }
    let y_step = tick_step(y_top);
    let mut v = 0.0;
    while v <= y_top + 1e-9 {
        let y = frame.y(v);
        let _ = writeln!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 8.0,
            y + 4.0,
            trim(v)
        );
        v += y_step;
    }
    let _ = writeln!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b:.1}\" stroke=\"black\"/>\
         <line x1=\"{LEFT}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\" stroke=\"black\"/>",
        b = HEIGHT - BOTTOM,
        r = WIDTH - RIGHT
    );
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">GPU compute time within the \
         iteration (ms, no swapping)</text>",
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 15.0
    );
    let _ = writeln!(
        svg,
        "<text transform=\"translate(22,{:.1}) rotate(-90)\" text-anchor=\"middle\">device \
         memory (GiB)</text>",
        (TOP + HEIGHT - BOTTOM) / 2.0
    );

    // Curves.
    let allocated: Vec<f64> = fp
        .points
        .iter()
        .map(|p| frame.y(gib(p.allocated)))
        .collect();
    let needed: Vec<f64> = fp.points.iter().map(|p| frame.y(gib(p.needed))).collect();
    let base = frame.y(0.0);
    svg.push_str(&area(&steps(&xs, &allocated, end_x), base, "#999", 0.25));
    svg.push_str(&polyline(&steps(&xs, &needed, end_x), "#1f5fbf", 1.5, None));
    let mut legend: Vec<(String, String, Option<&str>, bool)> = vec![
        ("allocated (native)".into(), "#999".into(), None, true),
        ("holding live data".into(), "#1f5fbf".into(), None, false),
    ];
    // The swapped-out area is drawn for the first swapping policy only (overlapping areas of
    // several policies are unreadable); every swapping policy gets its on-device line.
    let mut area_drawn = false;
    for r in results {
        if r.policy == PolicyKind::None || r.report.resident_curve.len() != fp.points.len() {
            continue;
        }
        let (color, host_color) = match r.policy {
            PolicyKind::Plan => ("#1a9641", "#fdae61"),
            _ => ("#7b3294", "#c2a5cf"),
        };
        let name = if r.policy == PolicyKind::Plan {
            "plan"
        } else {
            "lru"
        };
        let on_device: Vec<f64> = r
            .report
            .resident_curve
            .iter()
            .map(|&(_, b)| frame.y(gib(b)))
            .collect();
        let on_host: Vec<f64> = fp
            .points
            .iter()
            .zip(&r.report.resident_curve)
            .map(|(p, &(_, b))| frame.y(gib(p.needed.saturating_sub(b))))
            .collect();
        if !area_drawn {
            area_drawn = true;
            svg.push_str(&area(&steps(&xs, &on_host, end_x), base, host_color, 0.6));
            legend.push((
                format!("{name}: swapped out (on host)"),
                host_color.into(),
                None,
                true,
            ));
        }
        svg.push_str(&polyline(&steps(&xs, &on_device, end_x), color, 2.0, None));
        legend.push((format!("{name}: on device"), color.into(), None, false));
    }
    let by = frame.y(gib(budget.bytes));
    svg.push_str(&polyline(
        &[(LEFT, by), (WIDTH - RIGHT, by)],
        "#d7191c",
        2.0,
        Some("8,5"),
    ));
    legend.push(("budget".into(), "#d7191c".into(), Some("8,5"), false));

    // Legend, and the numbers per policy.
    let lx = WIDTH - RIGHT + 15.0;
    let mut ly = TOP + 10.0;
    for (label, color, dash, filled) in &legend {
        if *filled {
            let _ = writeln!(
                svg,
                "<rect x=\"{lx}\" y=\"{:.1}\" width=\"22\" height=\"10\" fill=\"{color}\" \
                 fill-opacity=\"0.6\"/>",
                ly - 9.0
            );
        } else {
            svg.push_str(&polyline(
                &[(lx, ly - 4.0), (lx + 22.0, ly - 4.0)],
                color,
                2.0,
                *dash,
            ));
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{ly:.1}\">{}</text>",
            lx + 28.0,
            escape(label)
        );
        ly += 20.0;
    }
    ly += 10.0;
    let _ = writeln!(
        svg,
        "<text x=\"{lx}\" y=\"{ly:.1}\" font-weight=\"bold\">per iteration</text>"
    );
    ly += 18.0;
    let _ = writeln!(
        svg,
        "<text x=\"{lx}\" y=\"{ly:.1}\">compute {compute_ms:.1} ms</text>"
    );
    if let Some(b) = results.iter().find_map(|r| r.bound) {
        ly += 18.0;
        let _ = writeln!(
            svg,
            "<text x=\"{lx}\" y=\"{ly:.1}\">lower bound {:.1} ms</text>",
            b.bound_ns as f64 / 1e6
        );
    }
    for r in results {
        ly += 18.0;
        let name = match r.policy {
            PolicyKind::Plan => "plan",
            PolicyKind::Lru => "lru",
            PolicyKind::None => "none",
        };
        let _ = writeln!(
            svg,
            "<text x=\"{lx}\" y=\"{ly:.1}\">{name}: {:.1} ms, {:.2} GiB out</text>",
            r.report.step_ns as f64 / 1e6,
            gib(r.report.bytes_d2h)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
