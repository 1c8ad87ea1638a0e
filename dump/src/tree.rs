//! `btrkit-dump tree`: every tree of an image in the order and shape of
//! `btrfs inspect-internal dump-tree` (btrfs-progs 6.2), as text or JSON.
//!
//! Trees are walked breadth first by default (each level left to right, as
//! btrfs does) or depth first with `--dfs`. Damaged blocks never stop the
//! dump: each problem becomes an `ERROR:` line, what can still be read is
//! printed, and the exit code is 1.

use crate::json::JsonSink;
use crate::render::Text;
use crate::sink::{Event, Sink};
use crate::text::TextSink;
use btrkit_core::format::consts::*;
use btrkit_core::format::key::Key;
use btrkit_core::format::names::parse_tree_name;
use btrkit_core::format::root::RootItem;
use btrkit_core::image::{tree_root_of, Image};
use btrkit_core::tree::{
    walk, Expect, Node, OnDamage, Order, Place, Stop, TreeRoot, WalkEvent, WalkOptions,
};
use std::collections::HashSet;
use std::io;
use std::ops::ControlFlow;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit-dump tree disk.img\n  btrkit-dump tree disk.img --tree fs\n  \
btrkit-dump tree disk.img --tree 256\n  btrkit-dump tree disk.img --tree log\n  \
btrkit-dump tree disk.img --block 30408704 --follow\n  btrkit-dump tree disk.img --json > dump.json\n\n\
Exit status: 0 when every block read was valid; 1 when a block was damaged (each problem is an\n\
ERROR: line in the dump, which goes on with the rest) or the image cannot be opened.\n\n\
Times are printed as signed seconds (1960-01-01 is -315619200.0), where dump-tree prints\n\
them unsigned (18446744073393932416.0); nanoseconds of 10^9 or more on disk show as 999999999."
)]
pub struct Args {
    #[command(flatten)]
    pub dev: crate::devices::Devices,
    /// Print only this tree: a number or a name (root, extent, chunk, dev,
    /// fs, csum, quota, uuid, free-space, block-group, data-reloc, log).
    /// `log` prints the log root tree and every log tree (a subvolume's
    /// number prints only that subvolume's tree, as `dump-tree -t`).
    #[arg(short = 't', long, value_name = "ID|NAME")]
    pub tree: Option<String>,
    /// Print only the tree block at this logical address (may be repeated).
    #[arg(short = 'b', long, value_name = "BYTENR", value_parser = parse_u64)]
    pub block: Vec<u64>,
    /// With --block, also print every block below it.
    #[arg(long)]
    pub follow: bool,
    /// Depth-first traversal (default: breadth-first, each level left to right).
    #[arg(long, conflicts_with = "bfs")]
    pub dfs: bool,
    /// Breadth-first traversal (the default).
    #[arg(long)]
    pub bfs: bool,
    /// Print the checksum stored in each block header.
    #[arg(long)]
    pub csum_headers: bool,
    /// Print the data checksums of csum items.
    #[arg(long)]
    pub csum_items: bool,
    /// Machine-readable output: trees, blocks and items with decoded fields.
    #[arg(long)]
    pub json: bool,
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a number"))
}

/// The word dump-tree puts before " tree key (...)" for a ROOT_ITEM.
pub fn section_name(objectid: u64) -> &'static str {
    match objectid {
        BTRFS_ROOT_TREE_OBJECTID => "root",
        BTRFS_EXTENT_TREE_OBJECTID => "extent",
        BTRFS_CHUNK_TREE_OBJECTID => "chunk",
        BTRFS_DEV_TREE_OBJECTID => "device",
        BTRFS_FS_TREE_OBJECTID => "fs",
        BTRFS_ROOT_TREE_DIR_OBJECTID => "directory",
        BTRFS_CSUM_TREE_OBJECTID => "checksum",
        BTRFS_ORPHAN_OBJECTID => "orphan",
        BTRFS_TREE_LOG_OBJECTID => "log",
        BTRFS_TREE_LOG_FIXUP_OBJECTID => "log fixup",
        BTRFS_TREE_RELOC_OBJECTID => "reloc",
        BTRFS_DATA_RELOC_TREE_OBJECTID => "data reloc",
        BTRFS_EXTENT_CSUM_OBJECTID => "extent checksum",
        BTRFS_QUOTA_TREE_OBJECTID => "quota",
        BTRFS_UUID_TREE_OBJECTID => "uuid",
        BTRFS_FREE_SPACE_TREE_OBJECTID => "free space",
        BTRFS_MULTIPLE_OBJECTIDS => "multiple",
        BTRFS_BLOCK_GROUP_TREE_OBJECTID => "block group",
        _ => "file",
    }
}

