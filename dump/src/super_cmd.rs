//! `btrkit-dump super`: every superblock field. The human output keeps the
//! line layout of `btrfs inspect-internal dump-super -f` (same keys, values
//! and tab alignment) so the two can be diffed; lines that tool does not
//! print (`status`, `nr_global_roots`, non-zero reserved words, empty backup
//! slots) are additions. A damaged copy is shown, never refused.

use btrkit_core::format::chunk::Stripe;
use btrkit_core::format::consts::*;
use btrkit_core::format::names::{
    block_group_flags_str, compat_ro_names, incompat_names, key_string, super_flag_names,
};
use btrkit_core::format::superblock::{RootBackup, Superblock, SysChunkEntry};
use btrkit_core::image::{read_superblock_raw, SuperStatus};
use btrkit_core::io::{BlockDevice, FileDevice};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
#[command(
    after_help = "Exit status: 0 when every copy printed is valid (magic, checksum, bytenr), \
1 when one is damaged or the image cannot be read. Copies beyond the end of the image are \
reported as absent, which is not an error.\n\nExamples:\n  btrkit-dump super disk.img\n  \
btrkit-dump super disk.img --all-mirrors\n  btrkit-dump super disk.img --mirror 1 --json"
)]
pub struct Args {
    /// The image file or block device; with several (the devices of a
    /// filesystem on several devices), each device's superblock in turn.
    #[arg(required = true, num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// Print every copy: at 64 KiB, 64 MiB and 256 GiB, as far as the image reaches.
    #[arg(long, conflicts_with = "mirror")]
    pub all_mirrors: bool,
    /// Print copy N (0, 1 or 2) instead of the primary.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..3))]
    pub mirror: u8,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let mut reports = Vec::with_capacity(a.images.len());
    let mut failures = Vec::new();
    let mut damaged = false;
    for image in &a.images {
        let one = read_device(&a, image)?;
        damaged |= one.damaged;
        failures.extend(one.absent_error.map(|e| (true, e)));
        failures.extend(one.damage_line.map(|l| (false, Some(l))));
        reports.push(one.report);
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if a.json {
        match reports.as_slice() {
            [one] => serde_json::to_writer_pretty(&mut out, one)?,
            all => serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "devices": all }))?,
        }
        writeln!(out)?;
    } else {
        for r in &reports {
            for c in &r.superblocks {
                out.write_all(render_copy(c, &r.image).as_bytes())?;
            }
        }
    }
    out.flush()?;
    // Whatever was printed, a failure also gets one line on stderr naming it,
    // so a script (or a person reading only stderr) sees why the exit is 1.
    let mut absent = false;
    for (is_absent, e) in failures {
        if is_absent {
            absent = true;
            let e = e.as_deref().unwrap_or("superblock copy absent");
            if a.mirror == 0 {
                eprintln!("btrkit-dump: error: not a btrfs image: {e}");
            } else {
                eprintln!("btrkit-dump: error: {e}");
            }
        } else if let Some(l) = e {
            eprintln!("btrkit-dump: error: {l}");
        }
    }
    Ok(if absent || damaged { 1 } else { 0 })
}

/// What `super` found on one device.
struct DeviceReport {
    report: Report,
    damaged: bool,
    damage_line: Option<String>,
    absent_error: Option<Option<String>>,
}

