//! Input: the 4 KiB primary superblock. The first input byte chooses
//! whether magic, bytenr and checksum are fixed up, so the fuzzer gets past
//! them to the field checks and the sys_chunk_array bootstrap.
#![no_main]

use btrkit_core::chunk::ChunkMap;
use btrkit_core::csum::{block_csum, CsumType};
use btrkit_core::format::consts::*;
use btrkit_core::image::{check_superblock, read_superblock, Image, OpenOptions};
use btrkit_core::io::{BlockDevice, MemDevice};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

const SB: usize = BTRFS_SUPER_INFO_OFFSET as usize;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut img = vec![0u8; SB + BTRFS_SUPER_INFO_SIZE];
    let n = rest.len().min(BTRFS_SUPER_INFO_SIZE);
    img[SB..SB + n].copy_from_slice(&rest[..n]);
    if mode & 1 == 0 {
        let sb = &mut img[SB..];
        sb[0x30..0x38].copy_from_slice(&BTRFS_SUPER_INFO_OFFSET.to_le_bytes());
        sb[0x40..0x48].copy_from_slice(&BTRFS_MAGIC.to_le_bytes());
        let ty = u16::from_le_bytes([sb[0xc4], sb[0xc5]]);
        if let Ok(t) = CsumType::from_disk(ty) {
            let c = block_csum(t, &sb[..BTRFS_SUPER_INFO_SIZE]);
            sb[..BTRFS_CSUM_SIZE].copy_from_slice(&c);
        }
    }
    let dev = Arc::new(MemDevice::new(img));
    let Ok(sb) = read_superblock(dev.as_ref(), 0) else {
        return;
    };
    let _ = check_superblock(&sb, dev.size(), &mut Vec::new());
    // The bootstrap must cope with any array, whatever the field checks said.
    if let Ok(map) = ChunkMap::from_sys_chunk_array(&sb) {
        let ns = sb.nodesize.get() as u64;
        for m in map.iter() {
            for l in [
                m.logical,
                m.end().saturating_sub(1),
                m.end().saturating_sub(ns),
            ] {
                let _ = map.map(l, ns, sb.dev_item.devid.get());
            }
        }
        let _ = map.map(sb.chunk_root.get(), ns, sb.dev_item.devid.get());
        let _ = map.map(sb.root.get(), ns, sb.dev_item.devid.get());
    }
    for lenient in [true, false] {
        let _ = Image::open(
            dev.clone(),
            OpenOptions {
                lenient,
                ..Default::default()
            },
        );
    }
});
