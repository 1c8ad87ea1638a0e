//! Input: a tree block. The first byte picks the nodesize and whether the
//! checksum is fixed up (so validation goes past it); the rest is the block,
//! zero-padded or cut to nodesize. The header fsid is taken as the
//! filesystem's so the item checks are reached.
#![no_main]

use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::item::decode;
use btrkit_core::format::key::Key;
use btrkit_core::tree::node::{Expect, Node, ValidateCtx};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let nodesize: usize = [4096, 16384, 65536, 4096][(mode & 3) as usize];
    let mut buf = vec![0u8; nodesize];
    let n = rest.len().min(nodesize);
    buf[..n].copy_from_slice(&rest[..n]);
    let csum = CsumType::Crc32c;
    if mode & 4 == 0 {
        let c = block_csum(csum, &buf);
        buf[..32].copy_from_slice(&c);
    }
    let bytenr = u64::from_le_bytes(buf[48..56].try_into().unwrap_or([0; 8])); // OK: 8-byte slice of a >=4 KiB buffer
    let mut fsid = [0u8; 16];
    fsid.copy_from_slice(&buf[32..48]);
    let Ok(node) = Node::from_vec(bytenr, buf) else {
        return;
    };
    let ctx = ValidateCtx {
        nodesize: nodesize as u32,
        sectorsize: 4096,
        csum,
        fsid,
        max_generation: u64::MAX >> (mode >> 4),
    };
    let first = node.key(0);
    for expect in [
        Expect::default(),
        Expect {
            level: Some(node.level()),
            generation: Some(node.generation()),
            owner: Some(node.owner()),
            first_key: first,
        },
        Expect {
            level: Some(mode >> 5),
            generation: Some(1),
            owner: Some(5),
            first_key: Some(Key::MIN),
        },
    ] {
        let _ = node.validate(&ctx, &expect);
    }
    for slot in 0..node.nr_safe() + 2 {
        if let Some(k) = node.key(slot) {
            let _ = node.bin_search(&k);
            let _ = node.bin_search(&Key::new(k.objectid, k.ty, k.offset.wrapping_add(1)));
        }
        let _ = node.key_ptr(slot);
        if let (Some(it), Ok(d)) = (node.item(slot), node.item_data(slot)) {
            for cs in [4usize, 8, 32] {
                let _ = decode(&Key::from(&it.key), d, cs);
            }
        }
        let _ = node.decode_item(slot, csum.size());
    }
    let _ = node.bin_search(&Key::MIN);
    let _ = node.bin_search(&Key::new(u64::MAX, u8::MAX, u64::MAX));
});
