use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The image file or block device.
    pub image: PathBuf,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: Args) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
