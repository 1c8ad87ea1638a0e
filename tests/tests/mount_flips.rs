//! Byte flips in the metadata of a kernel-written image, read back
//! through the read path btrkit-mount serves from ([`ReadOnlyView`]):
//! opening, then every lookup, getattr, listing, read (compressed,
//! inline and regular extents), readlink and xattr of every name it can
//! reach must end, in bounded time and memory, without a panic, whatever
//! the flipped bytes say. `tests/tests/byteflip.rs` does the same for the
//! tree walks.
//!
//! Cases are seeded, so a failure names a seed that reproduces it.
//! `BTRKIT_MOUNT_FLIPS=N` runs N cases (default 300).

use btrkit_core::csum::block_csum;
use btrkit_core::format::consts::*;
use btrkit_core::image::{tree_root_of, Image, OpenOptions};
use btrkit_core::io::{BlockDevice, MemDevice};
use btrkit_core::mount_view::{ReadOnlyView, ROOT_NODE};
use btrkit_core::restore::{LogMode, ReadOptions};
use btrkit_core::tree::{walk_tree, WalkEvent};
use btrkit_core::util::prng::Prng;
use btrkit_tests::sys::CappedAlloc;
use btrkit_tests::{require_kernel_mount, skip_unless, KernelImage, MkfsOpts};
use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const ALLOC_CAP: usize = 256 << 20;
const CASE_LIMIT: Duration = Duration::from_secs(20);

#[global_allocator]
static ALLOC: CappedAlloc<ALLOC_CAP> = CappedAlloc;

/// The physical copies of every block of the fs tree and the trees the
/// view reads through it (root, extent, csum): where the flips go.
fn targets(img: &Image) -> Vec<Vec<u64>> {
    let mut trees = vec![img.root_tree()];
    if let Ok(items) = img.root_items_in(img.root_tree()) {
        trees.extend(
            items
                .iter()
                .filter(|(k, _)| {
                    [
                        BTRFS_FS_TREE_OBJECTID,
                        BTRFS_CSUM_TREE_OBJECTID,
                        BTRFS_EXTENT_TREE_OBJECTID,
                    ]
                    .contains(&k.objectid)
                })
                .map(|(k, ri)| tree_root_of(k.objectid, ri)),
        );
    }
    let ns = img.nodesize as u64;
    let mut out = Vec::new();
    for t in trees {
        let _ = walk_tree(img, t, |ev| {
            if let WalkEvent::Block { node, .. } = ev {
                if let Ok(copies) = img.chunks.map(node.bytenr, ns, img.devid) {
                    out.push(copies);
                }
            }
            ControlFlow::Continue(())
        });
    }
    out
}

/// Everything a mount answers, over every name reachable; results thrown
/// away (only panics, hangs and huge allocations matter). Returns how
/// many names were met.
fn serve_everything(dev: Arc<dyn BlockDevice>) -> usize {
    let o = ReadOptions {
        log: LogMode::Ignore,
        ..Default::default()
    };
    let Ok(mut v) = ReadOnlyView::open(vec![("img".into(), dev)], &o, None, true) else {
        return 0;
    };
    let mut met = 0usize;
    let mut seen = HashSet::new();
    let mut stack = vec![ROOT_NODE];
    while let Some(d) = stack.pop() {
        if !seen.insert(d) || seen.len() > 10_000 {
            continue;
        }
        let _ = v.getattr(d);
        let _ = v.listxattr(d);
        let Ok(h) = v.opendir(d) else { continue };
        let entries = v.dir_entries(h).map(|e| e.to_vec()).unwrap_or_default();
        for e in entries.iter().skip(2) {
            met += 1;
            let _ = v.lookup(d, &e.name);
            let _ = v.getxattr(e.node, b"user.test");
            let _ = v.listxattr(e.node);
            let Ok(st) = v.getattr(e.node) else { continue };
            match st.mode & libc::S_IFMT {
                libc::S_IFDIR => stack.push(e.node),
                libc::S_IFLNK => {
                    let _ = v.readlink(e.node);
                }
                _ => {
                    let _ = v.inline_contents(e.node, st.size, 4096);
                    // As the kernel reads: 128 KiB at a time, the first MiB.
                    let mut off = 0;
                    while off < st.size.min(1 << 20) {
                        if v.read(e.node, off, 128 << 10).is_err() {
                            break;
                        }
                        off += 128 << 10;
                    }
                }
            }
        }
        v.releasedir(h);
        let _ = v.take_warnings();
    }
    met
}

