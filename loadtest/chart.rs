//! A line chart drawn into an RGB buffer and written as a PNG (zlib by `miniz_oxide`): lag over
//! time, one line per tenant, with vertical marks (a kill). Small on purpose: axes with round
//! ticks, a 5x7 bitmap font for labels, a legend. No plotting dependency.

use std::path::Path;

use anyhow::{Context, Result};

const W: usize = 960;
const H: usize = 540;
const LEFT: usize = 90;
const RIGHT: usize = 24;
const TOP: usize = 56;
const BOTTOM: usize = 64;
const SCALE: usize = 2;

type Rgb = [u8; 3];

const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [20, 20, 20];
const GRID: Rgb = [225, 225, 225];
const MARK: Rgb = [220, 30, 30];
const PALETTE: [Rgb; 8] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [23, 190, 207],
];

pub struct Series {
    pub name: String,
    /// (x, y) in chart units (seconds, milliseconds).
    pub points: Vec<(f64, f64)>,
}

pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Vertical marks: (x, label).
    pub marks: Vec<(f64, String)>,
}

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        Canvas {
            px: vec![255; W * H * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x >= 0 && y >= 0 && (x as usize) < W && (y as usize) < H {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn rect(&mut self, x: i64, y: i64, w: i64, h: i64, c: Rgb) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, c);
            }
        }
    }

    /// A line two pixels thick (Bresenham with a 2x2 brush).
    fn line(&mut self, (mut x0, mut y0): (i64, i64), (x1, y1): (i64, i64), c: Rgb) {
        let dx = (x1 - x0).abs();
        let dy = -(y1 - y0).abs();
        let sx = if x0 < x1 { 1 } else { -1 };
        let sy = if y0 < y1 { 1 } else { -1 };
        let mut err = dx + dy;
        loop {
            self.rect(x0, y0, 2, 2, c);
            if x0 == x1 && y0 == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x0 += sx;
            }
            if e2 <= dx {
                err += dx;
                y0 += sy;
            }
        }
    }

    fn text(&mut self, x: i64, y: i64, s: &str, c: Rgb) {
        for (i, ch) in s.chars().enumerate() {
            let rows = glyph(ch);
            let ox = x + (i * 6 * SCALE) as i64;
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0b10000 >> col) != 0 {
                        self.rect(
                            ox + (col * SCALE) as i64,
                            y + (r * SCALE) as i64,
                            SCALE as i64,
                            SCALE as i64,
                            c,
                        );
                    }
                }
            }
        }
    }

    /// Text drawn bottom-to-top (for the y axis label).
    fn text_up(&mut self, x: i64, y: i64, s: &str, c: Rgb) {
        for (i, ch) in s.chars().enumerate() {
            let rows = glyph(ch);
            let oy = y - (i * 6 * SCALE) as i64;
            for (r, bits) in rows.iter().enumerate() {
                for col in 0..5 {
                    if bits & (0b10000 >> col) != 0 {
                        self.rect(
                            x + (r * SCALE) as i64,
                            oy - (col * SCALE) as i64,
                            SCALE as i64,
                            SCALE as i64,
                            c,
                        );
                    }
                }
            }
        }
    }
}

fn text_width(s: &str) -> i64 {
    (s.chars().count() * 6 * SCALE) as i64
}

