//! What the writeback tests of both backends share (backend/tests/writeback.rs for the RAM
//! filesystem and the INIT offer, backend/tests/passthrough_writeback.rs for the passthrough).

use super::*;
use virtiofs_backend::abi;
use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::server::ServerOptions;

pub const ALICE: (u32, u32) = (1000, 1000);
pub const BOB: (u32, u32) = (2000, 2000);
pub const WRITEBACK: ServerOptions = ServerOptions { xattr: true, readdirplus: true, writeback: true };

pub fn negotiated<F: FileSystem>(f: &Fuse<F>, offer: u64) -> u64 {
    let out = f.init(41, offer).expect("init");
    u64::from(out.flags) | u64::from(out.flags2) << 32
}

pub fn set_times(mtime: u64, ctime: u64) -> abi::SetattrIn {
    abi::SetattrIn { valid: abi::fattr::MTIME | abi::fattr::CTIME, mtime, ctime, ..Default::default() }
}

/// The times a writer who is not the owner may set: with writeback, whoever may write the file
/// (through a handle open for writing, as the kernel's flush sends them, or by permission, as a
/// `touch` turned explicit); without it the owner only. Nobody else either way.
pub fn writer_sets_times<F: FileSystem>(f: &Fuse<F>, writeback: bool) {
    let root = f.as_user(0, 0);
    let (e, _) = root.create(ROOT, b"shared", 0o666, O_RDWR | O_CREAT).map(with_fh).unwrap();
    let (p, _) = root.create(ROOT, b"private", 0o644, O_RDWR | O_CREAT).map(with_fh).unwrap();
    for (ino, mode) in [(e.nodeid, 0o666), (p.nodeid, 0o644)] {
        root.chown(ino, Some(ALICE.0), Some(ALICE.1)).unwrap();
        root.chmod(ino, mode).unwrap();
    }
    // (`as_user` sets the identity of every later request: `a`, `b` and `root` are one session.)
    let a = || f.as_user(ALICE.0, ALICE.1);
    let b = || f.as_user(BOB.0, BOB.1);
    let fh = b().open(e.nodeid, O_WRONLY).unwrap();
    b().write(e.nodeid, fh, 0, b"bob's").unwrap();
    let by_handle = abi::SetattrIn {
        valid: set_times(0, 0).valid | abi::fattr::FH,
        fh,
        ..set_times(1_000_000, 1_000_001)
    };
    let by_perm = set_times(2_000_000, 2_000_001);
    if writeback {
        let attr = b().setattr(e.nodeid, by_handle).unwrap();
        assert_eq!(attr.mtime, 1_000_000);
        let attr = b().setattr(e.nodeid, by_perm).unwrap();
        assert_eq!(attr.mtime, 2_000_000);
    } else {
        assert_eq!(b().setattr(e.nodeid, by_handle).unwrap_err(), libc::EPERM);
        assert_eq!(b().setattr(e.nodeid, by_perm).unwrap_err(), libc::EPERM);
    }
    assert_eq!(b().setattr(p.nodeid, by_perm).unwrap_err(), libc::EPERM, "no write permission: never");
    // The owner always may.
    assert_eq!(a().setattr(p.nodeid, by_perm).unwrap().mtime, 2_000_000);
}
