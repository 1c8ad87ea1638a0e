//! btrkit-corrupt: damage a Btrfs image file on purpose, for testing
//! repairs (after btrfs-progs' btrfs-corrupt-block). Every edit is made in
//! the tree block that holds the thing, the block's checksum recomputed
//! (unless `--leave-csum`) and every copy written (unless `--copy N`).
//! See `btrkit_tests::corrupt`.

use btrkit_tests::corrupt::{
    self, fields, parse_key, parse_tree, recipes, Corruptor, KeyOrder, NameEdit, Value,
};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "btrkit-corrupt",
    about = "Corrupt data structures of a Btrfs image file on purpose (for testing only)",
    after_help = "\
TREE is a number or a name: root, extent, chunk, dev, fs, csum, free-space, uuid,
block-group, or a subvolume id. KEY is OBJECTID,TYPE,OFFSET with TYPE a number or
a name (INODE_ITEM, EXTENT_DATA, DIR_INDEX, ...). VALUE is a number (0x.. hex),
+N / -N (added to / taken from the old value), ^N (bits flipped), random or
random:SEED (any other value), or hex:BYTES for byte arrays.

Examples:
  btrkit-corrupt disk.img list fs --type INODE_ITEM
  btrkit-corrupt disk.img fields fs 257,INODE_ITEM,0
  btrkit-corrupt disk.img set fs 257,INODE_ITEM,0 nbytes +4096
  btrkit-corrupt disk.img set extent 13631488,EXTENT_ITEM,4096 ref[0].type 0
  btrkit-corrupt disk.img delete fs 256,DIR_INDEX,2
  btrkit-corrupt disk.img set-key fs 257,EXTENT_DATA,0 257,EXTENT_DATA,1
  btrkit-corrupt disk.img name fs 256,DIR_ITEM,1234567 --bump
  btrkit-corrupt disk.img header 30441472 generation random
  btrkit-corrupt disk.img item-header 30441472 3 offset random
  btrkit-corrupt disk.img shift-items 30441472
  btrkit-corrupt disk.img super num_devices 2
  btrkit-corrupt disk.img recipe 016 --seed 7"
)]
struct Cli {
    /// The image file (changed in place).
    image: PathBuf,
    /// Leave the block's (or superblock's) checksum as it was: the damage
    /// shows as a checksum error too.
    #[arg(long, global = true)]
    leave_csum: bool,
    /// Write only copy N (0 the first) of a DUP or mirrored block, or
    /// superblock copy N, instead of every copy.
    #[arg(long, global = true, value_name = "N")]
    copy: Option<usize>,
    #[command(subcommand)]
    op: Op,
}

#[derive(Subcommand)]
enum Op {
    /// List the items of a tree: key, leaf, slot, size.
    List {
        tree: String,
        /// Only items of this key type (number or name).
        #[arg(long = "type")]
        ty: Option<String>,
        /// Only items with this objectid.
        #[arg(long)]
        objectid: Option<String>,
    },
    /// List the blocks of a tree: bytenr, level, items, generation.
    Blocks { tree: String },
    /// Show the named fields of an item and their values.
    Fields { tree: String, key: String },
    /// Set a named field of an item (btrfs-corrupt-block -i/-x/-e/-D/--block-group).
    Set {
        tree: String,
        key: String,
        field: String,
        value: String,
    },
    /// Set WIDTH bytes at OFFSET of an item's body (btrfs-corrupt-block -I --offset --value).
    SetRaw {
        tree: String,
        key: String,
        offset: usize,
        width: usize,
        value: String,
    },
    /// Fill LEN bytes at OFFSET of an item's body with BYTE
    /// (btrfs-corrupt-block -I --offset --bytes --value).
    Fill {
        tree: String,
        key: String,
        offset: usize,
        len: usize,
        byte: u8,
    },
    /// Delete an item (btrfs-corrupt-block -d).
    Delete { tree: String, key: String },
    /// Change an item's key: in place (the leaf may end up unsorted, as
    /// btrfs-corrupt-block -K does), or moved to its sorted slot with --sorted.
    SetKey {
        tree: String,
        key: String,
        new_key: String,
        #[arg(long)]
        sorted: bool,
    },
    /// Insert an item with a body given as hex.
    Insert {
        tree: String,
        key: String,
        /// The body: hex:.. bytes.
        body: String,
    },
    /// Change the name of a DIR_ITEM, DIR_INDEX, XATTR_ITEM, INODE_REF,
    /// INODE_EXTREF or ROOT_REF/BACKREF.
    Name {
        tree: String,
        key: String,
        /// The new name.
        #[arg(conflicts_with = "bump", required_unless_present = "bump")]
        name: Option<String>,
        /// Its first byte plus one (btrfs-corrupt-block -D -f name).
        #[arg(long)]
        bump: bool,
    },
    /// Reorder an extent item's inline references (the new order as
    /// indices, e.g. 1,0).
    Refs { key: String, order: String },
    /// Set an item header's `offset` or `size` (btrfs-corrupt-block -I -f offset).
    ItemHeader {
        bytenr: u64,
        slot: usize,
        field: String,
        value: String,
    },
    /// Set a tree block header field: generation, level, owner, bytenr,
    /// nritems, flags, fsid, chunk_tree_uuid (btrfs-corrupt-block -m).
    Header {
        bytenr: u64,
        field: String,
        value: String,
    },
    /// Shift the data of a leaf's second half of items (btrfs-corrupt-block
    /// -m BLOCK -f shift_items).
    ShiftItems { bytenr: u64 },
    /// Swap the keys of two slots of a block (cf. btrfs-corrupt-block -k).
    SwapKeys { bytenr: u64, a: usize, b: usize },
    /// Overwrite data bytes with random ones (btrfs-corrupt-block -l -b).
    Data {
        logical: u64,
        bytes: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Set a superblock field on every copy (dev_item.* for its device item).
    Super { field: String, value: String },
    /// Apply a recipe: one class of btrfs-progs' fsck-tests, a random
    /// target chosen by the seed.
    Recipe {
        /// The class (its name, or its number when unique).
        class: String,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// List the recipes.
    Recipes,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("btrkit-corrupt: {e}");
            ExitCode::from(1)
        }
    }
}

