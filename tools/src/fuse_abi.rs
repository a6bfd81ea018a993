//! The FUSE wire structures the driver sends and parses, written from `<linux/fuse.h>`
//! (protocol 7.41, as in Linux 6.12).
//!
//! Written independently of the backend's ABI module (`backend/src/abi.rs`) on purpose, and to
//! stay so: neither is derived from or checked against the other's source, so a layout or
//! constant mistake in one shows up as a failing end-to-end test instead of cancelling out. Do not
//! replace either with the other.

use crate::wire_struct;

/// FUSE major version.
pub const FUSE_KERNEL_VERSION: u32 = 7;
/// FUSE minor version Linux 6.12 speaks.
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 41;
/// Longest name Linux accepts in a dirent.
pub const FUSE_NAME_MAX: u32 = 1024;

/// Opcodes.
#[allow(missing_docs)]
pub mod opcode {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
}

/// FUSE_INIT flags (`flags | flags2 << 32`).
#[allow(missing_docs)]
pub mod init_flags {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const FILE_OPS: u64 = 1 << 2;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const SPLICE_WRITE: u64 = 1 << 7;
    pub const SPLICE_MOVE: u64 = 1 << 8;
    pub const SPLICE_READ: u64 = 1 << 9;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const HAS_IOCTL_DIR: u64 = 1 << 11;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const MAP_ALIGNMENT: u64 = 1 << 26;
    pub const SUBMOUNTS: u64 = 1 << 27;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const INIT_RESERVED: u64 = 1 << 31;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const HAS_INODE_DAX: u64 = 1 << 33;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;

    /// What Linux 6.12 `fuse_send_init` sends for a virtio-fs mount (no DAX; submounts on;
    /// `CONFIG_FUSE_PASSTHROUGH=y` as in distribution kernels).
    pub const LINUX_6_12_VIRTIOFS: u64 = ASYNC_READ
        | POSIX_LOCKS
        | ATOMIC_O_TRUNC
        | EXPORT_SUPPORT
        | BIG_WRITES
        | DONT_MASK
        | SPLICE_WRITE
        | SPLICE_MOVE
        | SPLICE_READ
        | FLOCK_LOCKS
        | HAS_IOCTL_DIR
        | AUTO_INVAL_DATA
        | DO_READDIRPLUS
        | READDIRPLUS_AUTO
        | ASYNC_DIO
        | WRITEBACK_CACHE
        | NO_OPEN_SUPPORT
        | PARALLEL_DIROPS
        | HANDLE_KILLPRIV
        | POSIX_ACL
        | ABORT_ERROR
        | MAX_PAGES
        | CACHE_SYMLINKS
        | NO_OPENDIR_SUPPORT
        | EXPLICIT_INVAL_DATA
        | HANDLE_KILLPRIV_V2
        | SETXATTR_EXT
        | INIT_EXT
        | SECURITY_CTX
        | CREATE_SUPP_GROUP
        | HAS_EXPIRE_ONLY
        | DIRECT_IO_ALLOW_MMAP
        | NO_EXPORT_SUPPORT
        | HAS_RESEND
        | ALLOW_IDMAP
        | SUBMOUNTS
        | PASSTHROUGH;
}

/// `fuse_lk_in.lk_flags`: a flock(2) lock.
pub const FUSE_LK_FLOCK: u32 = 1;
/// `fuse_release_in.release_flags`: drop the flock lock of `lock_owner`.
pub const FUSE_RELEASE_FLOCK_UNLOCK: u32 = 1 << 1;
/// Bit 0 of an INTERRUPT's own unique (Linux `FUSE_INT_REQ_BIT`).
pub const FUSE_INT_REQ_BIT: u64 = 1;
/// The kernel's largest lock offset ("to the end of the file").
pub const OFFSET_MAX: u64 = i64::MAX as u64;

/// SETATTR valid bits.
#[allow(missing_docs)]
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
}

wire_struct! {
    /// `fuse_in_header` (40 bytes).
    pub struct InHeader {
        /// Total request length, header included.
        pub len: u32,
        /// Opcode.
        pub opcode: u32,
        /// Request id.
        pub unique: u64,
        /// Target node.
        pub nodeid: u64,
        /// Caller uid.
        pub uid: u32,
        /// Caller gid.
        pub gid: u32,
        /// Caller pid.
        pub pid: u32,
        /// Length of extensions (in 8-byte units).
        pub total_extlen: u16,
        /// Padding.
        pub padding: u16,
    }
}

