//! RAID5/6 parity arithmetic: P is the XOR of the data stripes, Q the
//! Reed-Solomon syndrome over GF(2^8) with the polynomial
//! x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and generator 2, the data stripes
//! weighted g^0, g^1, ... in their order in the full stripe (the kernel's
//! `lib/raid6`: `gen_syndrome` evaluates Q by Horner from the last data
//! stripe down). Every function works on one column of a full stripe: the
//! same byte range of each stripe.

/// `GF_EXP[i]` = g^i (i < 510, so sums of two logarithms need no modulo);
/// `GF_LOG[x]` = log_g x for x != 0.
struct Tables {
    exp: [u8; 512],
    log: [u8; 256],
}

const fn tables() -> Tables {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x11d;
        }
        i += 1;
    }
    exp[510] = exp[0];
    exp[511] = exp[1];
    Tables { exp, log }
}

static GF: Tables = tables();

/// a * b in GF(2^8).
pub fn gf_mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    GF.exp[GF.log[a as usize] as usize + GF.log[b as usize] as usize]
}

/// g^n (n taken modulo 255).
pub fn gf_pow2(n: usize) -> u8 {
    GF.exp[n % 255]
}

/// 1 / a in GF(2^8); `a` must not be 0.
pub fn gf_inv(a: u8) -> u8 {
    debug_assert!(a != 0);
    GF.exp[(255 - GF.log[a as usize] as usize) % 255]
}

/// The table of x -> c * x, for multiplying a whole column by `c`.
fn mul_table(c: u8) -> [u8; 256] {
    let mut t = [0u8; 256];
    for (x, v) in t.iter_mut().enumerate() {
        *v = gf_mul(c, x as u8);
    }
    t
}

/// Each of the 8 bytes of `v` times 2 in GF(2^8).
#[inline]
fn mul2_x8(v: u64) -> u64 {
    let high = (v >> 7) & 0x0101_0101_0101_0101;
    ((v << 1) & 0xfefe_fefe_fefe_fefe) ^ high.wrapping_mul(0x1d)
}

fn word(b: &[u8]) -> u64 {
    u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]))
}

/// `dst ^= src`, same lengths.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    let n = dst.len().min(src.len());
    let (d8, dt) = dst[..n].split_at_mut(n / 8 * 8);
    let (s8, st) = src[..n].split_at(n / 8 * 8);
    for (d, s) in d8.chunks_exact_mut(8).zip(s8.chunks_exact(8)) {
        d.copy_from_slice(&(word(d) ^ word(s)).to_ne_bytes());
    }
    for (d, s) in dt.iter_mut().zip(st) {
        *d ^= s;
    }
}

/// `dst ^= c * src` in GF(2^8), same lengths.
fn mul_xor_into(dst: &mut [u8], src: &[u8], c: u8) {
    match c {
        0 => {}
        1 => xor_into(dst, src),
        _ => {
            let t = mul_table(c);
            for (d, s) in dst.iter_mut().zip(src) {
                *d ^= t[*s as usize];
            }
        }
    }
}

/// `buf = c * buf` in GF(2^8).
fn scale(buf: &mut [u8], c: u8) {
    if c != 1 {
        let t = mul_table(c);
        for b in buf.iter_mut() {
            *b = t[*b as usize];
        }
    }
}

/// P (and Q when `q` is given) of the data columns `data` (all one length,
/// in data-stripe order) into `p` and `q`.
pub fn gen_parity(data: &[&[u8]], p: &mut [u8], q: Option<&mut [u8]>) {
    let len = p.len();
    p.fill(0);
    for d in data {
        xor_into(p, &d[..len]);
    }
    let Some(q) = q else {
        return;
    };
    // Horner from the last data stripe down: q = (..(D[n-1]*g + D[n-2])*g ..) + D[0].
    q.fill(0);
    let words = len / 8 * 8;
    for d in data.iter().rev() {
        for (qw, dw) in q[..words]
            .chunks_exact_mut(8)
            .zip(d[..words].chunks_exact(8))
        {
            let v = mul2_x8(word(qw)) ^ word(dw);
            qw.copy_from_slice(&v.to_ne_bytes());
        }
        for (qb, db) in q[words..len].iter_mut().zip(&d[words..len]) {
            *qb = gf_mul(*qb, 2) ^ db;
        }
    }
}

