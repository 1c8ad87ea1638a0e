//! `btrfs receive --dump`: one line per command, as btrfs-progs prints it
//! (receive-dump.c): the command's name in 16 columns, the path from the
//! stream's subvolume with special characters escaped, padded to 32
//! columns, then the command's values. Times are local, as strftime's
//! `%FT%T%z` writes them.

use super::stream::{Command, Time};

/// Escape as btrfs-progs' string_print_escape_special: C escapes for
/// control characters, a backslash before space and backslash, octal for
/// anything else not printable. Returns the text and its length.
pub fn escape(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s {
        match c {
            0x07 => out.push_str("\\a"),
            0x08 => out.push_str("\\b"),
            0x1b => out.push_str("\\e"),
            0x0c => out.push_str("\\f"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x0b => out.push_str("\\v"),
            b' ' => out.push_str("\\ "),
            b'\\' => out.push_str("\\\\"),
            // isprint in the C locale; a char is signed, so bytes above
            // 0x7f print as the octal of their negative value's low bits.
            0x21..=0x7e => out.push(c as char),
            _ => {
                out.push('\\');
                out.push((b'0' + ((c & 0o300) >> 6)) as char);
                out.push((b'0' + ((c & 0o70) >> 3)) as char);
                out.push((b'0' + (c & 0o7)) as char);
            }
        }
    }
    out
}

/// path_cat_out of btrfs-progs: `a/b` with one trailing slash of each
/// dropped.
fn cat(a: &[u8], b: &[u8]) -> Vec<u8> {
    let a = a.strip_suffix(b"/").unwrap_or(a);
    let b = b.strip_suffix(b"/").unwrap_or(b);
    let mut v = Vec::with_capacity(a.len() + b.len() + 1);
    v.extend_from_slice(a);
    v.push(b'/');
    v.extend_from_slice(b);
    v
}

fn uuid(u: &[u8; 16]) -> String {
    crate::util::uuid::uuid_str(u)
}

/// Local time as strftime's `%FT%T%z`.
fn time(t: Time) -> String {
    match crate::io::host::local_time(t.sec) {
        Some((y, mo, d, h, mi, s, off)) => {
            let sign = if off < 0 { '-' } else { '+' };
            let off = off.unsigned_abs();
            format!(
                "{y}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{sign}{:02}{:02}",
                off / 3600,
                off / 60 % 60
            )
        }
        None => format!("{}.{:09}", t.sec, t.nsec),
    }
}

/// Formats the commands of streams as btrfs receive --dump.
pub struct Dumper {
    root: Vec<u8>,
    subvol: Vec<u8>,
}

impl Default for Dumper {
    fn default() -> Self {
        Dumper {
            root: b".".to_vec(),
            subvol: b".".to_vec(),
        }
    }
}

impl Dumper {
    fn line(&self, title: &str, path: &[u8], rest: Option<String>) -> String {
        let p = escape(&cat(&self.subvol, path));
        let mut s = format!("{title:<16}{p}");
        if let Some(r) = rest {
            let n = p.len();
            s.push(' ');
            for _ in n + 1..32 {
                s.push(' ');
            }
            s.push_str(&r);
        }
        s
    }

    /// The line of `c` (without its newline).
    pub fn line_of(&mut self, c: &Command) -> Option<String> {
        let l = match c {
            Command::Subvol {
                path,
                uuid: u,
                ctransid,
            } => {
                self.subvol = cat(&self.root, path);
                let p = escape(&self.subvol);
                let mut s = format!("{:<16}{p}", "subvol");
                pad(&mut s, p.len());
                s.push_str(&format!("uuid={} transid={ctransid}", uuid(u)));
                s
            }
            Command::Snapshot {
                path,
                uuid: u,
                ctransid,
                clone_uuid,
                clone_ctransid,
            } => {
                self.subvol = cat(&self.root, path);
                let p = escape(&self.subvol);
                let mut s = format!("{:<16}{p}", "snapshot");
                pad(&mut s, p.len());
                s.push_str(&format!(
                    "uuid={} transid={ctransid} parent_uuid={} parent_transid={clone_ctransid}",
                    uuid(u),
                    uuid(clone_uuid)
                ));
                s
            }
            Command::Mkfile { path, .. } => self.line("mkfile", path, None),
            Command::Mkdir { path, .. } => self.line("mkdir", path, None),
            Command::Mknod {
                path, mode, rdev, ..
            } => self.line("mknod", path, Some(format!("mode={mode:o} dev={rdev:#x}"))),
            Command::Mkfifo { path, .. } => self.line("mkfifo", path, None),
            Command::Mksock { path, .. } => self.line("mksock", path, None),
            Command::Symlink { path, target, .. } => {
                self.line("symlink", path, Some(format!("dest={}", escape(target))))
            }
            Command::Rename { from, to } => self.line(
                "rename",
                from,
                Some(format!("dest={}", escape(&cat(&self.subvol, to)))),
            ),
            Command::Link { path, target } => {
                self.line("link", path, Some(format!("dest={}", escape(target))))
            }
            Command::Unlink { path } => self.line("unlink", path, None),
            Command::Rmdir { path } => self.line("rmdir", path, None),
            Command::Write { path, offset, data } => self.line(
                "write",
                path,
                Some(format!("offset={offset} len={}", data.len())),
            ),
            Command::Clone {
                path,
                offset,
                len,
                clone_path,
                clone_offset,
                ..
            } => self.line(
                "clone",
                path,
                Some(format!(
                    "offset={offset} len={len} from={} clone_offset={clone_offset}",
                    escape(&cat(&self.subvol, clone_path))
                )),
            ),
            Command::SetXattr { path, name, data } => self.line(
                "set_xattr",
                path,
                Some(format!(
                    "name={} {} len={}",
                    escape(name),
                    escape(data),
                    data.len()
                )),
            ),
            Command::RemoveXattr { path, name } => {
                self.line("remove_xattr", path, Some(format!("name={}", escape(name))))
            }
            Command::Truncate { path, size } => {
                self.line("truncate", path, Some(format!("size={size}")))
            }
            Command::Chmod { path, mode } => self.line("chmod", path, Some(format!("mode={mode:o}"))),
            Command::Chown { path, uid, gid } => {
                self.line("chown", path, Some(format!("gid={gid} uid={uid}")))
            }
            Command::Utimes {
                path,
                atime,
                mtime,
                ctime,
            } => self.line(
                "utimes",
                path,
                Some(format!(
                    "atime={} mtime={} ctime={}",
                    time(*atime),
                    time(*mtime),
                    time(*ctime)
                )),
            ),
            Command::UpdateExtent { path, offset, len } => self.line(
                "update_extent",
                path,
                Some(format!("offset={offset} len={len}")),
            ),
            Command::EncodedWrite {
                path,
                offset,
                unencoded_file_len,
                unencoded_len,
                unencoded_offset,
                compression,
                encryption,
                data,
            } => self.line(
                "encoded_write",
                path,
                Some(format!(
                    "offset={offset} len={} unencoded_file_len={unencoded_file_len} unencoded_len={unencoded_len} unencoded_offset={unencoded_offset} compression={compression} encryption={encryption}",
                    data.len()
                )),
            ),
            Command::Fallocate {
                path,
                mode,
                offset,
                len,
            } => self.line(
                "fallocate",
                path,
                Some(format!("mode={mode} offset={offset} len={len}")),
            ),
            // btrfs-progs prints the value in decimal after "0x".
            Command::Fileattr { path, attr } => {
                self.line("fileattr", path, Some(format!("fileattr=0x{attr}")))
            }
            Command::EnableVerity {
                path,
                algorithm,
                block_size,
                salt,
                sig,
            } => self.line(
                "enable_verity",
                path,
                Some(format!(
                    "algorithm={algorithm} block_size={block_size} salt_len={} sig_len={}",
                    salt.len(),
                    sig.len()
                )),
            ),
            Command::End => return None,
        };
        Some(l)
    }
}

fn pad(s: &mut String, n: usize) {
    s.push(' ');
    for _ in n + 1..32 {
        s.push(' ');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_btrfs_progs_prints_them() {
        let mut d = Dumper::default();
        let l = d
            .line_of(&Command::Subvol {
                path: b"snap".to_vec(),
                uuid: [0; 16],
                ctransid: 7,
            })
            .unwrap();
        assert_eq!(
            l,
            "subvol          ./snap                          uuid=00000000-0000-0000-0000-000000000000 transid=7"
        );
        let l = d
            .line_of(&Command::Mkfile {
                path: b"a b".to_vec(),
                ino: 257,
            })
            .unwrap();
        assert_eq!(l, "mkfile          ./snap/a\\ b");
        let l = d
            .line_of(&Command::Chmod {
                path: Vec::new(),
                mode: 0o755,
            })
            .unwrap();
        assert_eq!(
            l,
            "chmod           ./snap/                         mode=755"
        );
        assert_eq!(escape(&[0xff, b'\n']), "\\377\\n");
    }
}
