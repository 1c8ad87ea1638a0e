//! The text rendering of a tree dump: the events of [`crate::sink`] as
//! `btrfs inspect-internal dump-tree` prints them (items via
//! [`crate::render`]).

use crate::render::{s, u, uuid, Text};
use crate::sink::{Event, Sink};
use btrkit_core::format::key::Key;
use btrkit_core::format::names::key_string;
use std::io::{self, Write};

/// The text dump, written through one buffer flushed in large writes.
pub struct TextSink<W: Write> {
    pub text: Text,
    w: W,
}

impl<W: Write> TextSink<W> {
    pub fn new(w: W, text: Text) -> Self {
        TextSink { text, w }
    }
    /// The writer, after [`Sink::finish`].
    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.w
    }
    fn spill(&mut self) -> io::Result<()> {
        if self.text.out.len() >= 1 << 20 {
            self.w.write_all(&self.text.out)?;
            self.text.out.clear();
        }
        Ok(())
    }
}

fn error_line(o: &mut Vec<u8>, message: &str, bytenr: Option<u64>, key: Option<Key>) {
    s(o, "ERROR: ");
    if let Some(b) = bytenr {
        s(o, "tree block ");
        u(o, b);
        if let Some(k) = key {
            s(o, " key ");
            s(o, &key_string(&k));
        }
        s(o, ": ");
    }
    s(o, message);
    o.push(b'\n');
}

impl<W: Write> Sink for TextSink<W> {
    fn event(&mut self, ev: Event<'_>) -> io::Result<()> {
        let t = &mut self.text;
        match ev {
            Event::Section { title, key, .. } => {
                s(&mut t.out, title);
                if let Some(k) = key {
                    s(&mut t.out, " tree ");
                    t.key(&k);
                    t.out.push(b' ');
                }
                t.out.push(b'\n');
            }
            Event::Block { node, problems } => {
                for p in problems {
                    error_line(&mut t.out, &p.message, Some(p.bytenr), p.key);
                }
                t.block(node);
            }
            Event::Error {
                message,
                bytenr,
                key,
            } => error_line(&mut t.out, message, bytenr, key),
            Event::Totals {
                total_bytes,
                bytes_used,
                fsid,
            } => {
                let o = &mut t.out;
                s(o, "total bytes ");
                u(o, total_bytes);
                s(o, "\nbytes used ");
                u(o, bytes_used);
                s(o, "\nuuid ");
                uuid(o, &fsid);
                o.push(b'\n');
            }
        }
        self.spill()
    }
    fn finish(&mut self) -> io::Result<()> {
        self.w.write_all(&self.text.out)?;
        self.text.out.clear();
        self.w.flush()
    }
}
