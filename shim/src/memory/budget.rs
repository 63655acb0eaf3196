//! The memory-size settings `TENSILE_DEVICE_MEMORY` and `TENSILE_HOST_MEMORY`: parsing,
//! the default device budget ([`default_device_budget`], with headroom for what libraries
//! allocate around the arena), and sizes printed back in human units ([`format_size`]).
//!
//! Accepted forms: a byte count (`123456`), a number with a binary unit (`512MiB`, `1.5GiB`,
//! `64KiB`, `1TiB`, or the shorthands `K`/`M`/`G`/`T`), a number with a decimal SI unit
//! (`KB`/`MB`/`GB`/`TB`: powers of 1000, as in the simulated GPU's `TENSILE_SIM_DEVICE_MEMORY`),
//! or a percentage of a total (`40%`). Case and whitespace around the unit are ignored.
//!
//! Pure functions over numbers: reading the card, the host or the coordinator's grant, and
//! deciding which rule applies to which setting, is the caller's business
//! ([`crate::managed::sizing`]).

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
        if num.is_empty() {
            // Nothing numeric at all (`abc`, `GiB`): quote the whole value.
            return Err(BudgetError::BadNumber(t.to_string()));
        }
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
/// free and total memory. Unset: [`default_device_budget`]. A percentage is of the total.
/// A bad setting is an error for the caller to report once; it then uses the default.
pub fn device_budget(setting: Option<&str>, free: u64, total: u64) -> Result<u64, BudgetError> {
    match setting {
        None => Ok(default_device_budget(free, total)),
        Some(text) => parse_size(text, total),
    }
}

/// Device memory left outside the arena when no budget is set: [`headroom`].
pub const MIN_HEADROOM: u64 = 1 << 30;

/// What libraries that allocate around the arena may still need after the manager starts:
/// the larger of 1 GiB and 5% of the card, but at most an eighth of the free memory. They are
/// the context's growth (kernels of cuBLAS, cuDNN and the application loaded lazily on first
/// use; local memory resized to the largest per-thread stack any kernel asks for, about
/// 270 MiB for 1 KiB per thread on an H100's 132 SMs x 2048 threads), and NCCL's buffers,
/// which recent versions map themselves with `cuMemCreate` (4 MiB `NCCL_BUFFSIZE` per
/// channel, peer and direction: 256 MiB for a ring of 32 channels, more with NVLS and several
/// communicators).
/// cuBLAS and cuDNN workspaces come through the application's allocator, that is the arena.
/// The eighth keeps a small card (or the simulated GPU's test cards of a few MiB) mostly
/// for the arena. `docs/memory.md` has the reasoning.
pub fn headroom(free: u64, total: u64) -> u64 {
    MIN_HEADROOM.max(total / 20).min(free / 8)
}

/// The budget when none (or a bad one) is set: the card's free memory less [`headroom`].
pub fn default_device_budget(free: u64, total: u64) -> u64 {
    free - headroom(free, total)
}

/// `bytes` in the largest binary unit that keeps it at least 1 (`1.5 GiB`, `512 KiB`,
/// `300 B`), with at most two decimals: the inverse of [`SizeSpec::parse`] for messages.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1u64 << (10 * (unit + 1)) {
        unit += 1;
    }
    if unit == 0 {
        return format!("{bytes} B");
    }
    let value = bytes as f64 / (1u64 << (10 * unit)) as f64;
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} {}", UNITS[unit])
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
            Err(BudgetError::BadNumber("GiB".into()))
        );
        assert_eq!(
            parse_size(" abc ", 0),
            Err(BudgetError::BadNumber("abc".into()))
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
    fn device_budget_defaults_to_free_memory_less_headroom() {
        // An H100: 5% of 80 GiB is 4 GiB.
        assert_eq!(device_budget(None, 70 * GIB, 80 * GIB), Ok(66 * GIB));
        // A 16 GiB card: the 1 GiB floor.
        assert_eq!(device_budget(None, 15 * GIB, 16 * GIB), Ok(14 * GIB));
        // A small or busy card: an eighth of its free memory.
        assert_eq!(device_budget(None, 4 * GIB, 80 * GIB), Ok(7 * GIB / 2));
        assert_eq!(device_budget(None, 64 << 20, 64 << 20), Ok(56 << 20));
        assert_eq!(device_budget(None, 0, 0), Ok(0));
        assert_eq!(device_budget(Some("40%"), 70 * GIB, 80 * GIB), Ok(32 * GIB));
        assert_eq!(device_budget(Some("6GiB"), 1, 2), Ok(6 * GIB));
        assert_eq!(
            device_budget(Some("lots"), 1, 2),
            Err(BudgetError::BadNumber("lots".into()))
        );
    }

    #[test]
    fn sizes_format_in_human_units() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1024), "1 KiB");
        assert_eq!(format_size(3 << 20), "3 MiB");
        assert_eq!(format_size(GIB + GIB / 2), "1.5 GiB");
        assert_eq!(format_size(1_769_472), "1.69 MiB");
        assert_eq!(format_size(100 << 40), "100 TiB");
    }

    #[test]
    fn errors_read_well() {
        let e = parse_size("6XB", 0).unwrap_err().to_string();
        assert!(e.contains("XB") && e.contains("GiB"), "{e}");
    }
}
