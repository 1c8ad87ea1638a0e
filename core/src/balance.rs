//! `btrfs balance start` offline: the block groups the filters choose are
//! relocated one at a time, highest logical address first (the kernel's
//! `__btrfs_balance`), into new space of the type's profile, or of the
//! profile a `convert=` asks for. Filters and their meaning follow the
//! kernel's `should_balance_chunk` (volumes.c) and btrfs-progs' parser
//! (cmds/balance.c).

use crate::format::consts::*;
use crate::trans::relocate::Moved;
use crate::trans::Store;
use crate::{Error, Result};

/// An inclusive range of a filter (`min..max`); an open end is `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Range {
    /// Lower bound, inclusive.
    pub min: Option<u64>,
    /// Upper bound (inclusive for counts and percentages, exclusive for
    /// byte ranges, as in the kernel).
    pub max: Option<u64>,
}

/// The filters of one block group type (`-d`, `-m` or `-s`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filters {
    /// `profiles=a|b`: only groups of these profiles (profile bits; SINGLE
    /// as [`SINGLE`]).
    pub profiles: Option<u64>,
    /// `usage=N` (used below N %) or `usage=min..max` (inclusive).
    pub usage: Option<Usage>,
    /// `devid=N`: only groups with a stripe on device N.
    pub devid: Option<u64>,
    /// `drange=a..b`: a stripe on `devid` meeting device bytes [a, b).
    pub drange: Option<Range>,
    /// `vrange=a..b`: the group meets logical bytes [a, b).
    pub vrange: Option<Range>,
    /// `stripes=a..b`: groups with that many stripes.
    pub stripes: Option<Range>,
    /// `limit=N` or `limit=a..b`: at most that many groups.
    pub limit: Option<Range>,
    /// `convert=PROFILE`: new chunks in this profile (profile bits).
    pub convert: Option<u64>,
    /// `soft`: with convert, skip groups already in the target profile.
    pub soft: bool,
}

/// The usage filter: below a percentage, or within a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// `usage=N`: used bytes below N % of the group.
    Below(u64),
    /// `usage=min..max`: used bytes from min % to max % of the group.
    Range(Range),
}

/// The profile bit btrfs uses for SINGLE in filters
/// (BTRFS_AVAIL_ALLOC_BIT_SINGLE).
pub const SINGLE: u64 = 1 << 48;

/// A whole balance request.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// `-d[filters]`.
    pub data: Option<Filters>,
    /// `-m[filters]`.
    pub metadata: Option<Filters>,
    /// `-s[filters]` (btrfs requires `--force` for it).
    pub system: Option<Filters>,
    /// `--force`: reduce metadata redundancy, name system groups.
    pub force: bool,
}

impl Request {
    /// The request btrfs-progs makes of the arguments: no type named
    /// means every type without filters (a full balance); `-m` without
    /// `-s` applies its filters to system groups too; `-s` alone needs
    /// `force`.
    pub fn normalize(mut self) -> Result<Request> {
        if self.data.is_none() && self.metadata.is_none() && self.system.is_none() {
            self.data = Some(Filters::default());
            self.metadata = Some(Filters::default());
            self.system = Some(Filters::default());
        } else if self.system.is_some() {
            if !self.force {
                return Err(Error::Invalid(
                    "refusing to operate on system chunks explicitly: pass --force if you really want to".into(),
                ));
            }
        } else if let Some(m) = &self.metadata {
            self.system = Some(m.clone());
        }
        Ok(self)
    }

    fn filters_for(&self, ty: u64) -> Option<&Filters> {
        if ty & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
            self.system.as_ref()
        } else if ty & BTRFS_BLOCK_GROUP_METADATA != 0 && ty & BTRFS_BLOCK_GROUP_DATA == 0 {
            self.metadata.as_ref()
        } else if ty & BTRFS_BLOCK_GROUP_DATA != 0 && ty & BTRFS_BLOCK_GROUP_METADATA != 0 {
            // Mixed groups are data and metadata: the data filters rule.
            self.data.as_ref().or(self.metadata.as_ref())
        } else if ty & BTRFS_BLOCK_GROUP_DATA != 0 {
            self.data.as_ref()
        } else {
            None
        }
    }
}

