//! `btrkit filesystem label`.

use anyhow::Context;
use btrkit_core::offline::Offline;
use std::path::PathBuf;

/// Arguments of `filesystem label`.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  btrkit filesystem label disk.img            print it\n  btrkit filesystem label disk.img backup     set it (as btrfs: device, then label)\n  btrkit filesystem label backup disk.img     set it (the image last, as btrkit's other commands)\n\nThe argument that is not a file is the new label; --set gives one that is."
)]
pub struct Args {
    /// The new label (for one that names an existing file).
    #[arg(long = "set", value_name = "LABEL")]
    set: Option<String>,
    /// The image and the set's other devices, and the new label first or
    /// last.
    #[arg(required = true, value_name = "[NEWLABEL] IMAGE... [NEWLABEL]")]
    words: Vec<String>,
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    let (files, labels): (Vec<&String>, Vec<&String>) = a
        .words
        .iter()
        .partition(|w| std::path::Path::new(w).exists());
    if labels.len() > 1 || (a.set.is_some() && !labels.is_empty()) {
        anyhow::bail!(
            "more than one argument is not an image: {}",
            labels
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let images: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
    let new = a
        .set
        .clone()
        .or_else(|| labels.first().map(|s| s.to_string()));
    let mut o = Offline::open(&images).context("opening the filesystem")?;
    match new {
        Some(l) => {
            btrkit_core::subvolume::set_label(&mut o.fs().store, &l)?;
            o.fs().commit("label")?;
        }
        None => println!("{}", o.fs().store.sb().label_str()),
    }
    o.close()?;
    Ok(())
}
