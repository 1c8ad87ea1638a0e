//! UUIDs: a new random one (version 4), and the text form of one both
//! ways (libuuid's uuid_unparse, lower case, and uuid_parse, which also
//! takes the 32 digits without dashes).

use crate::{Error, Result};

/// A new random (version 4) UUID.
pub fn random_uuid() -> [u8; 16] {
    let mut u = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut u);
    }
    if u == [0; 16] {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(1);
        u = (t ^ (std::process::id() as u128) << 64).to_le_bytes();
    }
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Append the 8-4-4-4-12 text of `u` to `out`.
pub fn write_uuid(out: &mut Vec<u8>, u: &[u8; 16]) {
    for (n, &x) in u.iter().enumerate() {
        if matches!(n, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(HEX[(x >> 4) as usize]);
        out.push(HEX[(x & 15) as usize]);
    }
}

/// The 8-4-4-4-12 text of `u`.
pub fn uuid_str(u: &[u8; 16]) -> String {
    let mut v = Vec::with_capacity(36);
    write_uuid(&mut v, u);
    // Only ASCII went in.
    String::from_utf8_lossy(&v).into_owned()
}

/// A UUID from its text: 32 hexadecimal digits, dashes anywhere.
pub fn parse_uuid(s: &str) -> Result<[u8; 16]> {
    let bad = || Error::Invalid(format!("'{s}' is not a UUID"));
    let mut digits = s.bytes().filter(|c| *c != b'-');
    let mut u = [0u8; 16];
    for b in u.iter_mut() {
        let mut v = 0u8;
        for _ in 0..2 {
            let d = digits.next().ok_or_else(bad)?;
            let x = (d as char).to_digit(16).ok_or_else(bad)?;
            v = v << 4 | x as u8;
        }
        *b = v;
    }
    if digits.next().is_some() {
        return Err(bad());
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let u = random_uuid();
        let t = uuid_str(&u);
        assert_eq!(t.len(), 36);
        assert_eq!(parse_uuid(&t).unwrap(), u);
        assert_eq!(parse_uuid(&t.replace('-', "")).unwrap(), u);
        assert_eq!(u[6] >> 4, 4, "version 4");
        for bad in [
            "",
            "xyz",
            "é0000000-0000-0000-0000-000000000000",
            &t[1..],
            &format!("{t}0"),
        ] {
            assert!(parse_uuid(bad).is_err(), "{bad:?}");
        }
    }
}