/// Parse one type's filters as btrfs-progs does (`usage=50,limit=2`,
/// `convert=raid1,soft`); empty: no filter.
pub fn parse_filters(s: &str) -> Result<Filters> {
    let mut f = Filters::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = match part.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (part, None),
        };
        let need = |what: &str| -> Result<&str> {
            value
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Error::Invalid(format!("the {what} filter requires an argument")))
        };
        match name {
            "profiles" => {
                let mut bits = 0;
                for p in need("profiles")?.split('|') {
                    let b = crate::format::names::parse_profile(p)?;
                    bits |= if b == 0 { SINGLE } else { b };
                }
                f.profiles = Some(bits);
            }
            "usage" => {
                let v = need("usage")?;
                f.usage = Some(if v.contains("..") {
                    let r = parse_range(v, "usage")?;
                    if r.min.unwrap_or(0) > 100 || r.max.is_some_and(|m| m > 100) {
                        return Err(Error::Invalid(format!("invalid usage range: {v}")));
                    }
                    Usage::Range(r)
                } else {
                    let n = parse_u64(v, "usage")?;
                    if n > 100 {
                        return Err(Error::Invalid(format!("invalid usage argument: {v}")));
                    }
                    Usage::Below(n)
                });
            }
            "devid" => {
                let n = parse_u64(need("devid")?, "devid")?;
                if n == 0 {
                    return Err(Error::Invalid("invalid devid argument: 0".into()));
                }
                f.devid = Some(n);
            }
            "drange" => f.drange = Some(parse_range(need("drange")?, "drange")?),
            "vrange" => f.vrange = Some(parse_range(need("vrange")?, "vrange")?),
            "stripes" => f.stripes = Some(parse_range(need("stripes")?, "stripes")?),
            "limit" => {
                let v = need("limit")?;
                f.limit = Some(if v.contains("..") {
                    parse_range(v, "limit")?
                } else {
                    let n = parse_u64(v, "limit")?;
                    Range {
                        min: None,
                        max: Some(n),
                    }
                });
            }
            "convert" => f.convert = Some(crate::format::names::parse_profile(need("convert")?)?),
            "soft" => f.soft = true,
            _ => {
                return Err(Error::Invalid(format!(
                    "unrecognized balance option: {name}"
                )))
            }
        }
    }
    if f.drange.is_some() && f.devid.is_none() {
        return Err(Error::Invalid(
            "drange filter must be used with devid filter".into(),
        ));
    }
    if f.soft && f.convert.is_none() {
        return Err(Error::Invalid(
            "'soft' filter requires 'convert' filter".into(),
        ));
    }
    Ok(f)
}

/// `btrfs balance start`'s options as words: `-d[FILTERS]`,
/// `-m[FILTERS]`, `-s[FILTERS]` (also `--data[=F]`, `--metadata[=F]`,
/// `--system[=F]`), `-f`/`--force`, `--full-balance`, `-v` (ignored).
pub fn parse_args<S: AsRef<str>>(words: &[S]) -> Result<Request> {
    let mut r = Request::default();
    for w in words {
        let w = w.as_ref();
        let (slot, rest) = if let Some(x) = w.strip_prefix("--data") {
            (Some(0), x.strip_prefix('=').unwrap_or(x))
        } else if let Some(x) = w.strip_prefix("--metadata") {
            (Some(1), x.strip_prefix('=').unwrap_or(x))
        } else if let Some(x) = w.strip_prefix("--system") {
            (Some(2), x.strip_prefix('=').unwrap_or(x))
        } else if let Some(x) = w.strip_prefix("-d") {
            (Some(0), x)
        } else if let Some(x) = w.strip_prefix("-m") {
            (Some(1), x)
        } else if let Some(x) = w.strip_prefix("-s") {
            (Some(2), x)
        } else {
            (None, "")
        };
        match (slot, w) {
            (Some(i), _) => {
                let f = Some(parse_filters(rest)?);
                match i {
                    0 => r.data = f,
                    1 => r.metadata = f,
                    _ => r.system = f,
                }
            }
            (None, "-f" | "--force") => r.force = true,
            (None, "--full-balance" | "-v" | "--verbose") => {}
            (None, other) => {
                return Err(Error::Invalid(format!("unknown balance option: {other}")))
            }
        }
    }
    Ok(r)
}

fn parse_u64(s: &str, what: &str) -> Result<u64> {
    s.trim()
        .parse()
        .map_err(|_| Error::Invalid(format!("invalid {what} argument: {s}")))
}

