//! What `evict` (drop_caches of dentries and inodes) drops, as the kernel
//! drops it: an inode whose pages were dirtied since the last sync is off
//! the inode LRU (I_DIRTY_PAGES, which an fsync's ranged writeback does
//! not clear) and stays, even once a truncate emptied its page cache;
//! after a sync it goes. Seen through what an eviction changes: an inode
//! read back from disk assumes it may have lost a name in the transaction
//! that last changed it (last_unlink_trans = last_trans), so its fsync logs
//! its parents, and a parent that lost an entry it never logged forces a
//! full commit.

mod common;

use btrkit_core::io::BlockDevice;
use common::*;
use std::sync::Arc;

const REASON: &str = "directory lost an entry the log cannot follow";

fn forced(fs: &btrkit_core::fs::Filesystem) -> u64 {
    fs.stats
        .full_commit_reasons
        .get(REASON)
        .copied()
        .unwrap_or(0)
}

#[test]
fn drop_caches_keeps_inodes_dirtied_since_the_last_sync() {
    let dev = new_image(256 << 20, &[]);
    let base: Arc<dyn BlockDevice> = dev.clone();
    let mut fs = mount(base, &[]).unwrap();
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755).unwrap();
    let f = fs.create(root, b"f", 0o644).unwrap();
    fs.create(root, b"g", 0o644).unwrap();
    fs.create(root, b"h", 0o644).unwrap();
    fs.write(f, 0, &[7u8; 3000]).unwrap();
    fs.sync().unwrap();

    // Dirtied since the sync: written back by its fsync, emptied by a
    // truncate, and still not evicted.
    fs.write(f, 0, &[8u8; 5000]).unwrap();
    fs.fsync(f, false, None).unwrap();
    fs.truncate(f, 0).unwrap();
    // The root loses an entry it never logged.
    fs.rename(root, b"g", d, b"g").unwrap();
    fs.evict();
    let before = forced(&fs);
    fs.fsync(f, false, None).unwrap();
    assert_eq!(
        forced(&fs),
        before,
        "f stayed in memory: its fsync does not log its parents"
    );

    // After a sync the inode is clean and goes with the next eviction.
    fs.sync().unwrap();
    fs.chmod(f, 0o600).unwrap();
    fs.rename(root, b"h", d, b"h").unwrap();
    fs.evict();
    let before = forced(&fs);
    fs.fsync(f, false, None).unwrap();
    assert_eq!(
        forced(&fs),
        before + 1,
        "f was evicted and read back: its fsync logs the root, which lost h"
    );
    let crashed: Arc<dyn BlockDevice> = Arc::new(dev.crash_device(|_| false));
    drop(fs);
    let mut after = mount(crashed.clone(), &[]).unwrap();
    let root = after.root();
    assert!(after.lookup(root, b"h").unwrap().is_none());
    let d = after.lookup(root, b"d").unwrap().unwrap();
    assert!(after.lookup(d, b"h").unwrap().is_some());
    drop(after);
    assert_clean(crashed, "after the crash");
}
