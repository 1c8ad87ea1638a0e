//! `btrkit-dump tree --json`: the same trees, blocks and items as the text
//! dump, as one JSON document written block by block (only one block's
//! value is ever held in memory).
//!
//! Shape: `{"image", "fsid", ..., "trees": [{"title", "tree", "key",
//! "blocks": [block | {"error", "bytenr", "key"}]}], "total_bytes",
//! "bytes_used", "damaged"}`; a block has its header fields, its
//! `problems`, and either `ptrs` (nodes) or `items` (leaves), each item with
//! `key`, `itemoff`, `itemsize` and the decoded `body`.

use crate::render::{leaf_free_space, uuid_string};
use crate::sink::{Event, Sink};
use btrkit_core::format::consts::*;
use btrkit_core::format::extent::InlineRef;
use btrkit_core::format::file_extent::FileExtent;
use btrkit_core::format::header::{HEADER_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::inode::Timespec;
use btrkit_core::format::item::{decode, ItemBody};
use btrkit_core::format::key::Key;
use btrkit_core::format::misc::{DiskBalanceArgs, DEV_STAT_NAMES};
use btrkit_core::format::names::{block_group_flags_str, key_string, key_type_name, objectid_name};
use btrkit_core::format::qgroup::qgroupid_str;
use btrkit_core::image::Image;
use btrkit_core::tree::Node;
use serde_json::{json, Value};
use std::io::{self, Write};
use std::path::Path;

pub struct JsonSink<W: Write> {
    w: W,
    head: Option<Value>,
    csum_size: usize,
    sectorsize: u32,
    in_tree: bool,
    first_tree: bool,
    first_block: bool,
    totals: Option<(u64, u64)>,
    damaged: u64,
    /// Reused for each block's JSON.
    buf: Vec<u8>,
}

impl<W: Write> JsonSink<W> {
    pub fn new(w: W, img: &Image, path: &Path) -> Self {
        let sb = &img.sb;
        let head = json!({
            "image": path.display().to_string(),
            "fsid": uuid_string(&sb.fsid),
            "generation": sb.generation.get(),
            "nodesize": img.nodesize,
            "sectorsize": img.sectorsize,
            "csum_type": img.csum.name(),
            "root": sb.root.get(),
            "chunk_root": sb.chunk_root.get(),
            "log_root": sb.log_root.get(),
        });
        JsonSink {
            w,
            head: Some(head),
            csum_size: img.csum.size(),
            sectorsize: img.sectorsize,
            in_tree: false,
            first_tree: true,
            first_block: true,
            totals: None,
            damaged: 0,
            buf: Vec::new(),
        }
    }

    /// The document's opening fields, written before the first tree.
    fn start(&mut self) -> io::Result<()> {
        if let Some(Value::Object(m)) = self.head.take() {
            self.w.write_all(b"{")?;
            for (k, v) in m {
                serde_json::to_writer(&mut self.w, &k)?;
                self.w.write_all(b":")?;
                serde_json::to_writer(&mut self.w, &v)?;
                self.w.write_all(b",")?;
            }
            self.w.write_all(b"\"trees\":[")?;
        }
        Ok(())
    }

    fn open_tree(&mut self, title: &str, tree: Option<u64>, key: Option<Key>) -> io::Result<()> {
        self.start()?;
        self.close_tree()?;
        if !self.first_tree {
            self.w.write_all(b",")?;
        }
        self.first_tree = false;
        let v = json!({
            "title": title,
            "tree": tree,
            "tree_name": tree.and_then(objectid_name),
            "key": key.map(|k| key_json(&k)),
        });
        let s = v.to_string();
        // Leave the object open for its blocks: drop its closing brace.
        let open = s.strip_suffix('}').unwrap_or(&s);
        self.w.write_all(open.as_bytes())?;
        self.w.write_all(b",\"blocks\":[\n")?;
        self.in_tree = true;
        self.first_block = true;
        Ok(())
    }

    fn close_tree(&mut self) -> io::Result<()> {
        if self.in_tree {
            self.w.write_all(b"]}\n")?;
            self.in_tree = false;
        }
        Ok(())
    }

    fn entry(&mut self, v: &Value) -> io::Result<()> {
        let s = serde_json::to_vec(v)?;
        self.entry_raw(&s)
    }

    /// One element of the current tree's `blocks`, already JSON.
    fn entry_raw(&mut self, json: &[u8]) -> io::Result<()> {
        if !self.in_tree {
            self.open_tree("blocks", None, None)?;
        }
        if !self.first_block {
            self.w.write_all(b",\n")?;
        }
        self.first_block = false;
        self.w.write_all(json)
    }
}

impl<W: Write> Sink for JsonSink<W> {
    fn event(&mut self, ev: Event<'_>) -> io::Result<()> {
        match ev {
            Event::Section { title, tree, key } => {
                let t = if key.is_some() {
                    format!("{title} tree")
                } else {
                    title.to_string()
                };
                self.open_tree(&t, Some(tree), key)
            }
            Event::Block { node, problems } => {
                if !problems.is_empty() {
                    self.damaged += 1;
                }
                let mut buf = std::mem::take(&mut self.buf);
                buf.clear();
                block_json(&mut buf, node, problems, self.csum_size, self.sectorsize);
                let r = self.entry_raw(&buf);
                self.buf = buf;
                r
            }
            Event::Error {
                message,
                bytenr,
                key,
            } => {
                self.damaged += 1;
                let v =
                    json!({"error": message, "bytenr": bytenr, "key": key.map(|k| key_json(&k))});
                self.entry(&v)
            }
            Event::Totals {
                total_bytes,
                bytes_used,
                ..
            } => {
                self.totals = Some((total_bytes, bytes_used));
                Ok(())
            }
        }
    }

    fn finish(&mut self) -> io::Result<()> {
        self.start()?;
        self.close_tree()?;
        self.w.write_all(b"]")?;
        if let Some((t, u)) = self.totals {
            write!(self.w, ",\"total_bytes\":{t},\"bytes_used\":{u}")?;
        }
        writeln!(self.w, ",\"damaged\":{}}}", self.damaged)?;
        self.w.flush()
    }
}

pub fn key_json(k: &Key) -> Value {
    json!({
        "objectid": k.objectid,
        "type": k.ty,
        "offset": k.offset,
        "type_name": key_type_name(k.objectid, k.ty),
        "text": key_string(k),
    })
}

/// A value that writes itself as JSON. Blocks are written straight into a
/// byte buffer this way: building a `serde_json::Value` per item costs more
/// than everything else in the dump together.
trait J {
    fn put(&self, o: &mut Vec<u8>);
}

macro_rules! int_j {
    ($($t:ty),*) => {$(
        impl J for $t {
            fn put(&self, o: &mut Vec<u8>) {
                o.extend_from_slice(itoa::Buffer::new().format(*self).as_bytes());
            }
        }
    )*};
}
int_j!(u8, u16, u32, u64, usize, i64);

impl J for str {
    fn put(&self, o: &mut Vec<u8>) {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *o, self);
    }
}
impl J for String {
    fn put(&self, o: &mut Vec<u8>) {
        self.as_str().put(o)
    }
}
impl<T: J + ?Sized> J for &T {
    fn put(&self, o: &mut Vec<u8>) {
        (**self).put(o)
    }
}
impl<T: J> J for Option<T> {
    fn put(&self, o: &mut Vec<u8>) {
        match self {
            Some(v) => v.put(o),
            None => o.extend_from_slice(b"null"),
        }
    }
}
impl<T: J> J for [T] {
    fn put(&self, o: &mut Vec<u8>) {
        o.push(b'[');
        for (i, v) in self.iter().enumerate() {
            if i > 0 {
                o.push(b',');
            }
            v.put(o);
        }
        o.push(b']');
    }
}