/// `a..b`, `a..`, `..b` or `a` (a range of one).
fn parse_range(s: &str, what: &str) -> Result<Range> {
    let Some((a, b)) = s.split_once("..") else {
        let n = parse_u64(s, what)?;
        return Ok(Range {
            min: Some(n),
            max: Some(n),
        });
    };
    let min = (!a.is_empty()).then(|| parse_u64(a, what)).transpose()?;
    let max = (!b.is_empty()).then(|| parse_u64(b, what)).transpose()?;
    if let (Some(x), Some(y)) = (min, max) {
        if x > y {
            return Err(Error::Invalid(format!("invalid {what} range: {s}")));
        }
    }
    Ok(Range { min, max })
}

/// A block group as the filters see it.
#[derive(Clone, Debug)]
pub struct GroupInfo {
    /// Logical start and length.
    pub start: u64,
    /// Length in bytes.
    pub length: u64,
    /// Type and profile bits.
    pub flags: u64,
    /// Bytes used.
    pub used: u64,
    /// (devid, device offset, bytes on that device) of every stripe.
    pub stripes: Vec<(u64, u64, u64)>,
}

/// Every block group with its stripes, highest logical address first
/// (the order the kernel's balance visits them).
pub fn groups(st: &Store) -> Vec<GroupInfo> {
    let mut out: Vec<GroupInfo> = st
        .block_groups()
        .map(|g| {
            let stripes = st
                .chunk_map()
                .lookup(g.start)
                .map(|m| {
                    let n = m.stripes.len() as u64;
                    let per = crate::chunk::stripe_length(m.type_flags, m.length, n.max(1));
                    m.stripes.iter().map(|&(d, o)| (d, o, per)).collect()
                })
                .unwrap_or_default();
            GroupInfo {
                start: g.start,
                length: g.length,
                flags: g.flags,
                used: g.used,
                stripes,
            }
        })
        .collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.start));
    out
}

/// Whether the filters (all but limit) take group `g`
/// (should_balance_chunk).
fn takes(f: &Filters, g: &GroupInfo) -> bool {
    let profile = g.flags & BTRFS_BLOCK_GROUP_PROFILE_MASK;
    if let Some(p) = f.profiles {
        let bit = if profile == 0 { SINGLE } else { profile };
        if p & bit == 0 {
            return false;
        }
    }
    match f.usage {
        Some(Usage::Below(n)) => {
            let thresh = if n == 0 {
                1
            } else {
                g.length.saturating_mul(n) / 100
            };
            if g.used >= thresh {
                return false;
            }
        }
        Some(Usage::Range(r)) => {
            let lo = r.min.map_or(0, |m| g.length.saturating_mul(m) / 100);
            let hi = match r.max {
                None | Some(0) => 1,
                Some(m) => g.length.saturating_mul(m) / 100,
            };
            let hi = if r.max.is_none() { g.length + 1 } else { hi };
            if !(lo <= g.used && g.used < hi) {
                return false;
            }
        }
        None => {}
    }
    if let Some(d) = f.devid {
        if !g.stripes.iter().any(|s| s.0 == d) {
            return false;
        }
        if let Some(r) = f.drange {
            let (lo, hi) = (r.min.unwrap_or(0), r.max.unwrap_or(u64::MAX));
            if !g
                .stripes
                .iter()
                .any(|&(dev, off, len)| dev == d && off < hi && off + len > lo)
            {
                return false;
            }
        }
    }
    if let Some(r) = f.vrange {
        let (lo, hi) = (r.min.unwrap_or(0), r.max.unwrap_or(u64::MAX));
        if !(g.start < hi && g.start + g.length > lo) {
            return false;
        }
    }
    if let Some(r) = f.stripes {
        let n = g.stripes.len() as u64;
        if r.min.is_some_and(|m| n < m) || r.max.is_some_and(|m| n > m) {
            return false;
        }
    }
    if f.soft && f.convert == Some(profile) {
        return false;
    }
    true
}

/// The groups `req` would relocate were nothing to change on the way, in
/// order. A balance decides each group when it reaches it (a group's
/// usage grows as the groups before it move into it), as the kernel does.
pub fn select(st: &Store, req: &Request) -> Vec<GroupInfo> {
    let mut limits = Limits::default();
    groups(st)
        .into_iter()
        .filter(|g| limits.take(req, g))
        .collect()
}

