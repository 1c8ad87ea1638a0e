//! btrkit-restore: copy files out of a Btrfs image without writing it,
//! with the fsync log applied in memory first, so what fsync made durable
//! is restored too.

use anyhow::{bail, Context};
use btrkit_cli::ReadArgs;
use btrkit_core::fs::Loc;
use btrkit_core::io::{BlockDevice, FileDevice};
use btrkit_core::restore::{self, RestoreOptions, RestoreReport};
use clap::Parser;
use comfy_table::Table;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "btrkit-restore",
    version,
    about = "Copy files out of a Btrfs image without writing to it (the fsync log applied in memory)",
    after_help = "Examples:\n  btrkit-restore crash.img out/              everything, as the kernel shows it after its log replay\n  btrkit-restore crash.img out/ --no-log     the state of the last commit\n  btrkit-restore a.img b.img out/ -m         a filesystem on two devices, with owners, modes and times\n  btrkit-restore crash.img out/ --path-regex '^/home/' --dry-run\n\nNames, links and directories of the image are data, never paths: nothing is made, changed or followed outside DEST. Device nodes need --device-nodes, security/trusted/system xattrs --privileged-xattrs, set-id bits -m.\n\nExit status: 0 everything restored, 1 some files lost, restored with bad data or from a damaged log (listed), 2 nothing restorable, 16 usage.",
    // The shared read arguments, in words of what restore does.
    mut_arg("no_log", |a| a.help("Ignore the fsync log: restore the state of the last commit")),
    mut_arg("backup", |a| a.help(
        "Read from backup root slot N of the superblock (an older commit) instead of the last \
         commit's roots; see --list-roots"
    )),
    mut_arg("tree_root", |a| a.help(
        "Read from the root tree node at this logical address (as `btrfs restore -t`)"
    ))
)]
struct Args {
    /// The image (and the other devices of a filesystem on several
    /// devices, in any order), then the destination directory.
    #[arg(required = true, num_args = 2.., value_name = "IMAGE... DEST")]
    paths: Vec<PathBuf>,
    #[command(flatten)]
    read: ReadArgs,
    /// List the backup roots and the trees of the root tree, then exit.
    #[arg(long)]
    list_roots: bool,
    /// Restore owner, mode and times too (as `btrfs restore -m`).
    #[arg(short = 'm', long)]
    metadata: bool,
    /// Descend into snapshots too.
    #[arg(long)]
    snapshots: bool,
    /// Restore only this subvolume: its path in the filesystem or its id.
    #[arg(long, value_name = "PATH|ID")]
    subvol: Option<String>,
    /// Restore only files whose path (from the start, `/dir/file`) matches.
    #[arg(long, value_name = "REGEX")]
    path_regex: Option<String>,
    /// List what would be restored, with sizes; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Replace files that exist at the destination (else they are kept).
    /// A directory there is never replaced, a symlink there is replaced
    /// itself: nothing is ever written through one.
    #[arg(long)]
    overwrite: bool,
    /// Make block and character device nodes (as root; not made by
    /// default, as btrfs restore never makes them: they are listed).
    #[arg(long = "device-nodes")]
    make_devices: bool,
    /// Set security.*, trusted.* and system.* extended attributes too
    /// (file capabilities, SELinux labels, ACLs); user.* ones always are.
    #[arg(long)]
    privileged_xattrs: bool,
    /// Write data that fails its checksum on every copy, as it stands,
    /// listing the bad ranges (by default such a file is lost).
    #[arg(long)]
    write_bad_data: bool,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// No report unless something is lost.
    #[arg(short, long)]
    quiet: bool,
}

fn main() {
    btrkit_cli::generate::handle::<Args>();
    let a = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let usage = !matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            );
            let _ = e.print();
            std::process::exit(if usage { 16 } else { 0 });
        }
    };
    match run(&a) {
        Ok(r) => std::process::exit(if incomplete(&r) { 1 } else { 0 }),
        Err(e) => {
            eprintln!(
                "btrkit-restore: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            std::process::exit(2);
        }
    }
}

fn run(a: &Args) -> anyhow::Result<RestoreReport> {
    let (dest, images) = match a.paths.split_last() {
        Some((d, i)) if !i.is_empty() => (d.clone(), i.to_vec()),
        _ => bail!("give the image and the destination directory"),
    };
    let devs = FileDevice::open_all_mmap(&a.read.paths(&images))?;
    if a.list_roots {
        list_roots(&devs, a)?;
        return Ok(RestoreReport::default());
    }
    btrkit_core::io::host::raise_fd_limit();
    let (mut fs, log_fallback) =
        restore::open_virtual_fallback(devs, &a.read.read_options(a.read.log_mode()))
            .context("opening the filesystem")?;
    let start = match &a.subvol {
        None => fs.root(),
        Some(s) => match s.parse::<u64>() {
            Ok(id) => Loc {
                subvol: id,
                ino: btrkit_core::format::consts::BTRFS_FIRST_FREE_OBJECTID,
                parent: 0,
            },
            Err(_) => fs
                .resolve(s, true)
                .with_context(|| format!("subvolume {s}"))?,
        },
    };
    let re = match &a.path_regex {
        Some(r) => Some(regex_lite::Regex::new(r).with_context(|| format!("--path-regex {r}"))?),
        None => None,
    };
    let select = |p: &str| re.as_ref().is_none_or(|re| re.is_match(p));
    let pb = progress_bar();
    let r = restore::restore(
        &mut fs,
        start,
        &dest,
        &RestoreOptions {
            metadata: a.metadata,
            overwrite: a.overwrite,
            dry_run: a.dry_run,
            snapshots: a.snapshots,
            devices: a.make_devices,
            privileged_xattrs: a.privileged_xattrs,
            write_bad_data: a.write_bad_data,
            select: re.as_ref().map(|_| &select as &dyn Fn(&str) -> bool),
        },
        &mut |files, bytes| {
            if files.is_multiple_of(256) {
                pb.set_message(format!("{files} files"));
                pb.set_position(bytes);
            }
        },
    )?;
    let mut r = r;
    r.log_fallback = log_fallback;
    pb.finish_and_clear();
    print(&r, a);
    Ok(r)
}