/// Bytes as a string, invalid UTF-8 replaced (names, xattr values).
struct Lossy<'a>(&'a [u8]);
impl J for Lossy<'_> {
    fn put(&self, o: &mut Vec<u8>) {
        String::from_utf8_lossy(self.0).as_ref().put(o)
    }
}

/// Bytes as a hex string.
struct Hex<'a>(&'a [u8]);
impl J for Hex<'_> {
    fn put(&self, o: &mut Vec<u8>) {
        o.push(b'"');
        crate::render::hex_bytes(o, self.0);
        o.push(b'"');
    }
}

struct KeyJ<'a>(&'a Key);
impl J for KeyJ<'_> {
    fn put(&self, o: &mut Vec<u8>) {
        let k = self.0;
        Obj::new(o)
            .f("objectid", &k.objectid)
            .f("type", &k.ty)
            .f("offset", &k.offset)
            .f("type_name", &key_type_name(k.objectid, k.ty))
            .f("text", &key_string(k))
            .end();
    }
}

/// A time: signed seconds (negative before 1970) and nanoseconds below
/// 10^9 (as [`Timespec::get`] reads them); an on-disk nanosecond count
/// of 10^9 or more is shown beside as `nsec_on_disk`.
struct Ts(Timespec);
impl J for Ts {
    fn put(&self, o: &mut Vec<u8>) {
        let (sec, nsec) = self.0.get();
        let raw = self.0.nsec.get();
        let mut ob = Obj::new(o);
        ob.f("sec", &sec).f("nsec", &nsec);
        if raw != nsec {
            ob.f("nsec_on_disk", &raw);
        }
        ob.end();
    }
}

