//! A latency-percentile chart as a hand-written SVG.
//!
//! x: percentile on a log scale of "nines" (`-log10(1 - p)`: 50 -> 0.3, 90 -> 1, 99 -> 2, 99.9 ->
//! 3, 99.99 -> 4); y: latency on a log scale; one line per 4 KiB row (queue depth / policy),
//! reads solid, writes dashed.

use std::fmt::Write;

use super::BenchReport;

const W: f64 = 900.0;
const H: f64 = 540.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 5] = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e"];

fn nines(p: f64) -> f64 {
    -(1.0 - p / 100.0).max(1e-9).log10()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The chart for the 4 KiB rows of `r`.
pub fn render_svg(r: &BenchReport) -> String {
    let rows: Vec<_> = r.rows.iter().filter(|row| row.block == 4096 && !row.curve.is_empty()).collect();
    let (mut lo, mut hi) = (f64::MAX, f64::MIN);
    for row in &rows {
        for &(_, v) in &row.curve {
            let v = v.max(0.01);
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    if rows.is_empty() {
        (lo, hi) = (1.0, 10.0);
    }
    let (ylo, yhi) = (lo.log10().floor(), hi.log10().ceil().max(lo.log10().floor() + 1.0));
    let (xlo, xhi) = (nines(50.0), 4.0);
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let x = |p: f64| LEFT + (nines(p) - xlo) / (xhi - xlo) * pw;
    let y = |us: f64| TOP + ph - (us.max(0.01).log10() - ylo) / (yhi - ylo) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let title = format!(
        "virtiofs-bench 4 KiB latency by percentile (queue size {}, {}; {})",
        r.setup.queue_size, r.machine.cpu_model, r.setup.device
    );
    let _ = writeln!(s, r#"<text x="{LEFT}" y="28" font-size="14">{}</text>"#, esc(&title));
    // Grid and axes.
    for p in [50.0, 90.0, 99.0, 99.9, 99.99] {
        let xp = x(p);
        let _ = writeln!(
            s,
            "<line x1=\"{xp:.1}\" y1=\"{TOP}\" x2=\"{xp:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>",
            TOP + ph
        );
        let _ =
            writeln!(s, r#"<text x="{xp:.1}" y="{:.1}" text-anchor="middle">p{p}</text>"#, TOP + ph + 18.0);
    }
    let mut e = ylo;
    while e <= yhi + 1e-9 {
        let v = 10f64.powf(e);
        let yp = y(v);
        let label = if v >= 1.0 { format!("{v:.0}") } else { format!("{v}") };
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{yp:.1}\" x2=\"{:.1}\" y2=\"{yp:.1}\" stroke=\"#ddd\"/>",
            LEFT + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
            LEFT - 6.0,
            yp + 4.0
        );
        e += 1.0;
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">percentile (log scale of nines)</text>"#,
        LEFT + pw / 2.0,
        H - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{:.1}" text-anchor="middle" transform="rotate(-90 20 {:.1})">latency (us, log scale)</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // One line per row.
    let mut keys: Vec<String> = Vec::new();
    let mut legend_y = TOP + 10.0;
    for row in &rows {
        // Reads and writes of the same depth and policy share a colour.
        let key = format!("{}{:?}", row.depth_label, row.policy);
        let i = keys.iter().position(|k| *k == key).unwrap_or_else(|| {
            keys.push(key);
            keys.len() - 1
        });
        let c = COLORS[i % COLORS.len()];
        let write = row.workload.contains("write");
        let pts: Vec<String> = row.curve.iter().map(|&(p, v)| format!("{:.1},{:.1}", x(p), y(v))).collect();
        let dash = if write { r#" stroke-dasharray="6 4""# } else { "" };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2"{dash} points="{}"/>"#,
            pts.join(" ")
        );
        let label = format!(
            "{} QD={}{}",
            row.workload,
            row.depth,
            row.policy.map(|p| format!(" {p}")).unwrap_or_default()
        );
        let lx = LEFT + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{c}" stroke-width="2"{dash}/>"#,
            lx + 30.0
        );
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 36.0, legend_y + 4.0, esc(&label));
        legend_y += 20.0;
    }
    let _ = writeln!(s, "</svg>");
    s
}
