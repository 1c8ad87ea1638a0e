//! `btrkit-fsck rescue NAME IMAGE...`: btrfs rescue's commands. Each
//! module runs one through the engine (`btrkit_core::rescue`) and prints
//! its report; the exit code follows the report's status.

mod chunk_recover;
mod clear_ino_cache;
mod clear_uuid_tree;
mod fix_data_checksum;
mod fix_device_size;
mod super_recover;
mod zero_log;

use crate::cli::{Common, Rescue};
use btrkit_core::rescue::{RescueReport, Status};
use std::io::{BufRead, IsTerminal, Write};

pub fn run(cmd: &Rescue) -> anyhow::Result<i32> {
    match cmd {
        Rescue::ChunkRecover {
            common,
            yes,
            dry_run,
        } => chunk_recover::run(common, *yes, *dry_run),
        Rescue::SuperRecover {
            common,
            yes,
            dry_run,
        } => super_recover::run(common, *yes, *dry_run),
        Rescue::ZeroLog { common, dry_run } => zero_log::run(common, *dry_run),
        Rescue::FixDeviceSize { common, dry_run } => fix_device_size::run(common, *dry_run),
        Rescue::FixDataChecksum {
            common,
            readonly,
            mirror,
        } => fix_data_checksum::run(common, *readonly, *mirror),
        Rescue::ClearUuidTree { common, dry_run } => clear_uuid_tree::run(common, *dry_run),
        Rescue::ClearInoCache { common, dry_run } => clear_ino_cache::run(common, *dry_run),
    }
}

/// The exit code of a report.
fn exit_code(s: Status) -> i32 {
    match s {
        Status::NothingToDo => crate::EXIT_CLEAN,
        Status::Done => crate::EXIT_REPAIRED,
        Status::WouldChange | Status::ErrorsLeft => crate::EXIT_ERRORS,
    }
}

/// Print `r` (`--json`: the report with the command, its status and the
/// devices) and return its exit code.
fn show<R: RescueReport>(common: &Common, command: &str, r: &R) -> anyhow::Result<i32> {
    let status = r.status();
    if common.json {
        let mut body = serde_json::to_value(r)?;
        if let Some(o) = body.as_object_mut() {
            o.insert("command".into(), command.into());
            o.insert("status".into(), serde_json::to_value(status)?);
        }
        crate::render::print_json(&common.images, body)?;
    } else {
        let name = crate::render::names(&common.images);
        for l in r.lines() {
            println!("{name}: {l}");
        }
    }
    Ok(exit_code(status))
}

/// Whether the user confirms `what` (`-y`, or a yes on a terminal);
/// None when there is no terminal to ask on (a usage error).
fn confirmed(yes: bool, what: &str) -> anyhow::Result<Option<bool>> {
    if yes {
        return Ok(Some(true));
    }
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        eprintln!("btrkit-fsck: {what} writes to the image: add -y to confirm (or --dry-run to see what it would do)");
        return Ok(None);
    }
    eprint!("{what}: write to the image? [y/N] ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(Some(matches!(line.trim(), "y" | "Y" | "yes")))
}
