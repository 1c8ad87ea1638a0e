//! Devices joining and leaving the filesystem (btrfs_init_new_device,
//! the end of btrfs_rm_device): the device item in the chunk tree, each
//! device's own item in its superblocks, the superblock's device count
//! and total size. Moving what lies on a leaving device is relocation's
//! job (the device_change module's).

use super::Store;
use crate::format::consts::*;
use crate::format::dev::DevItem;
use crate::format::key::Key;
use crate::io::BlockDevice;
use crate::{Error, Result};
use std::sync::Arc;
use zerocopy::{FromBytes, IntoBytes};

/// Devices joining, leaving and taking each other's place: their items,
/// the superblock's count and size. Obtained from [`Store::membership`].
pub struct Membership<'a> {
    st: &'a mut Store,
}

impl Store {
    /// See [`Membership`].
    pub fn membership(&mut self) -> Membership<'_> {
        Membership { st: self }
    }

    /// Device `devid`, when present.
    pub fn chunk_map_device(&self, devid: u64) -> Option<Arc<dyn BlockDevice>> {
        self.img.device_of(devid).cloned()
    }
}

impl Membership<'_> {
    /// Add device `dev` (`name` for messages) of `size` bytes: the next
    /// devid, a new device uuid, its item in the chunk tree; the
    /// superblock's device count and size grow. Its superblocks are
    /// written by the next commit. Returns the devid.
    pub fn add_device(
        &mut self,
        name: String,
        dev: Arc<dyn BlockDevice>,
        size: u64,
    ) -> Result<u64> {
        let ss = self.st.sectorsize() as u64;
        let size = size / ss * ss;
        let mut devid = 0u64;
        for (k, _) in self.st.items_in(
            BTRFS_CHUNK_TREE_OBJECTID,
            Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, 0),
            Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, u64::MAX),
        )? {
            devid = devid.max(k.offset);
        }
        let devid = devid
            .checked_add(1)
            .ok_or_else(|| Error::Invalid("no device id left".into()))?;
        let item = DevItem {
            devid: devid.into(),
            total_bytes: size.into(),
            bytes_used: 0.into(),
            io_align: (ss as u32).into(),
            io_width: (ss as u32).into(),
            sector_size: (ss as u32).into(),
            type_: 0.into(),
            generation: 0.into(),
            start_offset: 0.into(),
            dev_group: 0.into(),
            seek_speed: 0,
            bandwidth: 0,
            uuid: crate::util::uuid::random_uuid(),
            fsid: self.st.sb.dev_item.fsid,
        };
        self.st.insert_item(
            BTRFS_CHUNK_TREE_OBJECTID,
            &Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid),
            item.as_bytes(),
        )?;
        self.st.img.add_device(name, dev, item);
        self.st.space.set_dev_item(&mut self.st.sb, devid, item);
        let n = self.st.sb.num_devices.get();
        self.st.sb.num_devices.set(n + 1);
        let t = self.st.sb.total_bytes.get();
        self.st.sb.total_bytes.set(t.saturating_add(size));
        Ok(devid)
    }

    /// Take device `devid`, which holds no dev extent any more, out of the
    /// filesystem: its device item and device stats item go, the
    /// superblock's count and size shrink, and it is no longer written.
    /// Returns the device (to scratch its superblocks once the removal is
    /// committed).
    pub fn remove_device(&mut self, devid: u64) -> Result<Option<Arc<dyn BlockDevice>>> {
        let left = self.st.items_in(
            BTRFS_DEV_TREE_OBJECTID,
            Key::new(devid, BTRFS_DEV_EXTENT_KEY, 0),
            Key::new(devid, BTRFS_DEV_EXTENT_KEY, u64::MAX),
        )?;
        if let Some((k, _)) = left.first() {
            return Err(Error::Internal(format!(
                "device {devid} still holds a dev extent at {}",
                k.offset
            )));
        }
        let di = match self.st.space.dev_item_of(&self.st.sb, devid) {
            Some(d) => d,
            // A missing device: its item as the chunk tree has it.
            None => self
                .tree_device_item(devid)?
                .ok_or_else(|| Error::Invalid(format!("no device {devid}")))?,
        };
        self.st.delete_item(
            BTRFS_CHUNK_TREE_OBJECTID,
            &Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid),
        )?;
        self.st.delete_item(
            BTRFS_DEV_TREE_OBJECTID,
            &Key::new(BTRFS_DEV_STATS_OBJECTID, BTRFS_PERSISTENT_ITEM_KEY, devid),
        )?;
        let n = self.st.sb.num_devices.get();
        self.st.sb.num_devices.set(n.saturating_sub(1));
        let t = self.st.sb.total_bytes.get();
        self.st
            .sb
            .total_bytes
            .set(t.saturating_sub(di.total_bytes.get()));
        if devid == self.st.sb.dev_item.devid.get() {
            // The superblock carries another device's item from now on.
            let next = self.st.space.other_dev_items.keys().next().copied();
            if let Some(id) = next {
                if let Some(it) = self.st.space.other_dev_items.remove(&id) {
                    self.st.sb.dev_item = it;
                }
            }
        } else {
            self.st.space.other_dev_items.remove(&devid);
        }
        Ok(self.st.img.remove_device(devid))
    }

    /// Device `dev` takes device `devid`'s place with its devid, device
    /// uuid and sizes (the end of a replace); the next commit writes its
    /// superblocks. Returns the device replaced (None when missing).
    pub fn swap_device(
        &mut self,
        devid: u64,
        name: String,
        dev: Arc<dyn BlockDevice>,
    ) -> Result<Option<Arc<dyn BlockDevice>>> {
        if self.st.space.dev_item_of(&self.st.sb, devid).is_none() {
            // A missing device: its item as the chunk tree has it.
            let item = self
                .tree_device_item(devid)?
                .ok_or_else(|| Error::Invalid(format!("no device {devid}")))?;
            self.st.space.set_dev_item(&mut self.st.sb, devid, item);
        }
        Ok(self.st.img.replace_device(devid, name, dev))
    }

    /// Device `devid`'s item in the chunk tree (None: no such device).
    pub fn tree_device_item(&mut self, devid: u64) -> Result<Option<DevItem>> {
        let k = Key::new(BTRFS_DEV_ITEMS_OBJECTID, BTRFS_DEV_ITEM_KEY, devid);
        match self.st.lookup(BTRFS_CHUNK_TREE_OBJECTID, &k)? {
            Some(d) => Ok(Some(DevItem::read_from_bytes(&d).map_err(|_| {
                Error::corrupt_key_as(crate::CorruptKind::Device, "dev item size", 0, k)
            })?)),
            None => Ok(None),
        }
    }

    /// Devids of the filesystem's devices that are missing (opened
    /// degraded).
    pub fn missing_devices(&self) -> &[u64] {
        &self.st.img.missing
    }
}
