use anyhow::bail;
use btrkit_core::csum::CsumType;
use btrkit_core::mkfs::{parse_uuid, Features, MkfsOptions};
use std::path::PathBuf;

#[derive(clap::Parser)]
#[command(
    name = "btrkit-mkfs",
    version,
    about = "Create a Btrfs filesystem on an image file or device",
    after_help = "Examples:\n  btrkit-mkfs -b 1G disk.img\n  btrkit-mkfs -n 65536 --csum xxhash -L data -f disk.img\n  btrkit-mkfs -b 4G --rootdir ./tree disk.img\n  btrkit-mkfs -b 1G -m raid1 -d raid1 a.img b.img\n  btrkit-mkfs -b 1G -m raid1c3 -d raid10 a.img b.img c.img d.img\n\nExit status: 0 created, 1 error (one line on stderr), 2 usage error."
)]
pub struct Args {
    /// Size of each device (K/M/G/T suffixes); creates or extends the image
    /// files.
    #[arg(short = 'b', long = "byte-count")]
    pub size: Option<String>,
    /// Tree block size: a power of two from 4K to 64K (default 16K; the
    /// sector size with --mixed).
    #[arg(short = 'n', long = "nodesize")]
    pub nodesize: Option<String>,
    /// Data block size (only 4K).
    #[arg(short = 's', long = "sectorsize", default_value = "4K")]
    pub sectorsize: String,
    /// Checksum algorithm: crc32c, xxhash, sha256 or blake2.
    #[arg(long = "csum", alias = "checksum", default_value = "crc32c")]
    pub csum: String,
    #[arg(short = 'L', long = "label", default_value = "")]
    pub label: String,
    #[arg(short = 'U', long = "uuid")]
    pub uuid: Option<String>,
    /// The device's own UUID (dev_item.uuid); one device only.
    #[arg(long = "device-uuid")]
    pub device_uuid: Option<String>,
    /// With --rootdir: compress the files, ALGO[:LEVEL] (zlib 1-9, lzo,
    /// zstd 1-15, or no), in 128 KiB extents kept where they save space.
    #[arg(long = "compress", value_name = "ALGO[:LEVEL]")]
    pub compress: Option<String>,
    /// With --compress: decide as the kernel does under `-o
    /// compress-force` (every 512 KiB run tried, no file given up on)
    /// instead of `-o compress` (a heuristic, and a file given up on at its
    /// first piece that does not shrink): a smaller image where files mix
    /// compressible and incompressible bytes, for more time compressing.
    #[arg(long = "compress-force")]
    pub compress_force: bool,
    /// With --rootdir: make SUBDIR (relative to it) a subvolume; TYPE rw
    /// (default), ro, default (also the default subvolume) or default-ro.
    /// Repeatable.
    #[arg(short = 'u', long = "subvol", value_name = "TYPE:SUBDIR")]
    pub subvol: Vec<String>,
    /// With --rootdir: set inode flags on PATH (relative to it) and, for a
    /// directory, everything under it: FLAGS comma separated, nodatacow
    /// (implies nodatasum) and nodatasum. Repeatable.
    #[arg(long = "inode-flags", value_name = "FLAGS:PATH")]
    pub inode_flags: Vec<String>,
    /// With --rootdir, on one device: the smallest filesystem that holds
    /// the tree (small chunks, the device ending at the last), the image
    /// file truncated to it; a missing image file is created.
    #[arg(long = "shrink")]
    pub shrink: bool,
    /// With --rootdir, on image files: share the source files' data blocks
    /// with the images (reflink, FICLONERANGE) instead of copying them;
    /// source and images on one btrfs, or xfs with reflink. Not with
    /// --compress.
    #[arg(long = "reflink")]
    pub reflink: bool,
    /// Do not discard (TRIM) the devices; btrkit-mkfs never discards, so
    /// this is accepted for mkfs.btrfs's command lines.
    #[arg(short = 'K', long = "nodiscard")]
    pub nodiscard: bool,
    /// Features, comma separated; ^name disables (no-holes, skinny-metadata,
    /// extref, free-space-tree, block-group-tree, mixed-bg, raid56);
    /// `-O list-all` lists them.
    #[arg(short = 'O', long = "features")]
    pub features: Vec<String>,
    /// Runtime features (free-space-tree), as mkfs.btrfs -R.
    #[arg(short = 'R', long = "runtime-features")]
    pub runtime_features: Vec<String>,
    /// Metadata (and system) profile: single, dup, raid0, raid1, raid1c3,
    /// raid1c4, raid10. Default: dup on one device, raid1 on several.
    #[arg(short = 'm', long = "metadata")]
    pub metadata: Option<String>,
    /// Data profile (as -m). Default: single.
    #[arg(short = 'd', long = "data")]
    pub data: Option<String>,
    /// Mixed block groups: data and metadata share block groups (small
    /// filesystems); nodes are one sector, -m and -d must agree.
    #[arg(short = 'M', long = "mixed")]
    pub mixed: bool,
    /// Copy this directory's contents into the new filesystem.
    #[arg(short = 'r', long = "rootdir")]
    pub rootdir: Option<PathBuf>,
    /// Overwrite an existing filesystem.
    #[arg(short = 'f', long = "force")]
    pub force: bool,
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// The image files or block devices; several make one filesystem over
    /// all of them (devids in this order).
    #[arg(value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
}

pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    btrkit_core::util::size::parse_size(s).map_err(|e| anyhow::anyhow!("size {e}"))
}

/// `-O list-all` was given.
pub fn lists_features(a: &Args) -> bool {
    a.features
        .iter()
        .flat_map(|l| l.split(','))
        .any(|f| f.trim() == "list-all")
}

impl Args {
    /// The `--inode-flags` arguments, parsed.
    pub fn inode_flags(&self) -> anyhow::Result<Vec<(PathBuf, u64)>> {
        if !self.inode_flags.is_empty() && self.rootdir.is_none() {
            bail!("--inode-flags needs --rootdir (it names a path copied in)");
        }
        self.inode_flags
            .iter()
            .map(|s| Ok(btrkit_core::mkfs::rootdir::parse_inode_flags(s)?))
            .collect()
    }

    /// The `--subvol` arguments, parsed.
    pub fn subvols(&self) -> anyhow::Result<Vec<btrkit_core::mkfs::rootdir::SubvolSpec>> {
        if !self.subvol.is_empty() && self.rootdir.is_none() {
            bail!("--subvol needs --rootdir (it names a directory copied in)");
        }
        self.subvol
            .iter()
            .map(|s| Ok(btrkit_core::mkfs::rootdir::SubvolSpec::parse(s)?))
            .collect()
    }

    pub fn options(&self) -> anyhow::Result<MkfsOptions> {
        let mut o = MkfsOptions::default();
        if let Some(s) = &self.size {
            o.size = Some(parse_size(s)?);
        }
        let ns = match &self.nodesize {
            Some(n) => {
                o.nodesize_given = true;
                parse_size(n)?
            }
            None => u64::from(o.nodesize),
        };
        let ss = parse_size(&self.sectorsize)?;
        if ns > u32::MAX as u64 || ss > u32::MAX as u64 {
            bail!("nodesize {ns} or sectorsize {ss} out of range");
        }
        o.nodesize = ns as u32;
        o.sectorsize = ss as u32;
        o.csum = CsumType::parse(&self.csum)?;
        o.label = self.label.clone();
        if let Some(u) = &self.uuid {
            o.fsid = Some(parse_uuid(u)?);
        }
        if let Some(u) = &self.device_uuid {
            o.device_uuid = Some(parse_uuid(u)?);
        }
        if let Some(c) = &self.compress {
            if self.rootdir.is_none() {
                bail!("--compress needs --rootdir (it compresses the files copied in)");
            }
            o.compress = match c.to_ascii_lowercase().as_str() {
                "no" | "none" => None,
                s => Some(btrkit_core::fs::compress::Method::parse(s).ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown compression '{c}' (zlib[:1-9], lzo, zstd[:1-15] or no)"
                    )
                })?),
            };
        }
        if self.compress_force {
            if self.compress.is_none() {
                bail!(
                    "--compress-force needs --compress ALGO (it changes how files are compressed)"
                );
            }
            o.compress_force = true;
        }
        if self.shrink {
            if self.rootdir.is_none() {
                bail!(
                    "--shrink needs --rootdir (it shrinks the filesystem to the files copied in)"
                );
            }
            if self.images.len() > 1 {
                bail!("--shrink makes a filesystem on one device only");
            }
            o.chunk_cap = Some(btrkit_core::mkfs::SHRINK_CHUNK);
        }
        if self.reflink {
            if self.rootdir.is_none() {
                bail!("--reflink needs --rootdir (it shares the data of the files copied in)");
            }
            if o.compress.is_some() {
                bail!("--reflink cannot be used with --compress (a compressed extent holds other bytes than the file)");
            }
        }
        let mut f = Features::default();
        for l in self.features.iter().chain(self.runtime_features.iter()) {
            f.apply(l)?;
        }
        if self.mixed {
            f.mixed = true;
        }
        o.features = f;
        if let Some(m) = &self.metadata {
            o.metadata_profile = Some(btrkit_core::mkfs::parse_profile(m)?);
        }
        if let Some(d) = &self.data {
            o.data_profile = Some(btrkit_core::mkfs::parse_profile(d)?);
        }
        Ok(o)
    }
}
