//! The phase progress bar of the tools that report `check::Progress`
//! (btrkit-fsck, btrkit-tune): drawn on stderr only when asked and stderr
//! is a terminal.

use btrkit_core::check::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// A bar per phase: its name, a count of units against the phase's total.
pub struct Bar {
    pb: Option<ProgressBar>,
}

impl Bar {
    /// A bar, hidden unless `wanted` and stderr is a terminal.
    pub fn new(wanted: bool) -> Bar {
        if !wanted || !std::io::stderr().is_terminal() {
            return Bar { pb: None };
        }
        let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{spinner} phase {prefix}: {msg} [{bar:30}] {pos}/{len} ({elapsed})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        pb.set_style(style);
        Bar { pb: Some(pb) }
    }
    /// Clear the bar.
    pub fn finish(&self) {
        if let Some(pb) = &self.pb {
            pb.finish_and_clear();
        }
    }
}

impl Progress for Bar {
    fn phase(&self, phase: u8, name: &str, total: u64) {
        if let Some(pb) = &self.pb {
            pb.set_prefix(phase.to_string());
            pb.set_message(name.to_string());
            pb.set_length(total);
            pb.set_position(0);
        }
    }
    fn advance(&self, n: u64) {
        if let Some(pb) = &self.pb {
            pb.inc(n);
        }
    }
}