/// A round step giving about `n` ticks over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn label(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Renders the chart; each series is reduced to the maximum per pixel column.
pub fn render(chart: &Chart, path: &Path) -> Result<()> {
    let mut c = Canvas::new();
    let (pw, ph) = ((W - LEFT - RIGHT) as f64, (H - TOP - BOTTOM) as f64);
    let xs = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(chart.marks.iter().map(|m| m.0));
    let (mut x0, mut x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if x0 > x1 {
        (x0, x1) = (0.0, 1.0);
    }
    x0 = x0.min(0.0);
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let ymax = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let ystep = nice_step(ymax, 5.0);
    let y1 = (ymax / ystep).ceil() * ystep;
    let xstep = nice_step(x1 - x0, 8.0);
    let to_px = |x: f64, y: f64| -> (i64, i64) {
        (
            LEFT as i64 + ((x - x0) / (x1 - x0) * pw).round() as i64,
            (TOP as f64 + ph - (y / y1 * ph)).round() as i64,
        )
    };

    // Grid and ticks.
    let mut y = 0.0;
    while y <= y1 + ystep * 0.01 {
        let (_, py) = to_px(x0, y);
        c.rect(LEFT as i64, py, pw as i64, 1, GRID);
        let l = label(y, ystep);
        c.text(LEFT as i64 - 8 - text_width(&l), py - 7, &l, BLACK);
        y += ystep;
    }
    let mut x = (x0 / xstep).ceil() * xstep;
    while x <= x1 + xstep * 0.01 {
        let (px, _) = to_px(x, 0.0);
        c.rect(px, TOP as i64, 1, ph as i64, GRID);
        let l = label(x, xstep);
        c.text(px - text_width(&l) / 2, (H - BOTTOM) as i64 + 8, &l, BLACK);
        x += xstep;
    }
    c.rect(LEFT as i64, TOP as i64, 1, ph as i64, BLACK);
    c.rect(LEFT as i64, (H - BOTTOM) as i64, pw as i64, 1, BLACK);

    // Marks.
    for (mx, text) in &chart.marks {
        let (px, _) = to_px(*mx, 0.0);
        for yy in (TOP..H - BOTTOM).step_by(8) {
            c.rect(px, yy as i64, 2, 5, MARK);
        }
        c.text(px + 6, TOP as i64 + 4, text, MARK);
    }

    // Series: the maximum per pixel column, joined.
    for (i, s) in chart.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let mut cols: Vec<Option<f64>> = vec![None; pw as usize + 1];
        for (x, y) in &s.points {
            let col = (((x - x0) / (x1 - x0)) * pw).round().clamp(0.0, pw) as usize;
            let v = cols[col].get_or_insert(*y);
            *v = v.max(*y);
        }
        let mut prev: Option<(i64, i64)> = None;
        for (col, v) in cols.iter().enumerate() {
            if let Some(v) = v {
                let p = (LEFT as i64 + col as i64, to_px(x0, *v).1);
                match prev {
                    Some(q) => c.line(q, p, color),
                    None => c.rect(p.0, p.1, 2, 2, color),
                }
                prev = Some(p);
            }
        }
    }

    // Title, axis labels, legend.
    c.text(LEFT as i64, 14, &chart.title, BLACK);
    c.text(
        LEFT as i64 + pw as i64 / 2 - text_width(&chart.x_label) / 2,
        (H - 26) as i64,
        &chart.x_label,
        BLACK,
    );
    c.text_up(
        12,
        (TOP as f64 + ph / 2.0) as i64 + text_width(&chart.y_label) / 2,
        &chart.y_label,
        BLACK,
    );
    let mut ly = TOP as i64 + 28;
    for (i, s) in chart.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let lx = (W - RIGHT) as i64 - 16 - text_width(&s.name) - 24;
        c.rect(lx - 4, ly - 4, text_width(&s.name) + 36, 22, WHITE);
        c.rect(lx, ly + 5, 18, 4, color);
        c.text(lx + 24, ly, &s.name, BLACK);
        ly += 22;
    }

    std::fs::write(path, png(&c.px)).with_context(|| format!("could not write {}", path.display()))
}

/// A PNG of the canvas: 8-bit RGB, every row with filter 0, one zlib stream (miniz_oxide).
fn png(rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(H * (W * 3 + 1));
    for row in rgb.chunks(W * 3) {
        raw.push(0);
        raw.extend_from_slice(row);
    }
    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&(W as u32).to_be_bytes());
    ihdr.extend_from_slice(&(H as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // depth 8, RGB, deflate, filter 0, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(
        &mut out,
        b"IDAT",
        &miniz_oxide::deflate::compress_to_vec_zlib(&raw, 9),
    );
    chunk(&mut out, b"IEND", &[]);
    out
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// CRC-32 (ISO-HDLC, as PNG uses), bitwise: a chart has a handful of chunks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// 5x7 glyphs, one row per byte, the leftmost pixel in bit 4. Upper case is drawn as lower.
fn glyph(ch: char) -> [u8; 7] {
    match ch.to_ascii_lowercase() {
        ' ' => [0; 7],
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'a' => [0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F],
        'b' => [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E],
        'c' => [0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E],
        'd' => [0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F],
        'e' => [0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E],
        'f' => [0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08],
        'g' => [0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E],
        'h' => [0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11],
        'i' => [0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E],
        'j' => [0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C],
        'k' => [0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12],
        'l' => [0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'm' => [0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11],
        'n' => [0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11],
        'o' => [0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E],
        'p' => [0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10],
        'q' => [0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01],
        'r' => [0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10],
        's' => [0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E],
        't' => [0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06],
        'u' => [0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D],
        'v' => [0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'w' => [0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A],
        'x' => [0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11],
        'y' => [0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E],
        'z' => [0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        ',' => [0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08],
        ':' => [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00],
        '-' => [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00],
        '/' => [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '=' => [0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '_' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F],
        '+' => [0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00],
        '>' => [0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08],
        '<' => [0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02],
        '|' => [0x04; 7],
        '*' => [0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00],
        _ => [0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps_are_round() {
        assert_eq!(nice_step(1000.0, 5.0), 200.0);
        assert_eq!(nice_step(7.0, 8.0), 1.0);
        assert_eq!(nice_step(0.3, 5.0), 0.1);
    }

    #[test]
    fn crc32_matches_the_reference() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b"IEND"), 0xAE42_6082);
    }

    #[test]
    fn renders_a_png() {
        let dir = std::env::temp_dir().join(format!("tocsin-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.png");
        let chart = Chart {
            title: "lag per tenant".into(),
            x_label: "s".into(),
            y_label: "ms".into(),
            series: vec![Series {
                name: "t0".into(),
                points: (0..100)
                    .map(|i| (i as f64 / 10.0, (i * i) as f64))
                    .collect(),
            }],
            marks: vec![(5.0, "kill -9".into())],
        };
        render(&chart, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
