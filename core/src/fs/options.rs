//! Mount options: the ones that change the engine's behaviour, and every
//! other btrfs option the kernel accepts (recorded, and doing what they do
//! where it matters offline: nothing, for most).

use super::compress::Method;
use crate::{Error, Result};

/// The btrfs mount options of a mounted [`Filesystem`](super::Filesystem), parsed from
/// the kernel's `-o` syntax; defaults are the kernel's.
#[derive(Clone, Debug, PartialEq)]
pub struct MountOptions {
    /// Seconds between periodic commits (`commit=N`).
    pub commit_interval: u64,
    /// `compress[=METHOD[:LEVEL]]` / `compress-force[=...]`.
    pub compress: Option<Method>,
    /// `compress-force`: every data write is compressed (when `compress` is set),
    /// bypassing the heuristic and the inode's NOCOMPRESS flag.
    pub compress_force: bool,
    /// `nodatacow`: new files are written in place (and get no checksums).
    pub datacow: bool,
    /// `nodatasum`: new files get no checksums.
    pub datasum: bool,
    /// `max_inline=N`: largest file stored inline (bytes).
    pub max_inline: u64,
    /// `notreelog`: fsync commits the transaction instead of logging.
    pub treelog: bool,
    /// `flushoncommit`: a commit writes back dirty data first.
    pub flushoncommit: bool,
    /// `ssd` (`ssd_spread`): a log sync goes out at once instead of
    /// waiting a tick for other clients' fsyncs to join it.
    pub ssd: bool,
    /// `ssd`, `nossd` (or their `_spread` forms) given: the device's
    /// rotational flag does not decide.
    pub ssd_given: bool,
    /// Every option as given, in order.
    pub given: Vec<String>,
    /// Read-only (`ro` as the readers use it): the mount writes nothing of
    /// its own: no orphan cleanup (the kernel's btrfs_orphan_cleanup skips
    /// a read-only mount too), so an image whose extent tree cannot take
    /// a change still opens for reading.
    pub read_only: bool,
    /// `subvolid=N`: the subvolume the mount's root is, instead of the
    /// default one.
    pub subvolid: Option<u64>,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            commit_interval: 30,
            compress: None,
            compress_force: false,
            datacow: true,
            datasum: true,
            max_inline: super::extents::MAX_INLINE,
            treelog: true,
            flushoncommit: false,
            ssd: false,
            ssd_given: false,
            given: Vec::new(),
            read_only: false,
            subvolid: None,
        }
    }
}

/// Options the kernel accepts that change nothing offline.
const ACCEPTED: &[&str] = &[
    "rw",
    "ro",
    "defaults",
    "noatime",
    "relatime",
    "atime",
    "strictatime",
    "lazytime",
    "nodiratime",
    "diratime",
    "ssd",
    "nossd",
    "ssd_spread",
    "nossd_spread",
    "discard",
    "nodiscard",
    "space_cache",
    "nospace_cache",
    "autodefrag",
    "noautodefrag",
    "barrier",
    "nobarrier",
    "acl",
    "noacl",
    "user_xattr",
    "norecovery",
    "usebackuproot",
    "skip_balance",
    "enospc_debug",
    "noenospc_debug",
    "treelog_verbose",
    "rescan_uuid_tree",
    "clear_cache",
    "degraded",
    "inode_cache",
    "noinode_cache",
    "check_int",
    "ref_verify",
    "datasum",
    "datacow",
    "dev",
    "nodev",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "sync",
    "async",
    "loop",
];

/// Options with a value the kernel accepts that change nothing offline.
const ACCEPTED_VALUED: &[&str] = &[
    "space_cache",
    "discard",
    "subvol",
    "device",
    "thread_pool",
    "metadata_ratio",
    "fatal_errors",
    "rescue",
    "fragment",
    "context",
    "fscontext",
    "defcontext",
    "rootcontext",
    "uid",
    "gid",
    "mode",
];

