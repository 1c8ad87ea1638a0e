//! btrkit-mkfs: create a Btrfs filesystem image, optionally populated from
//! a directory.

mod args;
mod report;

use anyhow::bail;
use btrkit_core::mkfs::build::{build, Request};
use clap::Parser;

fn main() {
    btrkit_cli::generate::handle::<args::Args>();
    let a = args::Args::parse();
    match run(a) {
        Ok(()) => {}
        Err(e) => {
            eprintln!(
                "btrkit-mkfs: error: {}",
                format!("{e:#}").replace('\n', " ")
            );
            std::process::exit(1);
        }
    }
}

fn run(a: args::Args) -> anyhow::Result<()> {
    if args::lists_features(&a) {
        print!("{}", btrkit_core::mkfs::Features::list_all());
        return Ok(());
    }
    if a.images.is_empty() {
        bail!("no image given (usage: btrkit-mkfs [OPTIONS] IMAGE...)");
    }
    let req = Request {
        options: a.options()?,
        subvols: a.subvols()?,
        inode_flags: a.inode_flags()?,
        images: a.images.clone(),
        rootdir: a.rootdir.clone(),
        reflink: a.reflink,
        shrink: a.shrink,
        force: a.force,
    };
    let built = build(&req, &mut report::Bar::default())?;
    report::print(&built.summary, built.stats.as_ref(), a.json, a.quiet);
    Ok(())
}
