//! Text rendering of tree blocks and their items, shaped line for line like
//! btrfs-progs 6.2 `print-tree.c` so the two dumps can be diffed.
//!
//! Items are read through core's typed views (`btrkit_core::format`), never
//! by byte offsets of their own. Rendering never fails: as btrfs does, the
//! fields of a fixed-size structure are read from the item's start however
//! short the item is (up to the end of the block, zero past it, see
//! [`read_lenient`]), so a damaged item prints what can be read of it
//! instead of stopping the dump, while loops over packed entries are bounded
//! by the item size.
//!
//! Output goes into one byte buffer that the caller flushes in large writes;
//! numbers are formatted by hand and no line allocates.

use btrkit_core::format::block_group::BlockGroupItem;
use btrkit_core::format::chunk::{ChunkItem, Stripe, CHUNK_ITEM_SIZE, STRIPE_SIZE};
use btrkit_core::format::consts::*;
use btrkit_core::format::dev::{DevExtent, DevItem};
use btrkit_core::format::dir::{DirItem, DirLogItem};
use btrkit_core::format::extent::{
    ExtentDataRef, ExtentInlineRef, ExtentItem, SharedDataRef, TreeBlockInfo,
};
use btrkit_core::format::file_extent::{FileExtentItem, FILE_EXTENT_INLINE_DATA_START};
use btrkit_core::format::free_space::{FreeSpaceHeader, FreeSpaceInfo};
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::inode::{InodeExtref, InodeItem, InodeRef, Timespec};
use btrkit_core::format::key::Key;
use btrkit_core::format::misc::{BalanceItem, DevReplaceItem, DiskBalanceArgs, DEV_STAT_NAMES};
use btrkit_core::format::names::{key_type_name, objectid_name, write_key, write_objectid};
use btrkit_core::format::qgroup::{QgroupInfoItem, QgroupLimitItem, QgroupStatusItem};
use btrkit_core::format::root::{RootItem, RootRef};
use btrkit_core::format::{read_lenient, Le64};
use btrkit_core::tree::Node;
use std::mem::size_of;
use zerocopy::{FromBytes, IntoBytes};

/// The structure at byte `off` of `d` (an item's bytes to the end of its
/// block), fields past the end reading as zero.
fn at<T: FromBytes + IntoBytes>(d: &[u8], off: usize) -> T {
    read_lenient(d.get(off..).unwrap_or(&[]))
}

/// Up to `len` bytes of `d` from `off`, fewer where the bytes end.
fn bytes(d: &[u8], off: usize, len: usize) -> &[u8] {
    let rest = d.get(off..).unwrap_or(&[]);
    &rest[..len.min(rest.len())]
}

/// Converts timestamps to local time as `localtime_r` does, asking libc for
/// the UTC offset only once per quarter hour of time (every zone changes its
/// offset on a quarter-hour boundary), then doing the calendar arithmetic here.
#[derive(Default)]
pub struct LocalTime {
    cache: Vec<(i64, i64)>,
    /// Month and day of the last date that fitted a C `struct tm`.
    last_md: (u32, u32),
    /// The last local day converted, and its date.
    last_day: Option<(i64, (i64, u32, u32))>,
    /// The last timestamp formatted and its text: timestamps of files
    /// created together mostly repeat the same second.
    last: Option<(i64, Vec<u8>)>,
}

impl LocalTime {
    fn offset(&mut self, t: i64) -> i64 {
        let bucket = t.div_euclid(900);
        if let Some(&(_, off)) = self.cache.iter().find(|(b, _)| *b == bucket) {
            return off;
        }
        let off = gmtoff(t);
        if self.cache.len() >= 64 {
            self.cache.clear();
        }
        self.cache.push((bucket, off));
        off
    }

    /// `YYYY-MM-DD HH:MM:SS` in local time.
    pub fn write(&mut self, o: &mut Vec<u8>, t: i64) {
        if let Some((lt, text)) = &self.last {
            if *lt == t {
                o.extend_from_slice(text);
                return;
            }
        }
        let start = o.len();
        self.format(o, t);
        let mut text = self.last.take().map(|(_, v)| v).unwrap_or_default();
        text.clear();
        text.extend_from_slice(&o[start..]);
        self.last = Some((t, text));
    }

    fn format(&mut self, o: &mut Vec<u8>, t: i64) {
        let lt = t.saturating_add(self.offset(t));
        let days = lt.div_euclid(86400);
        let secs = lt.rem_euclid(86400);
        let (mut y, mut m, mut d) = match self.last_day {
            Some((day, ymd)) if day == days => ymd,
            _ => {
                let ymd = civil_from_days(days);
                self.last_day = Some((days, ymd));
                ymd
            }
        };
        if i32::try_from(y - 1900).is_ok() {
            self.last_md = (m, d);
        } else {
            // glibc gives up on such a year after storing it truncated to
            // int and leaves month and day as they were in the caller's
            // struct tm, i.e. those of the previous timestamp btrfs printed.
            y = (y - 1900) as i32 as i64 + 1900;
            (m, d) = self.last_md;
        }
        if y < 0 {
            o.push(b'-');
        }
        u(o, y.unsigned_abs());
        o.push(b'-');
        pad2(o, m as u64);
        o.push(b'-');
        pad2(o, d as u64);
        o.push(b' ');
        pad2(o, (secs / 3600) as u64);
        o.push(b':');
        pad2(o, (secs / 60 % 60) as u64);
        o.push(b':');
        pad2(o, (secs % 60) as u64);
    }
}

fn gmtoff(t: i64) -> i64 {
    btrkit_core::io::host::local_time(t).map_or(0, |lt| lt.6)
}

/// Proleptic Gregorian date of a day count since 1970-01-01.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[inline]
pub fn s(o: &mut Vec<u8>, x: &str) {
    o.extend_from_slice(x.as_bytes());
}

