//! Writeback caching (`--writeback`, `FUSE_WRITEBACK_CACHE`): when it is offered, and what the
//! RAM filesystem and the passthrough then allow that they would otherwise refuse. With it the
//! guest kernel owns the times (it sends every change of them, a writer's `touch` and the mtime
//! of written-back data, as explicit times, from whichever task flushes), reads through any
//! handle to fill partly written pages, and places `O_APPEND` writes itself.

mod harness;

use harness::writeback::*;
use harness::*;
use virtiofs_backend::abi;
use virtiofs_backend::filesystem::FileSystem;

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
