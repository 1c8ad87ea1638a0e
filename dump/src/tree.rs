use btrkit_core::format::names::write_key;
use btrkit_core::image::{Image, OpenOptions};
use btrkit_core::tree::{walk_tree, WalkEvent};
use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The image file or block device.
    pub image: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let img = Image::open_path(&a.image, OpenOptions { lenient: true, ..Default::default() })?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut trees = vec![img.root_tree(), img.chunk_tree()];
    for (k, ri) in img.root_items_in(img.root_tree())? {
        trees.push(btrkit_core::image::tree_root_of(k.objectid, &ri));
    }
    for t in trees {
        let _ = walk_tree(&img, t, |ev| {
            if let WalkEvent::Block { node, problems, .. } = ev {
                for p in problems {
                    let _ = writeln!(out, "ERROR: {}", p.message);
                }
                for s in 0..node.nr_safe() {
                    if let (Some(it), true) = (node.item(s), node.is_leaf()) {
                        let mut l = String::new();
                        write_key(&mut l, &it.key.into());
                        let _ = writeln!(out, "\titem {s} key {l} itemoff {} itemsize {}", it.offset.get(), it.size.get());
                    }
                }
            }
            ControlFlow::Continue(())
        });
    }
    Ok(0)
}
