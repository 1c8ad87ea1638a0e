//! An image held in memory: see [`MemDevice`].

use super::{past_end, BlockDevice};
use crate::{Error, Result};
use std::sync::RwLock;

/// An image held in memory, for tests and fuzzing.
pub struct MemDevice {
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    /// A device holding `data`; its size is `data.len()` and never changes.
    pub fn new(data: Vec<u8>) -> MemDevice {
        MemDevice {
            data: RwLock::new(data),
        }
    }
    /// A device of `size` zero bytes.
    pub fn zeroed(size: usize) -> MemDevice {
        MemDevice::new(vec![0; size])
    }
    /// A copy of the device's current contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().map(|d| d.clone()).unwrap_or_default()
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.data.read().map(|d| d.len() as u64).unwrap_or(0)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let d = self
            .data
            .read()
            .map_err(|_| Error::Internal("memory device lock poisoned".into()))?;
        let size = d.len() as u64;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= size)
            .ok_or_else(|| past_end(offset, buf.len(), size))?;
        buf.copy_from_slice(&d[offset as usize..end as usize]);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let mut d = self
            .data
            .write()
            .map_err(|_| Error::Internal("memory device lock poisoned".into()))?;
        let size = d.len() as u64;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= size)
            .ok_or_else(|| past_end(offset, buf.len(), size))?;
        d[offset as usize..end as usize].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        Ok(())
    }
}