#[test]
fn the_mount_read_path_survives_byte_flips() {
    skip_unless!(require_kernel_mount());
    // A kernel-written image with 4 KiB nodes (taller trees): inline,
    // regular and compressed files, a hard link, a symlink, xattrs.
    let mut k = KernelImage::new_mounted(
        &MkfsOpts::default().size(256 << 20).nodesize(4096),
        "compress=zlib",
    );
    for d in 0..3 {
        let dir = k.path(&format!("dir{d}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..60u32 {
            let len = [100usize, 3000, 9000, 200_000][(f % 4) as usize];
            let data: Vec<u8> = (0..len)
                .map(|i| {
                    if f % 8 < 4 {
                        (i / 64) as u8
                    } else {
                        (i as u32).wrapping_mul(2654435761).wrapping_add(f) as u8
                    }
                })
                .collect();
            std::fs::write(dir.join(format!("file-{f:03}")), data).unwrap();
        }
    }
    std::fs::hard_link(k.path("dir0/file-001"), k.path("dir1/hardlink")).unwrap();
    std::os::unix::fs::symlink("dir0/file-002", k.path("symlink")).unwrap();
    let _ = std::process::Command::new("setfattr")
        .args(["-n", "user.test", "-v", "value"])
        .arg(k.path("dir0"))
        .status();
    k.umount();

    let dev = Arc::new(MemDevice::new(std::fs::read(k.image()).unwrap()));
    let img = Image::open(dev.clone(), OpenOptions::default()).unwrap();
    let (targets, csum, ns) = (targets(&img), img.csum, img.nodesize as usize);
    drop(img);
    let intact = serve_everything(dev.clone());
    assert!(intact > 180, "only {intact} names served intact");

    let cases: u64 = std::env::var("BTRKIT_MOUNT_FLIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut failures = Vec::new();
    for seed in 0..cases {
        let mut r = Prng::new(seed + 77);
        let copies = &targets[r.below(targets.len() as u64) as usize];
        let mut block = vec![0u8; ns];
        dev.read_at(copies[0], &mut block).unwrap();
        let mut offs = Vec::new();
        for _ in 0..1 + r.below(8) {
            // Headers and item headers sit in the first bytes: favour them.
            let off = if r.below(2) == 0 {
                r.below(512)
            } else {
                r.below(ns as u64)
            } as usize;
            block[off] = match r.below(4) {
                0 => 0,
                1 => 0xff,
                _ => block[off] ^ (1 + r.below(255) as u8),
            };
            offs.push(off);
        }
        // Mostly with the checksum recomputed: the view reads a block bad
        // only in its checksum as it stands anyway.
        if r.below(4) != 0 {
            let c = block_csum(csum, &block);
            block[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        }
        let mut saved = Vec::new();
        for &c in copies {
            let mut orig = vec![0u8; ns];
            dev.read_at(c, &mut orig).unwrap();
            saved.push((c, orig));
            dev.write_at(c, &block).unwrap();
        }
        let desc = format!("seed {seed}: block at {} bytes {offs:?}", copies[0]);
        let (tx, rx) = mpsc::channel();
        let d: Arc<dyn BlockDevice> = dev.clone();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || {
            let n = CappedAlloc::<ALLOC_CAP>::armed(|| serve_everything(d));
            let _ = tx.send(n);
        });
        match rx.recv_timeout(CASE_LIMIT) {
            Ok(_) => {
                let _ = h.join();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("{desc}: still serving after {CASE_LIMIT:?} (hang)")
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
            eprintln!("slow case {desc}: {:?}", t0.elapsed());
        }
        for (c, orig) in saved {
            dev.write_at(c, &orig).unwrap();
        }
    }
    let refused = CappedAlloc::<ALLOC_CAP>::largest_refused();
    assert_eq!(refused, 0, "an allocation of {refused} bytes was attempted");
    assert!(
        failures.is_empty(),
        "{} failing case(s) of {cases}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
