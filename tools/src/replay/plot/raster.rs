//! A small rasterizer and PNG encoder for the plot: filled polygons (even-odd, alpha-blended),
//! stroked polylines (square pen, optional dashes), and bitmap text (see `font`). Enough for
//! axis-aligned step curves and labels, with no anti-aliasing; not a general 2-D renderer.
//! The PNG is 8-bit RGB, unfiltered rows, compressed with `flate2` (already a dependency),
//! so the `--plot x.png` feature costs no extra crate to build.

use std::io::Write as _;

use super::font::{glyph, GLYPH_H, GLYPH_W};

/// An RGB colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

/// Where a text's x coordinate is on the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

/// An RGB image being drawn.
pub struct Canvas {
    width: usize,
    height: usize,
    pixels: Vec<Rgb>,
}

impl Canvas {
    /// A canvas filled with `background`.
    pub fn new(width: usize, height: usize, background: Rgb) -> Self {
        Canvas {
            width,
            height,
            pixels: vec![background; width * height],
        }
    }

    fn blend(&mut self, x: i64, y: i64, color: Rgb, alpha: f64) {
        if x < 0 || y < 0 || x as usize >= self.width || y as usize >= self.height {
            return;
        }
        let p = &mut self.pixels[y as usize * self.width + x as usize];
        let mix = |old: u8, new: u8| {
            (f64::from(old) * (1.0 - alpha) + f64::from(new) * alpha).round() as u8
        };
        *p = Rgb(mix(p.0, color.0), mix(p.1, color.1), mix(p.2, color.2));
    }

    /// The colour at (x, y).
    #[cfg(test)]
    pub fn pixel(&self, x: usize, y: usize) -> Rgb {
        self.pixels[y * self.width + x]
    }

