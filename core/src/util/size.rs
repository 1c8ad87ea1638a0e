//! Sizes and offsets as people write them: `4096`, `0x1000`, `16K`, `1g`,
//! `2GiB`. One rule for every place that takes one (mkfs's options, the
//! mount options, a script's numbers): decimal or `0x` hexadecimal digits,
//! then an optional binary suffix K, M, G, T, P or E in either case,
//! optionally followed by `B` or `iB` (`16K`, `16KB` and `16KiB` are all
//! 16,384 bytes, as btrfs-progs and the kernel's memparse read them).

use std::fmt;

/// Why a size did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// No digits, or characters that are neither digits nor a suffix.
    NotANumber(String),
    /// A letter after the digits that is not a size suffix.
    UnknownSuffix(String),
    /// The value does not fit in 64 bits.
    Overflow(String),
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NotANumber(s) => write!(f, "{s:?} is not a number"),
            SizeError::UnknownSuffix(s) => {
                write!(f, "{s:?} has an unknown suffix (K, M, G, T, P or E)")
            }
            SizeError::Overflow(s) => write!(f, "{s:?} is too large"),
        }
    }
}

impl std::error::Error for SizeError {}

/// The bytes `s` names (leading and trailing blanks ignored).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let (hex, body) = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => (true, h),
        None => (false, t),
    };
    let is_digit = |c: char| {
        if hex {
            c.is_ascii_hexdigit()
        } else {
            c.is_ascii_digit()
        }
    };
    let split = body.find(|c: char| !is_digit(c)).unwrap_or(body.len());
    let (digits, suffix) = body.split_at(split);
    if digits.is_empty() {
        return Err(SizeError::NotANumber(s.to_string()));
    }
    let shift = match suffix.as_bytes() {
        [] => 0,
        [unit, rest @ ..] => {
            let shift = match unit.to_ascii_lowercase() {
                b'b' if rest.is_empty() => 0,
                b'k' => 10,
                b'm' => 20,
                b'g' => 30,
                b't' => 40,
                b'p' => 50,
                b'e' => 60,
                _ => return Err(SizeError::UnknownSuffix(s.to_string())),
            };
            let tail_ok = rest.is_empty()
                || rest.eq_ignore_ascii_case(b"b")
                || rest.eq_ignore_ascii_case(b"ib");
            if !tail_ok || (shift == 0 && !rest.is_empty()) {
                return Err(SizeError::UnknownSuffix(s.to_string()));
            }
            shift
        }
    };
    let n = u64::from_str_radix(digits, if hex { 16 } else { 10 })
        .map_err(|_| SizeError::Overflow(s.to_string()))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_written() {
        for (s, v) in [
            ("4096", 4096u64),
            (" 4096 ", 4096),
            ("0x1000", 4096),
            ("0X10k", 16 << 10),
            ("16K", 16 << 10),
            ("16k", 16 << 10),
            ("16KB", 16 << 10),
            ("16KiB", 16 << 10),
            ("1g", 1 << 30),
            ("2GiB", 2 << 30),
            ("3t", 3 << 40),
            ("1P", 1 << 50),
            ("1e", 1 << 60),
            ("512b", 512),
            ("0", 0),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
    }

    #[test]
    fn bad_sizes_are_refused() {
        for s in [
            "", "K", "x", "1x", "1KX", "1Kib2", "1bb", "-1", "1.5G", "0x",
        ] {
            assert!(
                matches!(
                    parse_size(s),
                    Err(SizeError::NotANumber(_) | SizeError::UnknownSuffix(_))
                ),
                "{s}: {:?}",
                parse_size(s)
            );
        }
        assert!(matches!(parse_size("16E"), Err(SizeError::Overflow(_))));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::Overflow(_))
        ));
    }
}