/// Whatever the closure writes (nested objects and arrays).
struct With<F: Fn(&mut Vec<u8>)>(F);
impl<F: Fn(&mut Vec<u8>)> J for With<F> {
    fn put(&self, o: &mut Vec<u8>) {
        (self.0)(o)
    }
}

/// An array of what `each` writes for every element.
fn arr<T>(o: &mut Vec<u8>, it: impl IntoIterator<Item = T>, mut each: impl FnMut(&mut Vec<u8>, T)) {
    o.push(b'[');
    for (i, v) in it.into_iter().enumerate() {
        if i > 0 {
            o.push(b',');
        }
        each(o, v);
    }
    o.push(b']');
}

/// An object being written: `Obj::new(o).f("a", &1).f("b", &"x").end()`.
/// Field names are plain ASCII and need no escaping.
struct Obj<'a> {
    o: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Obj<'a> {
    fn new(o: &'a mut Vec<u8>) -> Obj<'a> {
        o.push(b'{');
        Obj { o, first: true }
    }
    fn f<V: J + ?Sized>(&mut self, k: &str, v: &V) -> &mut Self {
        if !self.first {
            self.o.push(b',');
        }
        self.first = false;
        self.o.push(b'"');
        self.o.extend_from_slice(k.as_bytes());
        self.o.extend_from_slice(b"\":");
        v.put(self.o);
        self
    }
    fn end(&mut self) {
        self.o.push(b'}');
    }
}

/// One block as a JSON object, appended to `o`.
pub fn block_json(
    o: &mut Vec<u8>,
    node: &Node,
    problems: &[btrkit_core::tree::Problem],
    csum_size: usize,
    sectorsize: u32,
) {
    let h = node.header();
    let b = node.bytes();
    let free = if h.level == 0 {
        leaf_free_space(node) as i64
    } else {
        ((b.len() - HEADER_SIZE) / KEY_PTR_SIZE) as i64 - h.nritems.get() as i64
    };
    let mut m = Obj::new(o);
    m.f("bytenr", &node.bytenr)
        .f("header_bytenr", &h.bytenr.get())
        .f("level", &h.level)
        .f("nritems", &h.nritems.get())
        .f("free_space", &free)
        .f("generation", &h.generation.get())
        .f("owner", &h.owner.get())
        .f("owner_name", &objectid_name(h.owner.get()))
        .f("flags", &h.flag_bits())
        .f("backref_rev", &h.backref_rev())
        .f("csum", &Hex(&h.csum[..csum_size.min(h.csum.len())]))
        .f("fsid", &uuid_string(&h.fsid))
        .f("chunk_tree_uuid", &uuid_string(&h.chunk_tree_uuid));
    m.f(
        "problems",
        &With(|o| {
            arr(o, problems, |o, p| {
                Obj::new(o)
                    .f("kind", &format!("{:?}", p.kind))
                    .f("message", &p.message)
                    .f("slot", &p.slot)
                    .f("key", &p.key.as_ref().map(KeyJ))
                    .end()
            })
        }),
    );
    if h.level != 0 {
        m.f(
            "ptrs",
            &With(|o| {
                arr(
                    o,
                    (0..node.nr_safe()).filter_map(|slot| node.key_ptr(slot)),
                    |o, p| {
                        Obj::new(o)
                            .f("key", &KeyJ(&Key::from(&p.key)))
                            .f("blockptr", &p.blockptr.get())
                            .f("generation", &p.generation.get())
                            .end()
                    },
                )
            }),
        );
    } else {
        let data_size = b.len() - HEADER_SIZE;
        m.f(
            "items",
            &With(|o| {
                arr(o, (0..node.nr_safe()).map_while(|slot| node.item(slot).map(|it| (slot, it))), |o, (slot, it)| {
                    let key = Key::from(&it.key);
                    let (off, size) = (it.offset.get() as usize, it.size.get() as usize);
                    let mut im = Obj::new(o);
                    im.f("slot", &slot).f("key", &KeyJ(&key)).f("itemoff", &off).f("itemsize", &size);
                    im.f(
                        "body",
                        &With(|o| {
                            if off > data_size || off + size > data_size {
                                let e = format!("item data [{off}, +{size}) outside the leaf data area of {data_size} bytes");
                                Obj::new(o).f("error", &e).end();
                                return;
                            }
                            let d = &b[HEADER_SIZE + off..HEADER_SIZE + off + size];
                            match decode(&key, d, csum_size) {
                                Ok(body) => body_json(o, &key, &body, d, csum_size, sectorsize),
                                Err(e) => Obj::new(o).f("error", &e.to_string()).f("raw", &Hex(d)).end(),
                            }
                        }),
                    );
                    im.end();
                })
            }),
        );
    }
    m.end();
}

