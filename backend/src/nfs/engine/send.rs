//! Sending a slot's next call on the connection ([`send`]): its arguments from the slot, a
//! WRITE's data from the request's payload (stored in the UNSTABLE replay store first when it
//! is to go UNSTABLE), and why a call could not go ([`SendError`]).

use std::time::Instant;

use super::slot::{Call, Kind, Slot};
use crate::io::{Reader, Writer};
use crate::nfs::conn::{CallError, Conn, Sink};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::{Res, Stable};

/// The sink of a `Conn::call`: the payload of the call being sent.
pub(super) struct CallSink<'a> {
    pub(super) payload: Option<Reader<'a>>,
    pub(super) ended: bool,
}

impl Sink for CallSink<'_> {
    fn read_buffer(&mut self, _tag: u32) -> Option<Writer<'_>> {
        None
    }

    fn payload(&mut self, _tag: u32) -> Option<Reader<'_>> {
        self.payload.clone()
    }

    fn done(&mut self, _tag: u32, _res: Result<Res<'_>, CallError>) {
        self.ended = true;
    }
}

/// Why a slot's call did not go out.
#[derive(Debug)]
pub(super) enum SendError {
    /// The connection refused it.
    Call(CallError),
    /// A WRITE found the store full, and a COMMIT (on the wire, or to be sent) will free room:
    /// it waits in the engine (`room_wait`).
    NoRoom,
}

impl From<CallError> for SendError {
    fn from(e: CallError) -> Self {
        SendError::Call(e)
    }
}

/// Sends slot `tag`'s next call (`payload`: a WRITE's or replay's data, from where the call
/// starts). WRITE data goes to the replay store first when it is to be sent UNSTABLE.
pub(super) fn send(
    conn: &mut Conn,
    fs: &Shared,
    slot: &mut Slot,
    tag: u32,
    payload: Option<Reader<'_>>,
) -> Result<(), SendError> {
    let mut payload = payload;
    if slot.call == Call::Write {
        if let Some(p) = payload.as_mut() {
            p.truncate(slot.chunk as usize);
            let at = slot.offset + u64::from(slot.done);
            slot.unstable = fs.unstable.insert(slot.nodeid, &slot.fh, &slot.cred, at, p);
            slot.stable = if slot.unstable.is_some() { Stable::Unstable } else { Stable::FileSync };
            let now = Instant::now();
            if slot.unstable.is_none()
                && slot.room_until.is_none_or(|t| now < t)
                && fs.unstable.fits(p.bytes_left())
                && fs.unstable.room_may_come()
            {
                // Full, but a COMMIT frees room soon: wait for it (a retransmission interval
                // at most) and go UNSTABLE then.
                slot.room_until.get_or_insert(now + fs.retransmit);
                return Err(SendError::NoRoom);
            }
            if slot.unstable.is_none() && fs.unstable.enabled() {
                fs.unstable.count_full();
            }
            if slot.unstable.is_none() && fs.unstable.has_answered(slot.nodeid) {
                // No room and none to come: this one goes FILE_SYNC, after the file's stored
                // writes are committed (a replay must never land on top of it).
                slot.then = Some(Call::Write);
                slot.call = Call::Commit;
                payload = None;
            }
        }
    }
    if slot.call == Call::Commit {
        slot.horizon = fs.unstable.horizon();
    }
    let args = slot.args(slot.kind == Kind::Readdirplus);
    let mut sink = CallSink { payload, ended: false };
    let r = conn.call(tag, &slot.cred, &args, &mut sink);
    if r.is_err() || sink.ended {
        if let Some(id) = slot.unstable.take() {
            fs.unstable.remove(id);
        }
    }
    match r {
        Ok(()) if sink.ended => Err(CallError::Closed.into()),
        r => r.map_err(SendError::from),
    }
}
