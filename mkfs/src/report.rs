use btrkit_core::mkfs::build::Progress;
use btrkit_core::mkfs::rootdir::RootdirStats;
use btrkit_core::mkfs::MkfsSummary;
use comfy_table::{presets::NOTHING, Table};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// The `--rootdir` copy's progress bar (on a terminal only).
#[derive(Default)]
pub struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn start(&mut self, total_bytes: u64) {
        let pb = ProgressBar::new(total_bytes);
        if !std::io::stderr().is_terminal() {
            pb.set_draw_target(ProgressDrawTarget::hidden());
        }
        pb.set_style(
            ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        self.0 = Some(pb);
    }

    fn copied(&mut self, files: u64, bytes: u64) {
        if let Some(pb) = &self.0 {
            if files.is_multiple_of(256) {
                pb.set_position(bytes);
                pb.set_message(format!("{files} files"));
            }
        }
    }

    fn finish(&mut self) {
        if let Some(pb) = self.0.take() {
            pb.finish_and_clear();
        }
    }
}

pub fn human(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}B")
    } else {
        format!("{v:.2}{}", units[i])
    }
}

pub fn print(s: &MkfsSummary, stats: Option<&RootdirStats>, json: bool, quiet: bool) {
    if json {
        let v = serde_json::json!({ "summary": s, "rootdir": stats });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    if quiet {
        return;
    }
    let mut t = Table::new();
    t.load_preset(NOTHING);
    t.add_row(vec![
        "Label:",
        if s.label.is_empty() {
            "(null)"
        } else {
            &s.label
        },
    ]);
    t.add_row(vec!["UUID:", &s.uuid]);
    t.add_row(vec!["Node size:", &s.node_size.to_string()]);
    t.add_row(vec!["Sector size:", &s.sector_size.to_string()]);
    t.add_row(vec![
        "Filesystem size:".to_string(),
        human(s.filesystem_size),
    ]);
    t.add_row(vec!["Checksum:", &s.checksum]);
    t.add_row(vec![
        "Block group profiles:".to_string(),
        format!("data {}, metadata {}", s.profiles.0, s.profiles.1),
    ]);
    t.add_row(vec![
        "Number of devices:".to_string(),
        s.devices.len().to_string(),
    ]);
    t.add_row(vec!["Features:".to_string(), s.features.join(", ")]);
    if let Some(r) = stats {
        t.add_row(vec![
            "Copied:".to_string(),
            format!(
                "{} files, {} dirs, {} symlinks, {} hard links, {} special, {}",
                r.files,
                r.dirs,
                r.symlinks,
                r.hardlinks,
                r.special,
                human(r.bytes)
            ),
        ]);
    }
    println!("{t}");
    let mut c = Table::new();
    c.set_header(vec!["Chunk type", "Start", "Size"]);
    for (ty, start, len) in &s.chunks {
        c.add_row(vec![ty.clone(), start.to_string(), human(*len)]);
    }
    println!("{c}");
    if s.devices.len() > 1 {
        let mut d = Table::new();
        d.set_header(vec!["Devid", "Size", "Path"]);
        for (id, size, path) in &s.devices {
            d.add_row(vec![id.to_string(), human(*size), path.clone()]);
        }
        println!("{d}");
    }
}