fn read_device(a: &Args, image: &Path) -> anyhow::Result<DeviceReport> {
    // The device error already names the path.
    let dev = FileDevice::open_mmap(image)?;
    let mirrors: Vec<usize> = if a.all_mirrors {
        (0..BTRFS_SUPER_MIRROR_MAX).collect()
    } else {
        vec![a.mirror as usize]
    };
    let copies: Vec<CopyReport> = mirrors.iter().map(|&m| read_copy(&dev, m)).collect();
    let damaged = copies.iter().any(|c| c.present && !c.valid);
    let damage_line = copies.iter().find(|c| c.present && !c.valid).map(|c| {
        let no_magic = c.status.as_ref().is_some_and(|s| !s.magic_ok);
        let what = if c.all_zero {
            "all 4096 bytes are zero".to_string()
        } else {
            c.defects.join(", ")
        };
        format!(
            "{}superblock copy {} at byte {} is invalid: {what}",
            if no_magic && c.mirror == 0 {
                "not a btrfs image: "
            } else {
                ""
            },
            c.mirror,
            c.offset
        )
    });
    // Asking for one copy that the image cannot hold is a usage error.
    let absent_error = if a.all_mirrors {
        None
    } else {
        copies.iter().find(|c| !c.present).map(|c| c.error.clone())
    };

    Ok(DeviceReport {
        report: Report {
            image: image.display().to_string(),
            image_size: dev.size(),
            superblocks: copies,
        },
        damaged,
        damage_line,
        absent_error,
    })
}

#[derive(Serialize)]
struct Report {
    image: String,
    image_size: u64,
    superblocks: Vec<CopyReport>,
}

/// One superblock copy: absent (beyond the image end or unreadable), or its
/// fields with what holds and what does not.
#[derive(Serialize)]
struct CopyReport {
    mirror: usize,
    offset: u64,
    present: bool,
    valid: bool,
    /// What is wrong with a present copy (bad magic, checksum MISMATCH, ...).
    defects: Vec<String>,
    /// Every byte of the copy is zero: nothing was ever written there.
    all_zero: bool,
    status: Option<StatusJson>,
    superblock: Option<SuperJson>,
    /// Why a copy is absent.
    error: Option<String>,
}

#[derive(Serialize)]
struct StatusJson {
    magic_ok: bool,
    /// null when the checksum type is unknown.
    csum_ok: Option<bool>,
    bytenr_ok: bool,
    stored_csum: String,
    computed_csum: Option<String>,
}

fn read_copy(dev: &dyn BlockDevice, mirror: usize) -> CopyReport {
    let offset = btrfs_sb_offset(mirror);
    let absent = |error: String| CopyReport {
        mirror,
        offset,
        present: false,
        valid: false,
        defects: Vec::new(),
        all_zero: false,
        status: None,
        superblock: None,
        error: Some(error),
    };
    if dev.size() < offset + BTRFS_SUPER_INFO_SIZE as u64 {
        return absent(format!(
            "the image ({} bytes) ends before copy {mirror} at byte {offset}",
            dev.size()
        ));
    }
    match read_superblock_raw(dev, mirror) {
        Ok((sb, st)) => CopyReport {
            mirror,
            offset,
            present: true,
            valid: st.is_valid(),
            defects: st.defects(),
            all_zero: st.all_zero,
            status: Some(status_json(&st)),
            superblock: Some(super_json(&sb)),
            error: None,
        },
        Err(e) => absent(e.to_string()),
    }
}

fn status_json(st: &SuperStatus) -> StatusJson {
    StatusJson {
        magic_ok: st.magic_ok,
        csum_ok: st.csum_ok,
        bytenr_ok: st.bytenr_ok,
        stored_csum: hex(&st.stored_csum),
        computed_csum: st.computed_csum.as_deref().map(hex),
    }
}

/// The 0x-prefixed lowercase hex of `b`.
fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * b.len());
    s.push_str("0x");
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub(crate) use btrkit_core::util::uuid::uuid_str;

