//! Report rendering: a comfy-table summary by phase then the findings, or
//! the same data as JSON.

use btrkit_core::check::{Report, Severity};
use btrkit_core::format::names::key_string;
use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};
use std::path::PathBuf;

/// Width the tables must fit: the terminal's when stdout is one, else
/// `$COLUMNS`, else 120 (a pager or a log file), so a long message wraps
/// inside its cell instead of making a 300-column line.
fn table_width() -> u16 {
    if let Some((w, _)) = terminal_size() {
        return w;
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<u16>().ok())
        .filter(|&w| w >= 40)
        .unwrap_or(120)
}

fn terminal_size() -> Option<(u16, u16)> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let t = Table::new();
    t.width().map(|w| (w, 0))
}

fn new_table(width: u16) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_content_arrangement(ContentArrangement::Dynamic);
    t.set_width(width);
    t
}

pub fn human(images: &[PathBuf], r: &Report) {
    let width = table_width();
    let mut t = new_table(width);
    t.set_header(vec![
        "phase", "checks", "checked", "errors", "warnings", "ms",
    ]);
    for p in &r.phases {
        t.add_row(vec![
            p.phase.to_string(),
            p.name.to_string(),
            if p.ran {
                p.checked.to_string()
            } else {
                "skipped".into()
            },
            p.errors.to_string(),
            p.warnings.to_string(),
            p.millis.to_string(),
        ]);
    }
    println!("{t}");
    if !r.findings.is_empty() {
        let mut f = new_table(width);
        f.set_header(vec![
            "phase", "severity", "category", "tree", "bytenr", "key", "message",
        ]);
        for x in &r.findings {
            f.add_row(vec![
                x.phase.to_string(),
                match x.severity {
                    Severity::Error => "error".into(),
                    Severity::Warning => "warning".to_string(),
                },
                x.category.to_string(),
                x.tree.map(|t| (t as i64).to_string()).unwrap_or_default(),
                x.bytenr.map(|b| b.to_string()).unwrap_or_default(),
                x.key.map(|k| key_string(&k)).unwrap_or_default(),
                x.message.clone(),
            ]);
        }
        println!("{f}");
    }
    if r.suppressed > 0 {
        println!("{} more findings not listed", r.suppressed);
    }
    print_verdict(images, r);
}

/// `body` (a JSON object) with the image and every device named, on
/// stdout: every `--json` report starts from these.
pub(crate) fn print_json(images: &[PathBuf], mut body: serde_json::Value) -> anyhow::Result<()> {
    if let Some(o) = body.as_object_mut() {
        o.insert("image".into(), images[0].display().to_string().into());
        o.insert(
            "devices".into(),
            images
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .into(),
        );
    }
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(())
}

/// The devices checked, as one name: `a.img` or `a.img + b.img`.
pub(crate) fn names(images: &[PathBuf]) -> String {
    images
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" + ")
}

pub fn json(images: &[PathBuf], r: &Report) -> anyhow::Result<()> {
    print_json(
        images,
        serde_json::json!({
            "clean": r.is_clean(),
            "errors": r.errors,
            "warnings": r.warnings,
            "suppressed": r.suppressed,
            "phases": r.phases,
            "findings": r.findings,
        }),
    )
}

