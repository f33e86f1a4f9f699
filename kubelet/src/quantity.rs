//! Kubernetes resource quantities (`100m`, `1.5`, `128Mi`, `1G`, `1e3`).

/// Why a quantity string is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {0:?}")]
pub struct InvalidQuantity(pub String);

fn split(s: &str) -> (&str, &str) {
    let end = s
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || ((*c == '+' || *c == '-') && *i == 0)))
        .map_or(s.len(), |(i, _)| i);
    s.split_at(end)
}

/// Parses a quantity into a value scaled by `scale` (1 for bytes, 1000 for milli-units),
/// rounding up like Kubernetes does.
fn parse_scaled(s: &str, scale: f64) -> Result<i64, InvalidQuantity> {
    let bad = || InvalidQuantity(s.to_owned());
    let t = s.trim();
    let (number, suffix) = split(t);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| bad())?;
            10f64.powi(exp)
        }
        _ => return Err(bad()),
    };
    let scaled = (value * factor * scale).ceil();
    if !scaled.is_finite() || scaled < 0.0 || scaled > i64::MAX as f64 {
        return Err(bad());
    }
    Ok(scaled as i64)
}

/// A quantity in base units, rounded up (bytes for memory).
///
/// # Errors
/// If `s` is not a Kubernetes quantity or is negative.
pub fn parse(s: &str) -> Result<i64, InvalidQuantity> {
    parse_scaled(s, 1.0)
}

/// A quantity in thousandths (millicores for CPU), rounded up.
///
/// # Errors
/// If `s` is not a Kubernetes quantity or is negative.
pub fn parse_milli(s: &str) -> Result<i64, InvalidQuantity> {
    parse_scaled(s, 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities_in_millicores() {
        assert_eq!(parse_milli("100m"), Ok(100));
        assert_eq!(parse_milli("1"), Ok(1000));
        assert_eq!(parse_milli("1.5"), Ok(1500));
        assert_eq!(parse_milli("0.0001"), Ok(1), "rounded up");
    }

    #[test]
    fn memory_quantities_in_bytes() {
        assert_eq!(parse("128Mi"), Ok(128 << 20));
        assert_eq!(parse("1G"), Ok(1_000_000_000));
        assert_eq!(parse("1e3"), Ok(1000));
        assert_eq!(parse("64k"), Ok(64_000));
    }

    #[test]
    fn garbage_and_negatives_are_rejected() {
        for bad in ["", "abc", "12Q", "-1", "1.2.3", "Mi"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