/// Every field of the superblock, flags also by name, uuids as text.
#[derive(Serialize)]
struct SuperJson {
    csum_type: u16,
    csum_type_name: &'static str,
    csum_size: usize,
    csum: String,
    bytenr: u64,
    flags: u64,
    flag_names: Vec<String>,
    magic: String,
    magic_ok: bool,
    fsid: String,
    /// The raw field; all zero unless METADATA_UUID is set.
    metadata_uuid: String,
    /// The uuid tree blocks carry: metadata_uuid with METADATA_UUID, else fsid.
    tree_fsid: String,
    label: String,
    generation: u64,
    root: u64,
    sys_array_size: u32,
    chunk_root_generation: u64,
    root_level: u8,
    chunk_root: u64,
    chunk_root_level: u8,
    log_root: u64,
    log_root_transid: u64,
    log_root_level: u8,
    total_bytes: u64,
    bytes_used: u64,
    sectorsize: u32,
    nodesize: u32,
    leafsize: u32,
    stripesize: u32,
    root_dir: u64,
    num_devices: u64,
    compat_flags: u64,
    compat_ro_flags: u64,
    compat_ro_names: Vec<String>,
    incompat_flags: u64,
    incompat_names: Vec<String>,
    cache_generation: u64,
    uuid_tree_generation: u64,
    nr_global_roots: u64,
    reserved: Vec<u64>,
    dev_item: DevItemJson,
    /// dev_item.fsid equals the tree fsid, as it must.
    dev_item_fsid_match: bool,
    sys_chunk_array: SysArrayJson,
    backup_roots: Vec<BackupJson>,
    /// Bytes of the trailing padding that are not zero.
    padding_nonzero: usize,
}

#[derive(Serialize)]
struct DevItemJson {
    devid: u64,
    total_bytes: u64,
    bytes_used: u64,
    io_align: u32,
    io_width: u32,
    sector_size: u32,
    #[serde(rename = "type")]
    type_: u64,
    generation: u64,
    start_offset: u64,
    dev_group: u32,
    seek_speed: u8,
    bandwidth: u8,
    uuid: String,
    fsid: String,
}

#[derive(Serialize)]
struct SysArrayJson {
    size: u32,
    items: Vec<SysChunkJson>,
    /// Why decoding stopped early, if it did.
    error: Option<String>,
}

#[derive(Serialize)]
struct SysChunkJson {
    key: btrkit_core::format::key::Key,
    logical: u64,
    length: u64,
    owner: u64,
    stripe_len: u64,
    #[serde(rename = "type")]
    type_: u64,
    type_name: String,
    io_align: u32,
    io_width: u32,
    sector_size: u32,
    num_stripes: u16,
    sub_stripes: u16,
    stripes: Vec<StripeJson>,
}

#[derive(Serialize)]
struct StripeJson {
    devid: u64,
    offset: u64,
    dev_uuid: String,
}

#[derive(Serialize)]
struct TreeRef {
    bytenr: u64,
    generation: u64,
    level: u8,
}

#[derive(Serialize)]
struct BackupJson {
    slot: usize,
    /// tree_root and its generation are both 0: the slot was never used.
    empty: bool,
    tree_root: TreeRef,
    chunk_root: TreeRef,
    /// The block group tree root with EXTENT_TREE_V2.
    extent_root: TreeRef,
    fs_root: TreeRef,
    dev_root: TreeRef,
    csum_root: TreeRef,
    total_bytes: u64,
    bytes_used: u64,
    num_devices: u64,
    unused_64: Vec<u64>,
    unused_8: String,
}

/// Checksum algorithm names as dump-super and `mkfs.btrfs --csum` spell them.
fn csum_type_name(t: u16) -> &'static str {
    match t {
        BTRFS_CSUM_TYPE_CRC32 => "crc32c",
        BTRFS_CSUM_TYPE_XXHASH => "xxhash64",
        BTRFS_CSUM_TYPE_SHA256 => "sha256",
        BTRFS_CSUM_TYPE_BLAKE2 => "blake2",
        _ => "unknown",
    }
}

fn label_text(sb: &Superblock) -> String {
    // As dump-super: up to the first NUL, unprintable bytes as '.'.
    sb.label
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '.'
            }
        })
        .collect()
}

fn magic_text(sb: &Superblock) -> String {
    sb.magic
        .get()
        .to_le_bytes()
        .iter()
        .map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '.'
            }
        })
        .collect()
}

fn csum_size_of(sb: &Superblock) -> usize {
    btrkit_core::csum::CsumType::from_disk(sb.csum_type.get())
        .map(|t| t.size())
        .unwrap_or(BTRFS_CSUM_SIZE)
}

fn dev_fsid_match(sb: &Superblock) -> bool {
    sb.dev_item.fsid == sb.tree_fsid()
}

