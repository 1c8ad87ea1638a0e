//! The data a send will read, read ahead on a thread of its own in large
//! runs: the extents a stream sends lie mostly in the order the sender
//! asks for them, so touching ones are read in one request (up to
//! [`RUN`]) while the sender formats the commands before them. At most
//! [`AHEAD`] runs wait. Anything the thread cannot read, or that the
//! sender finds out of order, is read the ordinary way instead (through
//! the engine, with its checksum checks and mirror repair): this is only
//! a faster path to the same bytes, which the sender verifies.

use crate::chunk::ChunkMap;
use crate::io::BlockDevice;
use std::collections::BTreeMap;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

/// The largest read.
pub const RUN: u64 = 4 << 20;
/// Runs read and not yet taken.
pub const AHEAD: usize = 16;

/// A run read: its logical start and bytes (None: unreadable here).
type Run = (u64, Option<Vec<u8>>);

/// Reads extents ahead of their use.
pub struct ExtentReader {
    rx: Receiver<Run>,
    cur: Option<(u64, Vec<u8>)>,
    /// Runs still to come: start, length, the first inode whose extent
    /// it holds.
    pending: std::collections::VecDeque<(u64, u64, u64)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn read_run(
    chunks: &ChunkMap,
    devs: &BTreeMap<u64, Arc<dyn BlockDevice>>,
    s: u64,
    l: u64,
) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; l as usize];
    let mut at = 0usize;
    for p in chunks.pieces(s, l).ok()? {
        let (devid, phys) = *p.copies.first()?;
        let d = devs.get(&devid)?;
        let n = p.len as usize;
        d.read_at(phys, buf.get_mut(at..at + n)?).ok()?;
        at += n;
    }
    (at == buf.len()).then_some(buf)
}

impl ExtentReader {
    /// Start reading `extents` (inode, logical address, length), in the
    /// order the inodes will ask for them, touching ones joined.
    pub fn start(
        chunks: ChunkMap,
        devs: BTreeMap<u64, Arc<dyn BlockDevice>>,
        extents: &[(u64, u64, u64)],
    ) -> ExtentReader {
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for &(ino, s, l) in extents {
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == s && r.1 + l <= RUN => r.1 += l,
                Some(r) if r.0 <= s && s + l <= r.0 + r.1 => {}
                _ => runs.push((s, l, ino)),
            }
        }
        let (tx, rx) = sync_channel::<Run>(AHEAD);
        let todo: Vec<(u64, u64)> = runs.iter().map(|r| (r.0, r.1)).collect();
        let thread = std::thread::Builder::new()
            .name("btrkit-send-read".into())
            .spawn(move || {
                for (s, l) in todo {
                    let data = read_run(&chunks, &devs, s, l);
                    if tx.send((s, data)).is_err() {
                        return;
                    }
                }
            })
            .ok();
        ExtentReader {
            rx,
            cur: None,
            pending: if thread.is_some() {
                runs.into()
            } else {
                Default::default()
            },
            thread,
        }
    }

    /// The bytes `[s, s + l)` of inode `ino`'s extent when the reader has
    /// them. Runs for inodes up to `ino` are taken in turn (those before
    /// are dropped: their extents went another way); a run for a later
    /// inode is left for it.
    pub fn take(&mut self, ino: u64, s: u64, l: u64) -> Option<Vec<u8>> {
        loop {
            if let Some((cs, d)) = &self.cur {
                if *cs <= s && s + l <= cs + d.len() as u64 {
                    let a = (s - cs) as usize;
                    return Some(d[a..a + l as usize].to_vec());
                }
            }
            let &(_, _, first) = self.pending.front()?;
            if first > ino {
                return None;
            }
            self.pending.pop_front();
            let (rs, data) = self.rx.recv().ok()?;
            self.cur = data.map(|d| (rs, d));
        }
    }
}

impl Drop for ExtentReader {
    fn drop(&mut self) {
        // Dropping the receiver ends the thread at its next send.
        let (_, rx) = sync_channel::<Run>(0);
        drop(std::mem::replace(&mut self.rx, rx));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
