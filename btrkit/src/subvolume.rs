//! `btrkit subvolume`: btrfs(8)'s `subvolume` group on images. Paths are
//! inside the filesystem, from its top level (`/home`, `/snap/2024`).

use anyhow::Context;
use btrkit_core::devices::{Access, Devices, Single};
use btrkit_core::format::consts::*;
use btrkit_core::offline::Offline;
use clap::Subcommand;
use std::path::PathBuf;

/// The `subvolume` group's arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a subvolume at PATH.
    Create {
        /// Where, inside the filesystem.
        path: String,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// Snapshot the subvolume SRC at DEST (inside DEST when it is a
    /// directory).
    Snapshot {
        /// A read-only snapshot.
        #[arg(short = 'r')]
        readonly: bool,
        /// The subvolume.
        src: String,
        /// The snapshot's path, or the directory it goes in.
        dest: String,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// Delete the subvolume at PATH (its tree is dropped before the
    /// command ends).
    #[command(visible_alias = "del")]
    Delete {
        /// The subvolume.
        path: String,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// List the subvolumes (as `btrfs subvolume list`).
    List {
        /// Print each one's parent subvolume too.
        #[arg(short = 'p')]
        parent: bool,
        /// Print uuids (-u), parent uuids (-q), received uuids (-R).
        #[arg(short = 'u')]
        uuid: bool,
        #[arg(short = 'q')]
        parent_uuid: bool,
        #[arg(short = 'R')]
        received_uuid: bool,
        /// Only read-only ones.
        #[arg(short = 'r')]
        readonly: bool,
        /// The list as JSON.
        #[arg(long)]
        json: bool,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// The subvolume mounted when none is named.
    GetDefault {
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// Make a subvolume (an id, or a path) the default.
    SetDefault {
        /// Its id (5: the top level) or its path.
        subvol: String,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
}

/// Run the command.
pub fn run(a: &Args) -> anyhow::Result<()> {
    match &a.cmd {
        Cmd::Create { path, images } => {
            let mut o = Offline::open(images).context("opening the filesystem")?;
            let (dir, name) = o.fs().resolve_parent(path)?;
            o.fs().subvols().subvol_create(dir, &name)?;
            o.close()?;
            println!("Create subvolume '{path}'");
        }
        Cmd::Snapshot {
            readonly,
            src,
            dest,
            images,
        } => {
            let mut o = Offline::open(images).context("opening the filesystem")?;
            let s = o.fs().resolve(src, true)?;
            let (dir, name) = match o.fs().resolve(dest, true) {
                Ok(d) if o.fs().stat(d)?.is_dir() => {
                    let base = src.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                    if base.is_empty() {
                        anyhow::bail!("give the snapshot of the top level a name: {dest}/NAME");
                    }
                    (d, base.as_bytes().to_vec())
                }
                Ok(_) => anyhow::bail!("{dest} exists"),
                Err(_) => o.fs().resolve_parent(dest)?,
            };
            let l = o.fs().subvols().snapshot(s, dir, &name)?;
            if *readonly {
                o.fs().store.update_root_item(l.subvol, |r| {
                    r.flags.set(r.flags.get() | BTRFS_ROOT_SUBVOL_RDONLY)
                })?;
            }
            o.close()?;
            println!(
                "Create {}snapshot of '{src}' in '{dest}'",
                if *readonly { "a readonly " } else { "a " }
            );
        }
        Cmd::Delete { path, images } => {
            let mut o = Offline::open(images).context("opening the filesystem")?;
            let (dir, name) = o.fs().resolve_parent(path)?;
            o.fs().subvols().subvol_delete(dir, &name)?;
            o.fs().subvols().drop_deleted_now()?;
            o.close()?;
            println!("Delete subvolume '{path}'");
        }
        Cmd::List {
            parent,
            uuid,
            parent_uuid,
            received_uuid,
            readonly,
            json,
            images,
        } => {
            let mut st = open_store(images)?;
            let mut v = btrkit_core::subvolume::list(&mut st)?;
            if *readonly {
                v.retain(|s| s.readonly);
            }
            if *json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            for s in v {
                let mut line = format!("ID {} gen {}", s.id, s.gen);
                if *parent {
                    line += &format!(" parent {}", s.parent);
                }
                line += &format!(" top level {}", s.parent);
                if *parent_uuid {
                    line += &format!(" parent_uuid {:<36}", s.parent_uuid);
                }
                if *received_uuid {
                    line += &format!(" received_uuid {:<36}", s.received_uuid);
                }
                if *uuid {
                    line += &format!(" uuid {:<36}", s.uuid);
                }
                line += &format!(" path {}", s.path);
                println!("{line}");
            }
        }
        Cmd::GetDefault { images } => {
            let mut st = open_store(images)?;
            let id = btrkit_core::subvolume::default_id(&mut st)?;
            if id == BTRFS_FS_TREE_OBJECTID {
                println!("ID 5 (FS_TREE)");
            } else {
                let v = btrkit_core::subvolume::list(&mut st)?;
                match v.iter().find(|s| s.id == id) {
                    Some(s) => println!(
                        "ID {} gen {} top level {} path {}",
                        s.id, s.gen, s.parent, s.path
                    ),
                    None => println!("ID {id}"),
                }
            }
        }
        Cmd::SetDefault { subvol, images } => {
            let mut o = Offline::open(images).context("opening the filesystem")?;
            let l = match subvol.parse::<u64>() {
                Ok(id) => btrkit_core::fs::Loc::new(id, btrkit_core::fs::ROOT_DIR),
                Err(_) => o.fs().resolve(subvol, true)?,
            };
            o.fs().subvols().set_default_subvol(l)?;
            o.close()?;
        }
    }
    Ok(())
}

/// The filesystem opened read-only for listing.
pub fn open_store(images: &[PathBuf]) -> anyhow::Result<btrkit_core::trans::Store> {
    let d = Devices::open_paths(images, Access::default())?;
    let o = d
        .open(Default::default(), Single::AsSet)
        .context("opening the filesystem")?;
    Ok(btrkit_core::trans::Store::from_image(o.img)?)
}
