//! The `--plot` image: footprint over one iteration, the budget, and what each simulated policy
//! keeps on the device and on the host. The plot is built once as a list of shapes (lines,
//! areas, texts) and written as SVG (hand-written, no plotting dependency) for a `.svg` name or
//! rasterized to PNG (`raster`, with its own bitmap `font`) for a `.png` name; any other name is
//! refused before the work starts. The x axis is the iteration's GPU compute time (each op at
//! its start without swapping), so curves of policies that stall are drawn against the same ops
//! as the native footprint. Bytes are in GiB, or MiB / KiB when the largest value is smaller,
//! so small traces do not read "0.0 GiB".

mod font;
mod raster;

use std::fmt::Write as _;
use std::path::Path;

use tensile_analyzer::cost::format_bytes;
use tensile_analyzer::{Analysis, Budget, Evaluation, PolicyKind};

use raster::{Anchor, Canvas, Rgb};

const WIDTH: f64 = 1060.0;
const HEIGHT: f64 = 560.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 280.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// PNG pixels per plot unit: the bitmap font needs twice the SVG's resolution to be legible.
const PNG_SCALE: f64 = 2.0;

/// The image formats `--plot` writes, chosen by the file name's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Svg,
    Png,
}

/// The format for `path`, or a one-line error naming the accepted extensions.
pub fn format_for(path: &Path) -> Result<ImageFormat, String> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("svg") => Ok(ImageFormat::Svg),
        Some("png") => Ok(ImageFormat::Png),
        _ => Err(format!(
            "--plot {}: name the file .png (a PNG image) or .svg (an SVG drawing)",
            path.display()
        )),
    }
}

