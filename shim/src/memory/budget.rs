//! Parsing of the memory-size settings `TENSILE_DEVICE_MEMORY` and `TENSILE_HOST_MEMORY`.
//!
//! Accepted forms: a byte count (`123456`), a number with a binary unit (`512MiB`, `1.5GiB`,
//! `64KiB`, `1TiB`, or the shorthands `K`/`M`/`G`/`T`), a number with a decimal SI unit
//! (`KB`/`MB`/`GB`/`TB`: powers of 1000, as in the simulated GPU's `TENSILE_SIM_DEVICE_MEMORY`),
//! or a percentage of a total (`40%`). Case and whitespace around the unit are ignored.
//!
//! This module only turns text into bytes; deciding what a missing setting means (the card's
//! free memory, the coordinator's grant) is the caller's business.

use std::fmt;

/// A parsed size setting, before a percentage is resolved against a total.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeSpec {
    Bytes(u64),
    /// A fraction of a total in `(0, 1]`.
    Fraction(f64),
}

/// Why a size setting was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetError {
    Empty,
    /// The number part is not a number (`abcMiB`, `1.2.3GiB`).
    BadNumber(String),
    UnknownUnit(String),
    Zero,
    Negative,
    PercentOver100(String),
    /// The value does not fit in 64 bits of bytes.
    Overflow,
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetError::Empty => write!(f, "empty size"),
            BudgetError::BadNumber(s) => write!(f, "`{s}` is not a number"),
            BudgetError::UnknownUnit(u) => {
                write!(f, "unknown unit `{u}` (use B, KiB, MiB, GiB, TiB or %)")
            }
            BudgetError::Zero => write!(f, "size must be more than zero"),
            BudgetError::Negative => write!(f, "size must not be negative"),
            BudgetError::PercentOver100(s) => write!(f, "percentage `{s}` is over 100%"),
            BudgetError::Overflow => write!(f, "size is too large"),
        }
    }
}

impl std::error::Error for BudgetError {}

impl SizeSpec {
    /// Parses one setting value.
    pub fn parse(text: &str) -> Result<SizeSpec, BudgetError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(BudgetError::Empty);
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        if num.starts_with('-') {
            return Err(BudgetError::Negative);
        }
        let is_plain_number = !num.is_empty()
            && num.chars().all(|c| c.is_ascii_digit() || c == '.')
            && num.matches('.').count() <= 1
            && num != ".";
        if !is_plain_number {
            return Err(BudgetError::BadNumber(num.to_string()));
        }
        let value: f64 = num
            .parse()
            .map_err(|_| BudgetError::BadNumber(num.to_string()))?;
        if unit == "%" {
            if value == 0.0 {
                return Err(BudgetError::Zero);
            }
            if value > 100.0 {
                return Err(BudgetError::PercentOver100(t.to_string()));
            }
            return Ok(SizeSpec::Fraction(value / 100.0));
        }
        let scale: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(BudgetError::UnknownUnit(unit.to_string())),
        };
        let bytes = if num.contains('.') {
            let b = value * scale as f64;
            if b >= u64::MAX as f64 {
                return Err(BudgetError::Overflow);
            }
            b.floor() as u64
        } else {
            let whole: u64 = num.parse().map_err(|_| BudgetError::Overflow)?;
            whole.checked_mul(scale).ok_or(BudgetError::Overflow)?
        };
        if bytes == 0 {
            return Err(BudgetError::Zero);
        }
        Ok(SizeSpec::Bytes(bytes))
    }

    /// Bytes, resolving a percentage against `total`.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            SizeSpec::Bytes(b) => b,
            SizeSpec::Fraction(f) => (total as f64 * f).floor() as u64,
        }
    }
}

/// The device budget from the `TENSILE_DEVICE_MEMORY` setting (`None` when unset), the card's
/// free and total memory. Unset: the card's free memory. A percentage is of the total.
/// A bad setting is an error for the caller to report once; it then uses the default,
/// [`default_device_budget`].
pub fn device_budget(setting: Option<&str>, free: u64, total: u64) -> Result<u64, BudgetError> {
    match setting {
        None => Ok(default_device_budget(free)),
        Some(text) => parse_size(text, total),
    }
}