wire_struct! {
    /// `fuse_out_header` (16 bytes).
    pub struct OutHeader {
        /// Total reply length, header included.
        pub len: u32,
        /// 0 or a negative errno.
        pub error: i32,
        /// Request id being answered.
        pub unique: u64,
    }
}

wire_struct! {
    /// `fuse_init_in` (64 bytes).
    pub struct InitIn {
        /// Major version.
        pub major: u32,
        /// Minor version.
        pub minor: u32,
        /// Readahead.
        pub max_readahead: u32,
        /// Low flag word.
        pub flags: u32,
        /// High flag word.
        pub flags2: u32,
        /// Unused.
        pub unused: [u32; 11],
    }
}

wire_struct! {
    /// `fuse_init_out` (64 bytes).
    pub struct InitOut {
        /// Major version.
        pub major: u32,
        /// Minor version.
        pub minor: u32,
        /// Readahead.
        pub max_readahead: u32,
        /// Low flag word.
        pub flags: u32,
        /// Background request limit.
        pub max_background: u16,
        /// Congestion threshold.
        pub congestion_threshold: u16,
        /// Largest WRITE payload.
        pub max_write: u32,
        /// Time granularity (ns).
        pub time_gran: u32,
        /// Largest request in pages (with MAX_PAGES).
        pub max_pages: u16,
        /// DAX map alignment.
        pub map_alignment: u16,
        /// High flag word.
        pub flags2: u32,
        /// Passthrough stack depth.
        pub max_stack_depth: u32,
        /// Unused.
        pub unused: [u32; 6],
    }
}

wire_struct! {
    /// `fuse_attr` (88 bytes).
    pub struct Attr {
        /// Inode number.
        pub ino: u64,
        /// Size.
        pub size: u64,
        /// 512-byte blocks.
        pub blocks: u64,
        /// atime seconds.
        pub atime: u64,
        /// mtime seconds.
        pub mtime: u64,
        /// ctime seconds.
        pub ctime: u64,
        /// atime ns.
        pub atimensec: u32,
        /// mtime ns.
        pub mtimensec: u32,
        /// ctime ns.
        pub ctimensec: u32,
        /// Mode (type and permissions).
        pub mode: u32,
        /// Link count.
        pub nlink: u32,
        /// Owner.
        pub uid: u32,
        /// Group.
        pub gid: u32,
        /// Device number.
        pub rdev: u32,
        /// Block size.
        pub blksize: u32,
        /// FUSE_ATTR_* flags.
        pub flags: u32,
    }
}

wire_struct! {
    /// `fuse_entry_out` head (40 bytes; an [`Attr`] follows).
    pub struct EntryOutHead {
        /// Node id.
        pub nodeid: u64,
        /// Generation.
        pub generation: u64,
        /// Entry cache timeout (s).
        pub entry_valid: u64,
        /// Attribute cache timeout (s).
        pub attr_valid: u64,
        /// Entry timeout ns.
        pub entry_valid_nsec: u32,
        /// Attribute timeout ns.
        pub attr_valid_nsec: u32,
    }
}

/// `fuse_entry_out` (128 bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryOut {
    /// Node id.
    pub nodeid: u64,
    /// Generation.
    pub generation: u64,
    /// Entry cache timeout (s).
    pub entry_valid: u64,
    /// Attribute cache timeout (s).
    pub attr_valid: u64,
    /// Entry timeout ns.
    pub entry_valid_nsec: u32,
    /// Attribute timeout ns.
    pub attr_valid_nsec: u32,
    /// Attributes.
    pub attr: Attr,
}

impl EntryOut {
    /// Encoded size.
    pub const SIZE: usize = EntryOutHead::SIZE + Attr::SIZE;

    /// Decodes from the start of `b`.
    pub fn decode(b: &[u8]) -> Option<EntryOut> {
        let h = EntryOutHead::decode(b)?;
        let attr = Attr::decode(b.get(EntryOutHead::SIZE..)?)?;
        Some(EntryOut {
            nodeid: h.nodeid,
            generation: h.generation,
            entry_valid: h.entry_valid,
            attr_valid: h.attr_valid,
            entry_valid_nsec: h.entry_valid_nsec,
            attr_valid_nsec: h.attr_valid_nsec,
            attr,
        })
    }
}