fn super_json(sb: &Superblock) -> SuperJson {
    let d = &sb.dev_item;
    let (entries, err) = sb.sys_chunk_entries();
    let csum_size = csum_size_of(sb);
    SuperJson {
        csum_type: sb.csum_type.get(),
        csum_type_name: csum_type_name(sb.csum_type.get()),
        csum_size,
        csum: hex(&sb.csum[..csum_size]),
        bytenr: sb.bytenr.get(),
        flags: sb.flags.get(),
        flag_names: super_flag_names(sb.flags.get()),
        magic: magic_text(sb),
        magic_ok: sb.magic.get() == BTRFS_MAGIC,
        fsid: uuid_str(&sb.fsid),
        metadata_uuid: uuid_str(&sb.metadata_uuid),
        tree_fsid: uuid_str(&sb.tree_fsid()),
        label: label_text(sb),
        generation: sb.generation.get(),
        root: sb.root.get(),
        sys_array_size: sb.sys_chunk_array_size.get(),
        chunk_root_generation: sb.chunk_root_generation.get(),
        root_level: sb.root_level,
        chunk_root: sb.chunk_root.get(),
        chunk_root_level: sb.chunk_root_level,
        log_root: sb.log_root.get(),
        log_root_transid: sb.log_root_transid.get(),
        log_root_level: sb.log_root_level,
        total_bytes: sb.total_bytes.get(),
        bytes_used: sb.bytes_used.get(),
        sectorsize: sb.sectorsize.get(),
        nodesize: sb.nodesize.get(),
        leafsize: sb.leafsize.get(),
        stripesize: sb.stripesize.get(),
        root_dir: sb.root_dir_objectid.get(),
        num_devices: sb.num_devices.get(),
        compat_flags: sb.compat_flags.get(),
        compat_ro_flags: sb.compat_ro_flags.get(),
        compat_ro_names: compat_ro_names(sb.compat_ro_flags.get()),
        incompat_flags: sb.incompat_flags.get(),
        incompat_names: incompat_names(sb.incompat_flags.get()),
        cache_generation: sb.cache_generation.get(),
        uuid_tree_generation: sb.uuid_tree_generation.get(),
        nr_global_roots: sb.nr_global_roots.get(),
        reserved: sb.reserved.iter().map(|r| r.get()).collect(),
        dev_item: DevItemJson {
            devid: d.devid.get(),
            total_bytes: d.total_bytes.get(),
            bytes_used: d.bytes_used.get(),
            io_align: d.io_align.get(),
            io_width: d.io_width.get(),
            sector_size: d.sector_size.get(),
            type_: d.type_.get(),
            generation: d.generation.get(),
            start_offset: d.start_offset.get(),
            dev_group: d.dev_group.get(),
            seek_speed: d.seek_speed,
            bandwidth: d.bandwidth,
            uuid: uuid_str(&d.uuid),
            fsid: uuid_str(&d.fsid),
        },
        dev_item_fsid_match: dev_fsid_match(sb),
        sys_chunk_array: SysArrayJson {
            size: sb.sys_chunk_array_size.get(),
            items: entries.iter().map(sys_chunk_json).collect(),
            error: err.map(|e| e.to_string()),
        },
        backup_roots: sb
            .super_roots
            .iter()
            .enumerate()
            .map(|(i, b)| backup_json(i, b))
            .collect(),
        padding_nonzero: sb.padding.iter().filter(|&&b| b != 0).count(),
    }
}

fn sys_chunk_json(e: &SysChunkEntry) -> SysChunkJson {
    let c = &e.chunk;
    SysChunkJson {
        key: e.key,
        logical: e.key.offset,
        length: c.length.get(),
        owner: c.owner.get(),
        stripe_len: c.stripe_len.get(),
        type_: c.type_.get(),
        type_name: block_group_flags_str(c.type_.get()),
        io_align: c.io_align.get(),
        io_width: c.io_width.get(),
        sector_size: c.sector_size.get(),
        num_stripes: c.num_stripes.get(),
        sub_stripes: c.sub_stripes.get(),
        stripes: e.stripes.iter().map(stripe_json).collect(),
    }
}