/// `--qgroup-report`: every quota group's counts on disk and recomputed,
/// then the verdict of the whole check (whose findings it does not list).
pub fn qgroup_report(json: bool, images: &[PathBuf], r: &Report) -> anyhow::Result<()> {
    let q = r.qgroups.as_ref();
    if json {
        print_json(
            images,
            serde_json::json!({
                "clean": r.is_clean(),
                "errors": r.errors,
                "warnings": r.warnings,
                "quotas": q.is_some(),
                "qgroups": q,
                "different": q.map(|q| q.different()).unwrap_or(0),
            }),
        )?;
        return Ok(());
    }
    let Some(q) = q else {
        println!("{}: quotas are not enabled", names(images));
        print_verdict(images, r);
        return Ok(());
    };
    if let Some(why) = &q.not_computed {
        println!(
            "{}: quotas are enabled but no counts were computed: {why}",
            names(images)
        );
        print_verdict(images, r);
        return Ok(());
    }
    let mut t = new_table(table_width());
    t.set_header(vec![
        "qgroup",
        "referenced",
        "on disk",
        "diff",
        "exclusive",
        "on disk",
        "diff",
        "",
    ]);
    let diff = |ours: u64, disk: u64| {
        if ours == disk {
            String::new()
        } else {
            format!("{:+}", ours as i128 - disk as i128)
        }
    };
    for g in &q.groups {
        t.add_row(vec![
            g.name.clone(),
            g.referenced.to_string(),
            g.disk_referenced.to_string(),
            diff(g.referenced, g.disk_referenced),
            g.exclusive.to_string(),
            g.disk_exclusive.to_string(),
            diff(g.exclusive, g.disk_exclusive),
            if g.differs() { "different" } else { "" }.to_string(),
        ]);
    }
    println!(
        "Quota groups of {} ({} accounting; referenced and exclusive bytes recomputed from the trees beside the counts on disk)",
        names(images),
        if q.simple { "simple" } else { "full" }
    );
    println!("{t}");
    if let Some(at) = q.rescan {
        println!("a quota rescan is in progress (at {at}): differences are expected");
    } else if q.inconsistent {
        println!("quotas are marked inconsistent: differences are expected until a rescan");
    }
    match q.different() {
        0 => println!("{} quota groups, counts as recomputed", q.groups.len()),
        n => println!(
            "{n} of {} quota groups differ (btrkit-fsck --repair recounts them)",
            q.groups.len()
        ),
    }
    print_verdict(images, r);
    Ok(())
}

/// The last line of a report: the whole check's verdict.
fn print_verdict(images: &[PathBuf], r: &Report) {
    let verdict = if r.errors == 0 {
        "clean"
    } else {
        "errors found"
    };
    println!(
        "{}: {verdict} ({} errors, {} warnings)",
        names(images),
        r.errors,
        r.warnings
    );
}

/// The repair plan: each action with the findings it answers, then the
/// errors left alone with their reasons.
pub fn plan(p: &btrkit_core::check::repair::Plan) {
    let width = table_width();
    if !p.actions.is_empty() {
        let mut t = new_table(width);
        t.set_header(vec!["class", "action", "findings", "answers"]);
        for a in &p.actions {
            let mut answers = a.answers.join("\n");
            if a.findings as usize > a.answers.len() {
                answers.push_str(&format!(
                    "\n... {} more",
                    a.findings as usize - a.answers.len()
                ));
            }
            if a.findings == 0 {
                answers = "(asked for)".into();
            }
            t.add_row(vec![
                a.class.to_string(),
                a.description.clone(),
                a.findings.to_string(),
                answers,
            ]);
        }
        println!("{t}");
    }
    if !p.not_repairable.is_empty() {
        let mut t = new_table(width);
        t.set_header(vec!["not repairable", "why"]);
        for u in &p.not_repairable {
            t.add_row(vec![
                format!("{}: {}", u.finding.category, u.finding.message),
                u.reason.clone(),
            ]);
        }
        println!("{t}");
    }
    if p.actions.is_empty() {
        println!("nothing to repair");
    }
}

pub fn repair_json(
    images: &[PathBuf],
    o: &btrkit_core::check::repair::Outcome,
) -> anyhow::Result<()> {
    print_json(
        images,
        serde_json::json!({
            "clean_before": o.before.is_clean(),
            "errors_before": o.before.errors,
            "findings_before": o.before.findings,
            "actions": o.plan.actions,
            "not_repairable": o.plan.not_repairable,
            "refused": o.plan.refused,
            "committed": o.committed,
            "changes": o.changes,
            "clean_after": o.after.as_ref().map(|a| a.is_clean()),
            "errors_after": o.after.as_ref().map(|a| a.errors),
            "findings_after": o.after.as_ref().map(|a| &a.findings),
        }),
    )
}

/// What `--clear-space-cache` on its own did.
pub fn cleared(
    json: bool,
    images: &[PathBuf],
    which: btrkit_core::check::repair::SpaceCache,
    changes: &[String],
) -> anyhow::Result<()> {
    if json {
        print_json(
            images,
            serde_json::json!({
                "clear_space_cache": which,
                "committed": true,
                "changes": changes,
                "checked": false,
            }),
        )?;
        return Ok(());
    }
    for c in changes {
        println!("{}: {c}", images[0].display());
    }
    println!("committed; nothing else was checked or repaired (btrkit-fsck --repair does that)");
    Ok(())
}
