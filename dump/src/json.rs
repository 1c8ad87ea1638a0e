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
use crate::tree::{Event, Sink};
use btrkit_core::format::consts::*;
use btrkit_core::format::extent::InlineRef;
use btrkit_core::format::file_extent::FileExtent;
use btrkit_core::format::header::{HEADER_SIZE, KEY_PTR_SIZE};
use btrkit_core::format::item::{decode, ItemBody};
use btrkit_core::format::key::Key;
use btrkit_core::format::misc::{DiskBalanceArgs, DEV_STAT_NAMES};
use btrkit_core::format::names::{block_group_flags_str, key_string, key_type_name, objectid_name};
use btrkit_core::format::qgroup::qgroupid_str;
use btrkit_core::image::Image;
use btrkit_core::tree::Node;
use serde_json::{json, Map, Value};
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
        if !self.in_tree {
            self.open_tree("blocks", None, None)?;
        }
        if !self.first_block {
            self.w.write_all(b",\n")?;
        }
        self.first_block = false;
        serde_json::to_writer(&mut self.w, v)?;
        Ok(())
    }
}

impl<W: Write> Sink for JsonSink<W> {
    fn event(&mut self, ev: Event<'_>) -> io::Result<()> {
        match ev {
            Event::Section { title, tree, key } => {
                let t = if key.is_some() { format!("{title} tree") } else { title.to_string() };
                self.open_tree(&t, Some(tree), key)
            }
            Event::Block { node, problems } => {
                if !problems.is_empty() {
                    self.damaged += 1;
                }
                let v = block_json(node, problems, self.csum_size, self.sectorsize);
                self.entry(&v)
            }
            Event::Error { message, bytenr, key } => {
                self.damaged += 1;
                let v = json!({"error": message, "bytenr": bytenr, "key": key.map(|k| key_json(&k))});
                self.entry(&v)
            }
            Event::Totals { total_bytes, bytes_used, .. } => {
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

fn name(b: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(b).into_owned())
}

fn hex(b: &[u8]) -> Value {
    let mut v = Vec::with_capacity(b.len() * 2);
    crate::render::hex_bytes(&mut v, b);
    Value::String(String::from_utf8_lossy(&v).into_owned())
}

pub fn block_json(node: &Node, problems: &[btrkit_core::tree::Problem], csum_size: usize, sectorsize: u32) -> Value {
    let h = node.header();
    let b = node.bytes();
    let mut m = Map::new();
    m.insert("bytenr".into(), json!(node.bytenr));
    m.insert("header_bytenr".into(), json!(h.bytenr.get()));
    m.insert("level".into(), json!(h.level));
    m.insert("nritems".into(), json!(h.nritems.get()));
    let free = if h.level == 0 {
        leaf_free_space(node) as i64
    } else {
        ((b.len() - HEADER_SIZE) / KEY_PTR_SIZE) as i64 - h.nritems.get() as i64
    };
    m.insert("free_space".into(), json!(free));
    m.insert("generation".into(), json!(h.generation.get()));
    m.insert("owner".into(), json!(h.owner.get()));
    m.insert("owner_name".into(), json!(objectid_name(h.owner.get())));
    m.insert("flags".into(), json!(h.flag_bits()));
    m.insert("backref_rev".into(), json!(h.backref_rev()));
    m.insert("csum".into(), hex(&h.csum[..csum_size.min(h.csum.len())]));
    m.insert("fsid".into(), json!(uuid_string(&h.fsid)));
    m.insert("chunk_tree_uuid".into(), json!(uuid_string(&h.chunk_tree_uuid)));
    m.insert(
        "problems".into(),
        Value::Array(
            problems
                .iter()
                .map(|p| {
                    json!({"kind": format!("{:?}", p.kind), "message": p.message, "slot": p.slot, "key": p.key.map(|k| key_json(&k))})
                })
                .collect(),
        ),
    );
    if h.level != 0 {
        let ptrs: Vec<Value> = (0..node.nr_safe())
            .filter_map(|slot| node.key_ptr(slot))
            .map(|p| json!({"key": key_json(&Key::from(&p.key)), "blockptr": p.blockptr.get(), "generation": p.generation.get()}))
            .collect();
        m.insert("ptrs".into(), Value::Array(ptrs));
    } else {
        let data_size = b.len() - HEADER_SIZE;
        let mut items = Vec::with_capacity(node.nr_safe());
        for slot in 0..node.nr_safe() {
            let Some(it) = node.item(slot) else { break };
            let key = Key::from(&it.key);
            let (off, size) = (it.offset.get() as usize, it.size.get() as usize);
            let mut im = Map::new();
            im.insert("slot".into(), json!(slot));
            im.insert("key".into(), key_json(&key));
            im.insert("itemoff".into(), json!(off));
            im.insert("itemsize".into(), json!(size));
            let body = if off > data_size || off + size > data_size {
                json!({"error": format!("item data [{off}, +{size}) outside the leaf data area of {data_size} bytes")})
            } else {
                let d = &b[HEADER_SIZE + off..HEADER_SIZE + off + size];
                match decode(&key, d, csum_size) {
                    Ok(body) => body_json(&key, &body, d, csum_size, sectorsize),
                    Err(e) => json!({"error": e.to_string(), "raw": hex(d)}),
                }
            };
            im.insert("body".into(), body);
            items.push(Value::Object(im));
        }
        m.insert("items".into(), Value::Array(items));
    }
    Value::Object(m)
}

fn ts(sec: u64, nsec: u32) -> Value {
    json!({"sec": sec, "nsec": nsec})
}

fn balance_args(a: &DiskBalanceArgs) -> Value {
    let usage = a.usage.get();
    let limit = a.limit.get();
    let stripes = a.stripes.get();
    json!({
        "profiles": a.profiles.get(), "devid": a.devid.get(), "target": a.target.get(), "flags": a.flags.get(),
        "usage_min": usage as u32, "usage_max": (usage >> 32) as u32, "pstart": a.pstart.get(), "pend": a.pend.get(),
        "vstart": a.vstart.get(), "vend": a.vend.get(), "limit_min": limit as u32, "limit_max": (limit >> 32) as u32,
        "stripes_min": stripes as u32, "stripes_max": (stripes >> 32) as u32,
    })
}

fn body_json(key: &Key, body: &ItemBody<'_>, raw: &[u8], csum_size: usize, sectorsize: u32) -> Value {
    match body {
        ItemBody::InodeItem(ii) => json!({
            "kind": "inode_item",
            "generation": ii.generation.get(), "transid": ii.transid.get(), "size": ii.size.get(),
            "nbytes": ii.nbytes.get(), "block_group": ii.block_group.get(), "mode": ii.mode.get(),
            "mode_octal": format!("{:o}", ii.mode.get()), "nlink": ii.nlink.get(), "uid": ii.uid.get(),
            "gid": ii.gid.get(), "rdev": ii.rdev.get(), "sequence": ii.sequence.get(), "flags": ii.flags.get(),
            "atime": ts(ii.atime.sec.get(), ii.atime.nsec.get()), "ctime": ts(ii.ctime.sec.get(), ii.ctime.nsec.get()),
            "mtime": ts(ii.mtime.sec.get(), ii.mtime.nsec.get()), "otime": ts(ii.otime.sec.get(), ii.otime.nsec.get()),
        }),
        ItemBody::InodeRef(v) => json!({
            "kind": "inode_ref",
            "refs": v.iter().map(|r| json!({"index": r.index, "name": name(r.name)})).collect::<Vec<_>>(),
        }),
        ItemBody::InodeExtref(v) => json!({
            "kind": "inode_extref",
            "refs": v.iter().map(|r| json!({"index": r.index, "parent": r.parent, "name": name(r.name)})).collect::<Vec<_>>(),
        }),
        ItemBody::DirItem(v) => json!({
            "kind": match key.ty { BTRFS_DIR_INDEX_KEY => "dir_index", BTRFS_XATTR_ITEM_KEY => "xattr_item", _ => "dir_item" },
            "entries": v.iter().map(|e| json!({
                "location": key_json(&Key::from(&e.item.location)), "type": e.item.type_,
                "transid": e.item.transid.get(), "name": name(e.name), "data": name(e.data),
            })).collect::<Vec<_>>(),
        }),
        ItemBody::DirLog(d) => json!({"kind": "dir_log", "end": d.end.get()}),
        ItemBody::Orphan => json!({"kind": "orphan"}),
        ItemBody::FileExtent(fe) => {
            let h = fe.head();
            let mut m = json!({
                "kind": "file_extent", "generation": h.generation.get(), "ram_bytes": h.ram_bytes.get(),
                "compression": h.compression, "encryption": h.encryption, "other_encoding": h.other_encoding.get(),
                "type": h.type_,
                "type_name": match h.type_ { BTRFS_FILE_EXTENT_INLINE => "inline", BTRFS_FILE_EXTENT_PREALLOC => "prealloc", _ => "regular" },
            });
            match fe {
                FileExtent::Inline { data, .. } => m["inline_size"] = json!(data.len()),
                FileExtent::Disk { item, .. } => {
                    m["disk_bytenr"] = json!(item.disk_bytenr.get());
                    m["disk_num_bytes"] = json!(item.disk_num_bytes.get());
                    m["offset"] = json!(item.offset.get());
                    m["num_bytes"] = json!(item.num_bytes.get());
                }
            }
            m
        }
        ItemBody::ExtentCsum(d) => {
            let n = d.len() / csum_size.max(1);
            json!({
                "kind": "extent_csum", "start": key.offset, "length": n as u64 * sectorsize as u64,
                "csums": d.chunks_exact(csum_size.max(1)).map(hex).collect::<Vec<_>>(),
            })
        }
        ItemBody::RootItem(ri) => {
            let mut m = json!({
                "kind": "root_item", "generation": ri.generation.get(), "root_dirid": ri.root_dirid.get(),
                "bytenr": ri.bytenr.get(), "byte_limit": ri.byte_limit.get(), "bytes_used": ri.bytes_used.get(),
                "last_snapshot": ri.last_snapshot.get(), "flags": ri.flags.get(), "refs": ri.refs.get(),
                "drop_progress": key_json(&Key::from(&ri.drop_progress)), "drop_level": ri.drop_level,
                "level": ri.level, "generation_v2": ri.generation_v2.get(),
            });
            if ri.has_v2() {
                m["uuid"] = json!(uuid_string(&ri.uuid));
                m["parent_uuid"] = json!(uuid_string(&ri.parent_uuid));
                m["received_uuid"] = json!(uuid_string(&ri.received_uuid));
                m["ctransid"] = json!(ri.ctransid.get());
                m["otransid"] = json!(ri.otransid.get());
                m["stransid"] = json!(ri.stransid.get());
                m["rtransid"] = json!(ri.rtransid.get());
                m["ctime"] = ts(ri.ctime.sec.get(), ri.ctime.nsec.get());
                m["otime"] = ts(ri.otime.sec.get(), ri.otime.nsec.get());
                m["stime"] = ts(ri.stime.sec.get(), ri.stime.nsec.get());
                m["rtime"] = ts(ri.rtime.sec.get(), ri.rtime.nsec.get());
            }
            m
        }
        ItemBody::RootRef(r, n) => json!({
            "kind": if key.ty == BTRFS_ROOT_REF_KEY { "root_ref" } else { "root_backref" },
            "dirid": r.dirid.get(), "sequence": r.sequence.get(), "name": name(n),
        }),
        ItemBody::Extent(ev) => {
            let refs: Vec<Value> = ev
                .refs
                .iter()
                .map(|r| match *r {
                    InlineRef::TreeBlock { root } => json!({"type": "tree_block_ref", "root": root}),
                    InlineRef::SharedBlock { parent } => json!({"type": "shared_block_ref", "parent": parent}),
                    InlineRef::ExtentData { root, objectid, offset, count } => {
                        json!({"type": "extent_data_ref", "root": root, "objectid": objectid, "offset": offset, "count": count})
                    }
                    InlineRef::SharedData { parent, count } => json!({"type": "shared_data_ref", "parent": parent, "count": count}),
                    InlineRef::Owner { root } => json!({"type": "extent_owner_ref", "root": root}),
                })
                .collect();
            let mut m = json!({
                "kind": if key.ty == BTRFS_METADATA_ITEM_KEY { "metadata_item" } else { "extent_item" },
                "refs": ev.item.refs.get(), "generation": ev.item.generation.get(), "flags": ev.item.flags.get(),
                "inline_refs": refs,
            });
            if let Some(tb) = ev.tree_block_info {
                m["tree_block_key"] = key_json(&Key::from(&tb.key));
                m["tree_block_level"] = json!(tb.level);
            } else if key.ty == BTRFS_METADATA_ITEM_KEY {
                m["tree_block_level"] = json!(key.offset);
            }
            m
        }
        ItemBody::TreeBlockRef => json!({"kind": "tree_block_ref"}),
        ItemBody::SharedBlockRef => json!({"kind": "shared_block_ref"}),
        ItemBody::ExtentDataRef(r) => json!({
            "kind": "extent_data_ref", "root": r.root.get(), "objectid": r.objectid.get(),
            "offset": r.offset.get(), "count": r.count.get(),
        }),
        ItemBody::SharedDataRef(r) => json!({"kind": "shared_data_ref", "count": r.count.get()}),
        ItemBody::ExtentOwnerRef(root) => json!({"kind": "extent_owner_ref", "root": root}),
        ItemBody::BlockGroup(bg) => json!({
            "kind": "block_group", "used": bg.used.get(), "chunk_objectid": bg.chunk_objectid.get(),
            "flags": bg.flags.get(), "flags_name": block_group_flags_str(bg.flags.get()),
        }),
        ItemBody::FreeSpaceInfo(fi) => json!({"kind": "free_space_info", "extent_count": fi.extent_count.get(), "flags": fi.flags.get()}),
        ItemBody::FreeSpaceExtent => json!({"kind": "free_space_extent", "start": key.objectid, "length": key.offset}),
        ItemBody::FreeSpaceBitmap(d) => json!({"kind": "free_space_bitmap", "start": key.objectid, "length": key.offset, "bitmap": hex(d)}),
        ItemBody::DevExtent(de) => json!({
            "kind": "dev_extent", "chunk_tree": de.chunk_tree.get(), "chunk_objectid": de.chunk_objectid.get(),
            "chunk_offset": de.chunk_offset.get(), "length": de.length.get(),
            "chunk_tree_uuid": uuid_string(&de.chunk_tree_uuid),
        }),
        ItemBody::DevItem(di) => json!({
            "kind": "dev_item", "devid": di.devid.get(), "total_bytes": di.total_bytes.get(),
            "bytes_used": di.bytes_used.get(), "io_align": di.io_align.get(), "io_width": di.io_width.get(),
            "sector_size": di.sector_size.get(), "type": di.type_.get(), "generation": di.generation.get(),
            "start_offset": di.start_offset.get(), "dev_group": di.dev_group.get(), "seek_speed": di.seek_speed,
            "bandwidth": di.bandwidth, "uuid": uuid_string(&di.uuid), "fsid": uuid_string(&di.fsid),
        }),
        ItemBody::Chunk(c, stripes) => json!({
            "kind": "chunk", "length": c.length.get(), "owner": c.owner.get(), "stripe_len": c.stripe_len.get(),
            "type": c.type_.get(), "type_name": block_group_flags_str(c.type_.get()), "io_align": c.io_align.get(),
            "io_width": c.io_width.get(), "sector_size": c.sector_size.get(), "num_stripes": c.num_stripes.get(),
            "sub_stripes": c.sub_stripes.get(),
            "stripes": stripes.iter().map(|s| json!({
                "devid": s.devid.get(), "offset": s.offset.get(), "dev_uuid": uuid_string(&s.dev_uuid),
            })).collect::<Vec<_>>(),
        }),
        ItemBody::Uuid(ids) => json!({"kind": "uuid", "subvol_ids": ids}),
        ItemBody::QgroupStatus(st, enable_gen) => json!({
            "kind": "qgroup_status", "version": st.version.get(), "generation": st.generation.get(),
            "flags": st.flags.get(), "scan": st.rescan.get(), "enable_gen": enable_gen,
        }),
        ItemBody::QgroupInfo(qi) => json!({
            "kind": "qgroup_info", "qgroupid": qgroupid_str(key.offset), "generation": qi.generation.get(),
            "referenced": qi.rfer.get(), "referenced_compressed": qi.rfer_cmpr.get(),
            "exclusive": qi.excl.get(), "exclusive_compressed": qi.excl_cmpr.get(),
        }),
        ItemBody::QgroupLimit(ql) => json!({
            "kind": "qgroup_limit", "qgroupid": qgroupid_str(key.offset), "flags": ql.flags.get(),
            "max_referenced": ql.max_rfer.get(), "max_exclusive": ql.max_excl.get(),
            "rsv_referenced": ql.rsv_rfer.get(), "rsv_exclusive": ql.rsv_excl.get(),
        }),
        ItemBody::QgroupRelation => json!({
            "kind": "qgroup_relation", "src": qgroupid_str(key.objectid), "dst": qgroupid_str(key.offset),
        }),
        ItemBody::DevStats(vals) => {
            let mut m = Map::new();
            m.insert("kind".into(), json!("dev_stats"));
            for (n, v) in vals.iter().enumerate() {
                let k = DEV_STAT_NAMES.get(n).map(|s| s.to_string()).unwrap_or_else(|| format!("unknown_{n}"));
                m.insert(k, json!(v));
            }
            Value::Object(m)
        }
        ItemBody::DevReplace(r) => json!({
            "kind": "dev_replace", "src_devid": r.src_devid.get(), "cursor_left": r.cursor_left.get(),
            "cursor_right": r.cursor_right.get(), "cont_reading_from_srcdev_mode": r.cont_reading_from_srcdev_mode.get(),
            "replace_state": r.replace_state.get(), "time_started": r.time_started.get(),
            "time_stopped": r.time_stopped.get(), "num_write_errors": r.num_write_errors.get(),
            "num_uncorrectable_read_errors": r.num_uncorrectable_read_errors.get(),
        }),
        ItemBody::Balance(b) => json!({
            "kind": "balance", "flags": b.flags.get(), "data": balance_args(&b.data),
            "meta": balance_args(&b.meta), "sys": balance_args(&b.sys),
        }),
        ItemBody::VerityDesc(d, rest) => json!({
            "kind": "verity_desc", "size": d.size.get(), "encryption": d.encryption, "data": hex(rest),
        }),
        ItemBody::VerityMerkle(d) => json!({"kind": "verity_merkle", "data": hex(d)}),
        ItemBody::StringItem(d) => json!({"kind": "string", "data": name(d)}),
        ItemBody::Unknown(d) => json!({"kind": "unknown", "raw": hex(d)}),
        #[allow(unreachable_patterns)]
        _ => json!({"kind": "other", "raw": hex(raw)}),
    }
}