/// What is left of each type's `limit`.
#[derive(Default)]
struct Limits([Option<u64>; 3]);

impl Limits {
    /// Whether `req` relocates group `g` now, a limit counted down.
    fn take(&mut self, req: &Request, g: &GroupInfo) -> bool {
        let Some(f) = req.filters_for(g.flags) else {
            return false;
        };
        if !takes(f, g) {
            return false;
        }
        if let Some(r) = f.limit {
            let l = self.0[type_slot(g.flags)].get_or_insert(r.max.unwrap_or(u64::MAX));
            if *l == 0 {
                return false;
            }
            *l -= 1;
        }
        true
    }
}

fn type_slot(flags: u64) -> usize {
    if flags & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
        2
    } else if flags & BTRFS_BLOCK_GROUP_DATA != 0 {
        0
    } else {
        1
    }
}

/// Profiles that keep data through a failure (two copies or parity):
/// what the kernel lets a metadata conversion leave only with force.
const REDUNDANT: u64 = BTRFS_BLOCK_GROUP_DUP
    | BTRFS_BLOCK_GROUP_RAID1
    | BTRFS_BLOCK_GROUP_RAID1C3
    | BTRFS_BLOCK_GROUP_RAID1C4
    | BTRFS_BLOCK_GROUP_RAID10
    | BTRFS_BLOCK_GROUP_RAID5
    | BTRFS_BLOCK_GROUP_RAID6;

/// Refusals before anything is written (btrfs_balance's): a conversion
/// the devices cannot hold, or metadata or system groups leaving every
/// redundant profile without `force`.
pub fn check(st: &Store, req: &Request) -> Result<()> {
    let devices = st.num_devices_present();
    for (name, ty, f) in [
        ("data", BTRFS_BLOCK_GROUP_DATA, &req.data),
        ("metadata", BTRFS_BLOCK_GROUP_METADATA, &req.metadata),
        ("system", BTRFS_BLOCK_GROUP_SYSTEM, &req.system),
    ] {
        let Some(target) = f.as_ref().and_then(|f| f.convert) else {
            continue;
        };
        let attr = crate::chunk::RaidAttr::of(target).ok_or_else(|| {
            Error::Unsupported(format!("converting {name} to profile bits {target:#x}"))
        })?;
        if attr.devs_min > devices {
            return Err(Error::Invalid(format!(
                "unable to start balance: converting {name} to {} needs at least {} devices, the filesystem has {devices}",
                crate::format::names::profile_name(target),
                attr.devs_min
            )));
        }
        if ty != BTRFS_BLOCK_GROUP_DATA && !req.force {
            let now = st
                .block_groups()
                .filter(|g| g.flags & ty != 0 && g.flags & BTRFS_BLOCK_GROUP_DATA == 0)
                .fold(0, |a, g| a | g.flags);
            if now & REDUNDANT != 0 && target & REDUNDANT == 0 {
                return Err(Error::Invalid(
                    "balance would reduce metadata redundancy: pass --force if you want this"
                        .into(),
                ));
            }
        }
    }
    Ok(())
}

/// What a balance did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// Block groups the balance went through (every group there was).
    pub considered: u64,
    /// Block groups relocated.
    pub relocated: u64,
    /// Data extents moved and their bytes.
    pub data_extents: u64,
    /// Bytes of data moved.
    pub data_bytes: u64,
    /// Subvolume tree blocks copied.
    pub tree_blocks: u64,
}

