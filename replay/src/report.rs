use btrkit_core::format::names::key_string;
use btrkit_core::io::CopyMethod;
use btrkit_core::log::replay::{Event, ReplaySummary};
use btrkit_core::log::salvage::{Outcome, SalvageReport};
use comfy_table::Table;

pub fn no_log(image: &std::path::Path, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({ "image": image, "log": null, "replayed": false })
        );
    } else {
        println!("{}: no log to replay", image.display());
    }
}

pub fn print(s: &ReplaySummary, dry_run: bool, json: bool, copy: Option<CopyMethod>) {
    if json {
        let v = serde_json::json!({ "dry_run": dry_run, "copy": copy, "summary": s });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    match copy {
        Some(CopyMethod::Reflink) => {
            println!("output: reflink copy of the image (blocks shared until written)")
        }
        Some(CopyMethod::Sparse) => println!("output: sparse copy of the image"),
        None => {}
    }
    if dry_run {
        let mut t = Table::new();
        t.set_header(vec!["change", "subvol", "inode", "detail"]);
        for e in &s.events {
            let row: Vec<String> = match e {
                Event::InodeCreated {
                    subvol,
                    ino,
                    mode,
                    size,
                } => vec![
                    "inode created".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    format!("mode {mode:o} size {size}"),
                ],
                Event::InodeUpdated {
                    subvol,
                    ino,
                    mode,
                    size,
                } => vec![
                    "inode updated".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    format!("mode {mode:o} size {size}"),
                ],
                Event::NameAdded {
                    subvol,
                    dir,
                    name,
                    ino,
                } => vec![
                    "name added".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    format!("dir {dir}: {name}"),
                ],
                Event::NameRemoved {
                    subvol,
                    dir,
                    name,
                    ino,
                } => vec![
                    "name removed".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    format!("dir {dir}: {name}"),
                ],
                Event::DataReplaced {
                    subvol,
                    ino,
                    offset,
                    len,
                    kind,
                } => vec![
                    "data replaced".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    format!("[{offset}, {}) {kind}", offset + len),
                ],
                Event::Truncated { subvol, ino, size } => vec![
                    "truncated".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    format!("to {size}"),
                ],
                Event::XattrSet { subvol, ino, name } => vec![
                    "xattr set".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    name.clone(),
                ],
                Event::XattrRemoved { subvol, ino, name } => vec![
                    "xattr removed".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    name.clone(),
                ],
                Event::InodeRemoved { subvol, ino } => vec![
                    "inode removed".into(),
                    subvol.to_string(),
                    ino.to_string(),
                    String::new(),
                ],
            };
            t.add_row(row);
        }
        println!("{t}");
        println!("dry run: nothing was written");
    }
    if let Some(r) = &s.salvage {
        print_salvage(r);
    }
    let mut t = Table::new();
    t.set_header(vec![
        "log trees",
        "log blocks",
        "log items",
        "inodes created",
        "inodes updated",
        "inodes removed",
        "names added",
        "names removed",
        "data replaced",
    ]);
    t.add_row(vec![
        s.log_trees.to_string(),
        s.log_blocks.to_string(),
        s.log_items.to_string(),
        s.inodes_created.to_string(),
        s.inodes_updated.to_string(),
        s.inodes_removed.to_string(),
        s.names_added.to_string(),
        s.names_removed.to_string(),
        format!("{} bytes", s.data_bytes_replaced),
    ]);
    println!("{t}");
    if !dry_run {
        println!("log replayed; new generation {}", s.generation);
    }
}

/// Salvage: the lost blocks, then one row per inode the readable log names.
fn print_salvage(r: &SalvageReport) {
    if !r.lost_blocks.is_empty() {
        let mut t = Table::new();
        t.set_header(vec![
            "lost log block",
            "log of subvol",
            "level",
            "key range",
            "why",
        ]);
        for b in &r.lost_blocks {
            let end = b
                .end_key
                .as_ref()
                .map(key_string)
                .unwrap_or_else(|| "end".into());
            t.add_row(vec![
                b.bytenr.to_string(),
                b.subvol.to_string(),
                b.level.to_string(),
                format!("{} .. {end}", key_string(&b.first_key)),
                b.why.clone(),
            ]);
        }
        println!("{t}");
    }
    if let Some(why) = &r.zero_log {
        println!("salvage: {why}");
        return;
    }
    let mut t = Table::new();
    t.set_header(vec!["subvol", "inode", "path", "type", "result", "detail"]);
    for i in &r.inodes {
        t.add_row(vec![
            i.subvol.to_string(),
            i.ino.to_string(),
            i.path.clone().unwrap_or_else(|| "(no name)".into()),
            i.kind.unwrap_or("?").to_string(),
            match i.outcome {
                Outcome::Recovered => "recovered".to_string(),
                Outcome::NotRecovered => "not recovered".to_string(),
            },
            i.reason.clone().unwrap_or_default(),
        ]);
    }
    println!("{t}");
    println!(
        "salvage: {} logged inode(s) recovered, {} not recovered (they keep their committed state); {} log block(s) lost",
        r.recovered,
        r.not_recovered,
        r.lost_blocks.len()
    );
}