/// Writes the plot to `path` in the format its name asks for.
pub fn write(
    path: &Path,
    analysis: &Analysis,
    budget: Budget,
    results: &[Evaluation],
    trace: &Path,
) -> Result<(), String> {
    let format = format_for(path)?;
    let scene = footprint_scene(analysis, budget, results, trace);
    let bytes = match format {
        ImageFormat::Svg => scene.svg().into_bytes(),
        ImageFormat::Png => scene.png(),
    };
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// One drawing element, in plot units (SVG pixels).
enum Shape {
    Line {
        points: Vec<(f64, f64)>,
        color: &'static str,
        width: f64,
        dash: Option<(f64, f64)>,
    },
    Area {
        points: Vec<(f64, f64)>,
        color: &'static str,
        opacity: f64,
    },
    Text {
        x: f64,
        y: f64,
        text: String,
        anchor: Anchor,
        size: f64,
        bold: bool,
        vertical: bool,
    },
}

/// A whole plot: shapes in drawing order on a white page.
struct Scene {
    shapes: Vec<Shape>,
}

fn rgb(hex: &str) -> Rgb {
    let digits = hex.trim_start_matches('#');
    let channel = |i: usize| -> u8 {
        if digits.len() == 3 {
            let v = u8::from_str_radix(&digits[i..=i], 16).unwrap_or(0);
            v * 17
        } else {
            u8::from_str_radix(digits.get(2 * i..2 * i + 2).unwrap_or("00"), 16).unwrap_or(0)
        }
    };
    Rgb(channel(0), channel(1), channel(2))
}

impl Scene {
    fn line(&mut self, points: Vec<(f64, f64)>, color: &'static str, width: f64) {
        self.shapes.push(Shape::Line {
            points,
            color,
            width,
            dash: None,
        });
    }

    fn text(&mut self, x: f64, y: f64, text: impl Into<String>, anchor: Anchor) {
        self.shapes.push(Shape::Text {
            x,
            y,
            text: text.into(),
            anchor,
            size: 13.0,
            bold: false,
            vertical: false,
        });
    }

    fn svg(&self) -> String {
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
             viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"13\">"
        );
        let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
        for shape in &self.shapes {
            match shape {
                Shape::Line {
                    points,
                    color,
                    width,
                    dash,
                } => svg.push_str(&polyline(points, color, *width, *dash)),
                Shape::Area {
                    points,
                    color,
                    opacity,
                } => svg.push_str(&polygon(points, color, *opacity)),
                Shape::Text {
                    x,
                    y,
                    text,
                    anchor,
                    size,
                    bold,
                    vertical,
                } => {
                    let anchor = match anchor {
                        Anchor::Start => "start",
                        Anchor::Middle => "middle",
                        Anchor::End => "end",
                    };
                    let place = if *vertical {
                        format!("transform=\"translate({x:.1},{y:.1}) rotate(-90)\"")
                    } else {
                        format!("x=\"{x:.1}\" y=\"{y:.1}\"")
                    };
                    let _ = writeln!(
                        svg,
                        "<text {place} text-anchor=\"{anchor}\"{}{}>{}</text>",
                        if *size == 13.0 {
                            String::new()
                        } else {
                            format!(" font-size=\"{size}\"")
                        },
                        if *bold { " font-weight=\"bold\"" } else { "" },
                        escape(text)
                    );
                }
            }
        }
        svg.push_str("</svg>\n");
        svg
    }

    fn png(&self) -> Vec<u8> {
        let k = PNG_SCALE;
        let scale = |p: &[(f64, f64)]| -> Vec<(f64, f64)> {
            p.iter().map(|(x, y)| (x * k, y * k)).collect()
        };
        let mut canvas = Canvas::new(
            (WIDTH * k) as usize,
            (HEIGHT * k) as usize,
            Rgb(255, 255, 255),
        );
        for shape in &self.shapes {
            match shape {
                Shape::Line {
                    points,
                    color,
                    width,
                    dash,
                } => canvas.stroke(
                    &scale(points),
                    rgb(color),
                    width * k,
                    dash.map(|(on, off)| (on * k, off * k)),
                ),
                Shape::Area {
                    points,
                    color,
                    opacity,
                } => canvas.fill_polygon(&scale(points), rgb(color), *opacity),
                Shape::Text {
                    x,
                    y,
                    text,
                    anchor,
                    size,
                    bold,
                    vertical,
                } => {
                    // 13-unit text is the 5x7 font at twice the resolution; larger text grows.
                    let font_scale = ((size / 13.0) * 2.0).round().max(1.0) as usize;
                    canvas.text(
                        x * k,
                        y * k,
                        text,
                        *anchor,
                        font_scale,
                        *bold,
                        Rgb(0, 0, 0),
                        *vertical,
                    );
                }
            }
        }
        canvas.to_png()
    }
}

/// The unit bytes are drawn in: the largest binary unit that keeps the top of the axis >= 1.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Unit {
    name: &'static str,
    bytes: f64,
}

fn unit_for(max_bytes: u64) -> Unit {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    let (name, bytes) = UNITS
        .iter()
        .copied()
        .find(|&(_, b)| max_bytes >= b)
        .unwrap_or(UNITS[2]);
    Unit {
        name,
        bytes: bytes as f64,
    }
}

struct Frame {
    x_max: f64,
    y_max: f64,
    unit: Unit,
}

impl Frame {
    fn x(&self, ms: f64) -> f64 {
        LEFT + ms / self.x_max * (WIDTH - LEFT - RIGHT)
    }

    /// The y of a byte count.
    fn y(&self, bytes: u64) -> f64 {
        self.y_units(bytes as f64 / self.unit.bytes)
    }

