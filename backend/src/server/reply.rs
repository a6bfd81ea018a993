//! The reply encoder: a typed [`Reply`] (or an error) into a request's writable buffers, as FUSE
//! wire structs. One encoder for every path: the synchronous dispatcher and the completions of
//! a filesystem's engine ([`crate::filesystem::seam`]) both end here.

use std::mem::size_of;
use std::time::Duration;

use vm_memory::{ByteValued, VolatileSlice};

use super::RequestError;
use crate::abi::{self, OutHeader};
use crate::filesystem::dirent::{entry_out, to_attr};
use crate::filesystem::{self, FileLock, LockType, Opened, Reply, Stat};
use crate::io::{self, Writer};

/// Bytes of the reply header.
pub(crate) const OUT_HEADER_SIZE: usize = size_of::<OutHeader>();

type Result<T> = std::result::Result<T, RequestError>;

/// Encodes `reply` to request `unique` at the start of `w` (all of the writable buffers);
/// returns the reply's length. `limit` caps a count the filesystem reports: the data part's
/// length for [`Reply::Data`], the request's size for [`Reply::Written`].
pub(crate) fn encode(w: Writer<'_>, unique: u64, reply: &Reply, limit: u64) -> Result<usize> {
    match reply {
        Reply::Empty => {
            check_fits(&w, 0)?;
            let mut w = w;
            w.write_obj(&OutHeader { len: OUT_HEADER_SIZE as u32, error: 0, unique })?;
            Ok(OUT_HEADER_SIZE)
        }
        Reply::Entry(e) => reply_obj(w, unique, &entry_out(e)),
        Reply::Attr(attr, valid) => reply_obj(w, unique, &attr_out(attr, *valid)),
        Reply::Statx(st, valid) => {
            let out = abi::StatxOut {
                attr_valid: valid.as_secs(),
                attr_valid_nsec: valid.subsec_nanos(),
                flags: 0,
                spare: [0; 2],
                stat: to_statx(st),
            };
            reply_obj(w, unique, &out)
        }
        Reply::Open(o) => reply_obj(w, unique, &open_out(o)),
        Reply::Created(entry, opened) => {
            const BODY: usize = size_of::<abi::EntryOut>() + size_of::<abi::OpenOut>();
            check_fits(&w, BODY)?;
            let (mut hw, mut body) = split_reply(w)?;
            body.write_obj(&entry_out(entry))?;
            body.write_obj(&open_out(opened))?;
            finish_reply(&mut hw, unique, BODY)
        }
        Reply::Data(n) => {
            let n = (*n as u64).min(limit) as usize;
            let mut w = w;
            let len = OUT_HEADER_SIZE + n;
            w.write_obj(&OutHeader { len: len as u32, error: 0, unique })?;
            Ok(len)
        }
        Reply::XattrSize(n) => reply_obj(w, unique, &abi::GetxattrOut { size: *n, padding: 0 }),
        Reply::Written(n) => {
            // Never more than asked, so it fits 32 bits.
            let size = u32::try_from((*n as u64).min(limit)).unwrap_or(u32::MAX);
            reply_obj(w, unique, &abi::WriteOut { size, padding: 0 })
        }
        Reply::Offset(offset) => reply_obj(w, unique, &abi::LseekOut { offset: *offset }),
        Reply::StatFs(st) => {
            let out = abi::StatfsOut {
                st: abi::Kstatfs {
                    blocks: st.blocks,
                    bfree: st.bfree,
                    bavail: st.bavail,
                    files: st.files,
                    ffree: st.ffree,
                    bsize: st.bsize,
                    namelen: st.namelen,
                    frsize: st.frsize,
                    padding: 0,
                    spare: [0; 6],
                },
            };
            reply_obj(w, unique, &out)
        }
        Reply::Lock(lock) => reply_obj(w, unique, &abi::LkOut { lk: encode_lock(lock) }),
    }
}

