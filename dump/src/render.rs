//! Text rendering of tree blocks and their items, shaped line for line like
//! btrfs-progs 6.2 `print-tree.c` so the two dumps can be diffed.
//!
//! Rendering works on raw bytes and never fails: every field read past the
//! end of the block reads as zero, so a damaged item prints what can be read
//! of it (as btrfs does) instead of stopping the dump. Item bodies are read
//! from the item's start to the end of the block, as btrfs reads them, while
//! loops over packed entries are bounded by the item size.
//!
//! Output goes into one byte buffer that the caller flushes in large writes;
//! numbers are formatted by hand and no line allocates.

use btrkit_core::format::consts::*;
use btrkit_core::format::header::{HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::key::Key;
use btrkit_core::format::names::{key_type_name, objectid_name, write_key, write_objectid};
use btrkit_core::tree::Node;

/// Little-endian field reads that read zero past the end of the bytes.
#[derive(Clone, Copy)]
pub struct R<'a>(pub &'a [u8]);

impl<'a> R<'a> {
    #[inline]
    fn arr<const N: usize>(&self, o: usize) -> [u8; N] {
        let mut b = [0u8; N];
        if let Some(s) = self.0.get(o..) {
            let n = s.len().min(N);
            b[..n].copy_from_slice(&s[..n]);
        }
        b
    }
    #[inline]
    pub fn u8(&self, o: usize) -> u8 {
        self.0.get(o).copied().unwrap_or(0)
    }
    #[inline]
    pub fn u16(&self, o: usize) -> u16 {
        u16::from_le_bytes(self.arr(o))
    }
    #[inline]
    pub fn u32(&self, o: usize) -> u32 {
        u32::from_le_bytes(self.arr(o))
    }
    #[inline]
    pub fn u64(&self, o: usize) -> u64 {
        u64::from_le_bytes(self.arr(o))
    }
    pub fn key(&self, o: usize) -> Key {
        Key::new(self.u64(o), self.u8(o + 8), self.u64(o + 9))
    }
    pub fn uuid(&self, o: usize) -> [u8; 16] {
        self.arr(o)
    }
    /// Up to `len` bytes from `o`, fewer where the bytes end.
    pub fn bytes(&self, o: usize, len: usize) -> &'a [u8] {
        let s = self.0.get(o..).unwrap_or(&[]);
        &s[..len.min(s.len())]
    }
    pub fn from(&self, o: usize) -> R<'a> {
        R(self.0.get(o..).unwrap_or(&[]))
    }
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
    // SAFETY: localtime_r only writes the tm we own; a zeroed tm is a valid
    // value of the plain C struct.
    unsafe {
        let tt = t as libc::time_t;
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&tt, &mut tm).is_null() {
            0
        } else {
            tm.tm_gmtoff as i64
        }
    }
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

/// libuuid's `uuid_unparse` (lower case).
pub fn uuid(o: &mut Vec<u8>, id: &[u8; 16]) {
    for (n, &x) in id.iter().enumerate() {
        if matches!(n, 4 | 6 | 8 | 10) {
            o.push(b'-');
        }
        o.push(HEX[(x >> 4) as usize]);
        o.push(HEX[(x & 15) as usize]);
    }
}