fn stripe_json(s: &Stripe) -> StripeJson {
    StripeJson {
        devid: s.devid.get(),
        offset: s.offset.get(),
        dev_uuid: uuid_str(&s.dev_uuid),
    }
}

fn backup_json(slot: usize, b: &RootBackup) -> BackupJson {
    let r = |bytenr: u64, generation: u64, level: u8| TreeRef {
        bytenr,
        generation,
        level,
    };
    BackupJson {
        slot,
        empty: backup_empty(b),
        tree_root: r(b.tree_root.get(), b.tree_root_gen.get(), b.tree_root_level),
        chunk_root: r(
            b.chunk_root.get(),
            b.chunk_root_gen.get(),
            b.chunk_root_level,
        ),
        extent_root: r(
            b.extent_root.get(),
            b.extent_root_gen.get(),
            b.extent_root_level,
        ),
        fs_root: r(b.fs_root.get(), b.fs_root_gen.get(), b.fs_root_level),
        dev_root: r(b.dev_root.get(), b.dev_root_gen.get(), b.dev_root_level),
        csum_root: r(b.csum_root.get(), b.csum_root_gen.get(), b.csum_root_level),
        total_bytes: b.total_bytes.get(),
        bytes_used: b.bytes_used.get(),
        num_devices: b.num_devices.get(),
        unused_64: b.unused_64.iter().map(|x| x.get()).collect(),
        unused_8: hex(&b.unused_8),
    }
}

fn backup_empty(b: &RootBackup) -> bool {
    b.tree_root.get() == 0 && b.tree_root_gen.get() == 0
}

/// `key`, then tabs up to column 24 (at least one), then `value`: the
/// alignment dump-super uses.
fn kv(out: &mut String, key: &str, value: impl std::fmt::Display) {
    out.push_str(key);
    let mut col = key.len();
    loop {
        out.push('\t');
        col = (col / 8 + 1) * 8;
        if col >= 24 {
            break;
        }
    }
    let _ = writeln!(out, "{value}");
}

/// Flag names under a flags line, as dump-super lays them out.
fn flag_lines(out: &mut String, names: &[String]) {
    if names.is_empty() {
        return;
    }
    out.push_str("\t\t\t( ");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            out.push_str("|\n\t\t\t  ");
        }
        out.push_str(n);
        out.push(' ');
    }
    out.push_str(")\n");
}

