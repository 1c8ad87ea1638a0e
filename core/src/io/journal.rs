//! A device that keeps the history of what was written to it: every write
//! and every flush, in order, so that the state the disk could be in after
//! a power failure at any moment can be rebuilt afterwards (crash
//! exploration).

use super::BlockDevice;
use crate::{Error, Result};
use std::sync::{Arc, Mutex};

/// One event the device saw.
#[derive(Clone, Debug)]
pub enum JournalEvent {
    /// A write, as passed to `write_at`.
    Write {
        /// Byte offset of the write.
        offset: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// A flush: every write before it is durable.
    Flush,
}

/// The history of the devices of one set, in the one order their events
/// happened: (device index, event).
#[derive(Default)]
pub struct Journal {
    events: Mutex<Vec<(usize, JournalEvent)>>,
}

impl Journal {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Vec<(usize, JournalEvent)>>> {
        self.events
            .lock()
            .map_err(|_| Error::Internal("journal lock poisoned".into()))
    }

    /// Flushes of any device seen so far.
    pub fn flushes(&self) -> Result<usize> {
        Ok(self
            .lock()?
            .iter()
            .filter(|e| matches!(e.1, JournalEvent::Flush))
            .count())
    }

    /// Every device's events so far, in order, with the device's index.
    pub fn events(&self) -> Result<Vec<(usize, JournalEvent)>> {
        Ok(self.lock()?.clone())
    }
}

/// Passes everything to `inner` and remembers it in a [`Journal`], its own
/// or one shared by the devices of a set (tagged with its index there).
pub struct JournalDevice {
    inner: Arc<dyn BlockDevice>,
    journal: Arc<Journal>,
    index: usize,
}

impl JournalDevice {
    /// Record everything done to `inner` from now on.
    pub fn new(inner: Arc<dyn BlockDevice>) -> JournalDevice {
        JournalDevice::in_journal(inner, Arc::default(), 0)
    }

    /// Record everything done to `inner` in `journal`, as device `index`.
    pub fn in_journal(
        inner: Arc<dyn BlockDevice>,
        journal: Arc<Journal>,
        index: usize,
    ) -> JournalDevice {
        JournalDevice {
            inner,
            journal,
            index,
        }
    }

    /// Flushes seen so far (by every device of the journal).
    pub fn flushes(&self) -> Result<usize> {
        self.journal.flushes()
    }

    /// This device's events so far.
    pub fn events(&self) -> Result<Vec<JournalEvent>> {
        Ok(self
            .journal
            .lock()?
            .iter()
            .filter(|e| e.0 == self.index)
            .map(|e| e.1.clone())
            .collect())
    }
}

impl BlockDevice for JournalDevice {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.inner.write_at(offset, buf)?;
        self.journal.lock()?.push((
            self.index,
            JournalEvent::Write {
                offset,
                data: buf.to_vec(),
            },
        ));
        Ok(())
    }
    fn flush(&self) -> Result<()> {
        self.inner.flush()?;
        self.journal.lock()?.push((self.index, JournalEvent::Flush));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::MemDevice;

    #[test]
    fn records_writes_and_flushes_in_order() {
        let d = JournalDevice::new(Arc::new(MemDevice::new(vec![0u8; 1 << 16])));
        d.write_at(4096, &[1; 10]).unwrap();
        d.flush().unwrap();
        d.write_at(0, &[2; 5]).unwrap();
        let ev = d.events().unwrap();
        assert_eq!(ev.len(), 3);
        assert!(matches!(&ev[0], JournalEvent::Write { offset: 4096, data } if data == &[1; 10]));
        assert!(matches!(ev[1], JournalEvent::Flush));
        assert_eq!(d.flushes().unwrap(), 1);
        let mut b = [0u8; 5];
        d.read_at(0, &mut b).unwrap();
        assert_eq!(b, [2; 5]);
    }
}