    fn y_units(&self, value: f64) -> f64 {
        HEIGHT - BOTTOM - value / self.y_max * (HEIGHT - TOP - BOTTOM)
    }
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

fn polyline(points: &[(f64, f64)], color: &str, width: f64, dash: Option<(f64, f64)>) -> String {
    let pts: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    format!(
        "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\"{} points=\"{}\"/>\n",
        dash.map(|(on, off)| format!(" stroke-dasharray=\"{on},{off}\""))
            .unwrap_or_default(),
        pts.join(" ")
    )
}

fn polygon(points: &[(f64, f64)], color: &str, opacity: f64) -> String {
    let pts: Vec<String> = points
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect();
    format!(
        "<polygon fill=\"{color}\" fill-opacity=\"{opacity}\" stroke=\"none\" points=\"{}\"/>\n",
        pts.join(" ")
    )
}

/// The outline of the area under step-shaped `points`, down to `base`.
fn area(points: &[(f64, f64)], base: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() + 2);
    if let (Some(first), Some(last)) = (points.first(), points.last()) {
        out.push((first.0, base));
        out.extend_from_slice(points);
        out.push((last.0, base));
    }
    out
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

/// One legend line: label, colour, dash pattern, and whether it is a filled area's swatch.
type LegendEntry = (String, &'static str, Option<(f64, f64)>, bool);

/// Builds the plot.
fn footprint_scene(
    analysis: &Analysis,
    budget: Budget,
    results: &[Evaluation],
    trace: &Path,
) -> Scene {
    let fp = &analysis.footprint;
    let compute_ms = fp.compute_ns as f64 / 1e6;
    let top_bytes = fp.peak_allocated.max(budget.bytes);
    let unit = unit_for(top_bytes);
    let y_top = top_bytes as f64 / unit.bytes * 1.1;
    let frame = Frame {
        x_max: compute_ms.max(1e-6),
        y_max: y_top.max(1e-6),
        unit,
    };
    let xs: Vec<f64> = fp
        .points
        .iter()
        .map(|p| frame.x(p.t_ns as f64 / 1e6))
        .collect();
    let end_x = frame.x(compute_ms);
    let mut scene = Scene { shapes: Vec::new() };
    let name = trace
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    scene.shapes.push(Shape::Text {
        x: LEFT,
        y: 28.0,
        text: format!(
            "{name} \u{2014} one iteration, budget {} ({:.0}% of peak)",
            format_bytes(budget.bytes),
            budget.bytes as f64 * 100.0 / fp.peak_allocated.max(1) as f64
        ),
        anchor: Anchor::Start,
        size: 16.0,
        bold: true,
        vertical: false,
    });

    // Grid and axes.
    let x_step = tick_step(compute_ms);
    let mut t = 0.0;
    while t <= compute_ms + 1e-9 {
        let x = frame.x(t);
        scene.line(vec![(x, TOP), (x, HEIGHT - BOTTOM)], "#eee", 1.0);
        scene.text(x, HEIGHT - BOTTOM + 18.0, trim(t), Anchor::Middle);
        t += x_step;
    }
    let y_step = tick_step(y_top);
    let mut v = 0.0;
    while v <= y_top + 1e-9 {
        let y = frame.y_units(v);
        scene.line(vec![(LEFT, y), (WIDTH - RIGHT, y)], "#eee", 1.0);
        scene.text(LEFT - 8.0, y + 4.0, trim(v), Anchor::End);
        v += y_step;
    }
    scene.line(vec![(LEFT, TOP), (LEFT, HEIGHT - BOTTOM)], "#000", 1.0);
    scene.line(
        vec![(LEFT, HEIGHT - BOTTOM), (WIDTH - RIGHT, HEIGHT - BOTTOM)],
        "#000",
        1.0,
    );
    scene.text(
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 15.0,
        "GPU compute time within the iteration (ms, no swapping)",
        Anchor::Middle,
    );
    scene.shapes.push(Shape::Text {
        x: 22.0,
        y: (TOP + HEIGHT - BOTTOM) / 2.0,
        text: format!("device memory ({})", unit.name),
        anchor: Anchor::Middle,
        size: 13.0,
        bold: false,
        vertical: true,
    });

    // Curves.
    let allocated: Vec<f64> = fp.points.iter().map(|p| frame.y(p.allocated)).collect();
    let needed: Vec<f64> = fp.points.iter().map(|p| frame.y(p.needed)).collect();
    let base = frame.y(0);
    scene.shapes.push(Shape::Area {
        points: area(&steps(&xs, &allocated, end_x), base),
        color: "#999",
        opacity: 0.25,
    });
    scene.line(steps(&xs, &needed, end_x), "#1f5fbf", 1.5);
    let mut legend: Vec<LegendEntry> = vec![
        ("allocated (native)".into(), "#999", None, true),
        ("holding live data".into(), "#1f5fbf", None, false),
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
            .map(|&(_, b)| frame.y(b))
            .collect();
        let on_host: Vec<f64> = fp
            .points
            .iter()
            .zip(&r.report.resident_curve)
            .map(|(p, &(_, b))| frame.y(p.needed.saturating_sub(b)))
            .collect();
        if !area_drawn {
            area_drawn = true;
            scene.shapes.push(Shape::Area {
                points: area(&steps(&xs, &on_host, end_x), base),
                color: host_color,
                opacity: 0.6,
            });
            legend.push((
                format!("{name}: swapped out (on host)"),
                host_color,
                None,
                true,
            ));
        }
        scene.line(steps(&xs, &on_device, end_x), color, 2.0);
        legend.push((format!("{name}: on device"), color, None, false));
    }
    let by = frame.y(budget.bytes);
    scene.shapes.push(Shape::Line {
        points: vec![(LEFT, by), (WIDTH - RIGHT, by)],
        color: "#d7191c",
        width: 2.0,
        dash: Some((8.0, 5.0)),
    });
    legend.push(("budget".into(), "#d7191c", Some((8.0, 5.0)), false));

    // Legend, and the numbers per policy.
    let lx = WIDTH - RIGHT + 15.0;
    let mut ly = TOP + 10.0;
    for (label, color, dash, filled) in legend {
        if filled {
            scene.shapes.push(Shape::Area {
                points: vec![
                    (lx, ly - 9.0),
                    (lx + 22.0, ly - 9.0),
                    (lx + 22.0, ly + 1.0),
                    (lx, ly + 1.0),
                ],
                color,
                opacity: 0.6,
            });
        } else {
            scene.shapes.push(Shape::Line {
                points: vec![(lx, ly - 4.0), (lx + 22.0, ly - 4.0)],
                color,
                width: 2.0,
                dash,
            });
        }
        scene.text(lx + 28.0, ly, label, Anchor::Start);
        ly += 20.0;
    }
    ly += 10.0;
    scene.shapes.push(Shape::Text {
        x: lx,
        y: ly,
        text: "per iteration".into(),
        anchor: Anchor::Start,
        size: 13.0,
        bold: true,
        vertical: false,
    });
    ly += 18.0;
    scene.text(lx, ly, format!("compute {compute_ms:.1} ms"), Anchor::Start);
    if let Some(b) = results.iter().find_map(|r| r.bound) {
        ly += 18.0;
        scene.text(
            lx,
            ly,
            format!("lower bound {:.1} ms", b.bound_ns as f64 / 1e6),
            Anchor::Start,
        );
    }
    for r in results {
        ly += 18.0;
        let name = match r.policy {
            PolicyKind::Plan => "plan",
            PolicyKind::Lru => "lru",
            PolicyKind::None => "none",
        };
        scene.text(
            lx,
            ly,
            format!(
                "{name}: {:.1} ms, {} out",
                r.report.step_ns as f64 / 1e6,
                format_bytes(r.report.bytes_d2h)
            ),
            Anchor::Start,
        );
    }
    scene
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_format_follows_the_extension() {
        assert_eq!(format_for(Path::new("a/x.png")), Ok(ImageFormat::Png));
        assert_eq!(format_for(Path::new("x.SVG")), Ok(ImageFormat::Svg));
        let err = format_for(Path::new("x.jpg")).unwrap_err();
        assert!(
            err.contains("x.jpg") && err.contains(".png") && err.contains(".svg"),
            "{err}"
        );
        assert!(format_for(Path::new("plot")).is_err());
    }

    #[test]
    fn small_sizes_get_a_small_unit() {
        assert_eq!(unit_for(5 << 30).name, "GiB");
        assert_eq!(unit_for(1 << 30).name, "GiB");
        assert_eq!(unit_for(300 << 20).name, "MiB");
        assert_eq!(unit_for(40 << 10).name, "KiB");
        assert_eq!(unit_for(10).name, "KiB");
    }

    #[test]
    fn colours_parse_in_both_hex_forms() {
        assert_eq!(rgb("#eee"), Rgb(0xee, 0xee, 0xee));
        assert_eq!(rgb("#1f5fbf"), Rgb(0x1f, 0x5f, 0xbf));
    }
}

#[cfg(test)]
mod image_tests {
    use std::io::Read as _;

    use clap::Parser;

    use super::super::{render, ReplayArgs};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn replay_with_plot(path: &std::path::Path) -> Result<String, String> {
        let trace = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../analyzer/tests/data/mlp.trace.gz"
        );
        let plot = path.to_string_lossy().into_owned();
        let argv = [
            "replay", trace, "--budget", "50%", "--policy", "plan,lru", "--plot", &plot,
        ];
        render(&Cli::try_parse_from(argv).expect("valid arguments").args)
    }

    /// The chunks of a PNG file, each CRC-checked: (type, data).
    fn chunks(png: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
        let mut out = Vec::new();
        let mut rest = &png[8..];
        while !rest.is_empty() {
            let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            let kind: [u8; 4] = rest[4..8].try_into().unwrap();
            let data = rest[8..8 + len].to_vec();
            let stored = u32::from_be_bytes(rest[8 + len..12 + len].try_into().unwrap());
            let mut crc = flate2::Crc::new();
            crc.update(&kind);
            crc.update(&data);
            assert_eq!(
                crc.sum(),
                stored,
                "CRC of {}",
                String::from_utf8_lossy(&kind)
            );
            out.push((kind, data));
            rest = &rest[12 + len..];
        }
        out
    }

    #[test]
    fn png_plot_is_a_real_png_of_the_plot() {
        let path = std::env::temp_dir().join(format!("replay-plot-{}.png", std::process::id()));
        replay_with_plot(&path).unwrap();
        let png = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let chunks = chunks(&png);
        let (kind, ihdr) = &chunks[0];
        assert_eq!(kind, b"IHDR");
        let width = u32::from_be_bytes(ihdr[..4].try_into().unwrap()) as usize;
        let height = u32::from_be_bytes(ihdr[4..8].try_into().unwrap()) as usize;
        assert_eq!((width, height), (2120, 1120));
        assert_eq!(&ihdr[8..], &[8, 2, 0, 0, 0], "8-bit RGB, no interlace");
        assert_eq!(&chunks.last().unwrap().0, b"IEND");
        let compressed: Vec<u8> = chunks
            .iter()
            .filter(|(k, _)| k == b"IDAT")
            .flat_map(|(_, d)| d.clone())
            .collect();
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&compressed[..])
            .read_to_end(&mut raw)
            .unwrap();
        assert_eq!(raw.len(), height * (1 + 3 * width));
        let rows: Vec<&[u8]> = raw.chunks(1 + 3 * width).collect();
        assert!(rows.iter().all(|r| r[0] == 0), "every row unfiltered");
        let count = |rgb: [u8; 3]| {
            rows.iter()
                .flat_map(|r| r[1..].chunks(3))
                .filter(|p| *p == rgb)
                .count()
        };
        // The dashed budget line, the plan's on-device line and black text are all drawn.
        assert!(count([0xd7, 0x19, 0x1c]) > 500, "budget line");
        assert!(count([0x1a, 0x96, 0x41]) > 500, "plan line");
        assert!(count([0, 0, 0]) > 5000, "axes and text");
        assert!(count([255, 255, 255]) > width * height / 2, "white page");
    }

    #[test]
    fn unknown_plot_extension_is_refused_before_the_work() {
        let path = std::env::temp_dir().join(format!("replay-plot-{}.jpg", std::process::id()));
        let err = replay_with_plot(&path).unwrap_err();
        assert!(err.contains(".png") && err.contains(".svg"), "{err}");
        assert!(!path.exists());
    }
}