/// Whether anything was left out or restored unverified: exit status 1.
fn incomplete(r: &RestoreReport) -> bool {
    !r.lost.is_empty() || !r.bad_data.is_empty() || r.log_fallback.is_some()
}

/// `--list-roots`: the superblock's backup roots, newest first, and every
/// tree of the root tree (root item key, node address, level).
fn list_roots(devs: &[(String, Arc<dyn BlockDevice>)], a: &Args) -> anyhow::Result<()> {
    let backups = restore::backup_roots(devs[0].1.as_ref(), a.read.mirror)?;
    let img = if devs.len() == 1 {
        btrkit_core::image::Image::open(
            devs[0].1.clone(),
            btrkit_core::image::OpenOptions {
                mirror: a.read.mirror,
                degraded: a.read.degraded,
                ..Default::default()
            },
        )?
    } else {
        btrkit_core::devices::DeviceSet::assemble(devs.to_vec())?.open(
            btrkit_core::image::OpenOptions {
                mirror: a.read.mirror,
                degraded: a.read.degraded,
                ..Default::default()
            },
        )?
    };
    let trees: Vec<(u64, u64, u8)> = img
        .root_items_in(img.root_tree())?
        .into_iter()
        .map(|(k, ri)| (k.objectid, ri.bytenr.get(), ri.level))
        .collect();
    if a.json {
        let v = serde_json::json!({
            "generation": img.sb.generation.get(),
            "tree_root": img.sb.root.get(),
            "backups": backups,
            "trees": trees.iter().map(|(id, b, l)| serde_json::json!({"id": id, "bytenr": b, "level": l})).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.set_header(vec!["root", "generation", "tree root", "fs tree root"]);
    t.add_row(vec![
        "superblock".to_string(),
        img.sb.generation.get().to_string(),
        img.sb.root.get().to_string(),
        String::new(),
    ]);
    for b in &backups {
        t.add_row(vec![
            format!("--backup {}", b.slot),
            b.generation.to_string(),
            b.tree_root.to_string(),
            b.fs_root.to_string(),
        ]);
    }
    println!("{t}");
    let mut t = Table::new();
    t.set_header(vec!["tree", "node", "level"]);
    for (id, b, l) in &trees {
        t.add_row(vec![id.to_string(), b.to_string(), l.to_string()]);
    }
    println!("{t}");
    Ok(())
}

fn progress_bar() -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    if !std::io::stderr().is_terminal() {
        pb.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {bytes} {msg} [{elapsed}]")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb
}

fn print(r: &RestoreReport, a: &Args) {
    // What was read instead of the log is said on stderr in every mode.
    if let Some(note) = &r.log_fallback {
        eprintln!("btrkit-restore: warning: {note}");
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(r).unwrap_or_default());
        return;
    }
    if a.dry_run {
        for (p, size) in &r.listed {
            println!("{size:>14} {p}");
        }
    }
    if !a.quiet || !r.lost.is_empty() {
        let mut t = Table::new();
        t.set_header(vec![
            "files",
            "dirs",
            "symlinks",
            "hard links",
            "special",
            "bytes",
            "kept",
            "lost",
        ]);
        t.add_row(vec![
            r.files,
            r.dirs,
            r.symlinks,
            r.hardlinks,
            r.special,
            r.bytes,
            r.skipped_existing,
            r.lost.len() as u64,
        ]);
        println!("{t}");
    }
    if !r.skipped_devices.is_empty() {
        eprintln!(
            "btrkit-restore: {} device nodes not made (--device-nodes makes them): {}",
            r.skipped_devices.len(),
            r.skipped_devices.join(" ")
        );
    }
    if r.skipped_xattrs > 0 {
        eprintln!(
            "btrkit-restore: {} security/trusted/system extended attributes not set \
             (--privileged-xattrs sets them)",
            r.skipped_xattrs
        );
    }
    if r.setid > 0 {
        eprintln!(
            "btrkit-restore: {} files restored with set-user-id or set-group-id bits",
            r.setid
        );
    }
    for b in &r.bad_data {
        let ranges: Vec<String> = b
            .ranges
            .iter()
            .map(|(o, n)| format!("[{o}, {})", o + n))
            .collect();
        eprintln!(
            "btrkit-restore: warning: {}: written with data that fails its checksum at {}",
            b.path,
            ranges.join(" ")
        );
    }
    if !r.lost.is_empty() {
        let mut t = Table::new();
        t.set_header(vec!["lost", "subvolume", "inode", "why"]);
        for l in &r.lost {
            t.add_row(vec![
                l.path.clone(),
                l.subvol.to_string(),
                l.ino.to_string(),
                l.what.clone(),
            ]);
        }
        println!("{t}");
    }
    for w in &r.warnings {
        eprintln!("btrkit-restore: warning: {w}");
    }
    for b in &r.bad_csum_blocks {
        eprintln!(
            "btrkit-restore: warning: tree block {b} fails its checksum on every copy; \
             what it holds was restored as it stands"
        );
    }
}
