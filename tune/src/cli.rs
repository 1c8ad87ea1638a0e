//! The command line: btrfstune's options, and btrkit's own for the
//! subvolume UUIDs, quotas and the label.

use btrkit_core::csum::CsumType;
use btrkit_core::tune::{NewUuid, QuotaChange, Request};
use btrkit_core::util::uuid::parse_uuid;
use std::path::PathBuf;

/// Change a Btrfs image offline (btrfstune's options).
#[derive(clap::Parser, Debug)]
#[command(
    name = "btrkit-tune",
    version,
    after_help = "Examples:\n  btrkit-tune -u clone.img                 new fsid and subvolume UUIDs for a clone\n  btrkit-tune -U 0a1b...-... --keep-subvol-uuids a.img\n  btrkit-tune --csum xxhash disk.img       convert every checksum\n  btrkit-tune --convert-to-block-group-tree dev1.img --device dev2.img\n  btrkit-tune -L data -S 1 seed.img\n\nAn interrupted -u/-U or --csum leaves a superblock flag the kernel refuses to\nmount with; run the same command again to finish it.\n\nExit codes: 0 done or nothing to do, 1 refused or failed, 2 usage error."
)]
pub struct Args {
    /// The image (or the first device of a set).
    #[arg(required = true, value_name = "IMAGE")]
    pub images: Vec<PathBuf>,
    /// Another device of the filesystem (repeatable).
    #[arg(long = "device", value_name = "PATH")]
    pub devices: Vec<PathBuf>,
    /// Rewrite the fsid to a random UUID (every tree block, device item and superblock).
    #[arg(short = 'u', conflicts_with_all = ["fsid_to", "metadata_uuid", "metadata_uuid_to"])]
    pub fsid: bool,
    /// Rewrite the fsid to UUID.
    #[arg(short = 'U', value_name = "UUID", conflicts_with_all = ["metadata_uuid", "metadata_uuid_to"])]
    pub fsid_to: Option<String>,
    /// Change the fsid to a random UUID in the superblocks only, the original kept as metadata UUID.
    #[arg(short = 'm', conflicts_with = "metadata_uuid_to")]
    pub metadata_uuid: bool,
    /// Change the fsid to UUID in the superblocks only (the metadata UUID: back to it).
    #[arg(short = 'M', value_name = "UUID")]
    pub metadata_uuid_to: Option<String>,
    /// Give every subvolume a new UUID (implied by -u/-U/-m/-M unless --keep-subvol-uuids).
    #[arg(long)]
    pub new_subvol_uuids: bool,
    /// With -u/-U/-m/-M: leave the subvolume UUIDs as they are (btrfstune's behaviour).
    #[arg(long, conflicts_with = "new_subvol_uuids")]
    pub keep_subvol_uuids: bool,
    /// Switch every data and metadata checksum to ALGO (crc32c, xxhash, sha256, blake2).
    #[arg(long = "csum", value_name = "ALGO")]
    pub csum: Option<String>,
    /// Move the block group items into the block group tree.
    #[arg(long, conflicts_with = "convert_from_block_group_tree")]
    pub convert_to_block_group_tree: bool,
    /// Move the block group items back into the extent tree.
    #[arg(long)]
    pub convert_from_block_group_tree: bool,
    /// Build the free space tree (space cache v2), dropping the v1 cache.
    #[arg(long)]
    pub convert_to_free_space_tree: bool,
    /// Enable no-holes.
    #[arg(short = 'n')]
    pub no_holes: bool,
    /// Enable extended inode refs.
    #[arg(short = 'r')]
    pub extref: bool,
    /// Enable skinny metadata extent refs (every tree block's EXTENT_ITEM rewritten).
    #[arg(short = 'x')]
    pub skinny: bool,
    /// Set (1) or clear (0) the seeding flag; clearing needs -f.
    #[arg(short = 'S', value_name = "0|1", value_parser = clap::value_parser!(u8).range(0..=1))]
    pub seeding: Option<u8>,
    /// Set the label (as `btrfs filesystem label`).
    #[arg(short = 'L', long = "label", value_name = "LABEL")]
    pub label: Option<String>,
    /// Enable quotas (qgroups, counted by a rescan).
    #[arg(long, conflicts_with_all = ["disable_quota", "enable_simple_quota", "remove_simple_quota"])]
    pub enable_quota: bool,
    /// Disable quotas: the quota tree removed.
    #[arg(long, conflicts_with_all = ["enable_simple_quota", "remove_simple_quota"])]
    pub disable_quota: bool,
    /// Enable simple quotas.
    #[arg(long, conflicts_with = "remove_simple_quota")]
    pub enable_simple_quota: bool,
    /// Remove simple quotas.
    #[arg(long)]
    pub remove_simple_quota: bool,
    /// Allow dangerous operations (clearing the seeding flag).
    #[arg(short = 'f')]
    pub force: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors, no progress bar.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

fn uuid_arg(s: &str) -> anyhow::Result<NewUuid> {
    Ok(NewUuid::Given(
        parse_uuid(s).map_err(|e| anyhow::anyhow!("bad UUID {s:?}: {e}"))?,
    ))
}

impl Args {
    /// The engine's request.
    pub fn request(&self) -> anyhow::Result<Request> {
        let fsid = match (&self.fsid_to, self.fsid) {
            (Some(u), _) => Some(uuid_arg(u)?),
            (None, true) => Some(NewUuid::Random),
            (None, false) => None,
        };
        let metadata_uuid = match (&self.metadata_uuid_to, self.metadata_uuid) {
            (Some(u), _) => Some(uuid_arg(u)?),
            (None, true) => Some(NewUuid::Random),
            (None, false) => None,
        };
        let csum = match &self.csum {
            None => None,
            Some(s) => Some(CsumType::parse(s)?),
        };
        let quota = if self.enable_quota {
            Some(QuotaChange::Enable)
        } else if self.disable_quota {
            Some(QuotaChange::Disable)
        } else if self.enable_simple_quota {
            Some(QuotaChange::EnableSimple)
        } else if self.remove_simple_quota {
            Some(QuotaChange::RemoveSimple)
        } else {
            None
        };
        let block_group_tree = if self.convert_to_block_group_tree {
            Some(true)
        } else if self.convert_from_block_group_tree {
            Some(false)
        } else {
            None
        };
        Ok(Request {
            fsid,
            metadata_uuid,
            subvol_uuids: self.new_subvol_uuids,
            keep_subvol_uuids: self.keep_subvol_uuids,
            csum,
            block_group_tree,
            free_space_tree: self.convert_to_free_space_tree,
            no_holes: self.no_holes,
            extref: self.extref,
            skinny_metadata: self.skinny,
            seeding: self.seeding.map(|s| s == 1),
            label: self.label.clone(),
            quota,
            force: self.force,
        })
    }
}
