//! The old serving process's side of a live update: each function brought to its quiet point
//! and sent, then the new process's verdict, then commit or rollback.
//!
//! Order: the new process says which formats it reads ([`Msg::Hello`]); nothing is frozen
//! before that. In format 3, the backends that can (the RAM filesystem) copy their state while
//! their functions serve ([`Msg::Precopy`]) and the new process builds from the copies before
//! anything is frozen ([`Msg::Precopied`]); at the quiet point they give only what changed
//! since. Then the control socket, then each function in turn: its server freezes it at
//! a message boundary ([`virtiofs_device::vfio_user::StopHandle::hand_over`]), its backend
//! gives its state, and all of it goes with its descriptors. The new process builds every
//! function without serving any and answers [`Msg::Ready`]; only then are the old servers
//! told that they were taken (they end without touching the client or the device) and the new
//! one [`Msg::Commit`]. On any failure the old servers are told they were not taken (they serve
//! on) and the new process [`Msg::Abort`].

use std::collections::HashSet;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use virtiofs_device::vfio_user::handover::{Answer, ANSWER_BOUND};

use super::channel::Channel;
use super::state::{
    self, BackendPart, ControlPart, FunctionPart, Msg, PrecopyPart, FORMATS_READ, PREVIOUS_VERSION,
    STATE_VERSION,
};
use super::{ControlCopy, UpdateError};
use crate::functions::HandoverEntry;

/// How long the new process may take to start and say hello.
pub const HELLO_BOUND: Duration = Duration::from_secs(20);
/// How long the new process may take to build every backend from its copy (the functions
/// serve meanwhile; the whole update took 0.4-0.8 s with 100,000 RAM filesystem files, see
/// BENCHMARKS.md).
pub const PRECOPY_BOUND: Duration = Duration::from_secs(30);
/// How long the new process may take to check and build every function. Below the servers'
/// own bound ([`ANSWER_BOUND`]), after which they serve on by themselves.
pub const READY_BOUND: Duration = Duration::from_secs(5);

/// A handover that went through.
pub struct Given {
    /// Functions handed over.
    pub functions: usize,
    /// The new process's version.
    pub version: String,
    /// From the first function frozen to the commit.
    pub pause: Duration,
    /// Where that time went.
    pub phases: Phases,
}

