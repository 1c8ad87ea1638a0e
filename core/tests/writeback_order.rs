//! Background writeback past the dirty limit goes as the kernel's flusher
//! goes for the background threshold: whole inodes, oldest dirtied first,
//! until dirty data and dirty tree blocks together are down to half the
//! limit. The newest data stays in memory, so a file deleted soon after
//! it was written is never written.

mod common;

use btrkit_core::io::BlockDevice;
use common::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;

#[test]
fn background_writeback_takes_the_oldest_inodes_down_to_half_the_limit() {
    let dev = new_image(512 << 20, &[]);
    let base: Arc<dyn BlockDevice> = dev.clone();
    let mut fs = mount(base, &[]).unwrap();
    let root = fs.root();
    // Tree blocks count against the limit too: what the creates dirtied
    // is taken off it first (the writes below dirty no tree block).
    for n in [b"a", b"b", b"c", b"d", b"e"] {
        fs.create(root, n, 0o644).unwrap();
    }
    let (_, tree, _) = fs.cache_sizes();
    assert!(tree > 0);
    let limit = (fs.dirty_limit() - tree) as usize;
    let half = fs.dirty_limit() as usize / 2 - tree as usize;
    let before = fs.stats.writeback_bytes;
    // Four files of a quarter of the room each, then one more page: over
    // the limit by that page.
    let names: [&[u8]; 5] = [b"a", b"b", b"c", b"d", b"e"];
    let mut files = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let f = fs.lookup(root, n).unwrap().unwrap();
        let len = if i < 4 { limit / 4 } else { 4096 };
        fs.write(f, 0, &vec![i as u8 + 1; len]).unwrap();
        files.push(f);
    }
    fs.periodic().unwrap();
    let written = (fs.stats.writeback_bytes - before) as usize;
    // Oldest first until the dirty data is down to half the limit less
    // the tree blocks: a, b and c (after b, more than that is dirty); d
    // and e stay.
    // (The target is taken when the writeback starts; completing its
    // ordered extents dirties tree blocks of its own.)
    let (_, _, dirty) = fs.cache_sizes();
    assert_eq!(
        written,
        3 * limit / 4,
        "written back: {} MiB",
        written / MIB
    );
    assert!(dirty as usize <= half && dirty as usize + limit / 4 > half);
    assert_eq!(dirty as usize, limit / 4 + 4096);

    // The newest file deleted before any writeback: its data never
    // reaches the disk, and what is left reads back whole after a sync.
    fs.unlink(root, b"d").unwrap();
    fs.sync().unwrap();
    assert_eq!(
        (fs.stats.writeback_bytes - before) as usize,
        3 * limit / 4 + 4096,
        "d was never written"
    );
    for (i, f) in files.iter().enumerate() {
        if i == 3 {
            continue;
        }
        let len = if i < 4 { limit / 4 } else { 4096 };
        let got = fs.read(*f, 0, len as u64).unwrap();
        assert!(got.iter().all(|&b| b == i as u8 + 1) && got.len() == len);
    }
}
