//! btrkit-mount on images whose names and directory links are hostile (a
//! kernel-made image with DIR_INDEX items patched): an entry named `a/a`,
//! `b\0b`, `.`, `..` or nothing, an entry pointing back at an ancestor
//! directory (a cycle) and a second name of a directory. The directory
//! holding them is still listed (FUSE once failed the whole listing with
//! EIO), the bad entries are left out with one warning line each naming
//! the directory's inode and the name's bytes, and a walk of the mount
//! ends with every directory met once.
//!
//! And an image whose fsync log leaf is damaged: the mount refuses with a
//! line that says the log could not be replayed and names `--salvage` and
//! `--no-log`, both of which then mount it.

use btrkit_core::format::consts::*;
use btrkit_tests::fsck_support::{
    find_log_item, patch_block, patch_dir_entry, DIR_ITEM_DATA_LEN as DATA_LEN,
    DIR_ITEM_LOCATION as LOC_OBJECTID, DIR_ITEM_NAME as NAME, DIR_ITEM_NAME_LEN as NAME_LEN,
};
use btrkit_tests::{require_fuse, require_kernel_mount, skip_unless, KernelImage, MkfsOpts};
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// btrkit-mount in the foreground, its stderr kept in a file.
struct Foreground {
    child: Child,
    mnt: PathBuf,
    log: PathBuf,
}