pub fn uuid_string(id: &[u8; 16]) -> String {
    let mut v = Vec::with_capacity(36);
    uuid(&mut v, id);
    String::from_utf8_lossy(&v).into_owned()
}

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

    fn timespec(&mut self, prefix: &str, r: R<'_>, off: usize) {
        let sec = r.u64(off);
        let nsec = r.u32(off + 8);
        let o = &mut self.out;
        s(o, prefix);
        u(o, sec);
        o.push(b'.');
        u(o, nsec as u64);
        s(o, " (");
        self.time.write(o, sec as i64);
        s(o, ")\n");
    }

    /// A whole block: header lines, then key pointers or items.
    pub fn block(&mut self, node: &Node) {
        self.header(node);
        let b = node.bytes();
        if node.is_leaf() {
            self.leaf_items(node);
        } else {
            for slot in 0..node.nr_safe() {
                let p = HEADER_SIZE + slot * KEY_PTR_SIZE;
                let r = R(b).from(p);
                self.out.push(b'\t');
                self.key(&r.key(0));
                s(&mut self.out, " block ");
                u(&mut self.out, r.u64(17));
                s(&mut self.out, " gen ");
                u(&mut self.out, r.u64(25));
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
        for slot in 0..node.nr_safe() {
            let ih = R(b).from(HEADER_SIZE + slot * ITEM_SIZE);
            let key = ih.key(0);
            let off = ih.u32(17);
            let size = ih.u32(21);
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
            self.item(&key, R(&b[start..]), size as usize);
        }
    }

    /// The decoded lines of one item. `r` runs from the item's first byte to
    /// the end of the block; `size` is the item size.
    pub fn item(&mut self, key: &Key, r: R<'_>, size: usize) {
        if key.ty == 0 && key.objectid == BTRFS_FREE_SPACE_OBJECTID {
            self.free_space_header(r);
        }
        match key.ty {
            BTRFS_INODE_ITEM_KEY => self.inode_item(r),
            BTRFS_INODE_REF_KEY => self.inode_refs(r, size),
            BTRFS_INODE_EXTREF_KEY => self.inode_extrefs(r, size),
            BTRFS_DIR_ITEM_KEY | BTRFS_DIR_INDEX_KEY | BTRFS_XATTR_ITEM_KEY => self.dir_items(r, size),
            BTRFS_DIR_LOG_INDEX_KEY | BTRFS_DIR_LOG_ITEM_KEY => {
                s(&mut self.out, "\t\tdir log end ");
                u(&mut self.out, r.u64(0));
                self.out.push(b'\n');
            }
            BTRFS_ORPHAN_ITEM_KEY => s(&mut self.out, "\t\torphan item\n"),
            BTRFS_ROOT_ITEM_KEY => self.root_item(r, size),
            BTRFS_ROOT_REF_KEY => self.root_ref(r, "ref"),
            BTRFS_ROOT_BACKREF_KEY => self.root_ref(r, "backref"),
            BTRFS_EXTENT_ITEM_KEY => self.extent_item(key, r, size, false),
            BTRFS_METADATA_ITEM_KEY => self.extent_item(key, r, size, true),
            BTRFS_TREE_BLOCK_REF_KEY => s(&mut self.out, "\t\ttree block backref\n"),
            BTRFS_SHARED_BLOCK_REF_KEY => s(&mut self.out, "\t\tshared block backref\n"),
            BTRFS_EXTENT_DATA_REF_KEY => self.extent_data_ref(r, 0),
            BTRFS_SHARED_DATA_REF_KEY => {
                s(&mut self.out, "\t\tshared data backref count ");
                u(&mut self.out, r.u32(0) as u64);
                self.out.push(b'\n');
            }
            BTRFS_EXTENT_REF_V0_KEY => s(&mut self.out, "\t\textent ref v0 (deprecated)\n"),
            BTRFS_CSUM_ITEM_KEY => s(&mut self.out, "\t\tcsum item\n"),
            BTRFS_EXTENT_CSUM_KEY => self.extent_csum(key.offset, r, size),
            BTRFS_EXTENT_DATA_KEY => self.file_extent(r, size),
            BTRFS_BLOCK_GROUP_ITEM_KEY => {
                let o = &mut self.out;
                s(o, "\t\tblock group used ");
                u(o, r.u64(0));
                s(o, " chunk_objectid ");
                u(o, r.u64(8));
                s(o, " flags ");
                bg_flags(o, r.u64(16));
                o.push(b'\n');
            }
            BTRFS_FREE_SPACE_INFO_KEY => {
                let o = &mut self.out;
                s(o, "\t\tfree space info extent count ");
                u(o, r.u32(0) as u64);
                s(o, " flags ");
                u(o, r.u32(4) as u64);
                o.push(b'\n');
            }
            BTRFS_FREE_SPACE_EXTENT_KEY => s(&mut self.out, "\t\tfree space extent\n"),
            BTRFS_FREE_SPACE_BITMAP_KEY => s(&mut self.out, "\t\tfree space bitmap\n"),
            BTRFS_CHUNK_ITEM_KEY => self.chunk(r),
            BTRFS_DEV_ITEM_KEY => self.dev_item(r),
            BTRFS_DEV_EXTENT_KEY => {
                let o = &mut self.out;
                s(o, "\t\tdev extent chunk_tree ");
                u(o, r.u64(0));
                s(o, "\n\t\tchunk_objectid ");
                u(o, r.u64(8));
                s(o, " chunk_offset ");
                u(o, r.u64(16));
                s(o, " length ");
                u(o, r.u64(24));
                s(o, "\n\t\tchunk_tree_uuid ");
                uuid(o, &r.uuid(32));
                o.push(b'\n');
            }
            BTRFS_QGROUP_STATUS_KEY => {
                let o = &mut self.out;
                s(o, "\t\tversion ");
                u(o, r.u64(0));
                s(o, " generation ");
                u(o, r.u64(8));
                s(o, " flags ");
                let f = r.u64(16);
                s(o, if f & BTRFS_QGROUP_STATUS_FLAG_ON != 0 { "ON" } else { "OFF" });
                if f & BTRFS_QGROUP_STATUS_FLAG_RESCAN != 0 {
                    s(o, "|SCANNING");
                }
                if f & BTRFS_QGROUP_STATUS_FLAG_INCONSISTENT != 0 {
                    s(o, "|INCONSISTENT");
                }
                s(o, " scan ");
                u(o, r.u64(24));
                o.push(b'\n');
            }
            BTRFS_QGROUP_RELATION_KEY => {}
            BTRFS_QGROUP_INFO_KEY => {
                let o = &mut self.out;
                s(o, "\t\tgeneration ");
                u(o, r.u64(0));
                s(o, "\n\t\treferenced ");
                u(o, r.u64(8));
                s(o, " referenced_compressed ");
                u(o, r.u64(16));
                s(o, "\n\t\texclusive ");
                u(o, r.u64(24));
                s(o, " exclusive_compressed ");
                u(o, r.u64(32));
                o.push(b'\n');
            }
            BTRFS_QGROUP_LIMIT_KEY => {
                let o = &mut self.out;
                s(o, "\t\tflags ");
                hex(o, r.u64(0));
                s(o, "\n\t\tmax_referenced ");
                i(o, r.u64(8) as i64);
                s(o, " max_exclusive ");
                i(o, r.u64(16) as i64);
                s(o, "\n\t\trsv_referenced ");
                i(o, r.u64(24) as i64);
                s(o, " rsv_exclusive ");
                i(o, r.u64(32) as i64);
                o.push(b'\n');
            }
            BTRFS_UUID_KEY_SUBVOL | BTRFS_UUID_KEY_RECEIVED_SUBVOL => {
                let o = &mut self.out;
                if size % 8 != 0 {
                    s(o, "btrfs: uuid item with illegal size ");
                    u(o, size as u64);
                    s(o, "!\n");
                } else {
                    for n in 0..size / 8 {
                        s(o, "\t\tsubvol_id ");
                        u(o, r.u64(n * 8));
                        o.push(b'\n');
                    }
                }
            }
            BTRFS_STRING_ITEM_KEY => {
                s(&mut self.out, "\t\titem data ");
                cstr(&mut self.out, r.bytes(0, size), size);
                self.out.push(b'\n');
            }
            BTRFS_PERSISTENT_ITEM_KEY => self.persistent(key, r, size),
            BTRFS_TEMPORARY_ITEM_KEY => self.temporary(key, r),
            BTRFS_DEV_REPLACE_KEY => self.dev_replace(r),
            // btrfs 6.2 prints nothing for other types; show the bytes.
            _ if size > 0 && !(key.ty == 0 && key.objectid == BTRFS_FREE_SPACE_OBJECTID) => self.raw(r.bytes(0, size)),
            _ => {}
        }
    }

    fn free_space_header(&mut self, r: R<'_>) {
        s(&mut self.out, "\t\tlocation ");
        self.key(&r.key(0));
        let o = &mut self.out;
        s(o, "\n\t\tcache generation ");
        u(o, r.u64(17));
        s(o, " entries ");
        u(o, r.u64(25));
        s(o, " bitmaps ");
        u(o, r.u64(33));
        o.push(b'\n');
    }

    fn inode_item(&mut self, r: R<'_>) {
        let o = &mut self.out;
        s(o, "\t\tgeneration ");
        u(o, r.u64(0));
        s(o, " transid ");
        u(o, r.u64(8));
        s(o, " size ");
        u(o, r.u64(16));
        s(o, " nbytes ");
        u(o, r.u64(24));
        s(o, "\n\t\tblock group ");
        u(o, r.u64(32));
        s(o, " mode ");
        oct(o, r.u32(52));
        s(o, " links ");
        u(o, r.u32(40) as u64);
        s(o, " uid ");
        u(o, r.u32(44) as u64);
        s(o, " gid ");
        u(o, r.u32(48) as u64);
        s(o, " rdev ");
        u(o, r.u64(56));
        s(o, "\n\t\tsequence ");
        u(o, r.u64(72));
        s(o, " flags 0x");
        let flags = r.u64(64);
        hex(o, flags);
        o.push(b'(');
        inode_flags(o, flags);
        s(o, ")\n");
        self.timespec("\t\tatime ", r, 112);
        self.timespec("\t\tctime ", r, 124);
        self.timespec("\t\tmtime ", r, 136);
        self.timespec("\t\totime ", r, 148);
    }

    fn inode_refs(&mut self, r: R<'_>, size: usize) {
        let mut cur = 0;
        while cur < size {
            let e = r.from(cur);
            let name_len = e.u16(8) as usize;
            let o = &mut self.out;
            s(o, "\t\tindex ");
            u(o, e.u64(0));
            s(o, " namelen ");
            u(o, name_len as u64);
            s(o, " name: ");
            cstr(o, e.bytes(10, name_len), BTRFS_NAME_LEN);
            o.push(b'\n');
            cur += 10 + name_len;
        }
    }

    fn inode_extrefs(&mut self, r: R<'_>, size: usize) {
        let mut cur = 0;
        while cur < size {
            let e = r.from(cur);
            let name_len = e.u16(16) as usize;
            let o = &mut self.out;
            s(o, "\t\tindex ");
            u(o, e.u64(8));
            s(o, " parent ");
            u(o, e.u64(0));
            s(o, " namelen ");
            u(o, name_len as u64);
            s(o, " name: ");
            cstr(o, e.bytes(18, name_len), BTRFS_NAME_LEN);
            o.push(b'\n');
            cur += 18 + name_len;
        }
    }

    fn dir_items(&mut self, r: R<'_>, size: usize) {
        let mut cur = 0;
        while cur < size {
            let e = r.from(cur);
            s(&mut self.out, "\t\tlocation ");
            self.key(&e.key(0));
            let o = &mut self.out;
            s(o, " type ");
            let ty = e.u8(29);
            match ty {
                BTRFS_FT_REG_FILE => s(o, "FILE"),
                BTRFS_FT_DIR => s(o, "DIR"),
                BTRFS_FT_CHRDEV => s(o, "CHRDEV"),
                BTRFS_FT_BLKDEV => s(o, "BLKDEV"),
                BTRFS_FT_FIFO => s(o, "FIFO"),
                BTRFS_FT_SOCK => s(o, "SOCK"),
                BTRFS_FT_SYMLINK => s(o, "SYMLINK"),
                BTRFS_FT_XATTR => s(o, "XATTR"),
                _ => {
                    s(o, "DIR_ITEM.");
                    u(o, ty as u64);
                }
            }
            let data_len = e.u16(25) as usize;
            let name_len = e.u16(27) as usize;
            s(o, "\n\t\ttransid ");
            u(o, e.u64(17));
            s(o, " data_len ");
            u(o, data_len as u64);
            s(o, " name_len ");
            u(o, name_len as u64);
            s(o, "\n\t\tname: ");
            cstr(o, e.bytes(30, name_len), BTRFS_NAME_LEN);
            o.push(b'\n');
            if data_len > 0 {
                s(o, "\t\tdata ");
                cstr(o, e.bytes(30 + name_len, data_len), BTRFS_NAME_LEN);
                o.push(b'\n');
            }
            cur += 30 + name_len + data_len;
        }
    }

    fn root_item(&mut self, r: R<'_>, size: usize) {
        // btrfs copies the item into a zeroed root item: bytes past the item
        // read as zero (legacy 239-byte items have no v2 fields).
        let mut buf = [0u8; 439];
        let src = r.bytes(0, size.min(439));
        buf[..src.len()].copy_from_slice(src);
        let r = R(&buf);
        let o = &mut self.out;
        let gen = r.u64(160);
        s(o, "\t\tgeneration ");
        u(o, gen);
        s(o, " root_dirid ");
        u(o, r.u64(168));
        s(o, " bytenr ");
        u(o, r.u64(176));
        s(o, " byte_limit ");
        u(o, r.u64(184));
        s(o, " bytes_used ");
        u(o, r.u64(192));
        s(o, "\n\t\tlast_snapshot ");
        u(o, r.u64(200));
        s(o, " flags 0x");
        let flags = r.u64(208);
        hex(o, flags);
        s(o, if flags & BTRFS_ROOT_SUBVOL_RDONLY != 0 { "(RDONLY)" } else { "(none)" });
        s(o, " refs ");
        u(o, r.u32(216) as u64);
        s(o, "\n\t\tdrop_progress ");
        self.key(&r.key(220));
        let o = &mut self.out;
        s(o, " drop_level ");
        u(o, r.u8(237) as u64);
        s(o, "\n\t\tlevel ");
        u(o, r.u8(238) as u64);
        s(o, " generation_v2 ");
        let gen2 = r.u64(239);
        u(o, gen2);
        o.push(b'\n');
        if gen == gen2 {
            for (name, off) in [("uuid", 247), ("parent_uuid", 263), ("received_uuid", 279)] {
                s(o, "\t\t");
                s(o, name);
                o.push(b' ');
                uuid(o, &r.uuid(off));
                o.push(b'\n');
            }
            s(o, "\t\tctransid ");
            u(o, r.u64(295));
            s(o, " otransid ");
            u(o, r.u64(303));
            s(o, " stransid ");
            u(o, r.u64(311));
            s(o, " rtransid ");
            u(o, r.u64(319));
            o.push(b'\n');
            self.timespec("\t\tctime ", r, 327);
            self.timespec("\t\totime ", r, 339);
            self.timespec("\t\tstime ", r, 351);
            self.timespec("\t\trtime ", r, 363);
        }
    }

    fn root_ref(&mut self, r: R<'_>, tag: &str) {
        let o = &mut self.out;
        let n = r.u16(16) as usize;
        s(o, "\t\troot ");
        s(o, tag);
        s(o, " key dirid ");
        u(o, r.u64(0));
        s(o, " sequence ");
        u(o, r.u64(8));
        s(o, " name ");
        cstr(o, r.bytes(18, n), n);
        o.push(b'\n');
    }

    fn extent_data_ref(&mut self, r: R<'_>, at: usize) {
        s(&mut self.out, "\t\textent data backref root ");
        self.objectid(r.u64(at), 0);
        let o = &mut self.out;
        s(o, " objectid ");
        u(o, r.u64(at + 8));
        s(o, " offset ");
        u(o, r.u64(at + 16));
        s(o, " count ");
        u(o, r.u32(at + 24) as u64);
        o.push(b'\n');
    }

    fn extent_item(&mut self, key: &Key, r: R<'_>, size: usize, metadata: bool) {
        if size < 24 {
            return;
        }
        let flags = r.u64(16);
        let o = &mut self.out;
        s(o, "\t\trefs ");
        u(o, r.u64(0));
        s(o, " gen ");
        u(o, r.u64(8));
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
        let mut p = 24;
        if flags & BTRFS_EXTENT_FLAG_TREE_BLOCK != 0 && !metadata {
            s(o, "\t\ttree block ");
            self.key(&r.key(24));
            let o = &mut self.out;
            s(o, " level ");
            u(o, r.u8(41) as u64);
            o.push(b'\n');
            p += 18;
        } else if metadata {
            s(o, "\t\ttree block skinny level ");
            i(o, key.offset as i32 as i64);
            o.push(b'\n');
        }
        while p < size {
            let ty = r.u8(p);
            let off = r.u64(p + 1);
            let len = match ty {
                BTRFS_TREE_BLOCK_REF_KEY => {
                    s(&mut self.out, "\t\ttree block backref root ");
                    self.objectid(off, 0);
                    self.out.push(b'\n');
                    9
                }
                BTRFS_SHARED_BLOCK_REF_KEY => {
                    s(&mut self.out, "\t\tshared block backref parent ");
                    u(&mut self.out, off);
                    self.out.push(b'\n');
                    9
                }
                BTRFS_EXTENT_DATA_REF_KEY => {
                    self.extent_data_ref(r, p + 1);
                    29
                }
                BTRFS_SHARED_DATA_REF_KEY => {
                    let o = &mut self.out;
                    s(o, "\t\tshared data backref parent ");
                    u(o, off);
                    s(o, " count ");
                    u(o, r.u32(p + 9) as u64);
                    o.push(b'\n');
                    13
                }
                _ => return,
            };
            p += len;
        }
    }

    fn extent_csum(&mut self, start: u64, r: R<'_>, size: usize) {
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
            for (n, c) in r.bytes(0, size).chunks_exact(cs).enumerate() {
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

    fn file_extent(&mut self, r: R<'_>, size: usize) {
        let o = &mut self.out;
        let ty = r.u8(20);
        let comp = r.u8(16);
        s(o, "\t\tgeneration ");
        u(o, r.u64(0));
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
            u(o, (size as u32).wrapping_sub(21) as u64);
            s(o, " ram_bytes ");
            u(o, r.u64(8));
            s(o, " compression ");
            compression(o, comp);
            o.push(b'\n');
            return;
        }
        let word = if ty == BTRFS_FILE_EXTENT_PREALLOC { "\t\tprealloc" } else { "\t\textent" };
        s(o, word);
        s(o, " data disk byte ");
        u(o, r.u64(21));
        s(o, " nr ");
        u(o, r.u64(29));
        o.push(b'\n');
        s(o, word);
        s(o, " data offset ");
        u(o, r.u64(37));
        s(o, " nr ");
        u(o, r.u64(45));
        if ty == BTRFS_FILE_EXTENT_PREALLOC {
            o.push(b'\n');
            return;
        }
        s(o, " ram ");
        u(o, r.u64(8));
        s(o, "\n\t\textent compression ");
        compression(o, comp);
        o.push(b'\n');
    }

    fn chunk(&mut self, r: R<'_>) {
        let o = &mut self.out;
        let n = r.u16(44);
        if n < 1 {
            s(o, "invalid num_stripes: ");
            u(o, n as u64);
            o.push(b'\n');
            return;
        }
        if r.0.len() < 48 + 32 * n as usize {
            s(o, "\t\tchunk item invalid\n");
            return;
        }
        s(o, "\t\tlength ");
        u(o, r.u64(0));
        s(o, " owner ");
        u(o, r.u64(8));
        s(o, " stripe_len ");
        u(o, r.u64(16));
        s(o, " type ");
        bg_flags(o, r.u64(24));
        s(o, "\n\t\tio_align ");
        u(o, r.u32(32) as u64);
        s(o, " io_width ");
        u(o, r.u32(36) as u64);
        s(o, " sector_size ");
        u(o, r.u32(40) as u64);
        s(o, "\n\t\tnum_stripes ");
        u(o, n as u64);
        s(o, " sub_stripes ");
        u(o, r.u16(46) as u64);
        o.push(b'\n');
        for k in 0..n as usize {
            let st = r.from(48 + k * 32);
            s(o, "\t\t\tstripe ");
            u(o, k as u64);
            s(o, " devid ");
            u(o, st.u64(0));
            s(o, " offset ");
            u(o, st.u64(8));
            s(o, "\n\t\t\tdev_uuid ");
            uuid(o, &st.uuid(16));
            o.push(b'\n');
        }
    }

    fn dev_item(&mut self, r: R<'_>) {
        let o = &mut self.out;
        s(o, "\t\tdevid ");
        u(o, r.u64(0));
        s(o, " total_bytes ");
        u(o, r.u64(8));
        s(o, " bytes_used ");
        u(o, r.u64(16));
        s(o, "\n\t\tio_align ");
        u(o, r.u32(24) as u64);
        s(o, " io_width ");
        u(o, r.u32(28) as u64);
        s(o, " sector_size ");
        u(o, r.u32(32) as u64);
        s(o, " type ");
        u(o, r.u64(36));
        s(o, "\n\t\tgeneration ");
        u(o, r.u64(44));
        s(o, " start_offset ");
        u(o, r.u64(52));
        s(o, " dev_group ");
        u(o, r.u32(60) as u64);
        s(o, "\n\t\tseek_speed ");
        u(o, r.u8(64) as u64);
        s(o, " bandwidth ");
        u(o, r.u8(65) as u64);
        s(o, "\n\t\tuuid ");
        uuid(o, &r.uuid(66));
        s(o, "\n\t\tfsid ");
        uuid(o, &r.uuid(82));
        o.push(b'\n');
    }

    fn persistent(&mut self, key: &Key, r: R<'_>, size: usize) {
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
        s(o, "\t\tdevice stats\n");
        let names = ["write_errs", "read_errs", "flush_errs", "corruption_errs", "generation"];
        for (n, name) in names.iter().enumerate() {
            s(o, if n == 0 { "\t\t" } else { " " });
            s(o, name);
            o.push(b' ');
            u(o, r.u64(n * 8));
        }
        o.push(b'\n');
        let known = names.len() * 8;
        if known < size {
            // btrfs 6.2 ends this line without a newline; so do we.
            s(o, "\t\tunknown stats item bytes ");
            u(o, (size - known) as u64);
            let mut n = names.len();
            while n * 8 < size {
                s(o, "\t\tunknown item ");
                u(o, n as u64);
                s(o, " offset ");
                u(o, (n * 8) as u64);
                s(o, " value ");
                u(o, r.u64(n * 8));
                o.push(b'\n');
                n += 1;
            }
        }
    }

    fn temporary(&mut self, key: &Key, r: R<'_>) {
        s(&mut self.out, "\t\ttemporary item objectid ");
        self.objectid(key.objectid, BTRFS_TEMPORARY_ITEM_KEY);
        let o = &mut self.out;
        s(o, " offset ");
        u(o, key.offset);
        o.push(b'\n');
        match key.objectid {
            BTRFS_BALANCE_OBJECTID => {
                s(o, "\t\tbalance status flags ");
                u(o, r.u64(0));
                o.push(b'\n');
                for (name, off) in [("DATA", 8), ("METADATA", 144), ("SYSTEM", 280)] {
                    s(o, "\t\t");
                    s(o, name);
                    o.push(b'\n');
                    balance_args(o, r.from(off));
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
    fn dev_replace(&mut self, r: R<'_>) {
        let o = &mut self.out;
        s(o, "\t\tsrc devid ");
        i(o, r.u64(0) as i64);
        s(o, " cursor left ");
        u(o, r.u64(8));
        s(o, " cursor right ");
        u(o, r.u64(16));
        s(o, " mode ");
        match r.u64(24) {
            0 => s(o, "ALWAYS"),
            1 => s(o, "AVOID"),
            m => {
                s(o, "unknown(");
                u(o, m);
                o.push(b')');
            }
        }
        s(o, "\n\t\tstate ");
        match r.u64(32) {
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
        u(o, r.u64(56));
        s(o, " uncorrectable read errors ");
        u(o, r.u64(64));
        o.push(b'\n');
        for (name, off) in [("\t\tstart time ", 40), ("\t\tstop time ", 48)] {
            let t = r.u64(off);
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
    let item = |slot: usize| R(b).from(HEADER_SIZE + slot * ITEM_SIZE);
    let first = item(0);
    let last = item(nr.min(node.nr_safe()).saturating_sub(1));
    let used = (first.u32(17).wrapping_add(first.u32(21)) as i32)
        .wrapping_sub(last.u32(17) as i32)
        .wrapping_add((ITEM_SIZE as i32).wrapping_mul(nr as i32));
    data_size.wrapping_sub(used)
}

fn compression(o: &mut Vec<u8>, c: u8) {
    u(o, c as u64);
    match c {
        BTRFS_COMPRESS_NONE => s(o, " (none)"),
        BTRFS_COMPRESS_ZLIB => s(o, " (zlib)"),
        BTRFS_COMPRESS_LZO => s(o, " (lzo)"),
        BTRFS_COMPRESS_ZSTD => s(o, " (zstd)"),
        _ => {
            s(o, " (UNKNOWN.");
            u(o, c as u64);
            o.push(b')');
        }
    }
}

fn inode_flags(o: &mut Vec<u8>, flags: u64) {
    let names: [(u64, &str); 12] = [
        (BTRFS_INODE_NODATASUM, "NODATASUM"),
        (BTRFS_INODE_NODATACOW, "NODATACOW"),
        (BTRFS_INODE_READONLY, "READONLY"),
        (BTRFS_INODE_NOCOMPRESS, "NOCOMPRESS"),
        (BTRFS_INODE_PREALLOC, "PREALLOC"),
        (BTRFS_INODE_SYNC, "SYNC"),
        (BTRFS_INODE_IMMUTABLE, "IMMUTABLE"),
        (BTRFS_INODE_APPEND, "APPEND"),
        (BTRFS_INODE_NODUMP, "NODUMP"),
        (BTRFS_INODE_NOATIME, "NOATIME"),
        (BTRFS_INODE_DIRSYNC, "DIRSYNC"),
        (BTRFS_INODE_COMPRESS, "COMPRESS"),
    ];
    let mut empty = true;
    for (bit, name) in names {
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

fn balance_args(o: &mut Vec<u8>, r: R<'_>) {
    s(o, "\t\tprofiles ");
    u(o, r.u64(0));
    s(o, " devid ");
    u(o, r.u64(16));
    s(o, " target ");
    u(o, r.u64(56));
    s(o, " flags ");
    u(o, r.u64(64));
    s(o, "\n\t\tusage_min ");
    u(o, r.u32(8) as u64);
    s(o, " usage_max ");
    u(o, r.u32(12) as u64);
    s(o, " pstart ");
    u(o, r.u64(24));
    s(o, " pend ");
    u(o, r.u64(32));
    s(o, "\n\t\tvstart ");
    u(o, r.u64(40));
    s(o, " vend ");
    u(o, r.u64(48));
    s(o, " limit_min ");
    u(o, r.u32(72) as u64);
    s(o, " limit_max ");
    u(o, r.u32(76) as u64);
    s(o, "\n\t\tstripes_min ");
    u(o, r.u32(80) as u64);
    s(o, " stripes_max ");
    u(o, r.u32(84) as u64);
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
        assert_eq!(std::str::from_utf8(&o).unwrap(), "0 18446744073709551615 -5 1f 100644");
        for v in [1u64, 9, 10, 99, 100, 12345, 9_999_999_999, 10_000_000_000_000_000_000] {
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
        t.item(&Key::new(257, BTRFS_INODE_REF_KEY, 256), R(&d), d.len());
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
        t.item(&Key::new(257, BTRFS_XATTR_ITEM_KEY, 1), R(&d), d.len());
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
        t.item(&Key::new(13631488, BTRFS_EXTENT_ITEM_KEY, 4096), R(&d), d.len());
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
        t.item(&Key::new(30408704, BTRFS_METADATA_ITEM_KEY, 0), R(&d), d.len());
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
        t.item(&Key::new(257, BTRFS_EXTENT_DATA_KEY, 0), R(&d), d.len());
        assert_eq!(
            out(&t),
            "\t\tgeneration 7 type 1 (regular)\n\t\textent data disk byte 13631488 nr 4096\n\
             \t\textent data offset 0 nr 8192 ram 8192\n\t\textent compression 3 (zstd)\n"
        );
        let mut t = text();
        let mut d = vec![0u8; 21 + 10];
        d[8] = 10;
        t.item(&Key::new(257, BTRFS_EXTENT_DATA_KEY, 0), R(&d), d.len());
        assert_eq!(
            out(&t),
            "\t\tgeneration 0 type 0 (inline)\n\t\tinline extent data size 10 ram_bytes 10 compression 0 (none)\n"
        );
    }

    #[test]
    fn truncated_item_reads_zero_and_unknown_is_raw() {
        let mut t = text();
        t.item(&Key::new(1, BTRFS_DEV_EXTENT_KEY, 0), R(&[1, 0]), 2);
        assert!(out(&t).starts_with("\t\tdev extent chunk_tree 1\n\t\tchunk_objectid 0 "));
        let mut t = text();
        t.item(&Key::new(257, 99, 0), R(&[0xab, 0x01]), 2);
        assert_eq!(out(&t), "\t\tdata (2 bytes)\n\t\t\tab01\n");
        assert!(std::panic::catch_unwind(|| {
            let mut t = text();
            for ty in 0..=255u8 {
                t.item(&Key::new(256, ty, 0), R(&[0xff; 7]), 4000);
            }
        })
        .is_ok());
    }

    #[test]
    fn keys_agree_with_names_write_key() {
        let ids = [0u64, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 255, 256, 257, 1 << 20, u64::MAX, u64::MAX - 8, u64::MAX - 10];
        let offs = [0u64, 1, 5, 256, 1 << 48 | 5, u64::MAX, u64::MAX - 8];
        for &id in &ids {
            for ty in 0..=255u8 {
                for &off in &offs {
                    let k = Key::new(id, ty, off);
                    let mut t = text();
                    t.key(&k);
                    assert_eq!(out(&t), format!("key {}", btrkit_core::format::names::key_string(&k)), "{k:?}");
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
            // SAFETY: as in gmtoff.
            let want = unsafe {
                let tt = t as libc::time_t;
                let mut tm: libc::tm = std::mem::zeroed();
                assert!(!libc::localtime_r(&tt, &mut tm).is_null());
                format!(
                    "{}-{:02}-{:02} {:02}:{:02}:{:02}",
                    tm.tm_year as i64 + 1900,
                    tm.tm_mon + 1,
                    tm.tm_mday,
                    tm.tm_hour,
                    tm.tm_min,
                    tm.tm_sec
                )
            };
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
        t.item(&Key::new(257, BTRFS_INODE_ITEM_KEY, 0), R(&d), d.len());
        let s = out(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "\t\tgeneration 6 transid 7 size 4096 nbytes 0");
        assert_eq!(lines[1], "\t\tblock group 0 mode 100644 links 1 uid 0 gid 0 rdev 0");
        assert_eq!(lines[2], "\t\tsequence 0 flags 0x11(NODATASUM|PREALLOC)");
        assert!(lines[3].starts_with("\t\tatime 0.17 ("), "{}", lines[3]);
        assert!(lines[6].starts_with("\t\totime 0.0 ("));
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn legacy_root_item_has_no_v2_lines() {
        let mut d = vec![0u8; 239];
        d[160] = 9; // generation
        d[176..184].copy_from_slice(&30408704u64.to_le_bytes());
        d[238] = 1; // level
        let mut t = text();
        t.item(&Key::new(5, BTRFS_ROOT_ITEM_KEY, 0), R(&d), d.len());
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
        d[24..32].copy_from_slice(&(BTRFS_BLOCK_GROUP_METADATA | BTRFS_BLOCK_GROUP_DUP).to_le_bytes());
        d[41] = 0x10; // sector_size 4096
        d[44] = 2;
        d[48] = 1;
        d[56..64].copy_from_slice(&(1u64 << 20).to_le_bytes());
        d[80] = 1;
        d[88..96].copy_from_slice(&(9u64 << 20).to_le_bytes());
        d[96] = 0xab;
        let mut t = text();
        t.item(&Key::new(256, BTRFS_CHUNK_ITEM_KEY, 1 << 20), R(&d), d.len());
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
        assert_eq!(std::str::from_utf8(&o).unwrap(), "METADATA|DUP DATA|single DATA|METADATA|single");
    }
}