/// Writes an error reply at the start of `writable`; 0 if not even a header fits.
pub(crate) fn reply_error(writable: &[VolatileSlice<'_>], unique: u64, errno: i32) -> usize {
    error_into(Writer::new(writable), unique, errno)
}

/// Writes an error reply at the start of `w`; 0 if not even a header fits.
pub(crate) fn error_into(mut w: Writer<'_>, unique: u64, errno: i32) -> usize {
    let out = OutHeader { len: OUT_HEADER_SIZE as u32, error: -errno, unique };
    match w.write_obj(&out) {
        Ok(()) => OUT_HEADER_SIZE,
        Err(_) => 0,
    }
}

/// Fails with `ERANGE` unless a reply with `body` bytes fits `w`.
pub(crate) fn check_fits(w: &Writer<'_>, body: usize) -> Result<()> {
    let wanted = OUT_HEADER_SIZE + body;
    if w.available() < wanted {
        return Err(io::Error::ShortWrite { wanted, left: w.available() }.into());
    }
    Ok(())
}

/// Splits a reply buffer into the header part and the body part.
pub(crate) fn split_reply(mut w: Writer<'_>) -> Result<(Writer<'_>, Writer<'_>)> {
    let hw = w.split_at(OUT_HEADER_SIZE)?;
    Ok((hw, w))
}

/// Writes the header of a reply of `len` bytes whose body is already in place.
pub(crate) fn finish_reply(hw: &mut Writer<'_>, unique: u64, body: usize) -> Result<usize> {
    let len = OUT_HEADER_SIZE + body;
    hw.write_obj(&OutHeader { len: len as u32, error: 0, unique })?;
    Ok(len)
}

#[inline]
pub(crate) fn reply_obj<T: ByteValued>(mut w: Writer<'_>, unique: u64, body: &T) -> Result<usize> {
    // Header first: the body's size is known, and once both fit neither write can fail.
    check_fits(&w, size_of::<T>())?;
    let len = OUT_HEADER_SIZE + size_of::<T>();
    w.write_obj(&OutHeader { len: len as u32, error: 0, unique })?;
    w.write_obj(body)?;
    Ok(len)
}

fn encode_lock(lock: &FileLock) -> abi::FileLock {
    let typ = match lock.typ {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
        LockType::Unlock => libc::F_UNLCK,
    };
    abi::FileLock { start: lock.start, end: lock.end, typ: typ as u32, pid: lock.pid }
}

fn open_out(o: &Opened) -> abi::OpenOut {
    abi::OpenOut { fh: o.fh, open_flags: o.open_flags, backing_id: 0 }
}

fn attr_out(attr: &Stat, valid: Duration) -> abi::AttrOut {
    abi::AttrOut {
        attr_valid: valid.as_secs(),
        attr_valid_nsec: valid.subsec_nanos(),
        dummy: 0,
        attr: to_attr(attr),
    }
}

fn sx_time(t: filesystem::Timespec) -> abi::SxTime {
    abi::SxTime { tv_sec: t.sec, tv_nsec: t.nsec, reserved: 0 }
}

fn to_statx(sx: &filesystem::Statx) -> abi::Statx {
    let st = &sx.stat;
    // `rdev` is in the kernel's new_encode_dev() format, like fuse_attr.rdev.
    let major = (st.rdev & 0xfff00) >> 8;
    let minor = (st.rdev & 0xff) | ((st.rdev >> 12) & 0xfff00);
    let mut mask = abi::statx::BASIC_STATS;
    if sx.btime.is_some() {
        mask |= abi::statx::BTIME;
    }
    abi::Statx {
        mask,
        blksize: st.blksize,
        attributes: 0,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        mode: st.mode as u16,
        spare0: 0,
        ino: st.ino,
        size: st.size,
        blocks: st.blocks,
        attributes_mask: 0,
        atime: sx_time(st.atime),
        btime: sx_time(sx.btime.unwrap_or_default()),
        ctime: sx_time(st.ctime),
        mtime: sx_time(st.mtime),
        rdev_major: major,
        rdev_minor: minor,
        dev_major: 0,
        dev_minor: 0,
        spare2: [0; 14],
    }
}