/// Why a column cannot be rebuilt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RebuildError {
    /// More stripes are lost than the parity covers.
    TooManyLost {
        /// Stripes lost.
        lost: usize,
        /// Parity stripes of the row.
        parity: usize,
    },
    /// The stripes given do not form one column (lengths, counts).
    Shape(String),
}

impl std::fmt::Display for RebuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RebuildError::TooManyLost { lost, parity } => write!(
                f,
                "{lost} stripes of the full stripe are lost and parity rebuilds at most {parity}"
            ),
            RebuildError::Shape(s) => f.write_str(s),
        }
    }
}

/// Fill in the lost stripes of one column. `stripes` holds the data
/// columns in data-stripe order, then P, then Q when `nparity` is 2;
/// `lost[i]` marks the stripes whose contents are not known (their bytes
/// are overwritten). At most `nparity` may be lost.
pub fn rebuild(stripes: &mut [Vec<u8>], lost: &[bool], nparity: usize) -> Result<(), RebuildError> {
    let n = stripes.len();
    if !(1..=2).contains(&nparity) || n < nparity + 1 || lost.len() != n {
        return Err(RebuildError::Shape(format!(
            "{n} stripes, {nparity} parity, {} lost flags",
            lost.len()
        )));
    }
    let len = stripes[0].len();
    if stripes.iter().any(|s| s.len() != len) {
        return Err(RebuildError::Shape("stripes of different lengths".into()));
    }
    let ndata = n - nparity;
    let lost_idx: Vec<usize> = (0..n).filter(|&i| lost[i]).collect();
    if lost_idx.len() > nparity {
        return Err(RebuildError::TooManyLost {
            lost: lost_idx.len(),
            parity: nparity,
        });
    }
    let lost_data: Vec<usize> = lost_idx.iter().copied().filter(|&i| i < ndata).collect();
    let (pi, qi) = (ndata, ndata + 1);
    let p_lost = lost[pi];
    let q_lost = nparity == 2 && lost[qi];
    match lost_data.as_slice() {
        [] => {}
        &[d] if !p_lost => {
            // D_d = P ^ the other data.
            let mut acc = stripes[pi].clone();
            for (i, s) in stripes[..ndata].iter().enumerate() {
                if i != d {
                    xor_into(&mut acc, s);
                }
            }
            stripes[d] = acc;
        }
        &[d] => {
            // P lost too (RAID6): g^d D_d = Q ^ sum of g^i D_i over the others.
            let mut acc = stripes[qi].clone();
            for (i, s) in stripes[..ndata].iter().enumerate() {
                if i != d {
                    mul_xor_into(&mut acc, s, gf_pow2(i));
                }
            }
            scale(&mut acc, gf_inv(gf_pow2(d)));
            stripes[d] = acc;
        }
        &[x, y] => {
            // Pxy = D_x ^ D_y, Qxy = g^x D_x ^ g^y D_y, so
            // D_x = (Qxy ^ g^y Pxy) / (g^x ^ g^y), D_y = Pxy ^ D_x.
            let mut pxy = stripes[pi].clone();
            let mut qxy = stripes[qi].clone();
            for (i, s) in stripes[..ndata].iter().enumerate() {
                if i != x && i != y {
                    xor_into(&mut pxy, s);
                    mul_xor_into(&mut qxy, s, gf_pow2(i));
                }
            }
            let (gx, gy) = (gf_pow2(x), gf_pow2(y));
            mul_xor_into(&mut qxy, &pxy, gy);
            scale(&mut qxy, gf_inv(gx ^ gy));
            xor_into(&mut pxy, &qxy);
            stripes[x] = qxy;
            stripes[y] = pxy;
        }
        more => {
            return Err(RebuildError::TooManyLost {
                lost: more.len(),
                parity: nparity,
            })
        }
    }
    if p_lost || q_lost {
        let (data, parity) = stripes.split_at_mut(ndata);
        let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
        let (p, q) = parity.split_at_mut(1);
        gen_parity(&refs, &mut p[0], q.first_mut().map(|v| v.as_mut_slice()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Multiplication by the definition: carry-less product reduced
    /// modulo 0x11d, bit by bit (no tables).
    fn slow_mul(a: u8, b: u8) -> u8 {
        let mut p: u16 = 0;
        let (mut a, mut b) = (a as u16, b);
        while b != 0 {
            if b & 1 != 0 {
                p ^= a;
            }
            a <<= 1;
            if a & 0x100 != 0 {
                a ^= 0x11d;
            }
            b >>= 1;
        }
        p as u8
    }

    fn slow_pow2(n: usize) -> u8 {
        (0..n).fold(1u8, |x, _| slow_mul(x, 2))
    }

    /// P and Q by the definition, byte by byte.
    fn slow_parity(data: &[Vec<u8>]) -> (Vec<u8>, Vec<u8>) {
        let len = data[0].len();
        let mut p = vec![0u8; len];
        let mut q = vec![0u8; len];
        for (i, d) in data.iter().enumerate() {
            for j in 0..len {
                p[j] ^= d[j];
                q[j] ^= slow_mul(slow_pow2(i), d[j]);
            }
        }
        (p, q)
    }

    fn bytes(rng: &mut crate::util::prng::Prng, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        rng.fill(&mut v);
        v
    }

    #[test]
    fn field_arithmetic_is_the_definitions() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(gf_mul(a, b), slow_mul(a, b), "{a} * {b}");
            }
            if a != 0 {
                assert_eq!(gf_mul(a, gf_inv(a)), 1);
            }
        }
        for n in 0..600 {
            assert_eq!(gf_pow2(n), slow_pow2(n % 255));
        }
        // A known value of the kernel's raid6 tables: 2^8 = 0x1d.
        assert_eq!(gf_pow2(8), 0x1d);
        for v in [0u64, u64::MAX, 0x8040_2010_0804_0201, 0x0123_4567_89ab_cdef] {
            let got = mul2_x8(v).to_ne_bytes();
            let want: Vec<u8> = v.to_ne_bytes().iter().map(|&b| slow_mul(b, 2)).collect();
            assert_eq!(got.to_vec(), want);
        }
    }

    #[test]
    fn parity_is_the_definition_and_every_loss_rebuilds() {
        let mut rng = crate::util::prng::Prng::new(0x9e37_79b9_7f4a_7c15);
        for &(ndata, len) in &[(1usize, 13usize), (2, 4096), (3, 1000), (4, 64), (8, 4103)] {
            for nparity in 1..=2usize {
                let data: Vec<Vec<u8>> = (0..ndata).map(|_| bytes(&mut rng, len)).collect();
                let (p, q) = slow_parity(&data);
                let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                let mut gp = vec![0xaa; len];
                let mut gq = vec![0x55; len];
                gen_parity(&refs, &mut gp, (nparity == 2).then_some(&mut gq[..]));
                assert_eq!(gp, p);
                if nparity == 2 {
                    assert_eq!(gq, q, "{ndata} data");
                }
                let mut full = data.clone();
                full.push(p.clone());
                if nparity == 2 {
                    full.push(q.clone());
                }
                let n = full.len();
                // Every single loss and every pair of losses.
                for a in 0..n {
                    for b in a..n {
                        if nparity == 1 && a != b {
                            continue;
                        }
                        let mut lost = vec![false; n];
                        lost[a] = true;
                        lost[b] = true;
                        let mut s = full.clone();
                        for (i, v) in s.iter_mut().enumerate() {
                            if lost[i] {
                                v.iter_mut().for_each(|x| *x = 0x5a);
                            }
                        }
                        rebuild(&mut s, &lost, nparity).unwrap();
                        assert_eq!(s, full, "{ndata}+{nparity} lost {a},{b}");
                    }
                }
                let mut s = full.clone();
                let lost = vec![true; n];
                assert!(matches!(
                    rebuild(&mut s, &lost, nparity),
                    Err(RebuildError::TooManyLost { .. })
                ));
            }
        }
    }
}
