//! Byte flips in the metadata of real images, read back in-process: opening
//! (lenient and strict), walking every tree, decoding every item and
//! iterating every tree must end, in bounded time and memory, without a
//! panic, whatever the flipped bytes say.
//!
//! Cases are deterministic (seeded with core's `Prng`), so a failure names a seed that
//! reproduces it. Flips hit the primary superblock or tree blocks found by
//! walking the intact image (every copy of a DUP block, or only the first),
//! and half the time the checksum is recomputed so validation has to catch
//! the damage itself instead of stopping at the checksum.

use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::consts::*;
use btrkit_core::format::item::decode;
use btrkit_core::format::key::Key;
use btrkit_core::image::{tree_root_of, Image, OpenOptions};
use btrkit_core::io::{BlockDevice, MemDevice};
use btrkit_core::tree::{walk_tree, TreeIter, TreeRoot, WalkEvent};
use btrkit_core::util::prng::Prng;
use btrkit_tests::fixtures::{have_cmd, is_root, kernel_populated_image, mkfs_btrfs};
use btrkit_tests::sys::CappedAlloc;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// No single allocation made while reading damaged metadata may exceed this:
/// a size taken from disk bytes without a bound would blow through it.
const ALLOC_CAP: usize = 256 << 20;
const CASE_LIMIT: Duration = Duration::from_secs(10);
const CASES_PER_IMAGE: u64 = 250;

#[global_allocator]
static ALLOC: CappedAlloc<ALLOC_CAP> = CappedAlloc;

/// A metadata region to damage: the physical offsets of every copy.
#[derive(Clone)]
struct Target {
    copies: Vec<u64>,
    len: usize,
    what: String,
}

/// Every tree to read: root, chunk, log root, and each tree the root trees name.
fn all_trees(img: &Image) -> Vec<TreeRoot> {
    let mut v = vec![img.root_tree(), img.chunk_tree()];
    if let Some(l) = img.log_root_tree() {
        v.push(l);
        if let Ok(items) = img.root_items_in(l) {
            v.extend(items.iter().map(|(k, ri)| TreeRoot {
                id: BTRFS_TREE_LOG_OBJECTID,
                ..tree_root_of(k.objectid, ri)
            }));
        }
    }
    if let Ok(items) = img.root_items_in(img.root_tree()) {
        v.extend(items.iter().map(|(k, ri)| tree_root_of(k.objectid, ri)));
    }
    v
}

/// The superblock and every tree block of the intact image.
fn targets(img: &Image) -> Vec<Target> {
    let mut out = vec![Target {
        copies: vec![BTRFS_SUPER_INFO_OFFSET],
        len: BTRFS_SUPER_INFO_SIZE,
        what: "superblock".into(),
    }];
    let ns = img.nodesize as u64;
    for t in all_trees(img) {
        let _ = walk_tree(img, t, |ev| {
            if let WalkEvent::Block { node, .. } = ev {
                if let Ok(copies) = img.chunks.map(node.bytenr, ns, img.devid) {
                    out.push(Target {
                        copies,
                        len: ns as usize,
                        what: format!("tree {} block {}", t.id as i64, node.bytenr),
                    });
                }
            }
            ControlFlow::Continue(())
        });
    }
    out
}

/// Everything the read path does with an image, with results thrown away:
/// only panics, hangs and huge allocations matter here. Returns how many
/// items were seen, to show the reads got somewhere.
fn exercise(dev: Arc<dyn BlockDevice>) -> usize {
    let mut seen = 0usize;
    for lenient in [true, false] {
        let Ok(img) = Image::open(
            dev.clone(),
            OpenOptions {
                lenient,
                ..Default::default()
            },
        ) else {
            continue;
        };
        let csum_size = img.csum.size();
        let trees = all_trees(&img);
        for &t in &trees {
            let _ = walk_tree(&img, t, |ev| {
                if let WalkEvent::Block { node, .. } = ev {
                    for slot in 0..node.nr_safe() {
                        if let Some(k) = node.key(slot) {
                            let _ = node.bin_search(&k);
                        }
                        if let (Some(it), Ok(d)) = (node.item(slot), node.item_data(slot)) {
                            let _ = decode(&Key::from(&it.key), d, csum_size);
                            seen += 1;
                        }
                    }
                }
                ControlFlow::Continue(())
            });
            if let Ok(mut it) = TreeIter::new(&img, t, Key::MIN) {
                let mut n = 0u64;
                while let Some(r) = it.next_item() {
                    n += 1;
                    // A few thousand items per tree in these images; far more means a loop.
                    assert!(n < 10_000_000, "TreeIter over tree {} does not end", t.id);
                    if let Ok(item) = r {
                        let _ = item.decode(csum_size);
                    }
                }
            }
        }
        for id in [
            BTRFS_EXTENT_TREE_OBJECTID,
            BTRFS_FS_TREE_OBJECTID,
            BTRFS_CSUM_TREE_OBJECTID,
            BTRFS_FREE_SPACE_TREE_OBJECTID,
        ] {
            let _ = img.find_root(id);
        }
    }
    seen
}

