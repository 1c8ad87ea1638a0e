//! The engine's clock: wall time at mount plus what a script's `sleep`
//! and each commit added, so a run's timestamps and time-driven work (the
//! commit interval, dirty expiry) do not depend on how fast it runs.

use crate::format::inode::Timespec;
use std::time::Duration;

/// The filesystem's clock and the age of its running transaction.
#[derive(Clone, Debug)]
pub struct Clock {
    /// Wall time at mount, since the epoch.
    base: Duration,
    /// Time passed since mount.
    offset: Duration,
    /// Clock reading at the running transaction's first change.
    trans_start: Option<Duration>,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock {
            base: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
            offset: Duration::ZERO,
            trans_start: None,
        }
    }
}

impl Clock {
    /// Time since mount.
    pub fn uptime(&self) -> Duration {
        self.offset
    }

    /// The current time, as every new timestamp reads it.
    pub fn now(&self) -> Timespec {
        let d = self.base + self.offset;
        Timespec {
            sec: d.as_secs().into(),
            nsec: d.subsec_nanos().into(),
        }
    }

    /// Move the clock forward.
    pub fn advance(&mut self, by: Duration) {
        self.offset += by;
    }

    /// Something changed: the running transaction's age counts from now if
    /// it had no change yet.
    pub fn dirtied(&mut self) {
        if self.trans_start.is_none() {
            self.trans_start = Some(self.offset);
        }
    }

    /// How long ago the running transaction's first change was; None when
    /// it has none.
    pub fn trans_age(&self) -> Option<Duration> {
        self.trans_start.map(|t0| self.offset.saturating_sub(t0))
    }

    /// The transaction committed: the next one has no change yet.
    pub fn committed(&mut self) {
        self.trans_start = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_age_counts_from_its_first_change() {
        let mut c = Clock::default();
        assert_eq!(c.trans_age(), None);
        c.advance(Duration::from_secs(3));
        c.dirtied();
        c.advance(Duration::from_secs(2));
        c.dirtied();
        assert_eq!(c.trans_age(), Some(Duration::from_secs(2)));
        assert_eq!(c.uptime(), Duration::from_secs(5));
        c.committed();
        assert_eq!(c.trans_age(), None);
    }
}