/// A ROOT_ITEM found while walking the root tree or the log root tree.
struct FoundRoot {
    key: Key,
    root: TreeRoot,
    /// Where an unfinished subvolume deletion stopped (drop_progress).
    drop: Option<Key>,
}

pub struct Dumper<'a> {
    img: &'a Image,
    sink: &'a mut dyn Sink,
    dfs: bool,
    /// Blocks with problems, unreadable blocks and bad references seen so far.
    pub damaged: usize,
    /// Spinner on stderr while the dump goes to a file or pipe.
    progress: Option<indicatif::ProgressBar>,
    blocks_read: u64,
}

impl<'a> Dumper<'a> {
    pub fn new(img: &'a Image, sink: &'a mut dyn Sink, dfs: bool) -> Self {
        use std::io::IsTerminal;
        let progress = (io::stderr().is_terminal() && !io::stdout().is_terminal()).then(|| {
            let pb = indicatif::ProgressBar::new_spinner();
            pb.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            pb
        });
        Dumper {
            img,
            sink,
            dfs,
            damaged: 0,
            progress,
            blocks_read: 0,
        }
    }

    fn error(&mut self, message: &str, bytenr: Option<u64>, key: Option<Key>) -> io::Result<()> {
        self.damaged += 1;
        self.sink.event(Event::Error {
            message,
            bytenr,
            key,
        })
    }

    /// Walk the tree under `start`. `print` sends blocks to the sink; with
    /// `roots`, the ROOT_ITEMs of the leaves are collected in key order.
    /// Subtrees wholly left of `drop` (the drop_progress of a subvolume whose
    /// deletion was interrupted) have been freed and are not read.
    #[allow(clippy::too_many_arguments)]
    fn walk(
        &mut self,
        start: u64,
        expect: Expect,
        log: bool,
        follow: bool,
        print: bool,
        drop: Option<Key>,
        mut roots: Option<&mut Vec<FoundRoot>>,
    ) -> io::Result<()> {
        let opts = WalkOptions {
            order: if self.dfs {
                Order::Depth
            } else {
                Order::Breadth
            },
            on_damage: OnDamage::Keep,
            log,
            drop,
            // Start the reads of the children now: on a cold page cache
            // the disk then works while the blocks before them are printed.
            prefetch: true,
            ..Default::default()
        };
        let img = self.img;
        let walked = walk(
            img,
            Place::start(start, expect),
            &opts,
            &mut HashSet::new(),
            |ev| -> ControlFlow<io::Error, bool> {
                let r = match ev {
                    WalkEvent::Revisit { parent, at, .. } => {
                        let m =
                            format!("referenced a second time in this tree (from block {parent})");
                        self.error(&m, Some(at.bytenr), at.expect.first_key)
                    }
                    WalkEvent::Unreadable {
                        bytenr,
                        parent,
                        key,
                        error,
                        ..
                    } => {
                        let m = match parent {
                            Some(parent) => {
                                format!("cannot read (pointer in block {parent}): {error}")
                            }
                            None => format!("cannot read: {error}"),
                        };
                        self.error(&m, Some(bytenr), key)
                    }
                    // No block is excluded from a dump.
                    WalkEvent::Excluded { .. } => Ok(()),
                    WalkEvent::Block { node, problems, .. } => {
                        return match self.block(node, problems, print, roots.as_deref_mut()) {
                            Ok(()) => ControlFlow::Continue(follow),
                            Err(e) => ControlFlow::Break(e),
                        }
                    }
                };
                match r {
                    Ok(()) => ControlFlow::Continue(true),
                    Err(e) => ControlFlow::Break(e),
                }
            },
        );
        match walked {
            ControlFlow::Continue(()) => Ok(()),
            ControlFlow::Break(Stop::Visitor(e)) => Err(e),
            // A dump keeps what it can read: damage never stops it.
            ControlFlow::Break(Stop::Damage(_)) => Ok(()),
        }
    }

