//! `--svg FILE`: the job's topology with each link's measured rate, in the style of the
//! benchmarks' plots (`benches/cluster.sh`: white ground, sans-serif 12, the same colours).
//! The ranks sit on a circle; each link is a line from the connecting rank to its peer
//! (connections of one pair side by side), as wide as its slower direction is fast, blue,
//! or red when flagged, labelled with its forward and back rates. Under the title, the all_sum
//! sweep's verdict when there is one (its largest size's busbw against the slowest link).

use std::fmt::Write as _;

use super::report::{Row, rate};

/// Escapes text for SVG.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The SVG of `rows` for the ranks whose hosts are `hosts`, titled `title`, with `note`
/// under the title.
pub(crate) fn svg(title: &str, note: Option<&str>, hosts: &[String], rows: &[Row]) -> String {
    let n = hosts.len().max(1);
    let (w, h) = (720.0_f64, 560.0_f64);
    let (cx, cy, radius) = (w / 2.0, h / 2.0 + 10.0, 190.0);
    let at = |r: usize| {
        // Rank 0 at the top, clockwise.
        let a = std::f64::consts::TAU * r as f64 / n as f64 - std::f64::consts::FRAC_PI_2;
        (cx + radius * a.cos(), cy + radius * a.sin())
    };
    let best = rows
        .iter()
        .filter_map(|r| {
            let (f, b) = r.rates();
            f.into_iter().chain(b).reduce(f64::min)
        })
        .fold(0.0_f64, f64::max);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="20" y="24" font-size="14">{}</text>"#,
        escape(title)
    );
    if let Some(note) = note {
        let _ = writeln!(
            s,
            "<text x=\"20\" y=\"42\" fill=\"#555\">{}</text>",
            escape(note)
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"20\" y=\"{}\" fill=\"#888\">each link from the connecting rank: forward / back; width: the slower direction; red: flagged</text>",
        h - 14.0
    );
    for row in rows {
        let ((x1, y1), (x2, y2)) = (at(row.from), at(row.to));
        let (dx, dy) = (x2 - x1, y2 - y1);
        let len = (dx * dx + dy * dy).sqrt().max(1.0);
        // Side by side: one pair's links (both ways, every connection) apart.
        let side = if row.from < row.to { 1.0 } else { -1.0 };
        let off = side * (8.0 + 14.0 * row.connection as f64);
        let (ox, oy) = (-dy / len * off, dx / len * off);
        let (f, b) = row.rates();
        let slower = f.into_iter().chain(b).reduce(f64::min);
        let width = match slower {
            Some(v) if best > 0.0 => 1.0 + 5.0 * v / best,
            _ => 1.0,
        };
        let colour = if row.flags.is_empty() {
            "#1f77b4"
        } else {
            "#d62728"
        };
        let dash = if slower.is_none() {
            r#" stroke-dasharray="6,4""#
        } else {
            ""
        };
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="{width:.1}"{dash}/>"#,
            x1 + ox,
            y1 + oy,
            x2 + ox,
            y2 + oy
        );
        let label = match (f, b) {
            (Some(f), Some(b)) => format!("{} {} / {}", row.name(), rate(f), rate(b)),
            _ => format!("{} {}", row.name(), row.flags.join(", ")),
        };
        let (mx, my) = ((x1 + x2) / 2.0 + ox * 2.2, (y1 + y2) / 2.0 + oy * 2.2 + 4.0);
        let _ = writeln!(
            s,
            r#"<text x="{mx:.1}" y="{my:.1}" text-anchor="middle" fill="{colour}">{}</text>"#,
            escape(&label)
        );
    }
    for (r, host) in hosts.iter().enumerate() {
        let (x, y) = at(r);
        let _ = writeln!(
            s,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"24\" fill=\"white\" stroke=\"#333\"/>"
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">rank {r}</text>"#,
            y + 4.0
        );
        let _ = writeln!(
            s,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
            y + 40.0,
            escape(host)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::measure::{Measurement, Transfer};

    #[test]
    fn the_svg_has_a_node_per_rank_and_a_labelled_line_per_link() {
        let t = |bytes: u64| Transfer {
            bytes,
            seconds: 1.0,
        };
        let rows: Vec<Row> = (0..3)
            .map(|r| Row {
                from: r,
                to: (r + 1) % 3,
                measurement: Some(Measurement {
                    forward: Some(t(117_500_000)),
                    back: Some(t(117_500_000)),
                    ..Measurement::default()
                }),
                flags: if r == 2 { vec!["slow".into()] } else { vec![] },
                ..Row::default()
            })
            .collect();
        let hosts = ["a".to_owned(), "b<&>".to_owned(), "c".to_owned()];
        let s = svg("3 <hosts>", Some("all_sum 64 MiB: 1 < 2"), &hosts, &rows);
        assert!(s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(s.ends_with("</svg>\n"));
        assert_eq!(s.matches("<circle").count(), 3);
        assert_eq!(s.matches("<line").count(), 3);
        assert_eq!(s.matches("0→1 940 Mbit/s / 940 Mbit/s").count(), 1);
        assert_eq!(
            s.matches("#d62728").count(),
            2,
            "the flagged link and its label"
        );
        assert!(s.contains("b&lt;&amp;&gt;") && s.contains("3 &lt;hosts&gt;"));
        assert!(s.contains(">all_sum 64 MiB: 1 &lt; 2</text>"));
    }
}
