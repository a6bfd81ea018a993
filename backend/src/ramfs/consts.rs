//! Linux constants the modules of [`RamFs`](super::RamFs) share, as the `u32`s the FUSE requests
//! carry: file types and mode bits, open flags, access bits, seek, fallocate and rename flags.

pub(super) const S_IFMT: u32 = libc::S_IFMT;
pub(super) const S_IFREG: u32 = libc::S_IFREG;
pub(super) const S_IFDIR: u32 = libc::S_IFDIR;
pub(super) const S_IFLNK: u32 = libc::S_IFLNK;
pub(super) const S_IFIFO: u32 = libc::S_IFIFO;
pub(super) const S_IFSOCK: u32 = libc::S_IFSOCK;
pub(super) const S_IFCHR: u32 = libc::S_IFCHR;
pub(super) const S_IFBLK: u32 = libc::S_IFBLK;
pub(super) const S_ISUID: u32 = libc::S_ISUID;
pub(super) const S_ISGID: u32 = libc::S_ISGID;
pub(super) const S_ISVTX: u32 = libc::S_ISVTX;
pub(super) const S_IXGRP: u32 = libc::S_IXGRP;
pub(super) const O_ACCMODE: u32 = libc::O_ACCMODE as u32;
pub(super) const O_RDONLY: u32 = libc::O_RDONLY as u32;
pub(super) const O_WRONLY: u32 = libc::O_WRONLY as u32;
pub(super) const O_RDWR: u32 = libc::O_RDWR as u32;
pub(super) const O_TRUNC: u32 = libc::O_TRUNC as u32;
pub(super) const O_EXCL: u32 = libc::O_EXCL as u32;
pub(super) const O_APPEND: u32 = libc::O_APPEND as u32;
pub(super) const SEEK_SET: u32 = libc::SEEK_SET as u32;
pub(super) const SEEK_CUR: u32 = libc::SEEK_CUR as u32;
pub(super) const SEEK_END: u32 = libc::SEEK_END as u32;
pub(super) const SEEK_DATA: u32 = libc::SEEK_DATA as u32;
pub(super) const SEEK_HOLE: u32 = libc::SEEK_HOLE as u32;
pub(super) const R_OK: u32 = 4;
pub(super) const W_OK: u32 = 2;
pub(super) const X_OK: u32 = 1;
pub(super) const FALLOC_FL_KEEP_SIZE: u32 = libc::FALLOC_FL_KEEP_SIZE as u32;
pub(super) const FALLOC_FL_PUNCH_HOLE: u32 = libc::FALLOC_FL_PUNCH_HOLE as u32;
pub(super) const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
pub(super) const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;
