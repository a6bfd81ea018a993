//! The commit family: FLUSH and FSYNC of a file with stored UNSTABLE writes (and RELEASE of
//! its last handle, and the WRITEs and truncating SETATTRs that must commit first) are a
//! COMMIT, then, if the server's write verifier changed, the stored writes the server may have
//! lost sent again FILE_SYNC, one at a time (`Call::Resend`, from the engine's replay buffer).
//!
//! And the background COMMIT ([`Background`]): the one the engine sends on its own when the
//! store is past its high-water mark, which no guest request waits for.

use std::time::Instant;

use super::send::CallSink;
use super::slot::{unexpected, Call, Flow, Kind, Prepared, Slot, JUKEBOX_DELAY};
use crate::filesystem::{Error, Reply};
use crate::nfs::conn::{CallError, Conn};
use crate::nfs::convert::nfs_error;
use crate::nfs::shared::{EngineCell, Shared};
use crate::nfs::unstable::BackgroundClaim;
use crate::nfs::wire::nfs3::{Args, Nfsstat, Res};

/// FLUSH or FSYNC of the request's node: a COMMIT if it has stored writes, else nothing to do.
pub(super) fn flush(fs: &Shared, slot: &mut Slot) -> Result<Prepared, Error> {
    if !fs.unstable.has(slot.nodeid) {
        return Ok(Prepared::Answered(Reply::Empty));
    }
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    Ok(Prepared::Send(Kind::Commit, Call::Commit))
}

/// What the reply `res` to a COMMIT or a stored write sent again means.
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>) -> Flow {
    match (slot.call, res) {
        (Call::Commit, Res::Failed { status: Nfsstat::Stale, .. }) => {
            // The file is gone: nothing of it can be committed any more.
            fs.unstable.drop_file(slot.nodeid);
            Flow::Done(Err(nfs_error(Nfsstat::Stale)))
        }
        (_, Res::Failed { status, .. }) => Flow::Done(Err(nfs_error(status))),
        (Call::Commit, Res::Commit { verf }) => {
            let c = fs.unstable.committed(slot.nodeid, verf, slot.horizon);
            if c.resend > 0 {
                log::info!("nfs: the server's write verifier changed: sending {} writes again", c.resend);
                slot.call = Call::Resend;
                Flow::Next
            } else if let Some(call) = slot.then.take() {
                slot.call = call;
                Flow::Next
            } else {
                Flow::Done(Ok(Reply::Empty))
            }
        }
        (Call::Resend, Res::Write { count, .. }) => {
            if count < slot.replay_len {
                return Flow::Done(Err(Error::Io));
            }
            if let Some(id) = slot.replay.take() {
                fs.unstable.remove(id);
            }
            // The next stored write of the file, if any.
            Flow::Next
        }
        (call, _) => unexpected(call),
    }
}

/// The connection tag of the background COMMIT (no slot has it: slots are request tokens).
pub(super) const BACKGROUND_TAG: u32 = u32::MAX;

/// A COMMIT the engine sent on its own, the store past its high-water mark (no guest request
/// waits for it; it only frees the store).
pub(super) struct Background {
    file: u64,
    horizon: u64,
    /// The store's one background COMMIT is this one while held.
    _claim: BackgroundClaim,
}

/// Sends a background COMMIT on `conn` unless another engine has one on the wire: of the file
/// with the most answered bytes stored, as its newest writer.
pub(super) fn send_background(fs: &Shared, conn: &mut Conn, cell: &EngineCell) -> Option<Background> {
    let claim = fs.unstable.begin_background()?;
    let pick = fs.unstable.pick_commit()?;
    let horizon = fs.unstable.horizon();
    let args = Args::Commit { fh: &pick.fh, offset: 0, count: 0 };
    let mut sink = CallSink { payload: None, ended: false };
    match conn.call(BACKGROUND_TAG, &pick.cred, &args, &mut sink) {
        Ok(()) if !sink.ended => {
            EngineCell::bump(&cell.calls);
            fs.unstable.count_background();
            Some(Background { file: pick.file, horizon, _claim: claim })
        }
        // The connection is full or down: the next round tries again.
        r => {
            log::trace!("nfs: background COMMIT not sent: {r:?}");
            None
        }
    }
}

/// The background COMMIT `b` ended with `res` (the claim goes with `b`: the next background
/// COMMIT may be sent); a failure holds the next one back until `after`.
pub(super) fn background_done(
    fs: &Shared,
    b: Background,
    res: Result<Res<'_>, CallError>,
    after: &mut Instant,
) {
    match res {
        Ok(Res::Commit { verf }) => {
            let c = fs.unstable.committed_background(b.file, verf, b.horizon);
            if c.resend > 0 {
                // Sent again at the file's next FLUSH, FSYNC or last close (or by a
                // write that finds the store full of them).
                log::info!("nfs: the server's write verifier changed: {} writes to send again", c.resend);
            }
        }
        Ok(Res::Failed { status: Nfsstat::Stale, .. }) => fs.unstable.drop_file(b.file),
        r => {
            log::debug!("nfs: background COMMIT failed: {:?}", r.err());
            *after = Instant::now() + JUKEBOX_DELAY;
        }
    }
}
