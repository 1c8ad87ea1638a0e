//! A fast hasher for maps keyed by block addresses and inode numbers:
//! those keys are not attacker-chosen, so a multiply-mix (as FxHash) beats
//! SipHash by far on the engine's hottest maps.

use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-mix hasher (FxHash style): each word is folded in by rotate, XOR and
/// multiply. Fast, but not resistant to chosen keys; use it only for keys the
/// engine makes itself (logical addresses, inode numbers, tree ids).
#[derive(Default, Clone, Copy)]
pub struct MixHasher(u64);

const K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        // Fold the high bits down: block addresses differ mostly in the
        // middle bits.
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(n as u64);
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// `BuildHasher` for [`MixHasher`] (stateless: every map hashes the same way).
pub type MixBuild = BuildHasherDefault<MixHasher>;
/// `HashMap` hashed with [`MixHasher`]; build one with `FastMap::default()`.
pub type FastMap<K, V> = std::collections::HashMap<K, V, MixBuild>;

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn spreads_block_addresses() {
        let mut m: FastMap<u64, u64> = FastMap::default();
        for i in 0..10_000u64 {
            m.insert(i * 16384 + (1 << 30), i);
        }
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.get(&(77 * 16384 + (1 << 30))), Some(&77));
    }
}