wire_struct! {
    /// `fuse_attr_out` head (16 bytes; an [`Attr`] follows).
    pub struct AttrOutHead {
        /// Attribute cache timeout (s).
        pub attr_valid: u64,
        /// ns part.
        pub attr_valid_nsec: u32,
        /// Padding.
        pub dummy: u32,
    }
}

/// `fuse_attr_out` size (104).
pub const ATTR_OUT_SIZE: usize = AttrOutHead::SIZE + Attr::SIZE;

wire_struct! {
    /// `fuse_getattr_in`.
    pub struct GetattrIn {
        /// FUSE_GETATTR_FH.
        pub getattr_flags: u32,
        /// Padding.
        pub dummy: u32,
        /// File handle.
        pub fh: u64,
    }
}

wire_struct! {
    /// `fuse_setattr_in` (88 bytes).
    pub struct SetattrIn {
        /// FATTR_* bits.
        pub valid: u32,
        /// Padding.
        pub padding: u32,
        /// File handle.
        pub fh: u64,
        /// New size.
        pub size: u64,
        /// Lock owner.
        pub lock_owner: u64,
        /// atime.
        pub atime: u64,
        /// mtime.
        pub mtime: u64,
        /// ctime.
        pub ctime: u64,
        /// atime ns.
        pub atimensec: u32,
        /// mtime ns.
        pub mtimensec: u32,
        /// ctime ns.
        pub ctimensec: u32,
        /// Mode.
        pub mode: u32,
        /// Unused.
        pub unused4: u32,
        /// uid.
        pub uid: u32,
        /// gid.
        pub gid: u32,
        /// Unused.
        pub unused5: u32,
    }
}

wire_struct! {
    /// `fuse_mkdir_in`.
    pub struct MkdirIn {
        /// Mode.
        pub mode: u32,
        /// umask.
        pub umask: u32,
    }
}