/// Run `req` (normalized): every selected group relocated, each in its
/// own transactions; `progress(done, total, group)` after each. Groups a
/// conversion leaves in another profile take no new extents meanwhile,
/// as the kernel's allocator then asks for the target profile only.
pub fn run(
    st: &mut Store,
    req: &Request,
    progress: &mut dyn FnMut(u64, u64, u64),
) -> Result<Report> {
    check(st, req)?;
    // Every group there is now, highest first; each is judged when the
    // balance reaches it. Groups made meanwhile lie above and are not
    // visited.
    let visit: Vec<u64> = groups(st).iter().map(|g| g.start).collect();
    let mut report = Report {
        considered: visit.len() as u64,
        ..Default::default()
    };
    let total = select(st, req).len() as u64;
    // Conversion targets for new chunks of each type.
    let mut fenced: Vec<u64> = Vec::new();
    // New chunks of a RAID5/6 or RAID1C3/4 target carry their incompat
    // bit from the first commit that has them.
    for f in [&req.data, &req.metadata, &req.system]
        .into_iter()
        .flatten()
    {
        match f.convert {
            Some(p) if p & (BTRFS_BLOCK_GROUP_RAID5 | BTRFS_BLOCK_GROUP_RAID6) != 0 => {
                st.set_incompat(BTRFS_FEATURE_INCOMPAT_RAID56)
            }
            Some(p) if p & (BTRFS_BLOCK_GROUP_RAID1C3 | BTRFS_BLOCK_GROUP_RAID1C4) != 0 => {
                st.set_incompat(BTRFS_FEATURE_INCOMPAT_RAID1C34)
            }
            _ => {}
        }
    }
    for (ty, f) in [
        (BTRFS_BLOCK_GROUP_DATA, &req.data),
        (BTRFS_BLOCK_GROUP_METADATA, &req.metadata),
        (BTRFS_BLOCK_GROUP_SYSTEM, &req.system),
    ] {
        let Some(target) = f.as_ref().and_then(|f| f.convert) else {
            continue;
        };
        st.chunks().set_restripe_target(ty, Some(target));
        for g in groups(st) {
            if g.flags & ty != 0 && g.flags & BTRFS_BLOCK_GROUP_PROFILE_MASK != target {
                fenced.push(g.start);
            }
        }
    }
    st.chunks().set_read_only(&fenced, true);
    let mut limits = Limits::default();
    let mut done = 0u64;
    let mut r = Ok(());
    for start in visit {
        let Some(g) = groups(st).into_iter().find(|g| g.start == start) else {
            continue;
        };
        if !limits.take(req, &g) {
            continue;
        }
        // A conversion that only adds copies keeps the group where it is.
        let target = req.filters_for(g.flags).and_then(|f| f.convert);
        let in_place = match target {
            Some(t) => match st.chunks().add_mirrors(start, t) {
                Ok(true) => st.commit().map(|_| true),
                other => other,
            },
            None => Ok(false),
        };
        let moved = match in_place {
            Ok(true) => Ok(Moved::default()),
            Ok(false) => st.relocation().relocate_group(start),
            Err(e) => Err(e),
        };
        match moved {
            Ok(m) => add(&mut report, m),
            Err(e) => {
                r = Err(e);
                break;
            }
        }
        done += 1;
        progress(done, total.max(done), start);
    }
    st.chunks().set_read_only(&fenced, false);
    for ty in [
        BTRFS_BLOCK_GROUP_DATA,
        BTRFS_BLOCK_GROUP_METADATA,
        BTRFS_BLOCK_GROUP_SYSTEM,
    ] {
        st.chunks().set_restripe_target(ty, None);
    }
    r?;
    st.chunks().update_profile_features();
    st.commit()?;
    Ok(report)
}

/// `btrfs balance start` on a mounted filesystem (the engine's `balance`
/// step): written back and committed first, deleted subvolumes dropped,
/// then [`run`], then a commit.
pub fn on_filesystem(fs: &mut crate::fs::Filesystem, req: &Request) -> Result<Report> {
    fs.subvols().prepare_relocation()?;
    let r = run(&mut fs.store, req, &mut |_, _, _| {})?;
    fs.subvols().finish_relocation()?;
    Ok(r)
}

