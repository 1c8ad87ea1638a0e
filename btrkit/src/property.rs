//! `btrkit property`: btrfs(8)'s `property` group on images: `ro` of a
//! subvolume, `compression` of a file or directory, `label` of the
//! filesystem. Objects are paths inside the filesystem.

use anyhow::Context;
use btrkit_core::offline::Offline;
use btrkit_core::subvolume::{self, PROPERTIES};
use clap::Subcommand;
use std::path::PathBuf;

/// The `property` group's arguments.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print a property (or every property the object has).
    Get {
        /// The object's type, when the path alone does not say it
        /// (subvol, inode, filesystem).
        #[arg(short = 't')]
        ty: Option<String>,
        /// The object (a path inside the filesystem), then the property
        /// (optional), then the image and the set's other devices.
        #[arg(required = true, num_args = 2.., value_name = "OBJECT [NAME] IMAGE")]
        words: Vec<String>,
    },
    /// Set a property.
    Set {
        /// The object's type (subvol, inode, filesystem).
        #[arg(short = 't')]
        ty: Option<String>,
        /// Make a received subvolume writable (its received uuid goes).
        #[arg(short = 'f')]
        force: bool,
        /// The object (a path inside the filesystem).
        object: String,
        /// The property: ro, compression or label.
        name: String,
        /// Its value.
        value: String,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// The properties an object can have.
    List {
        /// The object (a path inside the filesystem).
        object: String,
        /// The image, and the set's other devices.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
}

/// Run the command.
pub fn run(a: &Args) -> anyhow::Result<()> {
    match &a.cmd {
        Cmd::Get { ty, words } => {
            let object = &words[0];
            let (name, images): (Option<&str>, Vec<PathBuf>) = match words
                .get(1)
                .filter(|w| PROPERTIES.iter().any(|(n, _)| n == w))
            {
                Some(n) => (
                    Some(n.as_str()),
                    words[2..].iter().map(PathBuf::from).collect(),
                ),
                None => (None, words[1..].iter().map(PathBuf::from).collect()),
            };
            if images.is_empty() {
                anyhow::bail!("no image given");
            }
            let mut o = Offline::open(&images).context("opening the filesystem")?;
            let names: Vec<&str> = match name {
                Some(n) => vec![n],
                None => applicable(&mut o, object, ty.as_deref()),
            };
            for n in names {
                if let Some(v) = subvolume::get(o.fs(), object, n)? {
                    println!("{n}={v}");
                }
            }
            o.close()?;
        }
        Cmd::Set {
            ty: _,
            force,
            object,
            name,
            value,
            images,
        } => {
            let mut o = Offline::open(images).context("opening the filesystem")?;
            subvolume::set(o.fs(), object, name, value, *force)?;
            o.close()?;
        }
        Cmd::List { object, images } => {
            let mut o = Offline::open(images).context("opening the filesystem")?;
            for n in applicable(&mut o, object, None) {
                let what = match n {
                    "ro" => "read-only status of a subvolume",
                    "label" => "label of the filesystem",
                    _ => "compression algorithm for the file or directory",
                };
                println!("{n:<16}{what}");
            }
            o.close()?;
        }
    }
    Ok(())
}

/// The properties of the object at `path`: compression for any file,
/// ro for a subvolume, label for the top level (the filesystem).
fn applicable(o: &mut Offline, path: &str, ty: Option<&str>) -> Vec<&'static str> {
    let is_subvol = o
        .fs()
        .resolve(path, true)
        .is_ok_and(|l| l.ino == btrkit_core::fs::ROOT_DIR);
    PROPERTIES
        .iter()
        .filter(|(_, kind)| match ty {
            Some(t) => *kind == t,
            None => {
                *kind == "inode"
                    || (is_subvol && *kind == "subvol")
                    || (path == "/" && *kind == "filesystem")
            }
        })
        .map(|(n, _)| *n)
        .collect()
}