wire_struct! {
    /// `fuse_mknod_in`.
    pub struct MknodIn {
        /// Mode.
        pub mode: u32,
        /// Device.
        pub rdev: u32,
        /// umask.
        pub umask: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_rename_in`.
    pub struct RenameIn {
        /// New parent.
        pub newdir: u64,
    }
}

wire_struct! {
    /// `fuse_rename2_in`.
    pub struct Rename2In {
        /// New parent.
        pub newdir: u64,
        /// RENAME_* flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_link_in`.
    pub struct LinkIn {
        /// Existing node.
        pub oldnodeid: u64,
    }
}

wire_struct! {
    /// `fuse_open_in`.
    pub struct OpenIn {
        /// open(2) flags.
        pub flags: u32,
        /// FUSE_OPEN_* flags.
        pub open_flags: u32,
    }
}

wire_struct! {
    /// `fuse_create_in`.
    pub struct CreateIn {
        /// open(2) flags.
        pub flags: u32,
        /// Mode.
        pub mode: u32,
        /// umask.
        pub umask: u32,
        /// FUSE_OPEN_* flags.
        pub open_flags: u32,
    }
}

wire_struct! {
    /// `fuse_open_out`.
    pub struct OpenOut {
        /// File handle.
        pub fh: u64,
        /// FOPEN_* flags.
        pub open_flags: u32,
        /// Backing id (passthrough).
        pub backing_id: i32,
    }
}

wire_struct! {
    /// `fuse_release_in`.
    pub struct ReleaseIn {
        /// File handle.
        pub fh: u64,
        /// open(2) flags.
        pub flags: u32,
        /// FUSE_RELEASE_* flags.
        pub release_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
    }
}

wire_struct! {
    /// `fuse_flush_in`.
    pub struct FlushIn {
        /// File handle.
        pub fh: u64,
        /// Unused.
        pub unused: u32,
        /// Padding.
        pub padding: u32,
        /// Lock owner.
        pub lock_owner: u64,
    }
}

wire_struct! {
    /// `fuse_read_in` (also used by READDIR/READDIRPLUS).
    pub struct ReadIn {
        /// File handle.
        pub fh: u64,
        /// Offset.
        pub offset: u64,
        /// Bytes wanted.
        pub size: u32,
        /// FUSE_READ_* flags.
        pub read_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
        /// open(2) flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_write_in`.
    pub struct WriteIn {
        /// File handle.
        pub fh: u64,
        /// Offset.
        pub offset: u64,
        /// Bytes that follow.
        pub size: u32,
        /// FUSE_WRITE_* flags.
        pub write_flags: u32,
        /// Lock owner.
        pub lock_owner: u64,
        /// open(2) flags.
        pub flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_write_out`.
    pub struct WriteOut {
        /// Bytes written.
        pub size: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_fsync_in`.
    pub struct FsyncIn {
        /// File handle.
        pub fh: u64,
        /// FUSE_FSYNC_FDATASYNC.
        pub fsync_flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_file_lock`.
    pub struct FileLock {
        /// First byte.
        pub start: u64,
        /// Last byte, inclusive (`OFFSET_MAX`: to the end of the file).
        pub end: u64,
        /// `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
        pub typ: u32,
        /// Holder (GETLK reply) or requester.
        pub pid: u32,
    }
}

wire_struct! {
    /// `fuse_lk_in` (GETLK, SETLK, SETLKW).
    pub struct LkIn {
        /// File handle.
        pub fh: u64,
        /// Lock owner.
        pub owner: u64,
        /// The lock.
        pub lk_start: u64,
        /// Last byte of the lock.
        pub lk_end: u64,
        /// Type of the lock.
        pub lk_typ: u32,
        /// Pid of the lock.
        pub lk_pid: u32,
        /// `FUSE_LK_FLOCK` for flock(2).
        pub lk_flags: u32,
        /// Padding.
        pub padding: u32,
    }
}

wire_struct! {
    /// `fuse_interrupt_in`.
    pub struct InterruptIn {
        /// The request to interrupt.
        pub unique: u64,
    }
}

wire_struct! {
    /// `fuse_forget_in`.
    pub struct ForgetIn {
        /// Lookups to drop.
        pub nlookup: u64,
    }
}

wire_struct! {
    /// `fuse_kstatfs` / `fuse_statfs_out` (80 bytes).
    pub struct StatfsOut {
        /// Blocks.
        pub blocks: u64,
        /// Free blocks.
        pub bfree: u64,
        /// Available blocks.
        pub bavail: u64,
        /// Inodes.
        pub files: u64,
        /// Free inodes.
        pub ffree: u64,
        /// Block size.
        pub bsize: u32,
        /// Longest name.
        pub namelen: u32,
        /// Fragment size.
        pub frsize: u32,
        /// Padding.
        pub padding: u32,
        /// Spare.
        pub spare: [u32; 6],
    }
}

/// A parsed `fuse_dirent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirent {
    /// Inode number.
    pub ino: u64,
    /// Offset cookie of the next entry.
    pub off: u64,
    /// DT_* type.
    pub typ: u32,
    /// Name bytes.
    pub name: Vec<u8>,
}

/// A parsed `fuse_direntplus`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirentPlus {
    /// Entry (nodeid 0 means no lookup was done).
    pub entry: EntryOut,
    /// Directory entry.
    pub dirent: Dirent,
}

const DIRENT_HEAD: usize = 24;

fn align8(x: usize) -> usize {
    (x + 7) & !7
}

fn parse_one_dirent(b: &[u8]) -> Result<(Dirent, usize), String> {
    if b.len() < DIRENT_HEAD {
        return Err(format!("{} trailing bytes, shorter than a dirent", b.len()));
    }
    let ino = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let off = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    let namelen = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes"));
    let typ = u32::from_le_bytes(b[20..24].try_into().expect("4 bytes"));
    if namelen == 0 || namelen > FUSE_NAME_MAX {
        return Err(format!("dirent name length {namelen}"));
    }
    let reclen = align8(DIRENT_HEAD + namelen as usize);
    if reclen > b.len() {
        return Err(format!("dirent of {reclen} bytes overruns the {} left", b.len()));
    }
    let name = b[DIRENT_HEAD..DIRENT_HEAD + namelen as usize].to_vec();
    if name.contains(&b'/') || name.contains(&0) {
        return Err(format!("dirent name {:?} contains '/' or NUL", String::from_utf8_lossy(&name)));
    }
    Ok((Dirent { ino, off, typ, name }, reclen))
}

/// Parses a READDIR reply; the entries must exactly fill it (each padded to 8 bytes).
pub fn parse_dirents(mut b: &[u8]) -> Result<Vec<Dirent>, String> {
    let mut v = Vec::new();
    while !b.is_empty() {
        let (d, n) = parse_one_dirent(b)?;
        v.push(d);
        b = &b[n..];
    }
    Ok(v)
}

/// Parses a READDIRPLUS reply.
pub fn parse_direntplus(mut b: &[u8]) -> Result<Vec<DirentPlus>, String> {
    let mut v = Vec::new();
    while !b.is_empty() {
        let entry = EntryOut::decode(b)
            .ok_or_else(|| format!("{} trailing bytes, shorter than an entry_out", b.len()))?;
        let (d, n) = parse_one_dirent(&b[EntryOut::SIZE..])?;
        v.push(DirentPlus { entry, dirent: d });
        b = &b[EntryOut::SIZE + n..];
    }
    Ok(v)
}

/// Encodes a dirent (for tests of the parser and for fake servers).
pub fn encode_dirent(out: &mut Vec<u8>, ino: u64, off: u64, typ: u32, name: &[u8]) {
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&off.to_le_bytes());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&typ.to_le_bytes());
    out.extend_from_slice(name);
    let pad = align8(DIRENT_HEAD + name.len()) - DIRENT_HEAD - name.len();
    out.resize(out.len() + pad, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_linux() {
        assert_eq!(InHeader::SIZE, 40);
        assert_eq!(OutHeader::SIZE, 16);
        assert_eq!(InitIn::SIZE, 64);
        assert_eq!(InitOut::SIZE, 64);
        assert_eq!(Attr::SIZE, 88);
        assert_eq!(EntryOut::SIZE, 128);
        assert_eq!(ATTR_OUT_SIZE, 104);
        assert_eq!(SetattrIn::SIZE, 88);
        assert_eq!(ReadIn::SIZE, 40);
        assert_eq!(WriteIn::SIZE, 40);
        assert_eq!(OpenOut::SIZE, 16);
        assert_eq!(StatfsOut::SIZE, 80);
        assert_eq!(CreateIn::SIZE, 16);
        assert_eq!(ReleaseIn::SIZE, 24);
        assert_eq!(FlushIn::SIZE, 24);
    }

    #[test]
    fn dirents_roundtrip_and_reject() {
        let mut b = Vec::new();
        encode_dirent(&mut b, 1, 1, 4, b".");
        encode_dirent(&mut b, 1, 2, 4, b"..");
        encode_dirent(&mut b, 7, 3, 8, b"a-longer-name");
        let v = parse_dirents(&b).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[2].name, b"a-longer-name");
        assert_eq!(v[2].off, 3);
        // Truncated last entry.
        assert!(parse_dirents(&b[..b.len() - 1]).is_err());
        // Zero-length name.
        let mut z = Vec::new();
        encode_dirent(&mut z, 1, 1, 4, b"x");
        z[16] = 0;
        assert!(parse_dirents(&z).is_err());
        // Slash in a name.
        let mut s = Vec::new();
        encode_dirent(&mut s, 1, 1, 4, b"a/b");
        assert!(parse_dirents(&s).is_err());
    }

    #[test]
    fn direntplus_parse() {
        let mut b = vec![0u8; EntryOut::SIZE];
        b[0] = 9; // nodeid
        encode_dirent(&mut b, 9, 1, 8, b"f");
        let v = parse_direntplus(&b).unwrap();
        assert_eq!(v[0].entry.nodeid, 9);
        assert_eq!(v[0].dirent.name, b"f");
    }

    #[test]
    fn linux_init_flags_include_max_pages() {
        assert_ne!(init_flags::LINUX_6_12_VIRTIOFS & init_flags::MAX_PAGES, 0);
        assert_ne!(init_flags::LINUX_6_12_VIRTIOFS & init_flags::INIT_EXT, 0);
        assert_eq!(init_flags::LINUX_6_12_VIRTIOFS & init_flags::MAP_ALIGNMENT, 0);
    }
}