fn balance_args(a: &DiskBalanceArgs) -> impl J + '_ {
    With(move |o| {
        let usage = a.usage.get();
        let limit = a.limit.get();
        let stripes = a.stripes.get();
        Obj::new(o)
            .f("profiles", &a.profiles.get())
            .f("devid", &a.devid.get())
            .f("target", &a.target.get())
            .f("flags", &a.flags.get())
            .f("usage_min", &(usage as u32))
            .f("usage_max", &((usage >> 32) as u32))
            .f("pstart", &a.pstart.get())
            .f("pend", &a.pend.get())
            .f("vstart", &a.vstart.get())
            .f("vend", &a.vend.get())
            .f("limit_min", &(limit as u32))
            .f("limit_max", &((limit >> 32) as u32))
            .f("stripes_min", &(stripes as u32))
            .f("stripes_max", &((stripes >> 32) as u32))
            .end()
    })
}

fn body_json(
    o: &mut Vec<u8>,
    key: &Key,
    body: &ItemBody<'_>,
    raw: &[u8],
    csum_size: usize,
    sectorsize: u32,
) {
    let mut m = Obj::new(o);
    match body {
        ItemBody::InodeItem(ii) => {
            m.f("kind", "inode_item")
                .f("generation", &ii.generation.get())
                .f("transid", &ii.transid.get())
                .f("size", &ii.size.get())
                .f("nbytes", &ii.nbytes.get())
                .f("block_group", &ii.block_group.get())
                .f("mode", &ii.mode.get())
                .f("mode_octal", &format!("{:o}", ii.mode.get()))
                .f("nlink", &ii.nlink.get())
                .f("uid", &ii.uid.get())
                .f("gid", &ii.gid.get())
                .f("rdev", &ii.rdev.get())
                .f("sequence", &ii.sequence.get())
                .f("flags", &ii.flags.get())
                .f("atime", &Ts(ii.atime))
                .f("ctime", &Ts(ii.ctime))
                .f("mtime", &Ts(ii.mtime))
                .f("otime", &Ts(ii.otime));
        }
        ItemBody::InodeRef(v) => {
            m.f("kind", "inode_ref").f(
                "refs",
                &With(|o| {
                    arr(o, v.iter(), |o, r| {
                        Obj::new(o)
                            .f("index", &r.index)
                            .f("name", &Lossy(r.name))
                            .end()
                    })
                }),
            );
        }
        ItemBody::InodeExtref(v) => {
            m.f("kind", "inode_extref").f(
                "refs",
                &With(|o| {
                    arr(o, v.iter(), |o, r| {
                        Obj::new(o)
                            .f("index", &r.index)
                            .f("parent", &r.parent)
                            .f("name", &Lossy(r.name))
                            .end()
                    })
                }),
            );
        }
        ItemBody::DirItem(v) => {
            let kind = match key.ty {
                BTRFS_DIR_INDEX_KEY => "dir_index",
                BTRFS_XATTR_ITEM_KEY => "xattr_item",
                _ => "dir_item",
            };
            m.f("kind", kind).f(
                "entries",
                &With(|o| {
                    arr(o, v.iter(), |o, e| {
                        Obj::new(o)
                            .f("location", &KeyJ(&Key::from(&e.item.location)))
                            .f("type", &e.item.type_)
                            .f("transid", &e.item.transid.get())
                            .f("name", &Lossy(e.name))
                            .f("data", &Lossy(e.data))
                            .end()
                    })
                }),
            );
        }
        ItemBody::DirLog(d) => {
            m.f("kind", "dir_log").f("end", &d.end.get());
        }
        ItemBody::Orphan => {
            m.f("kind", "orphan");
        }
        ItemBody::FileExtent(fe) => {
            let h = fe.head();
            let type_name = match h.type_ {
                BTRFS_FILE_EXTENT_INLINE => "inline",
                BTRFS_FILE_EXTENT_PREALLOC => "prealloc",
                _ => "regular",
            };
            m.f("kind", "file_extent")
                .f("generation", &h.generation.get())
                .f("ram_bytes", &h.ram_bytes.get())
                .f("compression", &h.compression)
                .f("encryption", &h.encryption)
                .f("other_encoding", &h.other_encoding.get())
                .f("type", &h.type_)
                .f("type_name", type_name);
            match fe {
                FileExtent::Inline { data, .. } => {
                    m.f("inline_size", &data.len());
                }
                FileExtent::Disk { item, .. } => {
                    m.f("disk_bytenr", &item.disk_bytenr.get())
                        .f("disk_num_bytes", &item.disk_num_bytes.get())
                        .f("offset", &item.offset.get())
                        .f("num_bytes", &item.num_bytes.get());
                }
            }
        }
        ItemBody::ExtentCsum(d) => {
            let cs = csum_size.max(1);
            let n = d.len() / cs;
            m.f("kind", "extent_csum")
                .f("start", &key.offset)
                .f("length", &(n as u64 * sectorsize as u64))
                .f(
                    "csums",
                    &With(|o| arr(o, d.chunks_exact(cs), |o, c| Hex(c).put(o))),
                );
        }
        ItemBody::RootItem(ri) => {
            m.f("kind", "root_item")
                .f("generation", &ri.generation.get())
                .f("root_dirid", &ri.root_dirid.get())
                .f("bytenr", &ri.bytenr.get())
                .f("byte_limit", &ri.byte_limit.get())
                .f("bytes_used", &ri.bytes_used.get())
                .f("last_snapshot", &ri.last_snapshot.get())
                .f("flags", &ri.flags.get())
                .f("refs", &ri.refs.get())
                .f("drop_progress", &KeyJ(&Key::from(&ri.drop_progress)))
                .f("drop_level", &ri.drop_level)
                .f("level", &ri.level)
                .f("generation_v2", &ri.generation_v2.get());
            if ri.has_v2() {
                m.f("uuid", &uuid_string(&ri.uuid))
                    .f("parent_uuid", &uuid_string(&ri.parent_uuid))
                    .f("received_uuid", &uuid_string(&ri.received_uuid))
                    .f("ctransid", &ri.ctransid.get())
                    .f("otransid", &ri.otransid.get())
                    .f("stransid", &ri.stransid.get())
                    .f("rtransid", &ri.rtransid.get())
                    .f("ctime", &Ts(ri.ctime))
                    .f("otime", &Ts(ri.otime))
                    .f("stime", &Ts(ri.stime))
                    .f("rtime", &Ts(ri.rtime));
            }
        }
        ItemBody::RootRef(r, n) => {
            m.f(
                "kind",
                if key.ty == BTRFS_ROOT_REF_KEY {
                    "root_ref"
                } else {
                    "root_backref"
                },
            )
            .f("dirid", &r.dirid.get())
            .f("sequence", &r.sequence.get())
            .f("name", &Lossy(n));
        }
        ItemBody::Extent(ev) => {
            m.f(
                "kind",
                if key.ty == BTRFS_METADATA_ITEM_KEY {
                    "metadata_item"
                } else {
                    "extent_item"
                },
            )
            .f("refs", &ev.item.refs.get())
            .f("generation", &ev.item.generation.get())
            .f("flags", &ev.item.flags.get())
            .f(
                "inline_refs",
                &With(|o| {
                    arr(o, ev.refs.iter(), |o, r| {
                        let mut e = Obj::new(o);
                        match *r {
                            InlineRef::TreeBlock { root } => {
                                e.f("type", "tree_block_ref").f("root", &root)
                            }
                            InlineRef::SharedBlock { parent } => {
                                e.f("type", "shared_block_ref").f("parent", &parent)
                            }
                            InlineRef::ExtentData {
                                root,
                                objectid,
                                offset,
                                count,
                            } => e
                                .f("type", "extent_data_ref")
                                .f("root", &root)
                                .f("objectid", &objectid)
                                .f("offset", &offset)
                                .f("count", &count),
                            InlineRef::SharedData { parent, count } => e
                                .f("type", "shared_data_ref")
                                .f("parent", &parent)
                                .f("count", &count),
                            InlineRef::Owner { root } => {
                                e.f("type", "extent_owner_ref").f("root", &root)
                            }
                        };
                        e.end();
                    })
                }),
            );
            if let Some(tb) = ev.tree_block_info {
                m.f("tree_block_key", &KeyJ(&Key::from(&tb.key)))
                    .f("tree_block_level", &tb.level);
            } else if key.ty == BTRFS_METADATA_ITEM_KEY {
                m.f("tree_block_level", &key.offset);
            }
        }
        ItemBody::TreeBlockRef => {
            m.f("kind", "tree_block_ref");
        }
        ItemBody::SharedBlockRef => {
            m.f("kind", "shared_block_ref");
        }
        ItemBody::ExtentDataRef(r) => {
            m.f("kind", "extent_data_ref")
                .f("root", &r.root.get())
                .f("objectid", &r.objectid.get())
                .f("offset", &r.offset.get())
                .f("count", &r.count.get());
        }
        ItemBody::SharedDataRef(r) => {
            m.f("kind", "shared_data_ref").f("count", &r.count.get());
        }
        ItemBody::ExtentOwnerRef(root) => {
            m.f("kind", "extent_owner_ref").f("root", root);
        }
        ItemBody::BlockGroup(bg) => {
            m.f("kind", "block_group")
                .f("used", &bg.used.get())
                .f("chunk_objectid", &bg.chunk_objectid.get())
                .f("flags", &bg.flags.get())
                .f("flags_name", &block_group_flags_str(bg.flags.get()));
        }
        ItemBody::FreeSpaceInfo(fi) => {
            m.f("kind", "free_space_info")
                .f("extent_count", &fi.extent_count.get())
                .f("flags", &fi.flags.get());
        }
        ItemBody::FreeSpaceExtent => {
            m.f("kind", "free_space_extent")
                .f("start", &key.objectid)
                .f("length", &key.offset);
        }
        ItemBody::FreeSpaceBitmap(d) => {
            m.f("kind", "free_space_bitmap")
                .f("start", &key.objectid)
                .f("length", &key.offset)
                .f("bitmap", &Hex(d));
        }
        ItemBody::DevExtent(de) => {
            m.f("kind", "dev_extent")
                .f("chunk_tree", &de.chunk_tree.get())
                .f("chunk_objectid", &de.chunk_objectid.get())
                .f("chunk_offset", &de.chunk_offset.get())
                .f("length", &de.length.get())
                .f("chunk_tree_uuid", &uuid_string(&de.chunk_tree_uuid));
        }
        ItemBody::DevItem(di) => {
            m.f("kind", "dev_item")
                .f("devid", &di.devid.get())
                .f("total_bytes", &di.total_bytes.get())
                .f("bytes_used", &di.bytes_used.get())
                .f("io_align", &di.io_align.get())
                .f("io_width", &di.io_width.get())
                .f("sector_size", &di.sector_size.get())
                .f("type", &di.type_.get())
                .f("generation", &di.generation.get())
                .f("start_offset", &di.start_offset.get())
                .f("dev_group", &di.dev_group.get())
                .f("seek_speed", &di.seek_speed)
                .f("bandwidth", &di.bandwidth)
                .f("uuid", &uuid_string(&di.uuid))
                .f("fsid", &uuid_string(&di.fsid));
        }
        ItemBody::Chunk(c, stripes) => {
            m.f("kind", "chunk")
                .f("length", &c.length.get())
                .f("owner", &c.owner.get())
                .f("stripe_len", &c.stripe_len.get())
                .f("type", &c.type_.get())
                .f("type_name", &block_group_flags_str(c.type_.get()))
                .f("io_align", &c.io_align.get())
                .f("io_width", &c.io_width.get())
                .f("sector_size", &c.sector_size.get())
                .f("num_stripes", &c.num_stripes.get())
                .f("sub_stripes", &c.sub_stripes.get())
                .f(
                    "stripes",
                    &With(|o| {
                        arr(o, stripes.iter(), |o, s| {
                            Obj::new(o)
                                .f("devid", &s.devid.get())
                                .f("offset", &s.offset.get())
                                .f("dev_uuid", &uuid_string(&s.dev_uuid))
                                .end()
                        })
                    }),
                );
        }
        ItemBody::Uuid(ids) => {
            m.f("kind", "uuid").f("subvol_ids", ids.as_slice());
        }
        ItemBody::QgroupStatus(st, enable_gen) => {
            m.f("kind", "qgroup_status")
                .f("version", &st.version.get())
                .f("generation", &st.generation.get())
                .f("flags", &st.flags.get())
                .f("scan", &st.rescan.get())
                .f("enable_gen", enable_gen);
        }
        ItemBody::QgroupInfo(qi) => {
            m.f("kind", "qgroup_info")
                .f("qgroupid", &qgroupid_str(key.offset))
                .f("generation", &qi.generation.get())
                .f("referenced", &qi.rfer.get())
                .f("referenced_compressed", &qi.rfer_cmpr.get())
                .f("exclusive", &qi.excl.get())
                .f("exclusive_compressed", &qi.excl_cmpr.get());
        }
        ItemBody::QgroupLimit(ql) => {
            m.f("kind", "qgroup_limit")
                .f("qgroupid", &qgroupid_str(key.offset))
                .f("flags", &ql.flags.get())
                .f("max_referenced", &ql.max_rfer.get())
                .f("max_exclusive", &ql.max_excl.get())
                .f("rsv_referenced", &ql.rsv_rfer.get())
                .f("rsv_exclusive", &ql.rsv_excl.get());
        }
        ItemBody::QgroupRelation => {
            m.f("kind", "qgroup_relation")
                .f("src", &qgroupid_str(key.objectid))
                .f("dst", &qgroupid_str(key.offset));
        }
        ItemBody::DevStats(vals) => {
            m.f("kind", "dev_stats");
            for (n, v) in vals.iter().enumerate() {
                let k = DEV_STAT_NAMES
                    .get(n)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("unknown_{n}"));
                m.f(&k, v);
            }
        }
        ItemBody::DevReplace(r) => {
            m.f("kind", "dev_replace")
                .f("src_devid", &r.src_devid.get())
                .f("cursor_left", &r.cursor_left.get())
                .f("cursor_right", &r.cursor_right.get())
                .f(
                    "cont_reading_from_srcdev_mode",
                    &r.cont_reading_from_srcdev_mode.get(),
                )
                .f("replace_state", &r.replace_state.get())
                .f("time_started", &r.time_started.get())
                .f("time_stopped", &r.time_stopped.get())
                .f("num_write_errors", &r.num_write_errors.get())
                .f(
                    "num_uncorrectable_read_errors",
                    &r.num_uncorrectable_read_errors.get(),
                );
        }
        ItemBody::Balance(b) => {
            m.f("kind", "balance")
                .f("flags", &b.flags.get())
                .f("data", &balance_args(&b.data))
                .f("meta", &balance_args(&b.meta))
                .f("sys", &balance_args(&b.sys));
        }
        ItemBody::VerityDesc(d, rest) => {
            m.f("kind", "verity_desc")
                .f("size", &d.size.get())
                .f("encryption", &d.encryption)
                .f("data", &Hex(rest));
        }
        ItemBody::VerityMerkle(d) => {
            m.f("kind", "verity_merkle").f("data", &Hex(d));
        }
        ItemBody::StringItem(d) => {
            m.f("kind", "string").f("data", &Lossy(d));
        }
        ItemBody::Unknown(d) => {
            m.f("kind", "unknown").f("raw", &Hex(d));
        }
        #[allow(unreachable_patterns)]
        _ => {
            m.f("kind", "other").f("raw", &Hex(raw));
        }
    }
    m.end();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts_json(sec: i64, nsec: u32) -> String {
        let mut t = Timespec::new(sec, 0);
        t.nsec.set(nsec);
        let mut o = Vec::new();
        Ts(t).put(&mut o);
        String::from_utf8(o).unwrap()
    }

    #[test]
    fn times_are_signed() {
        assert_eq!(ts_json(-315_619_200, 0), r#"{"sec":-315619200,"nsec":0}"#);
        assert_eq!(ts_json(-1, 500_000_000), r#"{"sec":-1,"nsec":500000000}"#);
        assert_eq!(
            ts_json(7, 1_000_000_000),
            r#"{"sec":7,"nsec":999999999,"nsec_on_disk":1000000000}"#
        );
    }
}