/// The old process's time in each step of a handover, all functions together.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Phases {
    /// Copying the backends' state and waiting for the new process to build from it, while
    /// the functions serve (not part of the pause).
    pub precopy_ms: f64,
    /// Bringing the functions to their quiet points (`hand_over`).
    pub freeze_ms: f64,
    /// The backends giving their state.
    pub save_ms: f64,
    /// Sending the parts.
    pub send_ms: f64,
    /// Waiting for the new process to be ready.
    pub ready_ms: f64,
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// Hands `functions` and the control socket over to the new process at the other end of
/// `peer`; `updates`: the daemon's updates so far.
pub fn give(
    peer: &Channel,
    functions: Vec<HandoverEntry>,
    control: Option<&ControlCopy>,
    (updates, recoveries): (u64, u64),
    on_commit: impl FnOnce(),
) -> Result<Given, UpdateError> {
    let (version, format) = match peer.recv::<Msg>(HELLO_BOUND)? {
        (Msg::Hello { reads, version, pid }, _) => {
            let Some(format) = [STATE_VERSION, PREVIOUS_VERSION].into_iter().find(|f| reads.contains(f))
            else {
                let e = UpdateError::Format { reads, writes: STATE_VERSION };
                let _ = peer.send(&Msg::Abort { reason: crate::error_chain(&e) }, &[]);
                return Err(e);
            };
            log::info!(
                "live update: process {pid} (version {version}) reads formats {reads:?}; writing {format}"
            );
            (version, format)
        }
        (other, _) => return Err(UpdateError::Protocol(format!("expected hello, got {other:?}"))),
    };
    debug_assert!(FORMATS_READ.contains(&STATE_VERSION));
    let mut answers: Vec<Answer> = Vec::new();
    let savers: Vec<_> = functions.iter().filter_map(|f| f.saver.clone()).collect();
    let mut phases = Phases::default();
    let forget = || {
        savers.iter().for_each(|s| {
            s.forget_precopy();
            s.called_off();
        })
    };
    let mut copied = HashSet::new();
    if format >= 3 {
        let t = Instant::now();
        match precopy(peer, &functions) {
            Ok(tags) => copied = tags,
            Err(e) => {
                forget();
                let _ = peer.send(&Msg::Abort { reason: crate::error_chain(&e) }, &[]);
                return Err(e);
            }
        }
        phases.precopy_ms = ms(t);
    }
    let started = Instant::now();
    let r = send_all(peer, functions, control, (updates, recoveries), &copied, &mut answers, &mut phases)
        .and_then(|n| {
            let t = Instant::now();
            let verdict = peer.recv::<Msg>(READY_BOUND);
            phases.ready_ms = ms(t);
            match verdict? {
                (Msg::Ready, _) => Ok(n),
                (Msg::Refused { reason }, _) => Err(UpdateError::Refused(reason)),
                (other, _) => Err(UpdateError::Protocol(format!("expected ready, got {other:?}"))),
            }
        });
    let n = match r {
        // Past half the servers' bound a server may give up waiting any moment: call it off.
        Ok(_) if started.elapsed() > ANSWER_BOUND / 2 => Err(UpdateError::Protocol(format!(
            "the handover took {:?}, past half of the servers' {ANSWER_BOUND:?}",
            started.elapsed()
        ))),
        r => r,
    };
    let n = match n {
        Ok(n) => n,
        Err(e) => {
            forget();
            for a in answers {
                a.not_taken();
            }
            let _ = peer.send(&Msg::Abort { reason: crate::error_chain(&e) }, &[]);
            return Err(e);
        }
    };
    on_commit();
    // Before any old server ends (and drops what it holds): the data is the new process's.
    for s in &savers {
        s.handed_over();
    }
    let all = answers.len();
    let taken = answers.into_iter().map(Answer::taken).filter(|&t| t).count();
    if taken != all {
        // A server stopped waiting (it serves on): the new process must not serve too. The
        // ones taken have ended; their functions are lost to both (logged loudly).
        log::error!("live update: {} of {all} servers gave up waiting; calling the update off", all - taken);
        let _ = peer.send(&Msg::Abort { reason: "a server gave up waiting".into() }, &[]);
        return Err(UpdateError::Protocol("a server gave up waiting for the commit".into()));
    }
    for s in &savers {
        s.committed();
    }
    peer.send(&Msg::Commit, &[])?;
    Ok(Given { functions: n, version, pause: started.elapsed(), phases })
}

/// Sends a copy of each backend that takes one while its function serves, and waits for the
/// new process to have built from them all; the tags of the functions copied.
fn precopy(peer: &Channel, functions: &[HandoverEntry]) -> Result<HashSet<String>, UpdateError> {
    let mut tags = HashSet::new();
    for f in functions {
        let Some(copy) = f.saver.as_ref().and_then(|s| s.precopy()) else { continue };
        let failed = |why| UpdateError::Function { tag: f.tag.clone(), backend: f.backend, why };
        let (backend, files) = copy.map_err(failed)?;
        let part = PrecopyPart { tag: f.tag.clone(), origin: f.origin.clone(), backend };
        peer.send(&Msg::Precopy(Box::new(part)), &files.fds())?;
        tags.insert(f.tag.clone());
    }
    peer.send(&Msg::PrecopyEnd, &[])?;
    match peer.recv::<Msg>(PRECOPY_BOUND)? {
        (Msg::Precopied, _) => Ok(tags),
        (Msg::Refused { reason }, _) => Err(UpdateError::Refused(reason)),
        (other, _) => Err(UpdateError::Protocol(format!("expected precopied, got {other:?}"))),
    }
}