    /// One block read by the walk: counted, printed (or its problems
    /// reported), and its ROOT_ITEMs collected.
    fn block(
        &mut self,
        node: &Node,
        problems: &[btrkit_core::tree::Problem],
        print: bool,
        roots: Option<&mut Vec<FoundRoot>>,
    ) -> io::Result<()> {
        if !problems.is_empty() {
            self.damaged += 1;
        }
        self.blocks_read += 1;
        if let Some(pb) = &self.progress {
            if self.blocks_read.is_multiple_of(256) {
                pb.set_message(format!("{} tree blocks", self.blocks_read));
            }
        }
        if print {
            self.sink.event(Event::Block { node, problems })?;
        } else {
            for pr in problems {
                self.sink.event(Event::Error {
                    message: &pr.message,
                    bytenr: Some(pr.bytenr),
                    key: pr.key,
                })?;
            }
        }
        if node.is_leaf() {
            if let Some(r) = roots {
                self.collect_roots(node, r)?;
            }
        }
        Ok(())
    }

    fn collect_roots(&mut self, leaf: &Node, out: &mut Vec<FoundRoot>) -> io::Result<()> {
        for slot in 0..leaf.nr_safe() {
            let Some(key) = leaf.key(slot) else { continue };
            if key.ty != BTRFS_ROOT_ITEM_KEY {
                continue;
            }
            match leaf.item_data(slot).and_then(RootItem::parse) {
                Ok(ri) => {
                    let dp = Key::from(&ri.drop_progress);
                    let drop = (dp.objectid != 0).then_some(dp);
                    out.push(FoundRoot {
                        key,
                        root: tree_root_of(key.objectid, &ri),
                        drop,
                    })
                }
                Err(e) => {
                    let m = format!("root item unreadable, its tree is skipped: {e}");
                    self.error(&m, Some(leaf.bytenr), Some(key))?;
                }
            }
        }
        Ok(())
    }

    /// Print a whole tree from its root.
    fn tree(
        &mut self,
        root: TreeRoot,
        drop: Option<Key>,
        roots: Option<&mut Vec<FoundRoot>>,
    ) -> io::Result<()> {
        self.walk(
            root.bytenr,
            Expect::root(&root),
            root.id == BTRFS_TREE_LOG_OBJECTID,
            true,
            true,
            drop,
            roots,
        )
    }

    /// The ROOT_ITEMs of `root`, walked without printing (errors still count).
    fn roots_of(&mut self, root: TreeRoot) -> io::Result<Vec<FoundRoot>> {
        let mut v = Vec::new();
        self.walk(
            root.bytenr,
            Expect::root(&root),
            root.id == BTRFS_TREE_LOG_OBJECTID,
            true,
            false,
            None,
            Some(&mut v),
        )?;
        Ok(v)
    }

    fn found_trees(&mut self, found: &[FoundRoot], only: Option<u64>) -> io::Result<usize> {
        let mut n = 0;
        for f in found
            .iter()
            .filter(|f| only.is_none_or(|id| id == f.key.objectid))
        {
            self.sink.event(Event::Section {
                title: section_name(f.key.objectid),
                tree: f.key.objectid,
                key: Some(f.key),
            })?;
            self.tree(f.root, f.drop, None)?;
            n += 1;
        }
        Ok(n)
    }

    fn totals(&mut self) -> io::Result<()> {
        let sb = &self.img.sb;
        self.sink.event(Event::Totals {
            total_bytes: sb.total_bytes.get(),
            bytes_used: sb.bytes_used.get(),
            fsid: sb.fsid,
        })
    }