/// `%llu`. The digits are built left-aligned in a fixed 20-byte array that
/// is appended whole and then cut back, which compiles to a few moves
/// instead of a variable-length copy.
#[inline]
pub fn u(o: &mut Vec<u8>, mut v: u64) {
    let mut n = 1;
    let mut p = 10u64;
    while n < 20 && v >= p {
        n += 1;
        p = p.wrapping_mul(10);
    }
    let mut b = [0u8; 20];
    let mut i = n;
    while i > 0 {
        i -= 1;
        b[i] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    let len = o.len();
    o.extend_from_slice(&b);
    o.truncate(len + n);
}

pub fn i(o: &mut Vec<u8>, v: i64) {
    if v < 0 {
        o.push(b'-');
    }
    u(o, v.unsigned_abs());
}

fn pad2(o: &mut Vec<u8>, v: u64) {
    if v < 10 {
        o.push(b'0');
    }
    u(o, v);
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `%llx`.
pub fn hex(o: &mut Vec<u8>, v: u64) {
    let mut b = [0u8; 16];
    let mut i = b.len();
    let mut v = v;
    loop {
        i -= 1;
        b[i] = HEX[(v & 15) as usize];
        v >>= 4;
        if v == 0 {
            break;
        }
    }
    o.extend_from_slice(&b[i..]);
}

/// Each byte as two lowercase hex digits.
pub fn hex_bytes(o: &mut Vec<u8>, b: &[u8]) {
    for &x in b {
        o.push(HEX[(x >> 4) as usize]);
        o.push(HEX[(x & 15) as usize]);
    }
}

/// `%o`.
fn oct(o: &mut Vec<u8>, v: u32) {
    let mut b = [0u8; 11];
    let mut i = b.len();
    let mut v = v;
    loop {
        i -= 1;
        b[i] = b'0' + (v & 7) as u8;
        v >>= 3;
        if v == 0 {
            break;
        }
    }
    o.extend_from_slice(&b[i..]);
}

pub use btrkit_core::util::uuid::{uuid_str as uuid_string, write_uuid as uuid};

/// printf `%.*s`: at most `max` bytes, stopping at a NUL.
fn cstr(o: &mut Vec<u8>, b: &[u8], max: usize) {
    let b = &b[..b.len().min(max)];
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    o.extend_from_slice(&b[..end]);
}

/// What rendering needs to know about the filesystem, plus reused buffers.
pub struct Text {
    pub out: Vec<u8>,
    pub csum_size: usize,
    pub sectorsize: u32,
    pub csum_headers: bool,
    pub csum_items: bool,
    scratch: String,
    time: LocalTime,
}

impl Text {
    pub fn new(csum_size: usize, sectorsize: u32) -> Text {
        Text {
            out: Vec::with_capacity(1 << 20),
            csum_size,
            sectorsize,
            csum_headers: false,
            csum_items: false,
            scratch: String::with_capacity(64),
            time: LocalTime::default(),
        }
    }

    /// `key (OBJ TYPE OFF)` as btrfs_print_key. The common cases are written
    /// here directly; the rare ones go through `names::write_key`, which
    /// this must agree with (a unit test compares the two).
    pub fn key(&mut self, k: &Key) {
        s(&mut self.out, "key ");
        let special = matches!(
            k.ty,
            BTRFS_PERSISTENT_ITEM_KEY
                | BTRFS_DEV_EXTENT_KEY
                | BTRFS_QGROUP_RELATION_KEY
                | BTRFS_QGROUP_INFO_KEY
                | BTRFS_QGROUP_LIMIT_KEY
                | BTRFS_UUID_KEY_SUBVOL
                | BTRFS_UUID_KEY_RECEIVED_SUBVOL
                | BTRFS_DEV_ITEM_KEY
                | BTRFS_CHUNK_ITEM_KEY
                | BTRFS_ROOT_ITEM_KEY
        ) || k.ty == 0;
        if special {
            self.scratch.clear();
            write_key(&mut self.scratch, k);
            self.out.extend_from_slice(self.scratch.as_bytes());
            return;
        }
        let o = &mut self.out;
        o.push(b'(');
        match objectid_name(k.objectid) {
            Some(n) => s(o, n),
            None => u(o, k.objectid),
        }
        o.push(b' ');
        match key_type_name(k.objectid, k.ty) {
            Some(n) => s(o, n),
            None => {
                s(o, "UNKNOWN.");
                u(o, k.ty as u64);
            }
        }
        if k.offset == u64::MAX {
            s(o, " -1)");
        } else {
            o.push(b' ');
            u(o, k.offset);
            o.push(b')');
        }
    }

    /// print_objectid with a key type.
    pub fn objectid(&mut self, id: u64, ty: u8) {
        if ty == 0 && (BTRFS_FIRST_FREE_OBJECTID..BTRFS_LAST_FREE_OBJECTID).contains(&id) {
            u(&mut self.out, id);
            return;
        }
        self.scratch.clear();
        write_objectid(&mut self.scratch, id, ty);
        self.out.extend_from_slice(self.scratch.as_bytes());
    }

    /// `sec.nsec (date)`. The seconds are signed (dump-tree prints them
    /// as unsigned: 1960 shows there as 18446744073393932416) and the
    /// nanoseconds as [`Timespec::get`] reads them (below 10^9).
    fn timespec(&mut self, prefix: &str, t: &Timespec) {
        let (sec, nsec) = t.get();
        let o = &mut self.out;
        s(o, prefix);
        if sec < 0 {
            o.push(b'-');
        }
        u(o, sec.unsigned_abs());
        o.push(b'.');
        u(o, u64::from(nsec));
        s(o, " (");
        self.time.write(o, sec);
        s(o, ")\n");
    }

    /// A whole block: header lines, then key pointers or items.
    pub fn block(&mut self, node: &Node) {
        self.header(node);
        if node.is_leaf() {
            self.leaf_items(node);
        } else {
            for p in (0..node.nr_safe()).filter_map(|slot| node.key_ptr(slot)) {
                self.out.push(b'\t');
                self.key(&Key::from(&p.key));
                s(&mut self.out, " block ");
                u(&mut self.out, p.blockptr.get());
                s(&mut self.out, " gen ");
                u(&mut self.out, p.generation.get());
                self.out.push(b'\n');
            }
        }
    }

    fn header(&mut self, node: &Node) {
        let h = node.header();
        let nr = h.nritems.get();
        let len = node.bytes().len();
        let o = &mut self.out;
        if h.level != 0 {
            s(o, "node ");
            u(o, node.bytenr);
            s(o, " level ");
            u(o, h.level as u64);
            s(o, " items ");
            u(o, nr as u64);
            s(o, " free space ");
            let per = ((len - HEADER_SIZE) / KEY_PTR_SIZE) as u32;
            u(o, per.wrapping_sub(nr) as u64);
        } else {
            s(o, "leaf ");
            u(o, h.bytenr.get());
            s(o, " items ");
            u(o, nr as u64);
            s(o, " free space ");
            i(o, leaf_free_space(node) as i64);
        }
        s(o, " generation ");
        u(o, h.generation.get());
        s(o, " owner ");
        self.objectid(h.owner.get(), 0);
        let o = &mut self.out;
        o.push(b'\n');
        s(o, if h.level != 0 { "node " } else { "leaf " });
        u(o, h.bytenr.get());
        s(o, " flags 0x");
        let flags = h.flag_bits();
        hex(o, flags);
        o.push(b'(');
        if flags & BTRFS_HEADER_FLAG_WRITTEN != 0 {
            s(o, "WRITTEN");
        }
        if flags & BTRFS_HEADER_FLAG_RELOC != 0 {
            if flags & BTRFS_HEADER_FLAG_WRITTEN != 0 {
                o.push(b'|');
            }
            s(o, "RELOC");
        }
        s(o, ") backref revision ");
        u(o, h.backref_rev() as u64);
        if self.csum_headers {
            s(o, " csum 0x");
            hex_bytes(o, &h.csum[..self.csum_size.min(h.csum.len())]);
        }
        s(o, "\nfs uuid ");
        uuid(o, &h.fsid);
        s(o, "\nchunk uuid ");
        uuid(o, &h.chunk_tree_uuid);
        o.push(b'\n');
    }

    fn leaf_items(&mut self, node: &Node) {
        let b = node.bytes();
        let data_size = b.len() - HEADER_SIZE;
        for (slot, it) in
            (0..node.nr_safe()).filter_map(|slot| node.item(slot).map(|it| (slot, it)))
        {
            let key = Key::from(&it.key);
            let (off, size) = (it.offset.get(), it.size.get());
            if off as usize > data_size || off as u64 + size as u64 > data_size as u64 {
                // btrfs stops printing the leaf here; so do we, but say why.
                s(&mut self.out, "ERROR: leaf ");
                u(&mut self.out, node.bytenr);
                s(&mut self.out, " slot ");
                u(&mut self.out, slot as u64);
                s(&mut self.out, " pointer invalid, offset ");
                u(&mut self.out, off as u64);
                s(&mut self.out, " size ");
                u(&mut self.out, size as u64);
                s(&mut self.out, " leaf data limit ");
                u(&mut self.out, data_size as u64);
                s(&mut self.out, ", skipping the remaining slots\n");
                break;
            }
            s(&mut self.out, "\titem ");
            u(&mut self.out, slot as u64);
            self.out.push(b' ');
            self.key(&key);
            s(&mut self.out, " itemoff ");
            u(&mut self.out, off as u64);
            s(&mut self.out, " itemsize ");
            u(&mut self.out, size as u64);
            self.out.push(b'\n');
            let start = HEADER_SIZE + off as usize;
            self.item(&key, &b[start..], size as usize);
        }
    }

    /// The decoded lines of one item. `d` runs from the item's first byte to
    /// the end of the block and `size` is the item size: as btrfs does, the
    /// fields of a fixed-size structure are read wherever they fall (zero
    /// past the block), while loops over packed entries stop at the item
    /// size.
    pub fn item(&mut self, key: &Key, d: &[u8], size: usize) {
        if key.ty == 0 && key.objectid == BTRFS_FREE_SPACE_OBJECTID {
            self.free_space_header(&at(d, 0));
        }
        match key.ty {
            BTRFS_INODE_ITEM_KEY => self.inode_item(&at(d, 0)),
            BTRFS_INODE_REF_KEY => self.inode_refs(d, size),
            BTRFS_INODE_EXTREF_KEY => self.inode_extrefs(d, size),
            BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => {
                self.dir_items(d, size)
            }
            BTRFS_DIR_LOG_INDEX_KEY | BTRFS_DIR_LOG_ITEM_KEY => {
                let dl: DirLogItem = at(d, 0);
                s(&mut self.out, "\t\tdir log end ");
                u(&mut self.out, dl.end.get());
                self.out.push(b'\n');
            }
            BTRFS_ORPHAN_ITEM_KEY => s(&mut self.out, "\t\torphan item\n"),
            BTRFS_ROOT_ITEM_KEY => self.root_item(d, size),
            BTRFS_ROOT_REF_KEY => self.root_ref(d, "ref"),
            BTRFS_ROOT_BACKREF_KEY => self.root_ref(d, "backref"),
            BTRFS_EXTENT_ITEM_KEY => self.extent_item(key, d, size, false),
            BTRFS_METADATA_ITEM_KEY => self.extent_item(key, d, size, true),
            BTRFS_TREE_BLOCK_REF_KEY => s(&mut self.out, "\t\ttree block backref\n"),
            BTRFS_SHARED_BLOCK_REF_KEY => s(&mut self.out, "\t\tshared block backref\n"),
            BTRFS_EXTENT_DATA_REF_KEY => self.extent_data_ref(&at(d, 0)),
            BTRFS_SHARED_DATA_REF_KEY => {
                let r: SharedDataRef = at(d, 0);
                s(&mut self.out, "\t\tshared data backref count ");
                u(&mut self.out, r.count.get() as u64);
                self.out.push(b'\n');
            }
            BTRFS_EXTENT_REF_V0_KEY => s(&mut self.out, "\t\textent ref v0 (deprecated)\n"),
            BTRFS_CSUM_ITEM_KEY => s(&mut self.out, "\t\tcsum item\n"),
            BTRFS_EXTENT_CSUM_KEY => self.extent_csum(key.offset, d, size),
            BTRFS_EXTENT_DATA_KEY => self.file_extent(&at(d, 0), size),
            BTRFS_BLOCK_GROUP_ITEM_KEY => {
                let bg: BlockGroupItem = at(d, 0);
                let o = &mut self.out;
                s(o, "\t\tblock group used ");
                u(o, bg.used.get());
                s(o, " chunk_objectid ");
                u(o, bg.chunk_objectid.get());
                s(o, " flags ");
                bg_flags(o, bg.flags.get());
                o.push(b'\n');
            }
            BTRFS_FREE_SPACE_INFO_KEY => {
                let fi: FreeSpaceInfo = at(d, 0);
                let o = &mut self.out;
                s(o, "\t\tfree space info extent count ");
                u(o, fi.extent_count.get() as u64);
                s(o, " flags ");
                u(o, fi.flags.get() as u64);
                o.push(b'\n');
            }
            BTRFS_FREE_SPACE_EXTENT_KEY => s(&mut self.out, "\t\tfree space extent\n"),
            BTRFS_FREE_SPACE_BITMAP_KEY => s(&mut self.out, "\t\tfree space bitmap\n"),
            BTRFS_CHUNK_ITEM_KEY => self.chunk(d),
            BTRFS_DEV_ITEM_KEY => self.dev_item(&at(d, 0)),
            BTRFS_DEV_EXTENT_KEY => {
                let de: DevExtent = at(d, 0);
                let o = &mut self.out;
                s(o, "\t\tdev extent chunk_tree ");
                u(o, de.chunk_tree.get());
                s(o, "\n\t\tchunk_objectid ");
                u(o, de.chunk_objectid.get());
                s(o, " chunk_offset ");
                u(o, de.chunk_offset.get());
                s(o, " length ");
                u(o, de.length.get());
                s(o, "\n\t\tchunk_tree_uuid ");
                uuid(o, &de.chunk_tree_uuid);
                o.push(b'\n');
            }
            BTRFS_QGROUP_STATUS_KEY => {
                let st: QgroupStatusItem = at(d, 0);
                let o = &mut self.out;
                s(o, "\t\tversion ");
                u(o, st.version.get());
                s(o, " generation ");
                u(o, st.generation.get());
                s(o, " flags ");
                let f = st.flags.get();
                s(
                    o,
                    if f & BTRFS_QGROUP_STATUS_FLAG_ON != 0 {
                        "ON"
                    } else {
                        "OFF"
                    },
                );
                if f & BTRFS_QGROUP_STATUS_FLAG_RESCAN != 0 {
                    s(o, "|SCANNING");
                }
                if f & BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT != 0 {
                    s(o, "|INCONSISTENT");
                }
                s(o, " scan ");
                u(o, st.rescan.get());
                o.push(b'\n');
            }
            BTRFS_QGROUP_RELATION_KEY => {}
            BTRFS_QGROUP_INFO_KEY => {
                let qi: QgroupInfoItem = at(d, 0);
                let o = &mut self.out;
                s(o, "\t\tgeneration ");
                u(o, qi.generation.get());
                s(o, "\n\t\treferenced ");
                u(o, qi.rfer.get());
                s(o, " referenced_compressed ");
                u(o, qi.rfer_cmpr.get());
                s(o, "\n\t\texclusive ");
                u(o, qi.excl.get());
                s(o, " exclusive_compressed ");
                u(o, qi.excl_cmpr.get());
                o.push(b'\n');
            }
            BTRFS_QGROUP_LIMIT_KEY => {
                let ql: QgroupLimitItem = at(d, 0);
                let o = &mut self.out;
                s(o, "\t\tflags ");
                hex(o, ql.flags.get());
                s(o, "\n\t\tmax_referenced ");
                i(o, ql.max_rfer.get() as i64);
                s(o, " max_exclusive ");
                i(o, ql.max_excl.get() as i64);
                s(o, "\n\t\trsv_referenced ");
                i(o, ql.rsv_rfer.get() as i64);
                s(o, " rsv_exclusive ");
                i(o, ql.rsv_excl.get() as i64);
                o.push(b'\n');
            }
            BTRFS_UUID_KEY_SUBVOL | BTRFS_UUID_KEY_RECEIVED_SUBVOL => {
                let o = &mut self.out;
                if !size.is_multiple_of(8) {
                    s(o, "btrfs: uuid item with illegal size ");
                    u(o, size as u64);
                    s(o, "!\n");
                } else {
                    for n in 0..size / 8 {
                        s(o, "\t\tsubvol_id ");
                        u(o, at::<Le64>(d, n * 8).get());
                        o.push(b'\n');
                    }
                }
            }
            BTRFS_STRING_ITEM_KEY => {
                s(&mut self.out, "\t\titem data ");
                cstr(&mut self.out, bytes(d, 0, size), size);
                self.out.push(b'\n');
            }
            BTRFS_PERSISTENT_ITEM_KEY => self.persistent(key, d, size),
            BTRFS_TEMPORARY_ITEM_KEY => self.temporary(key, d),
            BTRFS_DEV_REPLACE_KEY => self.dev_replace(&at(d, 0)),
            // btrfs 6.2 prints nothing for other types; show the bytes.
            _ if size > 0 && !(key.ty == 0 && key.objectid == BTRFS_FREE_SPACE_OBJECTID) => {
                self.raw(bytes(d, 0, size))
            }
            _ => {}
        }
    }

    fn free_space_header(&mut self, h: &FreeSpaceHeader) {
        s(&mut self.out, "\t\tlocation ");
        self.key(&Key::from(&h.location));
        let o = &mut self.out;
        s(o, "\n\t\tcache generation ");
        u(o, h.generation.get());
        s(o, " entries ");
        u(o, h.num_entries.get());
        s(o, " bitmaps ");
        u(o, h.num_bitmaps.get());
        o.push(b'\n');
    }

    fn inode_item(&mut self, ii: &InodeItem) {
        let o = &mut self.out;
        s(o, "\t\tgeneration ");
        u(o, ii.generation.get());
        s(o, " transid ");
        u(o, ii.transid.get());
        s(o, " size ");
        u(o, ii.size.get());
        s(o, " nbytes ");
        u(o, ii.nbytes.get());
        s(o, "\n\t\tblock group ");
        u(o, ii.block_group.get());
        s(o, " mode ");
        oct(o, ii.mode.get());
        s(o, " links ");
        u(o, ii.nlink.get() as u64);
        s(o, " uid ");
        u(o, ii.uid.get() as u64);
        s(o, " gid ");
        u(o, ii.gid.get() as u64);
        s(o, " rdev ");
        u(o, ii.rdev.get());
        s(o, "\n\t\tsequence ");
        u(o, ii.sequence.get());
        s(o, " flags 0x");
        let flags = ii.flags.get();
        hex(o, flags);
        o.push(b'(');
        inode_flags(o, flags);
        s(o, ")\n");
        self.timespec("\t\tatime ", &ii.atime);
        self.timespec("\t\tctime ", &ii.ctime);
        self.timespec("\t\tmtime ", &ii.mtime);
        self.timespec("\t\totime ", &ii.otime);
    }

    fn inode_refs(&mut self, d: &[u8], size: usize) {
        let head = size_of::<InodeRef>();
        let mut cur = 0;
        while cur < size {
            let r: InodeRef = at(d, cur);
            let name_len = r.name_len.get() as usize;
            let o = &mut self.out;
            s(o, "\t\tindex ");
            u(o, r.index.get());
            s(o, " namelen ");
            u(o, name_len as u64);
            s(o, " name: ");
            cstr(o, bytes(d, cur + head, name_len), BTRFS_NAME_LEN);
            o.push(b'\n');
            cur += head + name_len;
        }
    }

    fn inode_extrefs(&mut self, d: &[u8], size: usize) {
        let head = size_of::<InodeExtref>();
        let mut cur = 0;
        while cur < size {
            let r: InodeExtref = at(d, cur);
            let name_len = r.name_len.get() as usize;
            let o = &mut self.out;
            s(o, "\t\tindex ");
            u(o, r.index.get());
            s(o, " parent ");
            u(o, r.parent_objectid.get());
            s(o, " namelen ");
            u(o, name_len as u64);
            s(o, " name: ");
            cstr(o, bytes(d, cur + head, name_len), BTRFS_NAME_LEN);
            o.push(b'\n');
            cur += head + name_len;
        }
    }

    fn dir_items(&mut self, d: &[u8], size: usize) {
        let head = size_of::<DirItem>();
        let mut cur = 0;
        while cur < size {
            let e: DirItem = at(d, cur);
            s(&mut self.out, "\t\tlocation ");
            self.key(&Key::from(&e.location));
            let o = &mut self.out;
            s(o, " type ");
            match e.type_ {
                BTRFS_FT_REG_FILE => s(o, "FILE"),
                BTRFS_FT_DIR => s(o, "DIR"),
                BTRFS_FT_CHRDEV => s(o, "CHRDEV"),
                BTRFS_FT_BLKDEV => s(o, "BLKDEV"),
                BTRFS_FT_FIFO => s(o, "FIFO"),
                BTRFS_FT_SOCK => s(o, "SOCK"),
                BTRFS_FT_SYMLINK => s(o, "SYMLINK"),
                BTRFS_FT_XATTR => s(o, "XATTR"),
                ty => {
                    s(o, "DIR_ITEM.");
                    u(o, ty as u64);
                }
            }
            let data_len = e.data_len.get() as usize;
            let name_len = e.name_len.get() as usize;
            s(o, "\n\t\ttransid ");
            u(o, e.transid.get());
            s(o, " data_len ");
            u(o, data_len as u64);
            s(o, " name_len ");
            u(o, name_len as u64);
            s(o, "\n\t\tname: ");
            cstr(o, bytes(d, cur + head, name_len), BTRFS_NAME_LEN);
            o.push(b'\n');
            if data_len > 0 {
                s(o, "\t\tdata ");
                cstr(o, bytes(d, cur + head + name_len, data_len), BTRFS_NAME_LEN);
                o.push(b'\n');
            }
            cur += head + name_len + data_len;
        }
    }

    fn root_item(&mut self, d: &[u8], size: usize) {
        // btrfs copies the item into a zeroed root item: bytes past the item
        // read as zero (legacy 239-byte items have no v2 fields).
        let ri: RootItem = read_lenient(bytes(d, 0, size));
        let o = &mut self.out;
        let gen = ri.generation.get();
        s(o, "\t\tgeneration ");
        u(o, gen);
        s(o, " root_dirid ");
        u(o, ri.root_dirid.get());
        s(o, " bytenr ");
        u(o, ri.bytenr.get());
        s(o, " byte_limit ");
        u(o, ri.byte_limit.get());
        s(o, " bytes_used ");
        u(o, ri.bytes_used.get());
        s(o, "\n\t\tlast_snapshot ");
        u(o, ri.last_snapshot.get());
        s(o, " flags 0x");
        let flags = ri.flags.get();
        hex(o, flags);
        s(
            o,
            if flags & BTRFS_ROOT_SUBVOL_RDONLY != 0 {
                "(RDONLY)"
            } else {
                "(none)"
            },
        );
        s(o, " refs ");
        u(o, ri.refs.get() as u64);
        s(o, "\n\t\tdrop_progress ");
        self.key(&Key::from(&ri.drop_progress));
        let o = &mut self.out;
        s(o, " drop_level ");
        u(o, ri.drop_level as u64);
        s(o, "\n\t\tlevel ");
        u(o, ri.level as u64);
        s(o, " generation_v2 ");
        u(o, ri.generation_v2.get());
        o.push(b'\n');
        if ri.has_v2() {
            for (name, id) in [
                ("uuid", &ri.uuid),
                ("parent_uuid", &ri.parent_uuid),
                ("received_uuid", &ri.received_uuid),
            ] {
                s(o, "\t\t");
                s(o, name);
                o.push(b' ');
                uuid(o, id);
                o.push(b'\n');
            }
            s(o, "\t\tctransid ");
            u(o, ri.ctransid.get());
            s(o, " otransid ");
            u(o, ri.otransid.get());
            s(o, " stransid ");
            u(o, ri.stransid.get());
            s(o, " rtransid ");
            u(o, ri.rtransid.get());
            o.push(b'\n');
            self.timespec("\t\tctime ", &ri.ctime);
            self.timespec("\t\totime ", &ri.otime);
            self.timespec("\t\tstime ", &ri.stime);
            self.timespec("\t\trtime ", &ri.rtime);
        }
    }

    fn root_ref(&mut self, d: &[u8], tag: &str) {
        let r: RootRef = at(d, 0);
        let o = &mut self.out;
        let n = r.name_len.get() as usize;
        s(o, "\t\troot ");
        s(o, tag);
        s(o, " key dirid ");
        u(o, r.dirid.get());
        s(o, " sequence ");
        u(o, r.sequence.get());
        s(o, " name ");
        cstr(o, bytes(d, size_of::<RootRef>(), n), n);
        o.push(b'\n');
    }

    fn extent_data_ref(&mut self, r: &ExtentDataRef) {
        s(&mut self.out, "\t\textent data backref root ");
        self.objectid(r.root.get(), 0);
        let o = &mut self.out;
        s(o, " objectid ");
        u(o, r.objectid.get());
        s(o, " offset ");
        u(o, r.offset.get());
        s(o, " count ");
        u(o, r.count.get() as u64);
        o.push(b'\n');
    }

    fn extent_item(&mut self, key: &Key, d: &[u8], size: usize, metadata: bool) {
        if size < size_of::<ExtentItem>() {
            return;
        }
        let ei: ExtentItem = at(d, 0);
        let flags = ei.flags.get();
        let o = &mut self.out;
        s(o, "\t\trefs ");
        u(o, ei.refs.get());
        s(o, " gen ");
        u(o, ei.generation.get());
        s(o, " flags ");
        if flags & BTRFS_EXTENT_FLAG_DATA != 0 {
            s(o, "DATA");
        }
        if flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 {
            if flags & BTRFS_EXTENT_FLAG_DATA != 0 {
                o.push(b'|');
            }
            s(o, "TREE_BLOCK");
        }
        if flags & BTRFS_BLOCK_FLAG_FULL_BACKREF != 0 {
            s(o, "|FULL_BACKREF");
        }
        o.push(b'\n');
        let mut p = size_of::<ExtentItem>();
        if flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 && !metadata {
            let tb: TreeBlockInfo = at(d, p);
            s(o, "\t\ttree block ");
            self.key(&Key::from(&tb.key));
            let o = &mut self.out;
            s(o, " level ");
            u(o, tb.level as u64);
            o.push(b'\n');
            p += size_of::<TreeBlockInfo>();
        } else if metadata {
            s(o, "\t\ttree block skinny level ");
            i(o, key.offset as i32 as i64);
            o.push(b'\n');
        }
        // Each inline ref: its type and offset, then for data refs the rest
        // of the ref (an extent data ref overlays the offset field).
        let head = size_of::<ExtentInlineRef>();
        while p < size {
            let r: ExtentInlineRef = at(d, p);
            let len = match r.type_ {
                BTRFS_TREE_BLOCK_REF_KEY => {
                    s(&mut self.out, "\t\ttree block backref root ");
                    self.objectid(r.offset.get(), 0);
                    self.out.push(b'\n');
                    head
                }
                BTRFS_SHARED_BLOCK_REF_KEY => {
                    s(&mut self.out, "\t\tshared block backref parent ");
                    u(&mut self.out, r.offset.get());
                    self.out.push(b'\n');
                    head
                }
                BTRFS_EXTENT_DATA_REF_KEY => {
                    self.extent_data_ref(&at(d, p + 1));
                    1 + size_of::<ExtentDataRef>()
                }
                BTRFS_SHARED_DATA_REF_KEY => {
                    let sd: SharedDataRef = at(d, p + head);
                    let o = &mut self.out;
                    s(o, "\t\tshared data backref parent ");
                    u(o, r.offset.get());
                    s(o, " count ");
                    u(o, sd.count.get() as u64);
                    o.push(b'\n');
                    head + size_of::<SharedDataRef>()
                }
                _ => return,
            };
            p += len;
        }
    }

    fn extent_csum(&mut self, start: u64, d: &[u8], size: usize) {
        let cs = self.csum_size.max(1);
        let len = ((size / cs) as u32).wrapping_mul(self.sectorsize);
        let o = &mut self.out;
        s(o, "\t\trange start ");
        u(o, start);
        s(o, " end ");
        u(o, start.wrapping_add(len as u64));
        s(o, " length ");
        u(o, len as u64);
        o.push(b'\n');
        if self.csum_items {
            // As many checksums a line as fit in 32 bytes of hex, at least one.
            let per_line = (BTRFS_CSUM_SIZE / cs / 2).max(1);
            let mut off = start;
            for (n, c) in bytes(d, 0, size).chunks_exact(cs).enumerate() {
                if n == 0 {
                    s(o, "\t\t");
                } else if n % per_line == 0 {
                    s(o, "\n\t\t");
                } else {
                    o.push(b' ');
                }
                o.push(b'[');
                u(o, off);
                s(o, "] 0x");
                hex_bytes(o, c);
                off = off.wrapping_add(self.sectorsize as u64);
            }
            o.push(b'\n');
        }
    }

    fn file_extent(&mut self, fe: &FileExtentItem, size: usize) {
        let o = &mut self.out;
        let ty = fe.type_;
        s(o, "\t\tgeneration ");
        u(o, fe.generation.get());
        s(o, " type ");
        u(o, ty as u64);
        s(
            o,
            match ty {
                BTRFS_FILE_EXTENT_INLINE => " (inline)\n",
                BTRFS_FILE_EXTENT_PREALLOC => " (prealloc)\n",
                BTRFS_FILE_EXTENT_REG => " (regular)\n",
                _ => " (unknown)\n",
            },
        );
        if ty == BTRFS_FILE_EXTENT_INLINE {
            s(o, "\t\tinline extent data size ");
            u(
                o,
                (size as u32).wrapping_sub(FILE_EXTENT_INLINE_DATA_START as u32) as u64,
            );
            s(o, " ram_bytes ");
            u(o, fe.ram_bytes.get());
            s(o, " compression ");
            compression(o, fe.compression);
            o.push(b'\n');
            return;
        }
        let word = if ty == BTRFS_FILE_EXTENT_PREALLOC {
            "\t\tprealloc"
        } else {
            "\t\textent"
        };
        s(o, word);
        s(o, " data disk byte ");
        u(o, fe.disk_bytenr.get());
        s(o, " nr ");
        u(o, fe.disk_num_bytes.get());
        o.push(b'\n');
        s(o, word);
        s(o, " data offset ");
        u(o, fe.offset.get());
        s(o, " nr ");
        u(o, fe.num_bytes.get());
        if ty == BTRFS_FILE_EXTENT_PREALLOC {
            o.push(b'\n');
            return;
        }
        s(o, " ram ");
        u(o, fe.ram_bytes.get());
        s(o, "\n\t\textent compression ");
        compression(o, fe.compression);
        o.push(b'\n');
    }

    fn chunk(&mut self, d: &[u8]) {
        let c: ChunkItem = at(d, 0);
        let o = &mut self.out;
        let n = c.num_stripes.get();
        if n < 1 {
            s(o, "invalid num_stripes: ");
            u(o, n as u64);
            o.push(b'\n');
            return;
        }
        // btrfs checks the stripes against the end of the block, not the item.
        if d.len() < CHUNK_ITEM_SIZE + STRIPE_SIZE * n as usize {
            s(o, "\t\tchunk item invalid\n");
            return;
        }
        s(o, "\t\tlength ");
        u(o, c.length.get());
        s(o, " owner ");
        u(o, c.owner.get());
        s(o, " stripe_len ");
        u(o, c.stripe_len.get());
        s(o, " type ");
        bg_flags(o, c.type_.get());
        s(o, "\n\t\tio_align ");
        u(o, c.io_align.get() as u64);
        s(o, " io_width ");
        u(o, c.io_width.get() as u64);
        s(o, " sector_size ");
        u(o, c.sector_size.get() as u64);
        s(o, "\n\t\tnum_stripes ");
        u(o, n as u64);
        s(o, " sub_stripes ");
        u(o, c.sub_stripes.get() as u64);
        o.push(b'\n');
        for k in 0..n as usize {
            let st: Stripe = at(d, CHUNK_ITEM_SIZE + k * STRIPE_SIZE);
            s(o, "\t\t\tstripe ");
            u(o, k as u64);
            s(o, " devid ");
            u(o, st.devid.get());
            s(o, " offset ");
            u(o, st.offset.get());
            s(o, "\n\t\t\tdev_uuid ");
            uuid(o, &st.dev_uuid);
            o.push(b'\n');
        }
    }

    fn dev_item(&mut self, di: &DevItem) {
        let o = &mut self.out;
        s(o, "\t\tdevid ");
        u(o, di.devid.get());
        s(o, " total_bytes ");
        u(o, di.total_bytes.get());
        s(o, " bytes_used ");
        u(o, di.bytes_used.get());
        s(o, "\n\t\tio_align ");
        u(o, di.io_align.get() as u64);
        s(o, " io_width ");
        u(o, di.io_width.get() as u64);
        s(o, " sector_size ");
        u(o, di.sector_size.get() as u64);
        s(o, " type ");
        u(o, di.type_.get());
        s(o, "\n\t\tgeneration ");
        u(o, di.generation.get());
        s(o, " start_offset ");
        u(o, di.start_offset.get());
        s(o, " dev_group ");
        u(o, di.dev_group.get() as u64);
        s(o, "\n\t\tseek_speed ");
        u(o, di.seek_speed as u64);
        s(o, " bandwidth ");
        u(o, di.bandwidth as u64);
        s(o, "\n\t\tuuid ");
        uuid(o, &di.uuid);
        s(o, "\n\t\tfsid ");
        uuid(o, &di.fsid);
        o.push(b'\n');
    }

    fn persistent(&mut self, key: &Key, d: &[u8], size: usize) {
        s(&mut self.out, "\t\tpersistent item objectid ");
        self.objectid(key.objectid, BTRFS_PERSISTENT_ITEM_KEY);
        let o = &mut self.out;
        s(o, " offset ");
        u(o, key.offset);
        o.push(b'\n');
        if key.objectid != BTRFS_DEV_STATS_OBJECTID {
            s(o, "\t\tunknown persistent item objectid ");
            u(o, key.objectid);
            o.push(b'\n');
            return;
        }
        // An array of 64-bit counters, named as far as btrfs knows them.
        let value = |n: usize| at::<Le64>(d, n * 8).get();
        s(o, "\t\tdevice stats\n");
        for (n, name) in DEV_STAT_NAMES.iter().enumerate() {
            s(o, if n == 0 { "\t\t" } else { " " });
            s(o, name);
            o.push(b' ');
            u(o, value(n));
        }
        o.push(b'\n');
        let known = DEV_STAT_NAMES.len() * 8;
        if known < size {
            // btrfs 6.2 ends this line without a newline; so do we.
            s(o, "\t\tunknown stats item bytes ");
            u(o, (size - known) as u64);
            let mut n = DEV_STAT_NAMES.len();
            while n * 8 < size {
                s(o, "\t\tunknown item ");
                u(o, n as u64);
                s(o, " offset ");
                u(o, (n * 8) as u64);
                s(o, " value ");
                u(o, value(n));
                o.push(b'\n');
                n += 1;
            }
        }
    }

    fn temporary(&mut self, key: &Key, d: &[u8]) {
        s(&mut self.out, "\t\ttemporary item objectid ");
        self.objectid(key.objectid, BTRFS_TEMPORARY_ITEM_KEY);
        let o = &mut self.out;
        s(o, " offset ");
        u(o, key.offset);
        o.push(b'\n');
        match key.objectid {
            BTRFS_BALANCE_OBJECTID => {
                let b: BalanceItem = at(d, 0);
                s(o, "\t\tbalance status flags ");
                u(o, b.flags.get());
                o.push(b'\n');
                for (name, args) in [("DATA", &b.data), ("METADATA", &b.meta), ("SYSTEM", &b.sys)] {
                    s(o, "\t\t");
                    s(o, name);
                    o.push(b'\n');
                    balance_args(o, args);
                }
            }
            // The csum-conversion root of btrfstune (BTRFS_CSUM_TREE_TMP_OBJECTID).
            13 => {
                s(o, "\t\tcsum tree tmp root ");
                u(o, key.offset);
                o.push(b'\n');
            }
            id => {
                s(o, "\t\tunknown temporary item objectid ");
                u(o, id);
                o.push(b'\n');
            }
        }
    }

    /// Not printed by btrfs 6.2; the layout of later btrfs-progs.
    fn dev_replace(&mut self, r: &DevReplaceItem) {
        let o = &mut self.out;
        s(o, "\t\tsrc devid ");
        i(o, r.src_devid.get() as i64);
        s(o, " cursor left ");
        u(o, r.cursor_left.get());
        s(o, " cursor right ");
        u(o, r.cursor_right.get());
        s(o, " mode ");
        match r.cont_reading_from_srcdev_mode.get() {
            0 => s(o, "ALWAYS"),
            1 => s(o, "AVOID"),
            m => {
                s(o, "unknown(");
                u(o, m);
                o.push(b')');
            }
        }
        s(o, "\n\t\tstate ");
        match r.replace_state.get() {
            0 => s(o, "NEVER_STARTED"),
            1 => s(o, "STARTED"),
            2 => s(o, "FINISHED"),
            3 => s(o, "CANCELED"),
            4 => s(o, "SUSPENDED"),
            m => {
                s(o, "unknown(");
                u(o, m);
                o.push(b')');
            }
        }
        s(o, " write errors ");
        u(o, r.num_write_errors.get());
        s(o, " uncorrectable read errors ");
        u(o, r.num_uncorrectable_read_errors.get());
        o.push(b'\n');
        for (name, t) in [
            ("\t\tstart time ", r.time_started.get()),
            ("\t\tstop time ", r.time_stopped.get()),
        ] {
            s(&mut self.out, name);
            u(&mut self.out, t);
            s(&mut self.out, " (");
            self.time.write(&mut self.out, t as i64);
            s(&mut self.out, ")\n");
        }
    }

    /// Bytes of an item type btrfs does not decode, 32 to a line.
    fn raw(&mut self, b: &[u8]) {
        let o = &mut self.out;
        s(o, "\t\tdata (");
        u(o, b.len() as u64);
        s(o, " bytes)\n");
        for line in b.chunks(32) {
            s(o, "\t\t\t");
            hex_bytes(o, line);
            o.push(b'\n');
        }
    }
}

/// btrfs_leaf_free_space, in the same 32-bit arithmetic.
pub fn leaf_free_space(node: &Node) -> i32 {
    let b = node.bytes();
    let data_size = (b.len() - HEADER_SIZE) as i32;
    let nr = node.nritems();
    if nr == 0 {
        return data_size;
    }
    // Offset and size of an item header (zero where there is none).
    let item = |slot: usize| {
        node.item(slot)
            .map_or((0, 0), |it| (it.offset.get(), it.size.get()))
    };
    let first = item(0);
    let last = item(nr.min(node.nr_safe()).saturating_sub(1));
    let used = (first.0.wrapping_add(first.1) as i32)
        .wrapping_sub(last.0 as i32)
        .wrapping_add((ITEM_SIZE as i32).wrapping_mul(nr as i32));
    data_size.wrapping_sub(used)
}

fn compression(o: &mut Vec<u8>, c: u8) {
    u(o, c as u64);
    match btrkit_core::format::names::compression_name(c) {
        Some(name) => {
            s(o, " (");
            s(o, name);
            o.push(b')');
        }
        None => {
            s(o, " (UNKNOWN.");
            u(o, c as u64);
            o.push(b')');
        }
    }
}

fn inode_flags(o: &mut Vec<u8>, flags: u64) {
    use btrkit_core::format::names::{INODE_FLAG_NAMES, PROGS_INODE_FLAGS};
    let mut empty = true;
    for &(bit, name) in &INODE_FLAG_NAMES[..PROGS_INODE_FLAGS] {
        if flags & bit != 0 {
            if !empty {
                o.push(b'|');
            }
            s(o, name);
            empty = false;
        }
    }
    if empty {
        s(o, "none");
    }
}

/// bg_flags_to_str of btrfs 6.2, quirks included: SYSTEM after METADATA gets
/// no separator.
pub fn bg_flags(o: &mut Vec<u8>, flags: u64) {
    let data = flags & BTRFS_BLOCK_GROUP_DATA != 0;
    if data {
        s(o, "DATA");
    }
    if flags & BTRFS_BLOCK_GROUP_METADATA != 0 {
        if data {
            o.push(b'|');
        }
        s(o, "METADATA");
    }
    if flags & BTRFS_BLOCK_GROUP_SYSTEM != 0 {
        if data {
            o.push(b'|');
        }
        s(o, "SYSTEM");
    }
    let profile = if flags & BTRFS_BLOCK_GROUP_RAID10 != 0 {
        "RAID10"
    } else if flags & BTRFS_BLOCK_GROUP_RAID1 != 0 {
        "RAID1"
    } else if flags & BTRFS_BLOCK_GROUP_RAID1C3 != 0 {
        "RAID1C3"
    } else if flags & BTRFS_BLOCK_GROUP_RAID1C4 != 0 {
        "RAID1C4"
    } else if flags & BTRFS_BLOCK_GROUP_DUP != 0 {
        "DUP"
    } else if flags & BTRFS_BLOCK_GROUP_RAID0 != 0 {
        "RAID0"
    } else if flags & BTRFS_BLOCK_GROUP_RAID5 != 0 {
        "RAID5"
    } else if flags & BTRFS_BLOCK_GROUP_RAID6 != 0 {
        "RAID6"
    } else {
        // btrfs 6.2 names the single profile in lower case.
        "single"
    };
    o.push(b'|');
    s(o, profile);
}

fn balance_args(o: &mut Vec<u8>, a: &DiskBalanceArgs) {
    // usage, limit and stripes each hold a min (low half) and a max (high half).
    let (usage, limit, stripes) = (a.usage.get(), a.limit.get(), a.stripes.get());
    s(o, "\t\tprofiles ");
    u(o, a.profiles.get());
    s(o, " devid ");
    u(o, a.devid.get());
    s(o, " target ");
    u(o, a.target.get());
    s(o, " flags ");
    u(o, a.flags.get());
    s(o, "\n\t\tusage_min ");
    u(o, usage as u32 as u64);
    s(o, " usage_max ");
    u(o, usage >> 32);
    s(o, " pstart ");
    u(o, a.pstart.get());
    s(o, " pend ");
    u(o, a.pend.get());
    s(o, "\n\t\tvstart ");
    u(o, a.vstart.get());
    s(o, " vend ");
    u(o, a.vend.get());
    s(o, " limit_min ");
    u(o, limit as u32 as u64);
    s(o, " limit_max ");
    u(o, limit >> 32);
    s(o, "\n\t\tstripes_min ");
    u(o, stripes as u32 as u64);
    s(o, " stripes_max ");
    u(o, stripes >> 32);
    o.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> Text {
        Text::new(4, 4096)
    }
    fn out(t: &Text) -> &str {
        std::str::from_utf8(&t.out).unwrap()
    }

    #[test]
    fn numbers_and_dates() {
        let mut o = Vec::new();
        u(&mut o, 0);
        o.push(b' ');
        u(&mut o, u64::MAX);
        o.push(b' ');
        i(&mut o, -5);
        o.push(b' ');
        hex(&mut o, 0x1f);
        o.push(b' ');
        oct(&mut o, 0o100644);
        assert_eq!(
            std::str::from_utf8(&o).unwrap(),
            "0 18446744073709551615 -5 1f 100644"
        );
        for v in [
            1u64,
            9,
            10,
            99,
            100,
            12345,
            9_999_999_999,
            10_000_000_000_000_000_000,
        ] {
            let mut o = Vec::new();
            u(&mut o, v);
            assert_eq!(std::str::from_utf8(&o).unwrap(), v.to_string());
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn inode_ref_item() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u64.to_le_bytes());
        d.extend_from_slice(&5u16.to_le_bytes());
        d.extend_from_slice(b"hello");
        let mut t = text();
        t.item(&Key::new(257, BTRFS_INODE_REF_KEY, 256), &d, d.len());
        assert_eq!(out(&t), "\t\tindex 3 namelen 5 name: hello\n");
    }

    #[test]
    fn dir_item_with_data() {
        let mut d = Vec::new();
        d.extend_from_slice(&[0u8; 17]);
        d.extend_from_slice(&7u64.to_le_bytes());
        d.extend_from_slice(&3u16.to_le_bytes());
        d.extend_from_slice(&8u16.to_le_bytes());
        d.push(BTRFS_FT_XATTR);
        d.extend_from_slice(b"user.foobar");
        let mut t = text();
        t.item(&Key::new(257, BTRFS_XATTR_ITEM_KEY, 1), &d, d.len());
        assert_eq!(
            out(&t),
            "\t\tlocation key (0 UNKNOWN.0 0) type XATTR\n\t\ttransid 7 data_len 3 name_len 8\n\t\tname: user.foo\n\t\tdata bar\n"
        );
    }

    #[test]
    fn extent_item_with_inline_refs() {
        let mut d = Vec::new();
        d.extend_from_slice(&2u64.to_le_bytes());
        d.extend_from_slice(&9u64.to_le_bytes());
        d.extend_from_slice(&BTRFS_EXTENT_FLAG_DATA.to_le_bytes());
        d.push(BTRFS_EXTENT_DATA_REF_KEY);
        for v in [5u64, 257, 0] {
            d.extend_from_slice(&v.to_le_bytes());
        }
        d.extend_from_slice(&1u32.to_le_bytes());
        d.push(BTRFS_SHARED_DATA_REF_KEY);
        d.extend_from_slice(&30408704u64.to_le_bytes());
        d.extend_from_slice(&1u32.to_le_bytes());
        let mut t = text();
        t.item(
            &Key::new(13631488, BTRFS_EXTENT_ITEM_KEY, 4096),
            &d,
            d.len(),
        );
        assert_eq!(
            out(&t),
            "\t\trefs 2 gen 9 flags DATA\n\
             \t\textent data backref root FS_TREE objectid 257 offset 0 count 1\n\
             \t\tshared data backref parent 30408704 count 1\n"
        );
    }

    #[test]
    fn skinny_metadata_item() {
        let mut d = Vec::new();
        d.extend_from_slice(&1u64.to_le_bytes());
        d.extend_from_slice(&6u64.to_le_bytes());
        d.extend_from_slice(&BTRFS_EXTENT_FLAG_TREE_BLOCK.to_le_bytes());
        d.push(BTRFS_TREE_BLOCK_REF_KEY);
        d.extend_from_slice(&2u64.to_le_bytes());
        let mut t = text();
        t.item(&Key::new(30408704, BTRFS_METADATA_ITEM_KEY, 0), &d, d.len());
        assert_eq!(
            out(&t),
            "\t\trefs 1 gen 6 flags TREE_BLOCK\n\t\ttree block skinny level 0\n\t\ttree block backref root EXTENT_TREE\n"
        );
    }

    #[test]
    fn file_extents() {
        let mut d = vec![0u8; 53];
        d[0] = 7;
        d[8..16].copy_from_slice(&8192u64.to_le_bytes());
        d[16] = BTRFS_COMPRESS_ZSTD;
        d[20] = BTRFS_FILE_EXTENT_REG;
        d[21..29].copy_from_slice(&13631488u64.to_le_bytes());
        d[29..37].copy_from_slice(&4096u64.to_le_bytes());
        d[45..53].copy_from_slice(&8192u64.to_le_bytes());
        let mut t = text();
        t.item(&Key::new(257, BTRFS_EXTENT_DATA_KEY, 0), &d, d.len());
        assert_eq!(
            out(&t),
            "\t\tgeneration 7 type 1 (regular)\n\t\textent data disk byte 13631488 nr 4096\n\
             \t\textent data offset 0 nr 8192 ram 8192\n\t\textent compression 3 (zstd)\n"
        );
        let mut t = text();
        let mut d = vec![0u8; 21 + 10];
        d[8] = 10;
        t.item(&Key::new(257, BTRFS_EXTENT_DATA_KEY, 0), &d, d.len());
        assert_eq!(
            out(&t),
            "\t\tgeneration 0 type 0 (inline)\n\t\tinline extent data size 10 ram_bytes 10 compression 0 (none)\n"
        );
    }

    #[test]
    fn truncated_item_reads_zero_and_unknown_is_raw() {
        let mut t = text();
        t.item(&Key::new(1, BTRFS_DEV_EXTENT_KEY, 0), &[1, 0], 2);
        assert!(out(&t).starts_with("\t\tdev extent chunk_tree 1\n\t\tchunk_objectid 0 "));
        let mut t = text();
        t.item(&Key::new(257, 99, 0), &[0xab, 0x01], 2);
        assert_eq!(out(&t), "\t\tdata (2 bytes)\n\t\t\tab01\n");
        assert!(std::panic::catch_unwind(|| {
            let mut t = text();
            for ty in 0..=255u8 {
                t.item(&Key::new(256, ty, 0), &[0xff; 7], 4000);
            }
        })
        .is_ok());
    }

    #[test]
    fn keys_agree_with_names_write_key() {
        let ids = [
            0u64,
            1,
            2,
            3,
            4,
            5,
            6,
            7,
            9,
            10,
            11,
            255,
            256,
            257,
            1 << 20,
            u64::MAX,
            u64::MAX - 8,
            u64::MAX - 10,
        ];
        let offs = [0u64, 1, 5, 256, 1 << 48 | 5, u64::MAX, u64::MAX - 8];
        for &id in &ids {
            for ty in 0..=255u8 {
                for &off in &offs {
                    let k = Key::new(id, ty, off);
                    let mut t = text();
                    t.key(&k);
                    assert_eq!(
                        out(&t),
                        format!("key {}", btrkit_core::format::names::key_string(&k)),
                        "{k:?}"
                    );
                }
            }
            let mut t = text();
            t.objectid(id, 0);
            let mut want = String::new();
            write_objectid(&mut want, id, 0);
            assert_eq!(out(&t), want);
        }
    }

    #[test]
    fn local_time_matches_libc() {
        let mut lt = LocalTime::default();
        let mut t = -2_000_000_000i64;
        while t < 4_000_000_000 {
            let mut o = Vec::new();
            lt.write(&mut o, t);
            let (y, mo, d, h, mi, se, _) = btrkit_core::io::host::local_time(t).unwrap();
            let want = format!("{y}-{mo:02}-{d:02} {h:02}:{mi:02}:{se:02}");
            assert_eq!(std::str::from_utf8(&o).unwrap(), want, "t={t}");
            t += 7_777_777;
        }
    }

    #[test]
    fn inode_item_lines() {
        let mut d = vec![0u8; 160];
        d[0] = 6; // generation
        d[8] = 7; // transid
        d[16..24].copy_from_slice(&4096u64.to_le_bytes());
        d[40] = 1; // nlink
        d[52..56].copy_from_slice(&0o100644u32.to_le_bytes());
        d[64] = (BTRFS_INODE_NODATASUM | BTRFS_INODE_PREALLOC) as u8;
        d[120..124].copy_from_slice(&17u32.to_le_bytes()); // atime nsec
        let mut t = text();
        t.item(&Key::new(257, BTRFS_INODE_ITEM_KEY, 0), &d, d.len());
        let s = out(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "\t\tgeneration 6 transid 7 size 4096 nbytes 0");
        assert_eq!(
            lines[1],
            "\t\tblock group 0 mode 100644 links 1 uid 0 gid 0 rdev 0"
        );
        assert_eq!(lines[2], "\t\tsequence 0 flags 0x11(NODATASUM|PREALLOC)");
        assert!(lines[3].starts_with("\t\tatime 0.17 ("), "{}", lines[3]);
        assert!(lines[6].starts_with("\t\totime 0.0 ("));
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn times_before_1970_are_negative() {
        let mut d = vec![0u8; 160];
        // atime 1969-12-31 23:59:59.5, mtime 1960-01-01, ctime with a
        // nanosecond count no kernel writes.
        d[112..120].copy_from_slice(&(-1i64).to_le_bytes());
        d[120..124].copy_from_slice(&500_000_000u32.to_le_bytes());
        d[124..132].copy_from_slice(&5i64.to_le_bytes());
        d[132..136].copy_from_slice(&u32::MAX.to_le_bytes());
        d[136..144].copy_from_slice(&(-315_619_200i64).to_le_bytes());
        let mut t = text();
        t.item(&Key::new(257, BTRFS_INODE_ITEM_KEY, 0), &d, d.len());
        let s = out(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert!(
            lines[3].starts_with("\t\tatime -1.500000000 ("),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("\t\tctime 5.999999999 ("),
            "{}",
            lines[4]
        );
        assert!(
            lines[5].starts_with("\t\tmtime -315619200.0 ("),
            "{}",
            lines[5]
        );
    }

    #[test]
    fn legacy_root_item_has_no_v2_lines() {
        let mut d = vec![0u8; 239];
        d[160] = 9; // generation
        d[176..184].copy_from_slice(&30408704u64.to_le_bytes());
        d[238] = 1; // level
        let mut t = text();
        t.item(&Key::new(5, BTRFS_ROOT_ITEM_KEY, 0), &d, d.len());
        assert_eq!(
            out(&t),
            "\t\tgeneration 9 root_dirid 0 bytenr 30408704 byte_limit 0 bytes_used 0\n\
             \t\tlast_snapshot 0 flags 0x0(none) refs 0\n\
             \t\tdrop_progress key (0 UNKNOWN.0 0) drop_level 0\n\
             \t\tlevel 1 generation_v2 0\n"
        );
    }

    #[test]
    fn chunk_item_with_two_stripes() {
        let mut d = vec![0u8; 48 + 64];
        d[0..8].copy_from_slice(&(8u64 << 20).to_le_bytes());
        d[8] = 2;
        d[16..24].copy_from_slice(&65536u64.to_le_bytes());
        d[24..32]
            .copy_from_slice(&(BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP).to_le_bytes());
        d[41] = 0x10; // sector_size 4096
        d[44] = 2;
        d[48] = 1;
        d[56..64].copy_from_slice(&(1u64 << 20).to_le_bytes());
        d[80] = 1;
        d[88..96].copy_from_slice(&(9u64 << 20).to_le_bytes());
        d[96] = 0xab;
        let mut t = text();
        t.item(&Key::new(256, BTRFS_CHUNK_ITEM_KEY, 1 << 20), &d, d.len());
        assert_eq!(
            out(&t),
            "\t\tlength 8388608 owner 2 stripe_len 65536 type METADATA|DUP\n\
             \t\tio_align 0 io_width 0 sector_size 4096\n\
             \t\tnum_stripes 2 sub_stripes 0\n\
             \t\t\tstripe 0 devid 1 offset 1048576\n\
             \t\t\tdev_uuid 00000000-0000-0000-0000-000000000000\n\
             \t\t\tstripe 1 devid 1 offset 9437184\n\
             \t\t\tdev_uuid ab000000-0000-0000-0000-000000000000\n"
        );
    }

    #[test]
    fn block_group_flags() {
        let mut o = Vec::new();
        bg_flags(&mut o, BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP);
        o.push(b' ');
        bg_flags(&mut o, BTRFS_BLOCK_GROUP_DATA);
        o.push(b' ');
        bg_flags(&mut o, BTRFS_BLOCK_GROUP_DATA | BTRFS_BLOCK_GROUP_METADATA);
        assert_eq!(
            std::str::from_utf8(&o).unwrap(),
            "METADATA|DUP DATA|single DATA|METADATA|single"
        );
    }
}
