//! `btrkit receive`: btrfs(8)'s `receive` into an image: the streams of
//! stdin or `-f FILE` applied under DIR (a directory inside the
//! filesystem, from its top level) through btrkit's engine, no kernel, no
//! root. `--dump` prints a stream as `btrfs receive --dump` does.

use anyhow::{bail, Context};
use btrkit_cli::progress::Bar;
use btrkit_core::check::Progress;
use btrkit_core::offline::Offline;
use btrkit_core::send::dump::Dumper;
use btrkit_core::send::receiver::{ReceiveOptions, Receiver};
use btrkit_core::send::stream::{Next, StreamReader};
use std::io::{Read, Write};
use std::path::PathBuf;

/// `btrkit receive`'s arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Read the stream from FILE instead of stdin.
    #[arg(short = 'f', value_name = "FILE")]
    file: Option<PathBuf>,
    /// Stop at the first END command: the rest of the input is not read.
    #[arg(short = 'e')]
    end: bool,
    /// Stop after this many failed commands (0: never).
    #[arg(short = 'E', long, default_value_t = 1)]
    max_errors: u64,
    /// Print the stream's commands (as `btrfs receive --dump`); nothing is
    /// written and no image is needed.
    #[arg(long)]
    dump: bool,
    /// The report as JSON.
    #[arg(long)]
    json: bool,
    /// Print nothing but errors.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// The image, the set's other devices, then the directory inside the
    /// filesystem to receive into.
    #[arg(value_name = "IMAGE... DIR")]
    args: Vec<String>,
}

fn input(a: &Args) -> anyhow::Result<Box<dyn Read>> {
    Ok(match &a.file {
        Some(f) => Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?,
        )),
        None => Box::new(std::io::BufReader::with_capacity(
            1 << 20,
            std::io::stdin().lock(),
        )),
    })
}

fn dump(a: &Args) -> anyhow::Result<()> {
    let mut inp = input(a)?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut d = Dumper::default();
    let mut streams = 0;
    while let Some(mut r) = StreamReader::open(&mut inp).context("reading the stream")? {
        streams += 1;
        loop {
            match r.next_command().context("failed to dump the send stream")? {
                Next::Command(c) => {
                    let end = c == btrkit_core::send::stream::Command::End;
                    if let Some(l) = d.line_of(&c) {
                        writeln!(out, "{l}")?;
                    }
                    if end {
                        break;
                    }
                }
                Next::Eof => bail!("failed to dump the send stream: it ends without END"),
            }
        }
    }
    if streams == 0 {
        bail!("empty stream is not considered valid");
    }
    out.flush()?;
    Ok(())
}

/// Run it.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if a.dump {
        return dump(a);
    }
    if a.args.len() < 2 {
        bail!("receive needs the image (and the set's other devices) and a directory inside it");
    }
    let (dir, images) = a.args.split_last().context("no directory named")?;
    let images: Vec<PathBuf> = images.iter().map(PathBuf::from).collect();
    let mut inp = input(a)?;
    let mut o = Offline::open(&images).context("opening the image")?;
    let bar = Bar::new(!a.quiet);
    bar.phase(1, "receiving (bytes of the stream)", 0);
    let mut last = 0u64;
    let r = Receiver::new(o.fs(), dir).and_then(|rc| {
        rc.receive(
            &mut inp,
            ReceiveOptions {
                max_errors: a.max_errors,
                honor_end: a.end,
            },
            &mut |n| {
                bar.advance(n.saturating_sub(last));
                last = n;
            },
        )
    });
    bar.finish();
    // What was received stays, consistent, whatever failed: the kernel
    // leaves a half-received subvolume as well.
    let closed = o.close();
    let r = r.context("receiving")?;
    closed.context("committing")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if !a.quiet {
        for s in &r.subvolumes {
            eprintln!(
                "At {} {}",
                if s.incremental { "snapshot" } else { "subvol" },
                s.path
            );
        }
    }
    Ok(())
}
