//! Deterministic pseudo-random numbers: file contents a workload writes
//! (the engine and the kernel write the same bytes), the random subset
//! of unflushed writes a simulated power failure keeps, and every seeded
//! case of the tests (one generator, so a seed names one case everywhere).

/// Deterministic pseudo-random bytes (xorshift64*), for fills and file bodies.
#[derive(Clone, Debug)]
pub struct Prng(u64);

impl Prng {
    /// A generator for `seed`. Every seed is usable, 0 included (the state is
    /// forced odd, so never the all-zero fixed point of xorshift); equal seeds
    /// give equal streams.
    pub fn new(seed: u64) -> Prng {
        Prng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// The next 64-bit word of the stream.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(MUL)
    }
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
    /// True with probability `num / den` (false when `den` is 0).
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        den != 0 && self.below(den) < num
    }
    /// A number in `lo..=hi` (`lo` when `hi <= lo`, drawing nothing).
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            lo
        } else {
            lo + self.below(hi - lo + 1)
        }
    }
    /// One element of `v` (`None` when it is empty, drawing nothing).
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> Option<&'a T> {
        if v.is_empty() {
            None
        } else {
            v.get(self.below(v.len() as u64) as usize)
        }
    }
    /// The seed of case `index` of a run seeded `seed`: unrelated seeds for
    /// neighbouring indexes (splitmix64 of `seed` mixed with splitmix64 of
    /// `index + 1`), so a case can be rerun on its own from its seed.
    pub fn derive(seed: u64, index: u64) -> u64 {
        splitmix64(seed ^ splitmix64(index.wrapping_add(1)))
    }
    /// The next `buf.len()` bytes: whole words in order, little-endian,
    /// then the first bytes of one more word.
    pub fn fill(&mut self, buf: &mut [u8]) {
        // Blocks of four lanes: each lane starts where the serial
        // generator would be at its first word (a jump of LANE steps, the
        // state update being linear over GF(2)), so the bytes are the
        // serial ones, made four words at a time.
        let mut blocks = buf.chunks_exact_mut(4 * LANE * 8);
        for b in &mut blocks {
            let mut st = [self.0, 0, 0, 0];
            for l in 1..4 {
                st[l] = jump(st[l - 1]);
            }
            let (q0, rest) = b.split_at_mut(LANE * 8);
            let (q1, rest) = rest.split_at_mut(LANE * 8);
            let (q2, q3) = rest.split_at_mut(LANE * 8);
            let q = [q0, q1, q2, q3];
            for i in 0..LANE {
                for l in 0..4 {
                    st[l] = step(st[l]);
                    let w = st[l].wrapping_mul(MUL).to_le_bytes();
                    q[l][i * 8..i * 8 + 8].copy_from_slice(&w);
                }
            }
            self.0 = st[3];
        }
        // Whole words as fixed-size stores (a copy of a length known only
        // at run time was a call per word).
        let mut words = blocks.into_remainder().chunks_exact_mut(8);
        for c in &mut words {
            let c: &mut [u8; 8] = c.try_into().unwrap_or_else(|_| unreachable!()); // OK: chunks_exact
            *c = self.next_u64().to_le_bytes();
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let v = self.next_u64().to_le_bytes();
            tail.copy_from_slice(&v[..tail.len()]);
        }
    }
}

const MUL: u64 = 0x2545_f491_4f6c_dd1d;

/// splitmix64's output function of `x` (one step from state `x`).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
/// Words one lane of [`Prng::fill`] makes per block.
const LANE: usize = 128;

/// One state update of xorshift64.
fn step(mut s: u64) -> u64 {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    s
}

/// The state [`LANE`] updates after `s`: the update is linear over GF(2),
/// so it is the XOR of the images of the bits set in `s`.
fn jump(s: u64) -> u64 {
    static TABLE: std::sync::OnceLock<[u64; 64]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut cols = [0u64; 64];
        for (k, c) in cols.iter_mut().enumerate() {
            let mut x = 1u64 << k;
            for _ in 0..LANE {
                x = step(x);
            }
            *c = x;
        }
        cols
    });
    let mut acc = 0;
    for (k, c) in t.iter().enumerate() {
        acc ^= c & 0u64.wrapping_sub((s >> k) & 1);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The serial definition: a word at a time.
    fn serial(seed: u64, len: usize) -> (Vec<u8>, u64) {
        let mut g = Prng::new(seed);
        let mut v = Vec::new();
        while v.len() < len {
            v.extend_from_slice(&g.next_u64().to_le_bytes());
        }
        v.truncate(len);
        (v, g.0)
    }

    #[test]
    fn derive_is_splitmix_of_seed_and_index() {
        // The values hostile-fuzz's case seeds had before they moved here.
        assert_eq!(Prng::derive(0, 0), splitmix64(splitmix64(1)));
        assert_ne!(Prng::derive(1, 0), Prng::derive(1, 1));
        assert_ne!(Prng::derive(1, 0), Prng::derive(2, 0));
        let mut g = Prng::new(5);
        assert!((0..1000).all(|_| (3..=9).contains(&g.between(3, 9))));
        assert_eq!(g.between(7, 7), 7);
        assert_eq!(g.pick::<u8>(&[]), None);
        assert!(!g.chance(1, 0));
        assert!(g.chance(1, 1));
    }

    #[test]
    fn fill_makes_the_serial_bytes() {
        for (seed, len) in [
            (1, 0),
            (2, 7),
            (3, 4095),
            (4, 4096),
            (5, 4104),
            (6, 8192 + 13),
            (7, 3 * 4096 + 5),
            (u64::MAX, 1 << 20),
        ] {
            let (want, state) = serial(seed, len);
            let mut g = Prng::new(seed);
            let mut got = vec![0u8; len];
            g.fill(&mut got);
            assert!(got == want, "seed {seed} len {len}");
            if len % 8 == 0 {
                assert_eq!(g.0, state, "state after seed {seed} len {len}");
            }
            // Pieces of a stream continue it.
            let mut g = Prng::new(seed);
            let mut got = vec![0u8; len];
            let cut = (len / 2) & !7;
            g.fill(&mut got[..cut]);
            g.fill(&mut got[cut..]);
            assert!(got == want, "seed {seed} len {len} in two pieces");
        }
    }
}