fn render_copy(c: &CopyReport, device: &str) -> String {
    let mut o = String::new();
    let (Some(sj), Some(st)) = (&c.superblock, &c.status) else {
        let _ = writeln!(o, "superblock: bytenr={}, device={device}", c.offset);
        let _ = writeln!(
            o,
            "---------------------------------------------------------"
        );
        kv(
            &mut o,
            "status",
            format!("absent: {}", c.error.as_deref().unwrap_or("not readable")),
        );
        o.push('\n');
        return o;
    };
    let _ = writeln!(o, "superblock: bytenr={}, device={device}", c.offset);
    let _ = writeln!(
        o,
        "---------------------------------------------------------"
    );
    if c.all_zero {
        // Every field would print as 0; say it once instead.
        kv(
            &mut o,
            "status",
            format!(
                "INVALID (mirror {}): no superblock, all 4096 bytes are zero",
                c.mirror
            ),
        );
        o.push('\n');
        return o;
    }
    if c.valid {
        kv(&mut o, "status", format!("valid (mirror {})", c.mirror));
    } else {
        kv(
            &mut o,
            "status",
            format!("INVALID (mirror {}): {}", c.mirror, c.defects.join(", ")),
        );
    }
    let known = st.csum_ok.is_some();
    kv(
        &mut o,
        "csum_type",
        format!(
            "{} ({})",
            sj.csum_type,
            if known { sj.csum_type_name } else { "INVALID" }
        ),
    );
    kv(&mut o, "csum_size", sj.csum_size);
    let mark = match (st.csum_ok, &st.computed_csum) {
        (Some(true), _) => "[match]".to_string(),
        (Some(false), Some(c)) => format!("[checksum MISMATCH, computed {c}]"),
        _ => "[UNKNOWN CSUM TYPE OR SIZE]".to_string(),
    };
    kv(&mut o, "csum", format!("{} {mark}", sj.csum));
    kv(
        &mut o,
        "bytenr",
        if st.bytenr_ok {
            sj.bytenr.to_string()
        } else {
            format!("{} [DOES NOT MATCH offset {}]", sj.bytenr, c.offset)
        },
    );
    kv(&mut o, "flags", format!("0x{:x}", sj.flags));
    flag_lines(&mut o, &sj.flag_names);
    kv(
        &mut o,
        "magic",
        format!(
            "{} {}",
            sj.magic,
            if sj.magic_ok {
                "[match]"
            } else {
                "[DON'T MATCH]"
            }
        ),
    );
    kv(&mut o, "fsid", &sj.fsid);
    // dump-super prints the uuid tree blocks carry under this name.
    kv(&mut o, "metadata_uuid", &sj.tree_fsid);
    kv(&mut o, "label", &sj.label);
    kv(&mut o, "generation", sj.generation);
    kv(&mut o, "root", sj.root);
    kv(&mut o, "sys_array_size", sj.sys_array_size);
    kv(&mut o, "chunk_root_generation", sj.chunk_root_generation);
    kv(&mut o, "root_level", sj.root_level);
    kv(&mut o, "chunk_root", sj.chunk_root);
    kv(&mut o, "chunk_root_level", sj.chunk_root_level);
    kv(&mut o, "log_root", sj.log_root);
    kv(&mut o, "log_root_transid (deprecated)", sj.log_root_transid);
    kv(&mut o, "log_root_level", sj.log_root_level);
    kv(&mut o, "total_bytes", sj.total_bytes);
    kv(&mut o, "bytes_used", sj.bytes_used);
    kv(&mut o, "sectorsize", sj.sectorsize);
    kv(&mut o, "nodesize", sj.nodesize);
    kv(&mut o, "leafsize (deprecated)", sj.leafsize);
    kv(&mut o, "stripesize", sj.stripesize);
    kv(&mut o, "root_dir", sj.root_dir);
    kv(&mut o, "num_devices", sj.num_devices);
    kv(&mut o, "compat_flags", format!("0x{:x}", sj.compat_flags));
    kv(
        &mut o,
        "compat_ro_flags",
        format!("0x{:x}", sj.compat_ro_flags),
    );
    flag_lines(&mut o, &sj.compat_ro_names);
    kv(
        &mut o,
        "incompat_flags",
        format!("0x{:x}", sj.incompat_flags),
    );
    flag_lines(&mut o, &sj.incompat_names);
    kv(&mut o, "cache_generation", sj.cache_generation);
    kv(&mut o, "uuid_tree_generation", sj.uuid_tree_generation);
    let d = &sj.dev_item;
    kv(&mut o, "dev_item.uuid", &d.uuid);
    kv(
        &mut o,
        "dev_item.fsid",
        format!(
            "{} {}",
            d.fsid,
            if sj.dev_item_fsid_match {
                "[match]"
            } else {
                "[DON'T MATCH]"
            }
        ),
    );
    kv(&mut o, "dev_item.type", d.type_);
    kv(&mut o, "dev_item.total_bytes", d.total_bytes);
    kv(&mut o, "dev_item.bytes_used", d.bytes_used);
    kv(&mut o, "dev_item.io_align", d.io_align);
    kv(&mut o, "dev_item.io_width", d.io_width);
    kv(&mut o, "dev_item.sector_size", d.sector_size);
    kv(&mut o, "dev_item.devid", d.devid);
    kv(&mut o, "dev_item.dev_group", d.dev_group);
    kv(&mut o, "dev_item.seek_speed", d.seek_speed);
    kv(&mut o, "dev_item.bandwidth", d.bandwidth);
    kv(&mut o, "dev_item.generation", d.generation);
    if d.start_offset != 0 {
        kv(&mut o, "dev_item.start_offset", d.start_offset);
    }
    kv(&mut o, "nr_global_roots", sj.nr_global_roots);
    if sj.reserved.iter().any(|&r| r != 0) {
        let words: Vec<String> = sj.reserved.iter().map(|r| format!("0x{r:x}")).collect();
        kv(&mut o, "reserved (not zero)", words.join(" "));
    }
    if sj.padding_nonzero != 0 {
        kv(
            &mut o,
            "padding (not zero)",
            format!("{} bytes", sj.padding_nonzero),
        );
    }
    let _ = writeln!(o, "sys_chunk_array[{BTRFS_SYSTEM_CHUNK_ARRAY_SIZE}]:");
    for (i, e) in sj.sys_chunk_array.items.iter().enumerate() {
        let _ = writeln!(o, "\titem {i} key {}", key_string(&e.key));
        let _ = writeln!(
            o,
            "\t\tlength {} owner {} stripe_len {} type {}",
            e.length, e.owner, e.stripe_len, e.type_name
        );
        let _ = writeln!(
            o,
            "\t\tio_align {} io_width {} sector_size {}",
            e.io_align, e.io_width, e.sector_size
        );
        let _ = writeln!(
            o,
            "\t\tnum_stripes {} sub_stripes {}",
            e.num_stripes, e.sub_stripes
        );
        for (j, s) in e.stripes.iter().enumerate() {
            let _ = writeln!(o, "\t\t\tstripe {j} devid {} offset {}", s.devid, s.offset);
            let _ = writeln!(o, "\t\t\tdev_uuid {}", s.dev_uuid);
        }
    }
    if let Some(e) = &sj.sys_chunk_array.error {
        let _ = writeln!(o, "\tERROR: {e}");
    }
    let _ = writeln!(o, "backup_roots[{BTRFS_NUM_BACKUP_ROOTS}]:");
    let v2 = sj.incompat_flags & BTRFS_FEATURE_INCOMPAT_EXTENT_TREE_V2 != 0;
    for b in &sj.backup_roots {
        if b.empty {
            let _ = writeln!(o, "\tbackup {}: (empty)\n", b.slot);
            continue;
        }
        let _ = writeln!(o, "\tbackup {}:", b.slot);
        let t = |o: &mut String, name: &str, sep: &str, r: &TreeRef| {
            let _ = writeln!(
                o,
                "\t\t{name}:{sep}{}\tgen: {}\tlevel: {}",
                r.bytenr, r.generation, r.level
            );
        };
        t(&mut o, "backup_tree_root", "\t", &b.tree_root);
        t(&mut o, "backup_chunk_root", "\t", &b.chunk_root);
        t(
            &mut o,
            if v2 {
                "backup_block_group_root"
            } else {
                "backup_extent_root"
            },
            "\t",
            &b.extent_root,
        );
        t(&mut o, "backup_fs_root", "\t\t", &b.fs_root);
        t(&mut o, "backup_dev_root", "\t", &b.dev_root);
        t(&mut o, "csum_root", "\t", &b.csum_root);
        let _ = writeln!(o, "\t\tbackup_total_bytes:\t{}", b.total_bytes);
        let _ = writeln!(o, "\t\tbackup_bytes_used:\t{}", b.bytes_used);
        let _ = writeln!(o, "\t\tbackup_num_devices:\t{}", b.num_devices);
        o.push('\n');
    }
    o.push('\n');
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn alignment_as_dump_super() {
        let mut s = String::new();
        kv(&mut s, "csum_type", 0);
        kv(&mut s, "chunk_root_generation", 6);
        kv(&mut s, "log_root_transid (deprecated)", 0);
        kv(&mut s, "bytenr", 65536);
        kv(&mut s, "dev_item.total_bytes", 1);
        assert_eq!(
            s,
            "csum_type\t\t0\nchunk_root_generation\t6\nlog_root_transid (deprecated)\t0\nbytenr\t\t\t65536\ndev_item.total_bytes\t1\n"
        );
        assert_eq!(
            uuid_str(&[0xab; 16]),
            "abababab-abab-abab-abab-abababababab"
        );
    }
}
