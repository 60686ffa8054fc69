//! Numbers for people: microseconds, byte counts and digit groups, as the
//! live progress line, the terminal summary and the HTML page print them.
//!
//! Owns formatting only: pure functions of a number, no I/O and no other
//! layer, so every printer shows a figure the same way.

/// Formats microseconds for people: `850µs`, `12.3ms`, `1.50s`.
pub fn fmt_micros(us: f64) -> String {
    if us < 1_000.0 {
        format!("{us:.0}µs")
    } else if us < 1_000_000.0 {
        format!("{:.2}ms", us / 1_000.0)
    } else {
        format!("{:.2}s", us / 1_000_000.0)
    }
}

/// 1234567 → "1,234,567".
pub fn thousands(v: u64) -> String {
    let digits = v.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes for people: `812 B`, `3.4 KiB`, `45.2 MiB`.
pub fn bytes(v: f64) -> String {
    if v < 1024.0 {
        format!("{v:.0} B")
    } else if v < 1024.0 * 1024.0 {
        format!("{:.1} KiB", v / 1024.0)
    } else if v < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", v / (1024.0 * 1024.0))
    } else {
        format!("{:.2} GiB", v / (1024.0 * 1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_micros(850.0), "850µs");
        assert_eq!(fmt_micros(12_345.0), "12.35ms");
        assert_eq!(fmt_micros(1_500_000.0), "1.50s");
    }

    #[test]
    fn groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(7_089_699), "7,089,699");
    }
}