impl Foreground {
    fn start(img: &Path, mnt: &Path, log: &Path) -> Foreground {
        std::fs::create_dir_all(mnt).unwrap();
        let child = Command::new(btrkit_tests::bin_path("btrkit-mount"))
            .arg(img)
            .arg(mnt)
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("btrkit-mount");
        let t0 = Instant::now();
        while !btrkit_tests::mount::is_mount_point(mnt) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "not mounted: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Foreground {
            child,
            mnt: mnt.to_path_buf(),
            log: log.to_path_buf(),
        }
    }

    /// Unmount, wait for the process, and give what it said.
    fn stop(mut self) -> String {
        self.unmount();
        std::fs::read_to_string(&self.log).unwrap()
    }

    fn unmount(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status();
        let t0 = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if t0.elapsed() > Duration::from_secs(30) {
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.mnt)
                    .status();
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Patch the entry `name` of `dir` (its DIR_INDEX, and DIR_ITEM too with
/// `item_too`).
fn patch_entry(img: &Path, dir: u64, name: &[u8], item_too: bool, f: &dyn Fn(&mut [u8], usize)) {
    let types: &[u8] = if item_too {
        &[BTRFS_DIR_INDEX_KEY, BTRFS_DIR_ITEM_KEY]
    } else {
        &[BTRFS_DIR_INDEX_KEY]
    };
    patch_dir_entry(img, dir, name, types, f);
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn hostile_names_and_directory_links_are_skipped() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let mut k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    for d in ["d", "top/mid/loop", "p/q", "r/s"] {
        std::fs::create_dir_all(k.path(d)).unwrap();
    }
    for f in ["d/x", "d/xx", "d/aaa", "d/bbb", "d/e", "d/ok", "p/q/inside"] {
        std::fs::write(k.path(f), f.as_bytes()).unwrap();
    }
    let (d, top, mid, q, r) = (
        ino(&k.path("d")),
        ino(&k.path("top")),
        ino(&k.path("top/mid")),
        ino(&k.path("p/q")),
        ino(&k.path("r")),
    );
    k.umount();
    let img = k.image().to_path_buf();
    let rename = |from: &[u8], to: &'static [u8]| {
        patch_entry(&img, d, from, false, &|b, o| {
            b[o + NAME..o + NAME + to.len()].copy_from_slice(to)
        });
    };
    rename(b"aaa", b"a/a");
    rename(b"bbb", b"b\0b");
    rename(b"x", b".");
    rename(b"xx", b"..");
    // An empty name: the byte that was the name is data.
    patch_entry(&img, d, b"e", false, &|b, o| {
        b[o + NAME_LEN..o + NAME_LEN + 2].copy_from_slice(&0u16.to_le_bytes());
        b[o + DATA_LEN..o + DATA_LEN + 2].copy_from_slice(&1u16.to_le_bytes());
    });
    // top/mid/loop names top again: a cycle. r/s names p/q: a second name.
    patch_entry(&img, mid, b"loop", true, &|b, o| {
        b[o + LOC_OBJECTID..o + 8].copy_from_slice(&top.to_le_bytes())
    });
    patch_entry(&img, r, b"s", true, &|b, o| {
        b[o + LOC_OBJECTID..o + 8].copy_from_slice(&q.to_le_bytes())
    });

    let m = Foreground::start(&img, &k.dir().join("fuse"), &k.dir().join("mount.log"));
    let mnt = m.mnt.clone();
    let names = |p: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(mnt.join(p))
            .unwrap_or_else(|e| panic!("list {p}: {e}"))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    // A directory is served under the first name met: p/q before r/s.
    assert_eq!(names("p"), ["q"]);
    // Listed twice: each warning is said once.
    for _ in 0..2 {
        assert_eq!(names("d"), ["ok"]);
        assert_eq!(names("top/mid"), Vec::<String>::new());
        assert_eq!(names("r"), Vec::<String>::new());
    }
    assert_eq!(
        std::fs::read(mnt.join("p/q/inside")).unwrap(),
        b"p/q/inside"
    );
    // A walk ends, meeting every directory once.
    let mut seen = HashSet::new();
    let mut stack = vec![(mnt.clone(), 0)];
    while let Some((p, depth)) = stack.pop() {
        assert!(
            depth < 16,
            "the walk goes deeper than the tree: {}",
            p.display()
        );
        assert!(seen.insert(ino(&p)), "{} met twice", p.display());
        for e in std::fs::read_dir(&p).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    assert_eq!(seen.len(), 7, "/, d, top, top/mid, p, p/q and r");
    let said = m.stop();
    let dir_d = format!("warning: directory inode {d} of subvolume 5: entry ");
    for (name, why) in [
        ("a/a", "contains '/'"),
        ("b\\x00b", "contains a NUL byte"),
        (".", "is \".\""),
        ("..", "is \"..\""),
        ("", "is empty"),
    ] {
        let line = format!("{dir_d}\"{name}\" skipped: its name {why}");
        assert_eq!(said.matches(&line).count(), 1, "{line}\nin:\n{said}");
    }
    for (dir, name, why) in [
        (mid, "loop", "second name of directory node"),
        (r, "s", "second name of directory node"),
    ] {
        let line = format!("warning: directory inode {dir} of subvolume 5: entry \"{name}\" skipped: it is a {why}");
        assert_eq!(said.matches(&line).count(), 1, "{line}\nin:\n{said}");
    }
    assert!(!said.contains("panicked"), "{said}");
}

#[test]
fn a_damaged_log_names_salvage_and_no_log() {
    skip_unless!(require_kernel_mount(), require_fuse());
    let k = KernelImage::new_mounted(&MkfsOpts::default(), "");
    std::fs::write(k.path("committed"), b"committed\n").unwrap();
    k.sync();
    std::fs::write(k.path("logged"), b"logged\n").unwrap();
    std::fs::File::open(k.path("logged"))
        .unwrap()
        .sync_all()
        .unwrap();
    let c = k.crash_copy("log.img");
    let img = k.dir().join("log.img");
    std::fs::copy(&c.path, &img).unwrap();
    // The log leaf's header names another address, on every copy (a
    // block bad only in its checksum would be read as it stands).
    let at = find_log_item(&img, 0, &|_, _| true).expect("a log item");
    patch_block(&img, at.bytenr, true, true, &|b| {
        b[48..56].copy_from_slice(&(at.bytenr + 4096).to_le_bytes())
    });

    let mnt = k.dir().join("fuse");
    let Err(e) = btrkit_tests::FuseMount::mount(&[&img], &mnt, &[]) else {
        panic!("mounted with a damaged log");
    };
    assert!(e.contains("exit Some(1)"), "{e}");
    assert!(
        e.contains("the fsync log could not be replayed")
            && e.contains("--salvage")
            && e.contains("--no-log"),
        "{e}"
    );
    for flag in ["--salvage", "--no-log"] {
        let m = btrkit_tests::FuseMount::mount(&[&img], &mnt, &[flag])
            .unwrap_or_else(|e| panic!("{flag}: {e}"));
        assert_eq!(
            std::fs::read(m.path().join("committed")).unwrap(),
            b"committed\n",
            "{flag}"
        );
        m.unmount().unwrap();
    }
}
