//! Writeback caching on the passthrough (see backend/tests/writeback.rs): a writer sets times,
//! write-only opens are readable, `O_APPEND` is the kernel's. A file of its own so that the
//! aarch64 check (qemu-user has no openat2) skips it with the other passthrough tests.

mod harness;

use harness::passthrough::{is_root, Fuse, Tree};
use harness::writeback::*;
use harness::*;

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
