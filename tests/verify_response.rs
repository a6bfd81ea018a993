//! The host driver model checks every reply as Linux 7.1's `virtio_fs_verify_response` does
//! (issue 11, item 7): a device that answers with a used length shorter than the out header, an
//! out header whose `len` is not the used length, or the wrong `unique`, fails the request in
//! the driver (EIO in Linux), so every end-to-end test enforces these rules. Here a deliberately
//! wrong device, behind a real socket, answers GETATTR in each wrong way.

use std::sync::Arc;
use std::time::Duration;

use virtiofs_device::config::Profile;
use virtiofs_device::poller::{RequestHandler, Taken};
use virtiofs_device::stats::Tally;
use virtiofs_dpu::RunningDevice;
use virtiofs_tools::{DriverError, DriverOptions, FsDriver};
use vm_memory::{Bytes, VolatileSlice};

/// Answers every request with an error reply, broken as the request's node id says.
struct WrongReplies;

impl RequestHandler for WrongReplies {
    fn handle(
        &self,
        _taken: Taken,
        readable: &[VolatileSlice<'_>],
        writable: &[VolatileSlice<'_>],
    ) -> (u32, Tally) {
        let mut inh = [0u8; 40];
        if readable.first().is_none_or(|r| r.read_slice(&mut inh, 0).is_err()) {
            return (0, Tally::default());
        }
        let unique = u64::from_le_bytes(inh[8..16].try_into().unwrap());
        let nodeid = u64::from_le_bytes(inh[16..24].try_into().unwrap());
        let (len, unique, used) = match nodeid {
            2 => (16u32, unique + 1, 16u32), // another request's unique
            3 => (24, unique, 16),           // oh.len says more than was written
            4 => (16, unique, 32),           // used length past oh.len
            5 => (16, unique, 8),            // used length shorter than the header
            _ => (16, unique, 16),           // a correct ENOENT
        };
        let mut out = [0u8; 16];
        out[..4].copy_from_slice(&len.to_le_bytes());
        out[4..8].copy_from_slice(&(-libc::ENOENT).to_le_bytes());
        out[8..].copy_from_slice(&unique.to_le_bytes());
        let used = match writable.first() {
            Some(w) if w.write_slice(&out, 0).is_ok() => used,
            _ => 0,
        };
        (used, Tally::default())
    }
}

#[test]
fn every_reply_is_verified_as_linux_7_1_does() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("wrong.sock");
    let dev = RunningDevice::start_with(&sock, Profile::default(), Arc::new(WrongReplies)).unwrap();
    let mut d =
        FsDriver::connect(&sock, DriverOptions { timeout: Duration::from_secs(5), ..Default::default() })
            .unwrap();
    let e = d.getattr(1).unwrap_err();
    assert_eq!(e.fuse_errno(), Some(libc::ENOENT), "a correct reply passes: {e}");
    for (node, what) in
        [(2, "unique"), (3, "differs from used length"), (4, "differs from used length"), (5, "shorter")]
    {
        match d.getattr(node) {
            Err(DriverError::BadReply { reason, .. }) => {
                assert!(reason.contains(what), "node {node}: {reason}")
            }
            other => panic!("node {node}: a reply that fails virtio_fs_verify_response was taken: {other:?}"),
        }
    }
    // Also on the lower level: a FUSE request submitted by hand fails as its completion is
    // collected, before any test looks at it.
    let getattr = 3;
    for node in [2u64, 3, 5] {
        d.submit(1, getattr, node, &[&[0u8; 16]], &[], 120, 0).unwrap();
        let r = d.wait_completions();
        assert!(matches!(r, Err(DriverError::BadReply { .. })), "node {node}: collected unchecked: {r:?}");
    }
    d.submit(1, getattr, 1, &[&[0u8; 16]], &[], 120, 0).unwrap();
    assert_eq!(d.wait_completions().unwrap().len(), 1);
    // Raw submissions (malformed-chain tests) are not FUSE requests and are not checked.
    let t = d.submit_raw(1, &[&[0u8; 40]], &[16]).unwrap();
    assert_eq!(d.wait_for(t).unwrap().used_len, 16);
    drop(d);
    dev.stop().unwrap();
}