    /// Everything, in dump-tree's order: root tree, chunk tree, log root
    /// tree, each tree of the root tree's ROOT_ITEMs, each log tree, totals.
    pub fn all(&mut self) -> io::Result<()> {
        let img = self.img;
        let mut found = Vec::new();
        self.sink.event(Event::Section {
            title: "root tree",
            tree: BTRFS_ROOT_TREE_OBJECTID,
            key: None,
        })?;
        self.tree(img.root_tree(), None, Some(&mut found))?;
        self.sink.event(Event::Section {
            title: "chunk tree",
            tree: BTRFS_CHUNK_TREE_OBJECTID,
            key: None,
        })?;
        self.tree(img.chunk_tree(), None, None)?;
        let mut logs = Vec::new();
        if let Some(lr) = img.log_root_tree() {
            self.sink.event(Event::Section {
                title: "log root tree",
                tree: BTRFS_TREE_LOG_OBJECTID,
                key: None,
            })?;
            self.tree(lr, None, Some(&mut logs))?;
        }
        self.found_trees(&found, None)?;
        self.found_trees(&logs, None)?;
        self.totals()
    }

    /// One tree by id. Returns false when the image has no such tree.
    pub fn one(&mut self, id: u64) -> io::Result<bool> {
        let img = self.img;
        match id {
            BTRFS_ROOT_TREE_OBJECTID => {
                self.sink.event(Event::Section {
                    title: "root tree",
                    tree: id,
                    key: None,
                })?;
                self.tree(img.root_tree(), None, None)?;
            }
            BTRFS_CHUNK_TREE_OBJECTID => {
                self.sink.event(Event::Section {
                    title: "chunk tree",
                    tree: id,
                    key: None,
                })?;
                self.tree(img.chunk_tree(), None, None)?;
            }
            BTRFS_TREE_LOG_OBJECTID => {
                let Some(lr) = img.log_root_tree() else {
                    return Ok(false);
                };
                self.sink.event(Event::Section {
                    title: "log root tree",
                    tree: id,
                    key: None,
                })?;
                let mut logs = Vec::new();
                self.tree(lr, None, Some(&mut logs))?;
                self.found_trees(&logs, None)?;
            }
            BTRFS_BLOCK_GROUP_TREE_OBJECTID => {
                let found = self.roots_of(img.root_tree())?;
                let Some(f) = found.iter().find(|f| f.key.objectid == id) else {
                    return Ok(false);
                };
                self.sink.event(Event::Section {
                    title: "block group tree",
                    tree: id,
                    key: None,
                })?;
                self.tree(f.root, f.drop, None)?;
            }
            _ => {
                let found = self.roots_of(img.root_tree())?;
                if self.found_trees(&found, Some(id))? == 0 {
                    return Ok(false);
                }
                self.totals()?;
            }
        }
        Ok(true)
    }

    /// Single blocks by address, in address order, as `dump-tree -b`.
    pub fn blocks(&mut self, blocks: &[u64], follow: bool) -> io::Result<()> {
        let log = self.img.sb.log_root.get() != 0;
        let mut v = blocks.to_vec();
        v.sort_unstable();
        v.dedup();
        for b in v {
            self.walk(b, Expect::default(), log, follow, true, None, None)?;
        }
        Ok(())
    }
}

