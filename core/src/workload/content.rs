//! Deterministic file contents shared by every backend, so a workload run on
//! the engine and on the kernel writes the same bytes.

use super::script::Fill;

pub use crate::util::prng::Prng;

/// Size of file `i` of a `writefiles` step over `min..=max`.
pub fn file_size(i: u32, min: u64, max: u64) -> u64 {
    let span = max - min + 1;
    min + (Prng::new(0x5eed ^ i as u64).next_u64() % span)
}

/// Content of file `i` of a `writefiles` step: its name first, so no two
/// files are alike, then pseudo-random bytes.
pub fn file_content(i: u32, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    Prng::new(i as u64 + 1).fill(&mut v);
    let tag = format!("file {i:05}\n");
    let n = tag.len().min(v.len());
    v[..n].copy_from_slice(&tag.as_bytes()[..n]);
    v
}

/// Name of file `i` of a `writefiles` step: `f` and five decimal digits
/// (`f00042`), in the step's directory.
pub fn file_name(i: u32) -> String {
    format!("f{i:05}")
}

/// Bytes of a write, produced in pieces: a byte fill, a text written once,
/// or a seeded stream. `next(buf)` fills `buf` with the next bytes.
pub struct FillStream {
    fill: Fill,
    rng: Option<Prng>,
    pos: usize,
}

impl FillStream {
    /// A stream at the start of `fill`'s bytes (a random fill restarts from
    /// its seed).
    pub fn new(fill: &Fill) -> FillStream {
        let rng = match fill {
            Fill::Random(s) => Some(Prng::new(*s)),
            _ => None,
        };
        FillStream {
            fill: fill.clone(),
            rng,
            pos: 0,
        }
    }
    /// Fill `buf` with the next `buf.len()` bytes of the stream. A random
    /// stream advances eight bytes at a time, so pieces must be multiples of
    /// eight bytes except the last (as the writers use them).
    pub fn next(&mut self, buf: &mut [u8]) {
        match &self.fill {
            Fill::Byte(b) => buf.fill(*b),
            Fill::Text(t) => {
                for x in buf.iter_mut() {
                    *x = t.get(self.pos).copied().unwrap_or(0);
                    self.pos += 1;
                }
            }
            Fill::Random(_) => {
                if let Some(r) = self.rng.as_mut() {
                    r.fill(buf);
                }
            }
        }
    }
}

/// Writes of a generated fill up to this size get their bytes made ahead,
/// on the thread that reads the script: at most [`super::script::STREAM_AHEAD`]
/// of them wait, so this bounds the memory that costs.
pub const PREPARE_MAX: u64 = 16 << 10;

/// The bytes of a step made ahead of running it, where that pays: a small
/// write of a pseudo-random fill (generating them is most of such a
/// step's own work). The runner writes exactly these bytes.
pub fn prepared_payload(st: &super::script::Step) -> Option<Vec<u8>> {
    match st {
        super::script::Step::Write {
            len,
            fill: fill @ Fill::Random(_),
            ..
        } if *len <= PREPARE_MAX => Some(fill_bytes(fill, *len)),
        _ => None,
    }
}

/// The whole content of a write of `len` bytes.
pub fn fill_bytes(fill: &Fill, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    FillStream::new(fill).next(&mut v);
    v
}

/// The warm-up every kernel scenario starts with unless it says `warmup
/// no`: files in two data size classes, each flushed before the next, then
/// a commit. Engine runs that compare with the kernel run the same steps.
///
/// Why the kernel needs it: it sorts data block groups into extent size
/// classes and allocates a new chunk rather than put an extent into a group
/// of another class; a chunk allocated in the running transaction makes the
/// next fsync commit instead of log. The warm-up gives both classes their
/// own block group before the steps start.
pub const WARMUP_DIR: &str = ".kcrash-warmup";

