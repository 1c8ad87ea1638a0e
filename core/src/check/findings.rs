//! What the checker reports: findings tagged by phase, and a per-phase
//! summary. Storage is capped so a badly damaged image cannot make the
//! report itself grow without bound; counts stay exact.

use crate::format::key::Key;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

/// The phases, in the order a report lists them.
pub const PHASES: [(u8, &str); 9] = [
    (1, "superblocks"),
    (2, "chunks, devices, block groups"),
    (3, "tree blocks"),
    (4, "extent tree"),
    (5, "free space tree and cache"),
    (6, "subvolumes"),
    (7, "checksums"),
    (8, "log trees"),
    (9, "quota groups"),
];

pub fn phase_name(p: u8) -> &'static str {
    PHASES
        .iter()
        .find(|(n, _)| *n == p)
        .map(|(_, s)| *s)
        .unwrap_or("?")
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub phase: u8,
    pub category: &'static str,
    pub severity: Severity,
    /// Tree id the finding is about, when it is about one tree.
    pub tree: Option<u64>,
    pub bytenr: Option<u64>,
    pub key: Option<Key>,
    pub message: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseSummary {
    pub phase: u8,
    pub name: &'static str,
    /// Things examined (superblocks, blocks, items, extents, inodes, bytes...).
    pub checked: u64,
    pub errors: u64,
    pub warnings: u64,
    pub millis: u64,
    /// False when the phase did not run (feature absent or not asked for).
    pub ran: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub phases: Vec<PhaseSummary>,
    pub findings: Vec<Finding>,
    /// Findings counted but not stored because of the cap.
    pub suppressed: u64,
    pub errors: u64,
    pub warnings: u64,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.errors == 0
    }
    /// Clean, and every copy of every tree block checked was good: what an
    /// image this engine wrote must be (a damaged DUP copy is only a
    /// warning to a user, since reads use the good one).
    pub fn is_pristine(&self) -> bool {
        self.is_clean() && !self.findings.iter().any(|f| f.category == "mirror-copy")
    }
}

/// Most findings stored per phase; the rest are only counted.
const CAP_PER_PHASE: usize = 2000;

pub(crate) struct Sink {
    pub findings: Vec<Finding>,
    pub stored: [usize; 10],
    pub phases: [PhaseSummary; 10],
    pub suppressed: u64,
}

impl Sink {
    pub fn new() -> Sink {
        let mut phases: [PhaseSummary; 10] = Default::default();
        for (i, p) in phases.iter_mut().enumerate() {
            p.phase = i as u8;
            p.name = phase_name(i as u8);
        }
        Sink {
            findings: Vec::new(),
            stored: [0; 10],
            phases,
            suppressed: 0,
        }
    }

    pub fn push(&mut self, f: Finding) {
        let p = (f.phase as usize).min(9);
        match f.severity {
            Severity::Error => self.phases[p].errors += 1,
            Severity::Warning => self.phases[p].warnings += 1,
        }
        if self.stored[p] < CAP_PER_PHASE {
            self.stored[p] += 1;
            self.findings.push(f);
        } else {
            self.suppressed += 1;
        }
    }

    pub fn checked(&mut self, phase: u8, n: u64) {
        let p = (phase as usize).min(9);
        self.phases[p].checked += n;
        self.phases[p].ran = true;
    }

    pub fn ran(&mut self, phase: u8) {
        self.phases[(phase as usize).min(9)].ran = true;
    }

    pub fn add_millis(&mut self, phase: u8, ms: u64) {
        self.phases[(phase as usize).min(9)].millis += ms;
    }

    pub fn into_report(mut self) -> Report {
        self.findings
            .sort_by_key(|f| (f.phase, std::cmp::Reverse(f.severity)));
        let phases: Vec<PhaseSummary> = self.phases.into_iter().skip(1).collect();
        let errors = phases.iter().map(|p| p.errors).sum();
        let warnings = phases.iter().map(|p| p.warnings).sum();
        Report {
            phases,
            findings: self.findings,
            suppressed: self.suppressed,
            errors,
            warnings,
        }
    }
}

/// Builder sugar: `F::err(4, "extent-ref").tree(5).at(b).key(k).msg(..)`.
pub(crate) struct F(Finding);

impl F {
    pub fn err(phase: u8, category: &'static str) -> F {
        F(Finding {
            phase,
            category,
            severity: Severity::Error,
            tree: None,
            bytenr: None,
            key: None,
            message: String::new(),
        })
    }
    pub fn warn(phase: u8, category: &'static str) -> F {
        let mut f = F::err(phase, category);
        f.0.severity = Severity::Warning;
        f
    }
    pub fn tree(mut self, t: u64) -> F {
        self.0.tree = Some(t);
        self
    }
    pub fn at(mut self, b: u64) -> F {
        self.0.bytenr = Some(b);
        self
    }
    pub fn key(mut self, k: Key) -> F {
        self.0.key = Some(k);
        self
    }
    pub fn opt_key(mut self, k: Option<Key>) -> F {
        self.0.key = k;
        self
    }
    pub fn msg(mut self, m: impl Into<String>) -> Finding {
        self.0.message = m.into();
        self.0
    }
}