fn add(r: &mut Report, m: Moved) {
    r.relocated += 1;
    r.data_extents += m.data_extents;
    r.data_bytes += m.data_bytes;
    r.tree_blocks += m.tree_blocks;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_as_btrfs_progs() {
        let f = parse_filters("usage=50,limit=2").unwrap();
        assert_eq!(f.usage, Some(Usage::Below(50)));
        assert_eq!(
            f.limit,
            Some(Range {
                min: None,
                max: Some(2)
            })
        );
        let f = parse_filters("convert=raid1,soft,profiles=single|dup").unwrap();
        assert_eq!(f.convert, Some(BTRFS_BLOCK_GROUP_RAID1));
        assert!(f.soft);
        assert_eq!(f.profiles, Some(SINGLE | BTRFS_BLOCK_GROUP_DUP));
        let f = parse_filters("usage=10..90,devid=2,drange=0..1073741824,vrange=5..").unwrap();
        assert_eq!(
            f.usage,
            Some(Usage::Range(Range {
                min: Some(10),
                max: Some(90)
            }))
        );
        assert_eq!(f.vrange.unwrap().max, None);
        assert!(parse_filters("soft").is_err());
        assert!(parse_filters("drange=1..2").is_err());
        assert!(parse_filters("usage=101").is_err());
        assert!(parse_filters("convert=raid7").is_err());
        assert!(parse_filters("bogus=1").is_err());
        assert!(parse_filters("limit=5..2").is_err());
    }

    fn group(start: u64, flags: u64, used: u64, stripes: Vec<(u64, u64, u64)>) -> GroupInfo {
        GroupInfo {
            start,
            length: 1 << 30,
            flags,
            used,
            stripes,
        }
    }

    #[test]
    fn filters_choose_as_the_kernel() {
        let d = BTRFS_BLOCK_GROUP_DATA;
        let g = group(1 << 30, d, 100 << 20, vec![(1, 1 << 20, 1 << 30)]);
        assert!(takes(&parse_filters("usage=10").unwrap(), &g));
        assert!(!takes(&parse_filters("usage=5").unwrap(), &g));
        assert!(!takes(&parse_filters("usage=0").unwrap(), &g));
        assert!(takes(&parse_filters("usage=5..20").unwrap(), &g));
        assert!(takes(&parse_filters("devid=1").unwrap(), &g));
        assert!(!takes(&parse_filters("devid=2").unwrap(), &g));
        assert!(takes(
            &parse_filters("devid=1,drange=0..2097152").unwrap(),
            &g
        ));
        assert!(!takes(
            &parse_filters(&format!("devid=1,drange={}..", (1u64 << 30) + (1 << 20))).unwrap(),
            &g
        ));
        assert!(takes(&parse_filters("profiles=single").unwrap(), &g));
        assert!(!takes(&parse_filters("profiles=raid1").unwrap(), &g));
        assert!(!takes(&parse_filters("convert=single,soft").unwrap(), &g));
        assert!(takes(&parse_filters("convert=dup,soft").unwrap(), &g));
        assert!(takes(&parse_filters("stripes=1").unwrap(), &g));
        assert!(!takes(&parse_filters("stripes=2..").unwrap(), &g));
        let empty = group(1 << 31, d, 0, vec![(1, 2 << 30, 1 << 30)]);
        assert!(takes(&parse_filters("usage=0").unwrap(), &empty));
    }

    #[test]
    fn each_type_takes_its_own_filters() {
        let r = parse_args(&["-musage=90"]).unwrap().normalize().unwrap();
        assert!(r.filters_for(BTRFS_BLOCK_GROUP_DATA).is_none());
        assert!(r
            .filters_for(BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP)
            .is_some());
        assert!(r.filters_for(BTRFS_BLOCK_GROUP_SYSTEM).is_some());
        assert!(r
            .filters_for(BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA)
            .is_some());
        let r = parse_args(&["-d"]).unwrap().normalize().unwrap();
        assert!(r.filters_for(BTRFS_BLOCK_GROUP_METADATA).is_none());
        assert!(r.filters_for(BTRFS_BLOCK_GROUP_SYSTEM).is_none());
    }

    #[test]
    fn words_parse_as_btrfs_balance_start() {
        let r = parse_args(&["-dusage=50", "-mconvert=raid1,soft", "-f"]).unwrap();
        assert_eq!(r.data.unwrap().usage, Some(Usage::Below(50)));
        assert_eq!(r.metadata.unwrap().convert, Some(BTRFS_BLOCK_GROUP_RAID1));
        assert!(r.force);
        let r = parse_args(&["-d", "--metadata=usage=5"]).unwrap();
        assert_eq!(r.data, Some(Filters::default()));
        assert!(parse_args(&["-x"]).is_err());
    }

    #[test]
    fn request_follows_btrfs_progs() {
        let r = Request::default().normalize().unwrap();
        assert!(r.data.is_some() && r.metadata.is_some() && r.system.is_some());
        let r = Request {
            metadata: Some(parse_filters("usage=30").unwrap()),
            ..Default::default()
        }
        .normalize()
        .unwrap();
        assert_eq!(r.system, r.metadata);
        assert!(r.data.is_none());
        assert!(Request {
            system: Some(Filters::default()),
            ..Default::default()
        }
        .normalize()
        .is_err());
    }
}