/// A tree id as dump-tree's `-t` takes it: a number, or a name in any case,
/// optionally as the C constant (`BTRFS_FS_TREE_OBJECTID`).
pub fn tree_id(s: &str) -> Option<u64> {
    if let Ok(v) = s.parse::<u64>() {
        return Some(v);
    }
    let l = s.to_ascii_lowercase();
    let l = l.strip_prefix("btrfs_").unwrap_or(&l);
    let l = l.strip_suffix("_objectid").unwrap_or(l);
    match l {
        "tree_reloc" | "reloc" => Some(BTRFS_TREE_RELOC_OBJECTID),
        "tree_log_fixup" | "log_fixup" => Some(BTRFS_TREE_LOG_FIXUP_OBJECTID),
        "tree_log" | "log" | "log_root" => Some(BTRFS_TREE_LOG_OBJECTID),
        "free_space" | "free-space" => Some(BTRFS_FREE_SPACE_TREE_OBJECTID),
        _ => parse_tree_name(l),
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let tree_id = match &a.tree {
        Some(t) => Some(match tree_id(t) {
            Some(0) | None => anyhow::bail!("unrecognized tree id: {t}"),
            Some(id) => id,
        }),
        None => None,
    };
    let img = a.dev.open()?;
    for w in &img.open_warnings {
        eprintln!("btrkit-dump: warning: {w}");
    }
    let stdout = io::stdout();
    let lock = stdout.lock();
    let mut sink: Box<dyn Sink> = if a.json {
        Box::new(JsonSink::new(
            io::BufWriter::with_capacity(1 << 20, lock),
            &img,
            a.dev.first(),
        ))
    } else {
        let mut text = Text::new(img.csum.size(), img.sectorsize);
        text.csum_headers = a.csum_headers;
        text.csum_items = a.csum_items;
        Box::new(TextSink::new(lock, text))
    };
    let mut d = Dumper::new(&img, sink.as_mut(), a.dfs);
    let r = (|| -> io::Result<bool> {
        if !a.block.is_empty() {
            d.blocks(&a.block, a.follow)?;
            return Ok(true);
        }
        if let Some(id) = tree_id {
            return d.one(id);
        }
        d.all()?;
        Ok(true)
    })();
    let damaged = d.damaged;
    if let Some(pb) = d.progress.take() {
        pb.finish_and_clear();
    }
    let r = r.and_then(|found| sink.finish().map(|_| found));
    match r {
        Ok(true) => {}
        Ok(false) => {
            let t = a.tree.as_deref().unwrap_or("");
            anyhow::bail!("{}: no tree {t} in this image", a.dev.first().display());
        }
        // A closed pipe (`| head`) ends the dump quietly.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            return Ok(if damaged > 0 { 1 } else { 0 })
        }
        Err(e) => return Err(anyhow::anyhow!("writing the dump: {e}")),
    }
    let rebuilt = img.take_rebuilt_reads();
    for d in &rebuilt.described {
        eprintln!("btrkit-dump: warning: {}", d.describe(&img));
    }
    if rebuilt.count > rebuilt.described.len() as u64 {
        eprintln!(
            "btrkit-dump: warning: {} more reads rebuilt from RAID5/6 parity",
            rebuilt.count - rebuilt.described.len() as u64
        );
    }
    if damaged > 0 {
        eprintln!(
            "btrkit-dump: {damaged} damaged tree block(s) or references; see the ERROR lines"
        );
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_names() {
        assert_eq!(tree_id("fs"), Some(5));
        assert_eq!(tree_id("FS_TREE"), Some(5));
        assert_eq!(tree_id("BTRFS_FS_TREE_OBJECTID"), Some(5));
        assert_eq!(tree_id("256"), Some(256));
        assert_eq!(tree_id("free-space"), Some(BTRFS_FREE_SPACE_TREE_OBJECTID));
        assert_eq!(tree_id("TREE_LOG"), Some(BTRFS_TREE_LOG_OBJECTID));
        assert_eq!(tree_id("log"), Some(BTRFS_TREE_LOG_OBJECTID));
        assert_eq!(tree_id("checksum"), Some(BTRFS_CSUM_TREE_OBJECTID));
        assert_eq!(tree_id("nonsense"), None);
        assert_eq!(
            tree_id("18446744073709551610"),
            Some(BTRFS_TREE_LOG_OBJECTID)
        );
        assert_eq!(tree_id("-6"), Some(BTRFS_TREE_LOG_OBJECTID));
    }

    #[test]
    fn sections_and_errors_as_text() {
        let mut sink = TextSink::new(Vec::new(), Text::new(4, 4096));
        sink.event(Event::Section {
            title: "root tree",
            tree: 1,
            key: None,
        })
        .unwrap();
        let k = Key::new(5, BTRFS_ROOT_ITEM_KEY, 0);
        sink.event(Event::Section {
            title: section_name(5),
            tree: 5,
            key: Some(k),
        })
        .unwrap();
        sink.event(Event::Error {
            message: "cannot read: bad",
            bytenr: Some(4096),
            key: Some(Key::new(256, 1, 0)),
        })
        .unwrap();
        sink.event(Event::Totals {
            total_bytes: 10,
            bytes_used: 2,
            fsid: [0xab; 16],
        })
        .unwrap();
        sink.finish().unwrap();
        assert_eq!(
            String::from_utf8(sink.into_inner()).unwrap(),
            "root tree\nfs tree key (FS_TREE ROOT_ITEM 0) \n\
             ERROR: tree block 4096 key (256 INODE_ITEM 0): cannot read: bad\n\
             total bytes 10\nbytes used 2\nuuid abababab-abab-abab-abab-abababababab\n"
        );
    }
}