fn key_type(s: &str) -> Result<u8, String> {
    Ok(parse_key(&format!("0,{s},0"))?.ty)
}

fn run(cli: Cli) -> Result<(), String> {
    if let Op::Recipes = cli.op {
        for r in recipes::recipes() {
            println!("{:<36} {}", r.class, r.what);
        }
        return Ok(());
    }
    if let Op::Recipe { class, seed } = &cli.op {
        let a = recipes::apply(&cli.image, class, *seed).map_err(|e| e.to_string())?;
        println!("{} (seed {}): {}", a.class, a.seed, a.target);
        for c in &a.changes {
            println!("  {c}");
        }
        return Ok(());
    }
    let mut c = Corruptor::open(&cli.image)?;
    c.opts.fix_csum = !cli.leave_csum;
    c.opts.copy = cli.copy;
    match cli.op {
        Op::List { tree, ty, objectid } => {
            let ty = ty.map(|t| key_type(&t)).transpose()?;
            let oid = objectid
                .map(|o| parse_key(&format!("{o},0,0")).map(|k| k.objectid))
                .transpose()?;
            for l in c.items(parse_tree(&tree)?)? {
                if ty.is_some_and(|t| t != l.key.ty) || oid.is_some_and(|o| o != l.key.objectid) {
                    continue;
                }
                println!(
                    "{} leaf {} slot {} size {}",
                    corrupt::key_str(&l.key),
                    l.bytenr,
                    l.slot,
                    l.data.len()
                );
            }
        }
        Op::Blocks { tree } => {
            for b in c.blocks(parse_tree(&tree)?)? {
                println!(
                    "block {} level {} items {} generation {} owner {} depth {} free {}",
                    b.bytenr, b.level, b.nritems, b.generation, b.owner, b.depth, b.free
                );
            }
        }
        Op::Fields { tree, key } => {
            let l = c.find(parse_tree(&tree)?, parse_key(&key)?)?;
            println!(
                "{} leaf {} slot {} size {}",
                corrupt::key_str(&l.key),
                l.bytenr,
                l.slot,
                l.data.len()
            );
            for f in fields::item_fields(&l.key, &l.data) {
                let v = match corrupt::read_field(&l.data, &f) {
                    Some(v) => v.to_string(),
                    None => l.data[f.off..f.off + f.width]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect(),
                };
                println!("  {:<24} @{:<4} {}  {v}", f.name, f.off, f.width);
            }
        }
        Op::Set {
            tree,
            key,
            field,
            value,
        } => {
            c.set_field(
                parse_tree(&tree)?,
                parse_key(&key)?,
                &field,
                &Value::parse(&value)?,
            )?;
        }
        Op::SetRaw {
            tree,
            key,
            offset,
            width,
            value,
        } => {
            c.set_raw(
                parse_tree(&tree)?,
                parse_key(&key)?,
                offset,
                width,
                &Value::parse(&value)?,
            )?;
        }
        Op::Fill {
            tree,
            key,
            offset,
            len,
            byte,
        } => c.fill(parse_tree(&tree)?, parse_key(&key)?, offset, len, byte)?,
        Op::Delete { tree, key } => c.delete(parse_tree(&tree)?, parse_key(&key)?)?,
        Op::SetKey {
            tree,
            key,
            new_key,
            sorted,
        } => c.set_key(
            parse_tree(&tree)?,
            parse_key(&key)?,
            parse_key(&new_key)?,
            if sorted {
                KeyOrder::Sorted
            } else {
                KeyOrder::InPlace
            },
        )?,
        Op::Insert { tree, key, body } => {
            let Value::Bytes(b) = Value::parse(&body)? else {
                return Err("the body is hex:BYTES".into());
            };
            c.insert(parse_tree(&tree)?, parse_key(&key)?, &b)?
        }
        Op::Name {
            tree,
            key,
            name,
            bump,
        } => {
            let e = if bump {
                NameEdit::Bump
            } else {
                NameEdit::Set(name.unwrap_or_default().into_bytes())
            };
            c.set_name(parse_tree(&tree)?, parse_key(&key)?, &e)?
        }
        Op::Refs { key, order } => {
            let order = order
                .split(',')
                .map(|s| s.trim().parse::<usize>().map_err(|e| format!("{s:?}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            c.reorder_inline_refs(parse_key(&key)?, &order)?
        }
        Op::ItemHeader {
            bytenr,
            slot,
            field,
            value,
        } => {
            c.set_item_header(bytenr, slot, &field, &Value::parse(&value)?)?;
        }
        Op::Header {
            bytenr,
            field,
            value,
        } => {
            c.set_header(bytenr, &field, &Value::parse(&value)?)?;
        }
        Op::ShiftItems { bytenr } => {
            c.shift_items(bytenr)?;
        }
        Op::SwapKeys { bytenr, a, b } => c.swap_keys(bytenr, a, b)?,
        Op::Data {
            logical,
            bytes,
            seed,
        } => c.corrupt_data(logical, bytes, seed)?,
        Op::Super { field, value } => {
            c.set_super(&field, &Value::parse(&value)?)?;
        }
        Op::Recipe { .. } | Op::Recipes => {}
    }
    for ch in &c.changes {
        println!("{ch}");
    }
    Ok(())
}