/// The warm-up as steps: in `/.kcrash-warmup`, a 4 KiB file and a
/// 256 KiB file of random data, each written and fdatasync'ed in turn,
/// then `sync`.
pub fn warmup_steps() -> Vec<super::script::Step> {
    use super::script::Step;
    let d = format!("/{WARMUP_DIR}");
    let mut v = vec![Step::Mkdir(d.clone())];
    for (name, len, seed) in [("small", 4096u64, 0xa11u64), ("medium", 256 << 10, 0xa12)] {
        let p = format!("{d}/{name}");
        v.push(Step::Write {
            path: p.clone(),
            off: 0,
            len,
            fill: Fill::Random(seed),
            enospc_ok: false,
        });
        v.push(Step::Fdatasync(p));
    }
    v.push(Step::Sync);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_contents_are_distinct_and_sized() {
        let a = file_content(1, file_size(1, 100, 4000));
        let b = file_content(2, file_size(2, 100, 4000));
        assert_ne!(a, b);
        assert!((100..=4000).contains(&(a.len() as u64)));
        assert!(a.starts_with(b"file 00001\n"));
        assert_eq!(file_content(3, 5), b"file ");
    }

    /// A write run with its bytes made ahead leaves the same file as one
    /// whose runner makes them.
    #[test]
    fn prepared_writes_write_the_same_bytes() {
        use super::super::engine::EngineRunner;
        use super::super::script::Step;
        let dev: std::sync::Arc<dyn crate::io::BlockDevice> =
            std::sync::Arc::new(crate::io::MemDevice::zeroed(256 << 20));
        let (st, staged, _) = crate::mkfs::make(dev.clone(), &Default::default()).unwrap();
        crate::mkfs::finish(st, &staged).unwrap();
        let mut fs =
            crate::fs::Filesystem::mount(dev, Default::default(), crate::log::LogState::boxed())
                .unwrap();
        let mut r = EngineRunner::new();
        for (i, len) in [1u64, 100, 4096, 5000, PREPARE_MAX, PREPARE_MAX + 1]
            .into_iter()
            .enumerate()
        {
            let step = |path: &str| Step::Write {
                path: path.into(),
                off: 3,
                len,
                fill: Fill::Random(i as u64 + 7),
                enospc_ok: false,
            };
            let (a, b) = (format!("/a{i}"), format!("/b{i}"));
            let pre = prepared_payload(&step(&a));
            assert_eq!(pre.is_some(), len <= PREPARE_MAX);
            r.apply_prepared(&mut fs, &step(&a), pre.as_deref())
                .unwrap();
            r.apply(&mut fs, &step(&b)).unwrap();
            let la = fs.resolve(&a, true).unwrap();
            let lb = fs.resolve(&b, true).unwrap();
            let da = fs.read(la, 0, len + 3).unwrap();
            assert_eq!(da, fs.read(lb, 0, len + 3).unwrap());
            assert_eq!(&da[3..], &fill_bytes(&Fill::Random(i as u64 + 7), len)[..]);
        }
    }

    #[test]
    fn streams_in_pieces_equal_whole() {
        let whole = fill_bytes(&Fill::Random(9), 100);
        let mut s = FillStream::new(&Fill::Random(9));
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 36];
        s.next(&mut a);
        s.next(&mut b);
        assert_eq!([a, b].concat(), whole);
        assert_eq!(fill_bytes(&Fill::Text(b"ab".to_vec()), 3), b"ab\0");
    }

    #[test]
    fn fill_is_the_word_stream_little_endian() {
        // The bytes every backend writes: word n of the generator, little
        // endian, the last word cut to the length.
        for len in [0usize, 1, 7, 8, 9, 4096, 4099] {
            let mut want = Vec::new();
            let mut g = Prng::new(77);
            while want.len() < len {
                want.extend_from_slice(&g.next_u64().to_le_bytes());
            }
            want.truncate(len);
            let mut got = vec![0u8; len];
            Prng::new(77).fill(&mut got);
            assert_eq!(got, want, "length {len}");
            let body = file_content(76, len as u64);
            let tag = format!("file {:05}\n", 76).into_bytes();
            let n = tag.len().min(len);
            assert_eq!(&body[..n], &tag[..n]);
            assert_eq!(&body[n..], &want[n..], "file body of length {len}");
        }
    }
}