/// The budget when none (or a bad one) is set: what the card has free.
pub fn default_device_budget(free: u64) -> u64 {
    free
}

/// Parses `text` and resolves it against `total` in one go.
pub fn parse_size(text: &str, total: u64) -> Result<u64, BudgetError> {
    SizeSpec::parse(text).map(|s| s.resolve(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn accepts_the_documented_forms() {
        assert_eq!(parse_size("6GiB", 0), Ok(6 * GIB));
        assert_eq!(parse_size("512MiB", 0), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB", 0), Ok(GIB + GIB / 2));
        assert_eq!(parse_size("123456", 0), Ok(123456));
        assert_eq!(parse_size("40%", 80 * GIB), Ok(32 * GIB));
        assert_eq!(parse_size(" 6 gib ", 0), Ok(6 * GIB));
        assert_eq!(
            parse_size("6GB", 0),
            Ok(6_000_000_000),
            "SI units are decimal"
        );
        assert_eq!(parse_size("6G", 0), Ok(6 * GIB), "the shorthand is binary");
        assert_eq!(parse_size("1.5MB", 0), Ok(1_500_000));
        assert_eq!(parse_size("2T", 0), Ok(2 << 40));
        assert_eq!(parse_size("100%", 1000), Ok(1000));
        assert_eq!(parse_size("12.5%", 1000), Ok(125));
        assert_eq!(parse_size("64KiB", 0), Ok(65536));
        assert_eq!(parse_size("7B", 0), Ok(7));
    }

    #[test]
    fn refuses_bad_values_by_kind() {
        assert_eq!(parse_size("", 0), Err(BudgetError::Empty));
        assert_eq!(parse_size("   ", 0), Err(BudgetError::Empty));
        assert_eq!(
            parse_size("6XB", 0),
            Err(BudgetError::UnknownUnit("XB".into()))
        );
        assert_eq!(
            parse_size("6 parsecs", 0),
            Err(BudgetError::UnknownUnit("parsecs".into()))
        );
        assert_eq!(parse_size("0", 0), Err(BudgetError::Zero));
        assert_eq!(parse_size("0GiB", 0), Err(BudgetError::Zero));
        assert_eq!(parse_size("0%", 100), Err(BudgetError::Zero));
        assert_eq!(parse_size("0.0000000001B", 0), Err(BudgetError::Zero));
        assert_eq!(parse_size("-1GiB", 0), Err(BudgetError::Negative));
        assert_eq!(
            parse_size("101%", 100),
            Err(BudgetError::PercentOver100("101%".into()))
        );
        assert_eq!(
            parse_size("GiB", 0),
            Err(BudgetError::BadNumber(String::new()))
        );
        assert_eq!(
            parse_size("1.2.3GiB", 0),
            Err(BudgetError::BadNumber("1.2.3".into()))
        );
        assert_eq!(parse_size("99999999999TiB", 0), Err(BudgetError::Overflow));
        assert_eq!(
            parse_size("99999999999999999999", 0),
            Err(BudgetError::Overflow)
        );
    }

    #[test]
    fn device_budget_defaults_to_free_memory() {
        assert_eq!(device_budget(None, 70 * GIB, 80 * GIB), Ok(70 * GIB));
        assert_eq!(device_budget(Some("40%"), 70 * GIB, 80 * GIB), Ok(32 * GIB));
        assert_eq!(device_budget(Some("6GiB"), 1, 2), Ok(6 * GIB));
        assert_eq!(
            device_budget(Some("lots"), 1, 2),
            Err(BudgetError::BadNumber(String::new()))
        );
    }

    #[test]
    fn errors_read_well() {
        let e = parse_size("6XB", 0).unwrap_err().to_string();
        assert!(e.contains("XB") && e.contains("GiB"), "{e}");
    }
}