/// Apply case `seed` to `dev`, returning the original bytes to restore.
fn damage(
    dev: &MemDevice,
    targets: &[Target],
    csum: CsumType,
    seed: u64,
) -> (String, Vec<(u64, Vec<u8>)>) {
    let mut r = Prng::new(seed);
    // A quarter of the cases hit the superblock, the rest a tree block.
    let t = if r.below(4) == 0 {
        &targets[0]
    } else {
        &targets[1 + r.below(targets.len() as u64 - 1) as usize]
    };
    let all_copies = r.below(4) != 0;
    let recsum = r.below(2) == 0;
    let flips = 1 + r.below(8) as usize;
    let copies: Vec<u64> = if all_copies {
        t.copies.clone()
    } else {
        t.copies[..1].to_vec()
    };
    let mut saved = Vec::new();
    let mut block = vec![0u8; t.len];
    dev.read_at(copies[0], &mut block)
        .expect("read intact block");
    let mut offs = Vec::new();
    for _ in 0..flips {
        // Headers, item headers and the superblock's fields sit in the
        // first bytes; favour them, but hit anywhere too.
        let off = if r.below(2) == 0 {
            r.below(512.min(t.len as u64))
        } else {
            r.below(t.len as u64)
        } as usize;
        let v = match r.below(4) {
            0 => 0,
            1 => 0xff,
            _ => block[off] ^ (1 + r.below(255) as u8),
        };
        block[off] = v;
        offs.push(off);
    }
    if recsum {
        let c = block_csum(csum, &block);
        block[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
    }
    for &c in &copies {
        let mut orig = vec![0u8; t.len];
        dev.read_at(c, &mut orig).expect("read intact block");
        saved.push((c, orig));
        dev.write_at(c, &block).expect("write damaged block");
    }
    let desc = format!(
        "seed {seed}: {} ({} of {} copies), bytes {offs:?}{}",
        t.what,
        copies.len(),
        t.copies.len(),
        if recsum { ", checksum recomputed" } else { "" }
    );
    (desc, saved)
}

fn run_cases(label: &str, image: &Path, seed_base: u64) {
    run_cases_n(label, image, seed_base, CASES_PER_IMAGE);
}

/// Run `cases` seeded cases on `image`; returns what the targets were.
fn run_cases_n(label: &str, image: &Path, seed_base: u64, cases: u64) -> Vec<String> {
    let data = std::fs::read(image).expect("read image");
    let dev = Arc::new(MemDevice::new(data));
    let img =
        Image::open(dev.clone(), OpenOptions::default()).expect("intact image opens strictly");
    let targets = targets(&img);
    let csum = img.csum;
    drop(img);
    assert!(
        targets.len() > 5,
        "{label}: only {} metadata blocks found",
        targets.len()
    );
    let intact_items = exercise(dev.clone());
    let start = Instant::now();
    let mut failures = Vec::new();
    for i in 0..cases {
        let seed = seed_base + i;
        let (desc, saved) = damage(&dev, &targets, csum, seed);
        let (tx, rx) = mpsc::channel();
        let d: Arc<dyn BlockDevice> = dev.clone();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || {
            let n = CappedAlloc::<ALLOC_CAP>::armed(|| exercise(d));
            let _ = tx.send(n);
        });
        match rx.recv_timeout(CASE_LIMIT) {
            Ok(_) => {
                let _ = h.join();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The thread is stuck on shared data; report and stop here.
                panic!("{label}: {desc}: still reading after {CASE_LIMIT:?} (hang)");
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let msg = match h.join() {
                    Err(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default(),
                    Ok(()) => String::new(),
                };
                failures.push(format!("{desc}: panicked: {msg}"));
            }
        }
        if t0.elapsed() > CASE_LIMIT / 2 {
            eprintln!("{label}: slow case {desc}: {:?}", t0.elapsed());
        }
        for (off, orig) in saved {
            dev.write_at(off, &orig).expect("restore");
        }
    }
    let refused = CappedAlloc::<ALLOC_CAP>::largest_refused();
    assert_eq!(
        refused, 0,
        "{label}: an allocation of {refused} bytes was attempted"
    );
    eprintln!(
        "{label}: {cases} cases over {} metadata blocks ({intact_items} items intact) in {:?}",
        targets.len(),
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{label}: {} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    targets.into_iter().map(|t| t.what).collect()
}

#[test]
fn byteflip_fresh_mkfs_image() {
    if !have_cmd("mkfs.btrfs") {
        btrkit_tests::skip("mkfs.btrfs not installed");
        return;
    }
    let td = tempfile::tempdir().expect("tempdir");
    let p = td.path().join("fresh.img");
    mkfs_btrfs(&p, 128 << 20, &[]).expect("mkfs.btrfs");
    run_cases("fresh mkfs image", &p, 1_000);
}

#[test]
fn byteflip_kernel_written_image() {
    if !have_cmd("mkfs.btrfs") {
        btrkit_tests::skip("mkfs.btrfs not installed");
        return;
    }
    if !is_root() {
        btrkit_tests::skip("loop mounting needs root");
        return;
    }
    let td = tempfile::tempdir().expect("tempdir");
    let p = td.path().join("kernel.img");
    if let Err(e) = kernel_populated_image(&p, 256 << 20) {
        // Root without loop devices (a container): nothing to mount with.
        if e.contains("loop") || e.contains("mount") {
            btrkit_tests::skip(&format!("cannot loop-mount here: {e}"));
            return;
        }
        panic!("building the kernel-written image: {e}");
    }
    run_cases("kernel-written image", &p, 1_000_000);
}

#[test]
fn byteflip_kernel_log_tree_fixture() {
    // A real fsync log written by the kernel: flips reach the log root tree
    // and the log trees it names.
    let name = "065-valid-log-tree--already-present";
    if btrkit_tests::fixtures::fsck_fixture_dir().is_none() {
        btrkit_tests::skip("../shared/fixtures/btrfs-progs-fsck is missing");
        return;
    }
    let _cache = btrkit_tests::fixtures::FixtureCacheGuard;
    let p = btrkit_tests::fixtures::fsck_fixture(name).expect("extract fixture");
    let n = run_cases_n("kernel log-tree fixture", &p, 2_000_000, 150);
    assert!(
        n.iter().any(|t| t.contains("tree -6 ")),
        "no log tree block among the targets"
    );
}

// ---------------------------------------------------------------------------
// Property tests: the same functions the cargo-fuzz targets drive
// (fuzz/fuzz_targets/{node,superblock}.rs), fed random and mutated real
// blocks, so they run on every `cargo test` and not only under a fuzzer.

mod props {
    use super::*;
    use btrkit_core::chunk::ChunkMap;
    use btrkit_core::image::{check_superblock, read_superblock};
    use btrkit_core::tree::node::{Expect, Node, ValidateCtx};
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// Real metadata of a fresh 4 KiB-node image: the superblock and every tree block.
    struct Corpus {
        sb: Vec<u8>,
        blocks: Vec<(u64, Vec<u8>)>,
        ctx: ValidateCtx,
    }

    /// The corpus; None only when mkfs.btrfs is missing. Any other failure
    /// to build it (mkfs failing, the image not opening, a tree not
    /// walking) fails the test that asks: a property run on an empty or
    /// partial corpus must not pass.
    fn corpus() -> Option<&'static Corpus> {
        static C: OnceLock<Option<Result<Corpus, String>>> = OnceLock::new();
        let c = C.get_or_init(|| {
            if !have_cmd("mkfs.btrfs") {
                return None;
            }
            Some(build_corpus())
        });
        match c {
            None => None,
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => panic!("the property corpus cannot be built: {e}"),
        }
    }

    fn build_corpus() -> Result<Corpus, String> {
        let td = tempfile::tempdir().map_err(|e| e.to_string())?;
        let p = td.path().join("corpus.img");
        mkfs_btrfs(&p, 128 << 20, &["-n", "4096"])?;
        let bytes = std::fs::read(&p).map_err(|e| e.to_string())?;
        let dev = Arc::new(MemDevice::new(bytes));
        let img = Image::open(dev.clone(), OpenOptions::default()).map_err(|e| e.to_string())?;
        let mut sb = vec![0u8; BTRFS_SUPER_INFO_SIZE];
        dev.read_at(BTRFS_SUPER_INFO_OFFSET, &mut sb)
            .map_err(|e| e.to_string())?;
        let mut blocks = Vec::new();
        for t in all_trees(&img) {
            let mut bad = None;
            let _ = walk_tree(&img, t, |ev| {
                match ev {
                    WalkEvent::Block {
                        node, problems: [], ..
                    } => blocks.push((node.bytenr, node.bytes().to_vec())),
                    WalkEvent::Block { node, problems, .. } => {
                        bad = Some(format!("block {}: {}", node.bytenr, problems[0].message))
                    }
                    WalkEvent::Unreadable { bytenr, error, .. } => {
                        bad = Some(format!("block {bytenr}: {error}"))
                    }
                    WalkEvent::Revisit { bytenr, .. } => {
                        bad = Some(format!("block {bytenr} referenced twice"))
                    }
                    WalkEvent::Excluded { why, at } => {
                        bad = Some(format!("block {}: {why}", at.bytenr))
                    }
                }
                ControlFlow::Continue(())
            });
            if let Some(b) = bad {
                return Err(format!("a fresh image's tree does not walk clean: {b}"));
            }
        }
        Ok(Corpus {
            sb,
            blocks,
            ctx: img.ctx(false),
        })
    }

    /// The corpus, or a SKIP line (once per test; a failure when oracles are
    /// required) when it cannot be built: a property test that ran on
    /// nothing must not look like one that passed.
    fn corpus_or_skip() -> Option<&'static Corpus> {
        let c = corpus();
        if c.is_none() {
            static SKIPPED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
            let name = btrkit_tests::test_name();
            let mut done = SKIPPED.lock().unwrap_or_else(|p| p.into_inner());
            if !done.contains(&name) {
                done.push(name);
                drop(done);
                btrkit_tests::skip("mkfs.btrfs missing: no real tree blocks to mutate");
            }
        }
        c
    }

    fn exercise_node(bytenr: u64, buf: Vec<u8>, ctx: &ValidateCtx) {
        let Ok(node) = Node::from_vec(bytenr, buf) else {
            return;
        };
        let first = node.key(0);
        for expect in [
            Expect::default(),
            Expect {
                level: Some(node.level()),
                generation: Some(node.generation()),
                owner: Some(node.owner()),
                first_key: first,
            },
            Expect {
                level: Some(1),
                generation: Some(1),
                owner: Some(BTRFS_FS_TREE_OBJECTID),
                first_key: Some(Key::MIN),
            },
        ] {
            let _ = node.validate(ctx, &expect);
        }
        for slot in 0..node.nr_safe() + 2 {
            if let Some(k) = node.key(slot) {
                let _ = node.bin_search(&k);
            }
            let _ = node.key_ptr(slot);
            if let (Some(it), Ok(d)) = (node.item(slot), node.item_data(slot)) {
                for cs in [4usize, 8, 32] {
                    let _ = decode(&Key::from(&it.key), d, cs);
                }
            }
            let _ = node.decode_item(slot, ctx.csum.size());
        }
        let _ = node.bin_search(&Key::MAX);
    }

    fn exercise_superblock(sb: &[u8]) {
        let sb_off = BTRFS_SUPER_INFO_OFFSET as usize;
        let mut img = vec![0u8; sb_off + BTRFS_SUPER_INFO_SIZE];
        img[sb_off..sb_off + sb.len().min(BTRFS_SUPER_INFO_SIZE)]
            .copy_from_slice(&sb[..sb.len().min(BTRFS_SUPER_INFO_SIZE)]);
        let dev = Arc::new(MemDevice::new(img));
        let Ok(s) = read_superblock(dev.as_ref(), 0) else {
            return;
        };
        let _ = check_superblock(&s, dev.size(), &mut Vec::new());
        if let Ok(map) = ChunkMap::from_sys_chunk_array(&s) {
            let ns = s.nodesize.get() as u64;
            for m in map.iter() {
                for l in [
                    m.logical,
                    m.end().saturating_sub(1),
                    m.end().saturating_sub(ns),
                ] {
                    let _ = map.map(l, ns, s.dev_item.devid.get());
                }
            }
        }
        for lenient in [true, false] {
            let _ = Image::open(
                dev.clone(),
                OpenOptions {
                    lenient,
                    ..Default::default()
                },
            );
        }
    }

    fn mutate(buf: &mut [u8], muts: &[(usize, u8)], recsum: bool, csum: CsumType) {
        for &(o, v) in muts {
            // Half the mutations land in the first 512 bytes, where headers are.
            let o = if o % 2 == 0 {
                (o / 2) % 512.min(buf.len())
            } else {
                (o / 2) % buf.len()
            };
            buf[o] = v;
        }
        if recsum {
            let c = block_csum(csum, buf);
            buf[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        }
    }

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 400,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn random_tree_blocks(mut buf in proptest::collection::vec(any::<u8>(), 4096), recsum: bool, fill in 0usize..4096) {
            // Random bytes past `fill` are zeroed: many real blocks are mostly empty.
            buf[fill..].fill(0);
            let ctx = ValidateCtx { nodesize: 4096, sectorsize: 4096, csum: CsumType::Crc32c, fsid: buf[32..48].try_into().unwrap_or([0; 16]), alt_fsid: None, alt_csum: None, max_generation: u64::MAX };
            mutate(&mut buf, &[], recsum, CsumType::Crc32c);
            exercise_node(4096 * 7, buf, &ctx);
        }

        #[test]
        fn mutated_real_tree_blocks(pick: usize, muts in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..24), recsum: bool) {
            let Some(c) = corpus_or_skip() else { return Ok(()) };
            let (bytenr, block) = &c.blocks[pick % c.blocks.len()];
            let mut buf = block.clone();
            mutate(&mut buf, &muts, recsum, c.ctx.csum);
            exercise_node(*bytenr, buf, &c.ctx);
        }

        #[test]
        fn mutated_real_superblock(muts in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..24), recsum: bool) {
            let Some(c) = corpus_or_skip() else { return Ok(()) };
            let mut sb = c.sb.clone();
            mutate(&mut sb, &muts, recsum, c.ctx.csum);
            exercise_superblock(&sb);
        }

        #[test]
        fn random_sys_chunk_arrays(arr in proptest::collection::vec(any::<u8>(), 0..=BTRFS_SYSTEM_CHUNK_ARRAY_SIZE), size_field in 0u32..3000) {
            let Some(c) = corpus_or_skip() else { return Ok(()) };
            let mut sb = c.sb.clone();
            let at = std::mem::offset_of!(btrkit_core::format::superblock::Superblock, sys_chunk_array);
            sb[at..at + arr.len()].copy_from_slice(&arr);
            let sz = std::mem::offset_of!(btrkit_core::format::superblock::Superblock, sys_chunk_array_size);
            sb[sz..sz + 4].copy_from_slice(&size_field.to_le_bytes());
            mutate(&mut sb, &[], true, c.ctx.csum);
            exercise_superblock(&sb);
        }
    }

    /// The corpus the mutation properties run on holds a block of every
    /// tree a fresh image has, and a superblock that parses.
    #[test]
    fn corpus_available() {
        let Some(c) = corpus() else {
            btrkit_tests::skip("mkfs.btrfs missing; mutated-real-block properties ran on nothing");
            return;
        };
        eprintln!(
            "property corpus: {} tree blocks of a fresh image",
            c.blocks.len()
        );
        let owners: std::collections::BTreeSet<u64> = c
            .blocks
            .iter()
            .filter_map(|(b, buf)| Node::from_vec(*b, buf.clone()).ok().map(|n| n.owner()))
            .collect();
        // Root, extent, chunk, device, fs, checksum and free space trees
        // at least (mkfs.btrfs 6.x makes a UUID tree and more too).
        assert!(
            owners.len() >= 6,
            "the corpus has blocks of {} trees only: {owners:?}",
            owners.len()
        );
        assert_eq!(c.sb.len(), BTRFS_SUPER_INFO_SIZE);
        // struct btrfs_super_block: magic at byte 64.
        let magic = u64::from_le_bytes(c.sb[64..72].try_into().unwrap());
        assert_eq!(magic, BTRFS_MAGIC, "the corpus superblock has no magic");
    }
}