    /// Fills a polygon (even-odd rule, pixel centres) with `color` at opacity `alpha`.
    pub fn fill_polygon(&mut self, points: &[(f64, f64)], color: Rgb, alpha: f64) {
        if points.len() < 3 {
            return;
        }
        let min_y = points
            .iter()
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min)
            .floor()
            .max(0.0) as usize;
        let max_y = points
            .iter()
            .map(|p| p.1)
            .fold(f64::NEG_INFINITY, f64::max)
            .ceil()
            .min(self.height as f64) as usize;
        let mut crossings = Vec::new();
        for y in min_y..max_y {
            let cy = y as f64 + 0.5;
            crossings.clear();
            for i in 0..points.len() {
                let (a, b) = (points[i], points[(i + 1) % points.len()]);
                if (a.1 <= cy) != (b.1 <= cy) {
                    crossings.push(a.0 + (cy - a.1) / (b.1 - a.1) * (b.0 - a.0));
                }
            }
            crossings.sort_by(f64::total_cmp);
            for pair in crossings.chunks_exact(2) {
                let from = (pair[0] - 0.5).ceil().max(0.0) as i64;
                let to = (pair[1] - 0.5).floor().min(self.width as f64 - 1.0) as i64;
                for x in from..=to {
                    self.blend(x, y as i64, color, alpha);
                }
            }
        }
    }

    /// Strokes a polyline `width` pixels wide; `dash` = (on, off) lengths in pixels.
    pub fn stroke(
        &mut self,
        points: &[(f64, f64)],
        color: Rgb,
        width: f64,
        dash: Option<(f64, f64)>,
    ) {
        let half = (width / 2.0).max(0.5);
        let mut travelled = 0.0;
        for pair in points.windows(2) {
            let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
            let length = (x1 - x0).hypot(y1 - y0);
            let steps = (length * 2.0).ceil().max(1.0) as usize;
            for i in 0..=steps {
                let t = i as f64 / steps as f64;
                let on = dash.is_none_or(|(on, off)| (travelled + t * length) % (on + off) < on);
                if !on {
                    continue;
                }
                let (cx, cy) = (x0 + t * (x1 - x0), y0 + t * (y1 - y0));
                let (left, right) = ((cx - half).round() as i64, (cx + half).round() as i64);
                let (top, bottom) = ((cy - half).round() as i64, (cy + half).round() as i64);
                for y in top..bottom.max(top + 1) {
                    for x in left..right.max(left + 1) {
                        self.blend(x, y, color, 1.0);
                    }
                }
            }
            travelled += length;
        }
    }

    /// Width in pixels of `text` at `scale` pixels per font pixel.
    pub fn text_width(text: &str, scale: usize) -> usize {
        let n = text.chars().count();
        (n * (GLYPH_W + 1)).saturating_sub(1) * scale
    }

    /// Draws `text` with its baseline at `y`; `vertical` turns it a quarter left (reading
    /// upwards, baseline at x), as the SVG's rotate(-90).
    #[allow(clippy::too_many_arguments)]
    pub fn text(
        &mut self,
        x: f64,
        y: f64,
        text: &str,
        anchor: Anchor,
        scale: usize,
        bold: bool,
        color: Rgb,
        vertical: bool,
    ) {
        let width = Self::text_width(text, scale) as f64;
        let start = match anchor {
            Anchor::Start => 0.0,
            Anchor::Middle => -width / 2.0,
            Anchor::End => -width,
        };
        let (x, y) = (x.round() as i64, y.round() as i64);
        let start = start.round() as i64;
        let height = (GLYPH_H * scale) as i64;
        for (i, c) in text.chars().enumerate() {
            let rows = glyph(c);
            let origin = start + (i * (GLYPH_W + 1) * scale) as i64;
            for (gy, row) in rows.iter().enumerate() {
                for gx in 0..GLYPH_W {
                    if row >> (GLYPH_W - 1 - gx) & 1 == 0 {
                        continue;
                    }
                    for dy in 0..scale {
                        for dx in 0..scale + usize::from(bold) {
                            // (u, v): along the text, and down from the baseline (v <= 0).
                            let u = origin + (gx * scale + dx) as i64;
                            let v = (gy * scale + dy) as i64 - height;
                            let (px, py) = if vertical {
                                (x + v, y - u)
                            } else {
                                (x + u, y + v)
                            };
                            self.blend(px, py, color, 1.0);
                        }
                    }
                }
            }
        }
    }

    /// The image as a PNG file.
    pub fn to_png(&self) -> Vec<u8> {
        let mut raw = Vec::with_capacity(self.height * (1 + 3 * self.width));
        for row in self.pixels.chunks_exact(self.width) {
            raw.push(0); // filter: none
            for p in row {
                raw.extend_from_slice(&[p.0, p.1, p.2]);
            }
        }
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        // Writing to a Vec cannot fail.
        let _ = zlib.write_all(&raw);
        let idat = zlib.finish().unwrap_or_default();
        let mut ihdr = Vec::with_capacity(13);
        ihdr.extend_from_slice(&(self.width as u32).to_be_bytes());
        ihdr.extend_from_slice(&(self.height as u32).to_be_bytes());
        // 8 bits per sample, colour type 2 (RGB), deflate, no filter method, no interlace.
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [
            (b"IHDR", &ihdr[..]),
            (b"IDAT", &idat[..]),
            (b"IEND", &[][..]),
        ] {
            png.extend_from_slice(&(data.len() as u32).to_be_bytes());
            png.extend_from_slice(kind);
            png.extend_from_slice(data);
            let mut crc = flate2::Crc::new();
            crc.update(kind);
            crc.update(data);
            png.extend_from_slice(&crc.sum().to_be_bytes());
        }
        png
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHITE: Rgb = Rgb(255, 255, 255);
    const RED: Rgb = Rgb(255, 0, 0);

    #[test]
    fn polygon_fills_inside_only_and_blends() {
        let mut c = Canvas::new(10, 10, WHITE);
        c.fill_polygon(&[(2.0, 2.0), (8.0, 2.0), (8.0, 8.0), (2.0, 8.0)], RED, 0.5);
        assert_eq!(c.pixel(5, 5), Rgb(255, 128, 128));
        assert_eq!(c.pixel(2, 2), Rgb(255, 128, 128));
        assert_eq!(c.pixel(8, 5), WHITE);
        assert_eq!(c.pixel(1, 5), WHITE);
    }

    #[test]
    fn dashed_stroke_leaves_gaps() {
        let mut c = Canvas::new(40, 5, WHITE);
        c.stroke(&[(0.0, 2.5), (40.0, 2.5)], RED, 1.0, Some((8.0, 5.0)));
        assert_eq!(c.pixel(3, 2), RED);
        assert_eq!(c.pixel(10, 2), WHITE);
        assert_eq!(c.pixel(15, 2), RED);
    }

    #[test]
    fn text_is_anchored() {
        let mut c = Canvas::new(30, 10, WHITE);
        // "1" ends in a bar of three pixels on its bottom row (columns 1..=3).
        c.text(29.0, 8.0, "1", Anchor::End, 1, false, RED, false);
        assert_eq!(c.pixel(25, 7), RED);
        assert_eq!(c.pixel(24, 7), WHITE);
        assert_eq!(Canvas::text_width("ab", 2), 22);
    }
}
