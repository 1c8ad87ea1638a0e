use btrkit_core::log::replay::{Event, ReplaySummary};
use comfy_table::Table;

pub fn no_log(image: &std::path::Path, json: bool) {
    if json {
        println!("{}", serde_json::json!({ "image": image, "log": null, "replayed": false }));
    } else {
        println!("{}: no log to replay", image.display());
    }
}

pub fn print(s: &ReplaySummary, dry_run: bool, json: bool) {
    if json {
        let v = serde_json::json!({ "dry_run": dry_run, "summary": s });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return;
    }
    if dry_run {
        let mut t = Table::new();
        t.set_header(vec!["change", "subvol", "inode", "detail"]);
        for e in &s.events {
            let row: Vec<String> = match e {
                Event::InodeCreated { subvol, ino, mode, size } => vec!["inode created".into(), subvol.to_string(), ino.to_string(), format!("mode {mode:o} size {size}")],
                Event::InodeUpdated { subvol, ino, mode, size } => vec!["inode updated".into(), subvol.to_string(), ino.to_string(), format!("mode {mode:o} size {size}")],
                Event::NameAdded { subvol, dir, name, ino } => vec!["name added".into(), subvol.to_string(), ino.to_string(), format!("dir {dir}: {name}")],
                Event::NameRemoved { subvol, dir, name, ino } => vec!["name removed".into(), subvol.to_string(), ino.to_string(), format!("dir {dir}: {name}")],
                Event::DataReplaced { subvol, ino, offset, len, kind } => vec!["data replaced".into(), subvol.to_string(), ino.to_string(), format!("[{offset}, {}) {kind}", offset + len)],
                Event::Truncated { subvol, ino, size } => vec!["truncated".into(), subvol.to_string(), ino.to_string(), format!("to {size}")],
                Event::XattrSet { subvol, ino, name } => vec!["xattr set".into(), subvol.to_string(), ino.to_string(), name.clone()],
                Event::XattrRemoved { subvol, ino, name } => vec!["xattr removed".into(), subvol.to_string(), ino.to_string(), name.clone()],
                Event::InodeRemoved { subvol, ino } => vec!["inode removed".into(), subvol.to_string(), ino.to_string(), String::new()],
            };
            t.add_row(row);
        }
        println!("{t}");
        println!("dry run: nothing was written");
    }
    let mut t = Table::new();
    t.set_header(vec!["log trees", "log blocks", "log items", "inodes created", "inodes updated", "inodes removed", "names added", "names removed", "data replaced"]);
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
