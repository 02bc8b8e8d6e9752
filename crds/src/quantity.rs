//! Kubernetes quantities as whole bytes (`1Gi`, `512Mi`, `4096`, `1G`, `1.5Gi`).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity that is not a whole, non-negative number of bytes within `u64`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid quantity {value:?}: {reason}")]
pub struct QuantityError {
    pub value: String,
    pub reason: &'static str,
}

/// Parse a quantity into bytes. Accepts binary (`Ki`..`Ei`) and decimal (`k`..`E`) suffixes,
/// a decimal fraction when the result is whole, and decimal exponents (`1e9`).
pub fn to_bytes(q: &Quantity) -> Result<u64, QuantityError> {
    parse_bytes(&q.0)
}

/// See [`to_bytes`].
pub fn parse_bytes(value: &str) -> Result<u64, QuantityError> {
    let err = |reason| QuantityError {
        value: value.to_string(),
        reason,
    };
    let s = value.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() {
        return Err(err("expected a number such as 1Gi"));
    }
    // (multiplier numerator as power of 2 or 10)
    let (base, exp): (u128, u32) = match suffix {
        "" => (10, 0),
        "Ki" => (2, 10),
        "Mi" => (2, 20),
        "Gi" => (2, 30),
        "Ti" => (2, 40),
        "Pi" => (2, 50),
        "Ei" => (2, 60),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        s if s.starts_with(['e', 'E']) => {
            let e: u32 = s[1..].parse().map_err(|_| err("bad exponent"))?;
            (10, e)
        }
        "m" => return Err(err("fractional bytes (milli) are not whole bytes")),
        _ => return Err(err("unknown suffix; use Ki, Mi, Gi, Ti, k, M, G or T")),
    };
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if !int_part
        .chars()
        .chain(frac_part.chars())
        .all(|c| c.is_ascii_digit())
    {
        return Err(err("expected a number such as 1Gi"));
    }
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = digits.parse().map_err(|_| err("number too large"))?;
    let denom = 10u128
        .checked_pow(u32::try_from(frac_part.len()).map_err(|_| err("number too large"))?)
        .ok_or_else(|| err("number too large"))?;
    let mult = base
        .checked_pow(exp)
        .ok_or_else(|| err("number too large"))?;
    let scaled = mantissa
        .checked_mul(mult)
        .ok_or_else(|| err("number too large"))?;
    if scaled % denom != 0 {
        return Err(err("not a whole number of bytes"));
    }
    u64::try_from(scaled / denom).map_err(|_| err("number too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_suffixes() {
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("4k"), Ok(4000));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("1e6"), Ok(1_000_000));
        assert_eq!(parse_bytes("8Ei"), Ok(8 << 60));
    }

    #[test]
    fn rejects_what_is_not_whole_bytes() {
        assert!(parse_bytes("1.5").is_err());
        assert!(parse_bytes("100m").is_err());
        assert!(parse_bytes("-1Gi").is_err());
        assert!(parse_bytes("Gi").is_err());
        assert!(parse_bytes("1Qi").is_err());
        assert!(parse_bytes("16Ei").is_err(), "overflows u64");
        let e = parse_bytes("1Qi").unwrap_err();
        assert!(e.to_string().contains("\"1Qi\""), "{e}");
    }
}