/// Sends the control socket and every function; the servers' answers go to `answers` as
/// their functions are frozen.
fn send_all(
    peer: &Channel,
    functions: Vec<HandoverEntry>,
    control: Option<&ControlCopy>,
    (updates, recoveries): (u64, u64),
    copied: &HashSet<String>,
    answers: &mut Vec<Answer>,
    phases: &mut Phases,
) -> Result<usize, UpdateError> {
    if let Some(c) = control {
        let listener = OwnedFd::from(c.listener.try_clone().map_err(io_err)?);
        let (socket_file, lock) = c.files.handed_over().map_err(io_err)?.into_parts();
        let part = ControlPart { path: c.path.clone(), socket_file, lock: lock.is_some() };
        let mut fds = vec![listener.as_fd()];
        fds.extend(lock.as_ref().map(|l| l.as_fd()));
        peer.send(&Msg::Control(part), &fds)?;
    }
    let n = functions.len();
    for f in functions {
        let HandoverEntry { tag, backend, origin, stop, saver } = f;
        let saver = saver.ok_or_else(|| UpdateError::Function {
            tag: tag.clone(),
            backend,
            why: "no state to give".into(),
        })?;
        let t = Instant::now();
        let (h, answer) =
            stop.hand_over().map_err(|source| UpdateError::Handover { tag: tag.clone(), source })?;
        answers.push(answer);
        phases.freeze_ms += ms(t);
        let t = Instant::now();
        let (backend_part, backend_files) =
            saver.save().map_err(|why| UpdateError::Function { tag: tag.clone(), backend, why })?;
        phases.save_ms += ms(t);
        let t = Instant::now();
        let changes =
            matches!(backend_part, BackendPart::RamfsChanges { .. } | BackendPart::PassthroughChanges { .. });
        if copied.contains(&tag) && !changes {
            peer.send(&Msg::DropCopy { tag: tag.clone() }, &[])?;
        }
        let (path, socket_file, lock, client, device, mut files) = state::server_part(h);
        files.extend(state::device_files(device.files));
        let part = FunctionPart {
            tag,
            origin,
            path,
            socket_file,
            lock,
            client,
            device: device.snapshot,
            backend: backend_part,
        };
        let mut fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
        fds.extend(backend_files.fds());
        peer.send(&Msg::Function(Box::new(part)), &fds)?;
        phases.send_ms += ms(t);
    }
    peer.send(&Msg::End { updates, recoveries }, &[])?;
    Ok(n)
}

fn io_err(e: std::io::Error) -> UpdateError {
    UpdateError::Channel(super::channel::ChannelError::Io(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new process that reads no format this one writes is told to go (Abort), and the
    /// update fails before anything is frozen; one that answers anything but ready is refused.
    #[test]
    fn a_new_process_of_another_format_is_refused_before_anything_is_frozen() {
        let (old, new) = Channel::pair().unwrap();
        let hello = Msg::Hello { reads: vec![STATE_VERSION + 1], version: "9.9.9".into(), pid: 1 };
        new.send(&hello, &[]).unwrap();
        let mut committed = false;
        let e = give(&old, Vec::new(), None, (0, 0), || committed = true).err().unwrap();
        assert!(matches!(e, UpdateError::Format { .. }), "{e}");
        assert!(!committed);
        let (m, _) = new.recv::<Msg>(Duration::from_secs(1)).unwrap();
        assert!(matches!(m, Msg::Abort { .. }), "{m:?}");

        // Format 3: the copies first; a refusal of them calls the update off.
        let hello = Msg::Hello { reads: FORMATS_READ.to_vec(), version: "0".into(), pid: 1 };
        new.send(&hello, &[]).unwrap();
        new.send(&Msg::Refused { reason: "no room".into() }, &[]).unwrap();
        let e = give(&old, Vec::new(), None, (0, 0), || committed = true).err().unwrap();
        assert!(e.to_string().contains("no room"), "{e}");
        assert!(!committed);
        let (m, _) = new.recv::<Msg>(Duration::from_secs(1)).unwrap();
        assert!(matches!(m, Msg::PrecopyEnd), "{m:?}");
        let (m, _) = new.recv::<Msg>(Duration::from_secs(1)).unwrap();
        assert!(matches!(m, Msg::Abort { .. }), "{m:?}");

        // A process that reads only the previous format gets no copies: the parts at once.
        let hello = Msg::Hello { reads: vec![PREVIOUS_VERSION], version: "0".into(), pid: 1 };
        new.send(&hello, &[]).unwrap();
        new.send(&Msg::Refused { reason: "still no room".into() }, &[]).unwrap();
        let e = give(&old, Vec::new(), None, (0, 0), || committed = true).err().unwrap();
        assert!(e.to_string().contains("still no room"), "{e}");
        let (m, _) = new.recv::<Msg>(Duration::from_secs(1)).unwrap();
        assert!(matches!(m, Msg::End { updates: 0, recoveries: 0 }), "{m:?}");
        let (m, _) = new.recv::<Msg>(Duration::from_secs(1)).unwrap();
        assert!(matches!(m, Msg::Abort { .. }), "{m:?}");
    }
}
