//! Helpers for the btrkit-fsck integration tests: locating the binary and
//! the shared fixtures, running the checker, and kernel-written images
//! (mounted with [`LoopMount`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::mount::LoopMount;

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `../shared/fixtures/btrfs-progs-fsck` relative to the repository root.
pub fn fixtures_dir() -> PathBuf {
    repo_root().join("../shared/fixtures/btrfs-progs-fsck")
}

/// Path of the btrkit-fsck binary of this build profile. `cargo test`
/// does not rebuild other packages' binaries, so it is built (once per
/// test process) before first use.
pub fn fsck_bin() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> -> target/<profile>/btrkit-fsck
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    BUILD.call_once(|| {
        let release = dir.file_name().is_some_and(|n| n == "release");
        let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        c.args(["build", "-q", "-p", "btrkit-fsck"])
            .current_dir(repo_root());
        if release {
            c.arg("--release");
        }
        let _ = c.status();
    });
    dir.join("btrkit-fsck")
}

/// Outcome of one btrkit-fsck run.
pub struct FsckRun {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl FsckRun {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or(serde_json::Value::Null)
    }
    /// Damage as (phase, category, message): error findings, and damaged
    /// copies of DUP tree blocks (a warning for the user, since reads use
    /// the good copy, but damage in anything we wrote).
    pub fn errors(&self) -> Vec<(u64, String, String)> {
        let v = self.json();
        v["findings"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|f| f["severity"] == "error" || f["category"] == "mirror-copy")
                    .map(|f| {
                        (
                            f["phase"].as_u64().unwrap_or(0),
                            f["category"].as_str().unwrap_or("").to_string(),
                            f["message"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Run `btrkit-fsck --json [extra] image` with a time limit.
pub fn run_fsck(image: &Path, extra: &[&str], limit: std::time::Duration) -> FsckRun {
    let mut c = Command::new(fsck_bin());
    c.arg("--json").args(extra).arg(image);
    run_with_limit(c, limit)
}

pub fn run_with_limit(mut c: Command, limit: std::time::Duration) -> FsckRun {
    use std::io::Read;
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            return FsckRun {
                code: -1,
                stdout: String::new(),
                stderr: format!("spawn failed: {e}"),
            }
        }
    };
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = out.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = err.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let start = std::time::Instant::now();
    let code = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.code().unwrap_or(-1),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break -2;
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(_) => break -1,
        }
    };
    FsckRun {
        code,
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

/// True when `prog` can be run.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {prog} >/dev/null 2>&1"))
        .status()
        .is_ok_and(|s| s.success())
}

pub use crate::sys::is_root;

/// Run a shell snippet, panicking with its output on failure (test setup).
pub fn sh(cmd: &str) {
    let o = Command::new("sh").arg("-c").arg(cmd).output();
    match o {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "`{cmd}` failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("`{cmd}` could not run: {e}"),
    }
}

/// Make a small kernel-written image: mkfs (free space tree left to the
/// kernel, see fsck_kernel.rs), mount, run `script` inside, unmount.
pub fn kernel_image(
    dir: &Path,
    name: &str,
    mkfs_args: &str,
    mount_opts: &str,
    script: &str,
) -> PathBuf {
    let img = dir.join(name);
    sh(&format!(
        "truncate -s 256M '{0}' && mkfs.btrfs -q -f -R ^free-space-tree {mkfs_args} '{0}'",
        img.display()
    ));
    {
        let m = LoopMount::new(&img, &format!("space_cache=v2,{mount_opts}"))
            .unwrap_or_else(|e| panic!("{e}"));
        sh(&format!("cd '{}' && {script}", m.path().display()));
    }
    img
}

/// Why kernel-image tests cannot run here, if they cannot.
pub fn kernel_unavailable() -> Option<String> {
    if !is_root() {
        return Some("not root".into());
    }
    for p in ["mkfs.btrfs", "btrfs", "mount", "umount", "xfs_io"] {
        if !have(p) {
            return Some(format!("{p} not installed"));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("no loop devices".into());
    }
    None
}

/// Where an item lives: its block, slot and the byte offset of its data.
#[derive(Clone, Copy, Debug)]
pub struct ItemAt {
    pub bytenr: u64,
    pub slot: usize,
    pub data_off: usize,
    pub data_len: usize,
    pub key: btrkit_core::format::key::Key,
}

/// The `nth` item of tree `tree` for which `pred(key, data)` holds.
pub fn find_item(
    image: &Path,
    tree: u64,
    nth: usize,
    pred: &dyn Fn(&btrkit_core::format::key::Key, &[u8]) -> bool,
) -> Option<ItemAt> {
    use btrkit_core::format::consts::*;
    use btrkit_core::format::header::HEADER_SIZE;
    use btrkit_core::image::{Image, OpenOptions};
    use btrkit_core::tree::TreeIter;
    let img = Image::open_path(image, OpenOptions::default()).ok()?;
    let root = match tree {
        BTRFS_ROOT_TREE_OBJECTID => img.root_tree(),
        BTRFS_CHUNK_TREE_OBJECTID => img.chunk_tree(),
        _ => img.find_root(tree).ok()??,
    };
    let mut it = TreeIter::new(&img, root, btrkit_core::format::key::Key::MIN).ok()?;
    let mut n = 0;
    while let Some(Ok(item)) = it.next_item() {
        let d = item.data().ok()?;
        if pred(&item.key, d) {
            if n == nth {
                let h = item.node.item(item.slot)?;
                return Some(ItemAt {
                    bytenr: item.node.bytenr,
                    slot: item.slot,
                    data_off: HEADER_SIZE + h.offset.get() as usize,
                    data_len: d.len(),
                    key: item.key,
                });
            }
            n += 1;
        }
    }
    None
}

/// Change tree block `bytenr` in place with `f`, on every copy (or only
/// copy 0 when `all_copies` is false), re-computing its checksum when
/// `fix_csum`.
pub fn patch_block(
    image: &Path,
    bytenr: u64,
    all_copies: bool,
    fix_csum: bool,
    f: &dyn Fn(&mut [u8]),
) {
    use btrkit_core::image::{Image, OpenOptions};
    use std::os::unix::fs::FileExt;
    let (phys, ns, csum) = {
        let img = Image::open_path(image, OpenOptions::default()).expect("open image");
        (
            img.chunks
                .map(bytenr, img.nodesize as u64, img.devid)
                .expect("map block"),
            img.nodesize as usize,
            img.csum,
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .expect("open rw");
    for (i, p) in phys.iter().enumerate() {
        if i > 0 && !all_copies {
            break;
        }
        let mut b = vec![0u8; ns];
        file.read_exact_at(&mut b, *p).expect("read block");
        f(&mut b);
        if fix_csum {
            let c = btrkit_core::csum::block_csum(csum, &b);
            b[..32].copy_from_slice(&c);
        }
        file.write_all_at(&b, *p).expect("write block");
    }
    let _ = file.sync_all();
}

/// Offsets in a `btrfs_dir_item` (the head of a DIR_ITEM or DIR_INDEX
/// entry): the location key's objectid, data_len, name_len, the name.
pub const DIR_ITEM_LOCATION: usize = 0;
pub const DIR_ITEM_DATA_LEN: usize = 25;
pub const DIR_ITEM_NAME_LEN: usize = 27;
pub const DIR_ITEM_NAME: usize = 30;

/// Change, on every copy and with the block's checksum recomputed, the
/// entry named `name` of directory `dir` in the fs tree: its item of each
/// key type in `types` (DIR_ITEM, DIR_INDEX), `f` given the block and the
/// offset of the item's data in it. Panics when an entry is missing.
pub fn patch_dir_entry(
    image: &Path,
    dir: u64,
    name: &[u8],
    types: &[u8],
    f: &dyn Fn(&mut [u8], usize),
) {
    for &ty in types {
        let at = find_item(
            image,
            btrkit_core::format::consts::BTRFS_FS_TREE_OBJECTID,
            0,
            &|k, d| k.objectid == dir && k.ty == ty && d.get(DIR_ITEM_NAME..) == Some(name),
        )
        .unwrap_or_else(|| panic!("no entry {name:?} of directory {dir} (key type {ty})"));
        patch_block(image, at.bytenr, true, true, &|b| f(b, at.data_off));
    }
}

/// Size and modification time of a file, to prove a run did not write to it.
pub fn file_stamp(p: &Path) -> (u64, Option<std::time::SystemTime>) {
    let m = std::fs::metadata(p).ok();
    (
        m.as_ref().map(|m| m.len()).unwrap_or(0),
        m.and_then(|m| m.modified().ok()),
    )
}

/// Like [`find_item`], over every log tree of the image's fsync log.
pub fn find_log_item(
    image: &Path,
    nth: usize,
    pred: &dyn Fn(&btrkit_core::format::key::Key, &[u8]) -> bool,
) -> Option<ItemAt> {
    use btrkit_core::format::consts::*;
    use btrkit_core::format::header::HEADER_SIZE;
    use btrkit_core::image::{tree_root_of, Image, OpenOptions};
    use btrkit_core::tree::TreeIter;
    let img = Image::open_path(image, OpenOptions::default()).ok()?;
    let mut n = 0;
    for (_, ri) in img.root_items_in(img.log_root_tree()?).ok()? {
        let root = tree_root_of(BTRFS_TREE_LOG_OBJECTID, &ri);
        let mut it = TreeIter::new(&img, root, btrkit_core::format::key::Key::MIN).ok()?;
        while let Some(Ok(item)) = it.next_item() {
            let d = item.data().ok()?;
            if pred(&item.key, d) {
                if n == nth {
                    let h = item.node.item(item.slot)?;
                    return Some(ItemAt {
                        bytenr: item.node.bytenr,
                        slot: item.slot,
                        data_off: HEADER_SIZE + h.offset.get() as usize,
                        data_len: d.len(),
                        key: item.key,
                    });
                }
                n += 1;
            }
        }
    }
    None
}
