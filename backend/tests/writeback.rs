//! Writeback caching (`--writeback`, `FUSE_WRITEBACK_CACHE`): when it is offered, and what the
//! RAM filesystem and the passthrough then allow that they would otherwise refuse. With it the
//! guest kernel owns the times (it sends every change of them, a writer's `touch` and the mtime
//! of written-back data, as explicit times, from whichever task flushes), reads through any
//! handle to fill partly written pages, and places `O_APPEND` writes itself.

mod harness;

use harness::*;
use virtiofs_backend::abi;
use virtiofs_backend::filesystem::FileSystem;
use virtiofs_backend::server::ServerOptions;

const ALICE: (u32, u32) = (1000, 1000);
const BOB: (u32, u32) = (2000, 2000);
const WRITEBACK: ServerOptions = ServerOptions { xattr: true, readdirplus: true, writeback: true };

fn negotiated<F: FileSystem>(f: &Fuse<F>, offer: u64) -> u64 {
    let out = f.init(41, offer).expect("init");
    u64::from(out.flags) | u64::from(out.flags2) << 32
}

/// A filesystem with every default: it makes none of the promises writeback needs.
struct Defaults;
impl FileSystem for Defaults {}

#[test]
fn offered_only_when_asked_to_a_kernel_with_killpriv_v2_and_to_a_filesystem_that_takes_it() {
    let wb = abi::init::WRITEBACK_CACHE;
    let ram = || harness::ram::Fuse::uninit();
    assert_eq!(negotiated(&ram(), LINUX_FLAGS) & wb, 0, "off by default");
    assert_ne!(negotiated(&ram().with_server_options(WRITEBACK), LINUX_FLAGS) & wb, 0);
    // A kernel without HANDLE_KILLPRIV_V2 could not clear set-user-id on written-back pages.
    assert_eq!(negotiated(&ram().with_server_options(WRITEBACK), OLD_FLAGS) & wb, 0);
    assert_eq!(
        negotiated(&ram().with_server_options(WRITEBACK), LINUX_FLAGS & !wb) & wb,
        0,
        "not offered by the kernel"
    );
    // The default `FileSystem::init` (the NFS backend's) refuses it.
    assert_eq!(negotiated(&Fuse::with_fs(Defaults).with_server_options(WRITEBACK), LINUX_FLAGS) & wb, 0);
}

fn set_times(mtime: u64, ctime: u64) -> abi::SetattrIn {
    abi::SetattrIn { valid: abi::fattr::MTIME | abi::fattr::CTIME, mtime, ctime, ..Default::default() }
}

/// The times a writer who is not the owner may set: with writeback, whoever may write the file
/// (through a handle open for writing, as the kernel's flush sends them, or by permission, as a
/// `touch` turned explicit); without it the owner only. Nobody else either way.
fn writer_sets_times<F: FileSystem>(f: &Fuse<F>, writeback: bool) {
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

#[test]
fn ramfs_writer_sets_times_with_writeback_only() {
    writer_sets_times(&harness::ram::Fuse::uninit().with_server_options(WRITEBACK).initialised(), true);
    writer_sets_times(&harness::ram::Fuse::new(), false);
}

#[test]
fn ramfs_kernel_times_are_kept_as_sent() {
    let f = harness::ram::Fuse::uninit().with_server_options(WRITEBACK).initialised();
    let (e, fh) = f.create(ROOT, b"f", 0o644, O_RDWR | O_CREAT).map(with_fh).unwrap();
    f.write(e.nodeid, fh, 0, b"data").unwrap();
    // The kernel's flush of its own mtime/ctime after writing the pages back.
    let arg = abi::SetattrIn {
        valid: abi::fattr::MTIME | abi::fattr::CTIME | abi::fattr::FH,
        fh,
        ..set_times(7, 9)
    };
    let attr = f.setattr(e.nodeid, arg).unwrap();
    assert_eq!((attr.mtime, attr.ctime, attr.size), (7, 9, 4));
    // A write-only handle may be read (the kernel fills the rest of a partly written page).
    let wo = f.open(e.nodeid, O_WRONLY).unwrap();
    assert_eq!(f.read(e.nodeid, wo, 0, 16).unwrap(), b"data");
}

mod passthrough {
    use super::*;
    use harness::passthrough::{is_root, Fuse, Tree};

    fn session(t: &Tree, writeback: bool) -> Fuse {
        let f = Fuse::uninit(&t.share);
        if writeback {
            f.with_server_options(WRITEBACK).initialised()
        } else {
            f.initialised()
        }
    }

    #[test]
    fn writer_sets_times_with_writeback_only() {
        assert!(is_root(), "the passthrough tests switch to the callers' ids: run as root");
        for wb in [true, false] {
            let t = Tree::new();
            writer_sets_times(&session(&t, wb), wb);
        }
    }

    #[test]
    fn write_only_opens_are_readable_and_append_is_the_kernels() {
        assert!(is_root(), "the passthrough tests switch to the callers' ids: run as root");
        for wb in [true, false] {
            let t = Tree::new();
            std::fs::write(t.share.join("log"), b"0123456789").unwrap();
            let f = session(&t, wb);
            let e = f.lookup(ROOT, b"log").unwrap();
            let fh = f.open(e.nodeid, O_WRONLY | libc::O_APPEND as u32).unwrap();
            // The kernel sends an O_APPEND write at the end it knows; with writeback that is
            // where it goes, without it the host file's O_APPEND puts it at the host's end.
            f.write(e.nodeid, fh, 4, b"ab").unwrap();
            let host = std::fs::read(t.share.join("log")).unwrap();
            if wb {
                assert_eq!(host, b"0123ab6789");
                assert_eq!(f.read(e.nodeid, fh, 0, 4).unwrap(), b"0123", "opened read-write");
            } else {
                assert_eq!(host, b"0123456789ab");
                assert_eq!(f.read(e.nodeid, fh, 0, 4).unwrap_err(), libc::EBADF);
            }
        }
    }

    #[test]
    fn a_write_only_file_still_opens_write_only() {
        assert!(is_root(), "the passthrough tests switch to the callers' ids: run as root");
        let t = Tree::new();
        let f = session(&t, true);
        let b = f.as_user(BOB.0, BOB.1);
        let (e, _) = b.create(ROOT, b"drop", 0o200, O_WRONLY | O_CREAT).map(with_fh).unwrap();
        let fh = b.open(e.nodeid, O_WRONLY).unwrap();
        b.write(e.nodeid, fh, 0, b"in").unwrap();
        assert_eq!(b.read(e.nodeid, fh, 0, 2).unwrap_err(), libc::EBADF, "no read permission: write-only");
        assert_eq!(std::fs::read(t.share.join("drop")).unwrap(), b"in");
    }
}
