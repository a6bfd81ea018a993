//! The FUSE layout of directory entries, attributes and lookup results: [`DirentWriter`] lists
//! a directory into a READDIR or READDIRPLUS reply's data, for the synchronous dispatcher's sinks
//! and for a filesystem's engine that lists a directory later ([`super::seam`]); the server's
//! reply encoder uses the same attribute and entry layouts.

use std::mem::size_of;

use super::{DirEntry, Entry, Stat};
use crate::abi;
use crate::io::Writer;

/// Encodes directory entries into the data part of a READDIR or READDIRPLUS reply, for the
/// synchronous dispatcher's sinks and for an engine that lists a directory later
/// ([`crate::filesystem::seam`]): the FUSE layout of an entry stays here.
#[derive(Debug)]
pub struct DirentWriter<'w, 'a> {
    out: &'w mut Writer<'a>,
}

impl<'w, 'a> DirentWriter<'w, 'a> {
    /// Entries go into `out` (the data part of the reply).
    pub fn new(out: &'w mut Writer<'a>) -> Self {
        DirentWriter { out }
    }

    /// Adds a READDIR entry; false (nothing written) if it does not fit.
    pub fn add(&mut self, e: &DirEntry<'_>) -> bool {
        add_dirent(self.out, e, None)
    }

    /// Adds a READDIRPLUS entry with its lookup result; false (nothing written) if it does not
    /// fit.
    pub fn add_plus(&mut self, e: &DirEntry<'_>, entry: &Entry) -> bool {
        add_dirent(self.out, e, Some(entry))
    }

    /// Bytes written so far: what [`super::Reply::Data`] reports.
    pub fn bytes_written(&self) -> usize {
        self.out.bytes_written()
    }
}

/// Serialises one directory entry into `out`; false (nothing written) if it does not fit.
pub(crate) fn add_dirent(out: &mut Writer<'_>, e: &DirEntry<'_>, entry: Option<&Entry>) -> bool {
    let namelen = e.name.len();
    let (fixed, total) = match entry {
        None => (size_of::<abi::Dirent>(), abi::dirent_size(namelen)),
        Some(_) => (size_of::<abi::DirentPlus>(), abi::direntplus_size(namelen)),
    };
    if namelen == 0 || namelen > abi::FUSE_NAME_MAX || total > out.available() {
        return false;
    }
    let dirent = abi::Dirent { ino: e.ino, off: e.offset, namelen: namelen as u32, typ: e.typ };
    let res = match entry {
        None => out.write_obj(&dirent),
        Some(entry) => out.write_obj(&abi::DirentPlus { entry_out: entry_out(entry), dirent }),
    };
    res.and_then(|_| out.write_all(e.name)).and_then(|_| out.write_zeros(total - fixed - namelen)).is_ok()
}

/// Attributes as the kernel takes them (`fuse_attr`).
pub(crate) fn to_attr(st: &Stat) -> abi::Attr {
    abi::Attr {
        ino: st.ino,
        size: st.size,
        blocks: st.blocks,
        atime: st.atime.sec as u64,
        mtime: st.mtime.sec as u64,
        ctime: st.ctime.sec as u64,
        atimensec: st.atime.nsec,
        mtimensec: st.mtime.nsec,
        ctimensec: st.ctime.nsec,
        mode: st.mode,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        rdev: st.rdev,
        blksize: st.blksize,
        flags: 0,
    }
}

/// A lookup result as the kernel takes it (`fuse_entry_out`).
pub(crate) fn entry_out(e: &Entry) -> abi::EntryOut {
    abi::EntryOut {
        nodeid: e.ino,
        generation: e.generation,
        entry_valid: e.entry_timeout.as_secs(),
        attr_valid: e.attr_timeout.as_secs(),
        entry_valid_nsec: e.entry_timeout.subsec_nanos(),
        attr_valid_nsec: e.attr_timeout.subsec_nanos(),
        attr: to_attr(&e.attr),
    }
}