impl MountOptions {
    /// Parse options (each may hold commas). Unknown options are refused,
    /// as the kernel refuses them.
    pub fn parse<S: AsRef<str>>(opts: &[S]) -> Result<MountOptions> {
        let mut o = MountOptions::default();
        for raw in opts {
            for opt in raw
                .as_ref()
                .split(',')
                .map(str::trim)
                .filter(|x| !x.is_empty())
            {
                o.apply(opt)?;
                o.given.push(opt.to_string());
            }
        }
        Ok(o)
    }

    fn apply(&mut self, opt: &str) -> Result<()> {
        let bad = || Error::Invalid(format!("mount option {opt:?} is not valid"));
        let (name, val) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        match (name, val) {
            ("subvolid", Some(v)) => {
                let n: u64 = v.parse().map_err(|_| bad())?;
                // 0 means the default subvolume, as the kernel reads it.
                self.subvolid = (n != 0).then_some(n);
            }
            ("commit", Some(v)) => {
                let n: u64 = v.parse().map_err(|_| bad())?;
                self.commit_interval = if n == 0 { 30 } else { n };
            }
            ("compress" | "compress-force", v) => {
                let m = Method::parse(v.unwrap_or("zlib"));
                match (v, m) {
                    (Some("no" | "none"), _) => {
                        self.compress = None;
                        self.compress_force = false;
                    }
                    (_, Some(m)) => {
                        self.compress = Some(m);
                        self.compress_force = name == "compress-force";
                        // Compression needs copy-on-write and checksums.
                        self.datacow = true;
                        self.datasum = true;
                    }
                    _ => return Err(bad()),
                }
            }
            ("nodatacow", None) => {
                self.datacow = false;
                self.datasum = false;
                self.compress = None;
                self.compress_force = false;
            }
            ("datacow", None) => self.datacow = true,
            ("nodatasum", None) => self.datasum = false,
            ("datasum", None) => {
                self.datasum = true;
                self.datacow = true;
            }
            ("max_inline", Some(v)) => {
                self.max_inline = crate::util::size::parse_size(v).map_err(|_| bad())?
            }
            ("notreelog", None) => self.treelog = false,
            ("treelog", None) => self.treelog = true,
            ("flushoncommit", None) => self.flushoncommit = true,
            ("noflushoncommit", None) => self.flushoncommit = false,
            ("ssd" | "ssd_spread", None) => (self.ssd, self.ssd_given) = (true, true),
            ("nossd" | "nossd_spread", None) => (self.ssd, self.ssd_given) = (false, true),
            (n, None) if ACCEPTED.contains(&n) => {}
            (n, Some(_)) if ACCEPTED_VALUED.contains(&n) => {}
            _ => return Err(bad()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::consts::*;

    #[test]
    fn parses_the_options_that_matter() {
        let o = MountOptions::parse(&[
            "commit=5,compress-force=zstd:9",
            "max_inline=0",
            "noatime,ssd,space_cache=v2",
            "notreelog,flushoncommit",
        ])
        .unwrap();
        assert_eq!(o.commit_interval, 5);
        assert_eq!(
            o.compress,
            Some(Method {
                kind: BTRFS_COMPRESS_ZSTD,
                level: 9
            })
        );
        assert!(o.compress_force && !o.treelog && o.flushoncommit);
        assert_eq!(o.max_inline, 0);
        let o = MountOptions::parse(&["nodatacow"]).unwrap();
        assert!(!o.datacow && !o.datasum && o.compress.is_none());
        let o = MountOptions::parse(&["compress"]).unwrap();
        assert_eq!(o.compress.map(|m| m.kind), Some(BTRFS_COMPRESS_ZLIB));
        assert!(MountOptions::parse(&["bogus"]).is_err());
        assert!(MountOptions::parse(&["compress=brotli"]).is_err());
        assert!(MountOptions::parse(&["max_inline=x"]).is_err());
    }

    /// ssd and nossd, when given, decide over the device's rotational flag.
    #[test]
    fn ssd_given_or_left_to_the_device() {
        let o = MountOptions::default();
        assert!(!o.ssd && !o.ssd_given);
        let o = MountOptions::parse(&["ssd_spread"]).unwrap();
        assert!(o.ssd && o.ssd_given);
        let o = MountOptions::parse(&["ssd,nossd"]).unwrap();
        assert!(!o.ssd && o.ssd_given);
    }
}
