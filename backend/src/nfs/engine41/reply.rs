//! What a COMPOUND's reply means for its slot ([`reply`]): the request is answered
//! ([`Flow::Done`]), or the slot's next step is to be sent ([`Flow::Next`], or after a wait:
//! [`Flow::After`]). Failures are the COMPOUND's last result (`nfsstat4` as the guest's errno),
//! or its status when no operation failed (at SEQUENCE or before any operation ran); a reply
//! that does not decode, or lacks a result asked for, is EIO. NFS4ERR_DELAY and GRACE reach
//! here only after an operation that must not run twice ran (the session resends the others):
//! the rest goes again alone. A BAD_STATEID, STALE_STATEID or EXPIRED on a handle's open opens
//! it again and sends the request again, once (`reopen`).

use std::time::Duration;

use super::attr::{error, stat, statfs};
use super::prepare::kept_state;
use super::slot::{Kind, Slot, Step, NAME_MAX};
use crate::filesystem::seam::{Completions, DirentWriter};
use crate::filesystem::{self, DirEntry, Entry, Error, Opened, Reply, Stat};
use crate::nfs::conn::{CallError, CompoundReply, Cred, ReadDone};
use crate::nfs::convert::access_ok;
use crate::nfs::locks41::Orphan;
use crate::nfs::nodes::{silly_name, OpenFile};
use crate::nfs::shared::{EngineCell, Shared};
use crate::nfs::wire::nfs4::{
    open_result, Delegation, DirEntries, Fattr4, Ftype4, Nfsstat4, OpNum, OpRes, Stable4, Stateid, Verifier,
};
use crate::nfs::wire::Fh;

/// What a reply means for its slot.
pub(super) enum Flow {
    /// The request is answered.
    Done(filesystem::Result<Reply>),
    /// `slot.step` is the next COMPOUND to send.
    Next,
    /// `slot.step` is the next COMPOUND to send, after this wait (from a later poll round: the
    /// rest of a COMPOUND answered DELAY or GRACE after an operation that must not run twice).
    After(Duration),
}

/// The wait before the rest of a COMPOUND answered NFS4ERR_DELAY (the session's wait).
const DELAY_WAIT: Duration = Duration::from_millis(50);
/// The wait before the rest of a COMPOUND answered NFS4ERR_GRACE.
const GRACE_WAIT: Duration = Duration::from_millis(250);

/// The wait before the rest of a COMPOUND that failed with `s`, if `s` says "later".
fn later(s: Nfsstat4) -> Option<Duration> {
    match s {
        Nfsstat4::Delay => Some(DELAY_WAIT),
        Nfsstat4::Grace => Some(GRACE_WAIT),
        _ => None,
    }
}

/// The results of one COMPOUND that the steps use, gathered in one pass.
#[derive(Default)]
struct Got<'a> {
    failed: Option<(OpNum, Nfsstat4)>,
    fh: Option<Fh>,
    /// A SETATTR succeeded.
    setattr: bool,
    attrs: Option<Fattr4>,
    /// The first GETATTR's (READDIR's directory fileid).
    first_attrs: Option<Fattr4>,
    open: Option<(Stateid, u32, Option<Stateid>)>,
    access: Option<u32>,
    link: Option<&'a [u8]>,
    dir: Option<(Verifier, DirEntries<'a>, bool)>,
    written: Option<u32>,
    /// WRITE's `committed` and verifier.
    write_verf: Option<(Stable4, Verifier)>,
    /// COMMIT's verifier.
    commit_verf: Option<Verifier>,
    read: Option<ReadDone>,
}

fn gather<'a>(reply: &CompoundReply<'a>) -> Result<Got<'a>, Error> {
    let mut g = Got { read: reply.read, ..Got::default() };
    for r in reply.results.clone() {
        match r.map_err(|_| Error::Io)? {
            OpRes::Failed { op, status, .. } => g.failed = Some((op, status)),
            OpRes::Getfh(fh) => g.fh = Some(fh),
            OpRes::Setattr(_) => g.setattr = true,
            OpRes::Getattr(a) => {
                if g.first_attrs.is_none() {
                    g.first_attrs = Some(a);
                }
                g.attrs = Some(a);
            }
            OpRes::Open(o) => {
                let deleg = match o.delegation {
                    Delegation::Read { stateid, .. } | Delegation::Write { stateid, .. } => Some(stateid),
                    Delegation::None | Delegation::NoneExt { .. } => None,
                };
                g.open = Some((o.stateid, o.rflags, deleg));
            }
            OpRes::Access { access, .. } => g.access = Some(access),
            OpRes::Readlink(t) => g.link = Some(t),
            OpRes::Readdir { verf, entries, eof } => g.dir = Some((verf, entries, eof)),
            OpRes::Write { count, committed, verf } => {
                g.written = Some(count);
                g.write_verf = Some((committed, verf));
            }
            OpRes::Commit { verf } => g.commit_verf = Some(verf),
            _ => {}
        }
    }
    if g.failed.is_none() && reply.status != Nfsstat4::Ok {
        // The COMPOUND failed with no operation's failure to show for it: at SEQUENCE (the
        // session leaves that status to the owner) or before any operation ran (BADXDR,
        // SERVERFAULT, REQ_TOO_BIG...). Never a success.
        g.failed = Some((OpNum::Sequence, reply.status));
    }
    Ok(g)
}

/// The entry of `fh` with attributes `a`: a node id the kernel now holds one more reference to.
fn entry(fs: &Shared, fh: &Fh, a: &Fattr4) -> filesystem::Result<Entry> {
    let attr = stat(a)?;
    let ino = fs.nodes.reference(fh)?;
    let t = fs.cache.timeout();
    Ok(Entry { ino, generation: 0, attr, entry_timeout: t, attr_timeout: t })
}

/// What the reply (or failure) `res` of slot's COMPOUND means (READ data and READLINK's target
/// and READDIR's entries go into the request's reply buffers, from `done`).
pub(super) fn reply(
    fs: &Shared,
    slot: &mut Slot,
    res: Result<CompoundReply<'_>, CallError>,
    done: &mut Completions<'_>,
    cell: &EngineCell,
) -> Flow {
    let reply = match res {
        Ok(r) => r,
        Err(e) => {
            log::debug!("nfs4.1: {:?} of request {:?} ended: {e}", slot.step, slot.token);
            if slot.step == Step::Close {
                return close_ended(fs, slot, Some((e.to_string(), true)), cell);
            }
            return Flow::Done(Err(Error::Io));
        }
    };
    let g = match gather(&reply) {
        Ok(g) => g,
        Err(_) if slot.step == Step::Close => {
            return close_ended(fs, slot, Some(("undecodable".into(), true)), cell)
        }
        Err(e) => return Flow::Done(Err(e)),
    };
    if slot.step == Step::Close {
        // A CLOSE the server refused otherwise than on an open it no longer knows goes again.
        let failure = g
            .failed
            .map(|(op, s)| (format!("{op:?} {s:?}"), !super::reopen::lost(s) && s != Nfsstat4::OldStateid));
        return close_ended(fs, slot, failure, cell);
    }
    match step(fs, slot, g, done, cell) {
        Ok(f) => f,
        Err(e) => Flow::Done(Err(e)),
    }
}

/// A CLOSE ended (`failure`: why, when it did not succeed, counted, and whether it goes again:
/// as an orphan, `Locks41::orphan_again`, since the pollers' renewals would keep the open for
/// the client's life): a silly name's REMOVE goes next whatever happened, else the answer kept
/// (or RELEASE's).
fn close_ended(fs: &Shared, slot: &mut Slot, failure: Option<(String, bool)>, cell: &EngineCell) -> Flow {
    if let Some((why, again)) = failure {
        EngineCell::bump(&cell.close_failures);
        log::info!("nfs4.1: CLOSE of an open of node {} failed: {why}", slot.nodeid);
        if again {
            fs.locks41.orphan_again(Orphan::Open(slot.obj, slot.stateid), 0);
        }
    }
    if slot.silly {
        slot.step = Step::Remove;
        return Flow::Next;
    }
    Flow::Done(slot.answer.take().unwrap_or(Ok(Reply::Empty)))
}

fn step(
    fs: &Shared,
    slot: &mut Slot,
    g: Got<'_>,
    done: &mut Completions<'_>,
    cell: &EngineCell,
) -> Result<Flow, Error> {
    if matches!(slot.step, Step::Commit | Step::Resend) {
        return super::commit::reply(fs, slot, g.failed.map(|f| f.1), g.commit_verf, g.written);
    }
    // Failures a step expects first.
    match (slot.step, g.failed) {
        (Step::ProbeTarget, Some((OpNum::Lookup, Nfsstat4::NoEnt))) => {
            slot.step = Step::Rename;
            return Ok(Flow::Next);
        }
        (Step::ProbeTarget, None) => return Err(Error::Exists),
        // The silly name's REMOVE after a RELEASE's CLOSE: logged if it failed (the guest's
        // RELEASE has no error to give).
        (Step::Remove, failed) if slot.kind == Kind::Release || slot.silly => {
            if let Some((_, s)) = failed {
                log::warn!("nfs4.1: the silly name of node {} stays: REMOVE failed: {s:?}", slot.nodeid);
            }
            return Ok(Flow::Done(slot.answer.take().unwrap_or(Ok(Reply::Empty))));
        }
        // The OPEN ran, a later operation of its COMPOUND did not.
        (Step::OpenFh | Step::OpenCreate | Step::OpenRest, Some((op, s)))
            if op != OpNum::Open && (g.open.is_some() || slot.step == Step::OpenRest) =>
        {
            if !(slot.kind == Kind::MknodReg && op == OpNum::Close) {
                return Ok(open_unfinished(slot, &g, s));
            }
            EngineCell::bump(&cell.close_failures);
            log::info!("nfs4.1: the CLOSE after a MKNOD failed: {s:?}");
        }
        // LINK or CREATE ran, an operation after it failed (DELAY or GRACE, or anything else:
        // the object is made, so the request is not the failure's): only the rest goes again,
        // after a wait if the server said so (LINK again would be EEXIST).
        (Step::Link, Some((op @ (OpNum::Restorefh | OpNum::Getattr), s))) => {
            log::debug!("nfs4.1: LINK ran, {op:?} after it failed ({s:?}): its GETATTR again");
            slot.obj = slot.fh2;
            slot.step = Step::Getattr;
            return Ok(later(s).map_or(Flow::Next, Flow::After));
        }
        (Step::Create, Some((op @ (OpNum::Getfh | OpNum::Getattr), s))) => {
            log::debug!("nfs4.1: CREATE ran, {op:?} after it failed ({s:?}): its LOOKUP again");
            slot.step = Step::Lookup;
            return Ok(later(s).map_or(Flow::Next, Flow::After));
        }
        (Step::Reopen, failed) => return super::reopen::reopened(fs, slot, failed, g.open),
        (_, Some((op, s))) if super::reopen::applies(slot, op, s) => {
            return super::reopen::start(fs, slot, s)
        }
        (Step::Delegreturn, _) => {
            if let Some((_, s)) = g.failed {
                log::debug!("nfs4.1: DELEGRETURN failed: {s:?}");
            }
            return Ok(Flow::Done(slot.answer.take().unwrap_or(Err(Error::Io))));
        }
        (_, Some((op, s))) => {
            if matches!(s, Nfsstat4::BadStateid | Nfsstat4::StaleStateid | Nfsstat4::Expired) {
                log::warn!("nfs4.1: {op:?} of node {}: {s:?} (the open is gone)", slot.nodeid);
            }
            return Err(error(s));
        }
        _ => {}
    }
    let t = fs.cache.timeout();
    let flow = match slot.step {
        Step::Lookup | Step::Create => {
            let (fh, a) = (g.fh.ok_or(Error::Io)?, g.attrs.ok_or(Error::Io)?);
            Flow::Done(entry(fs, &fh, &a).map(Reply::Entry))
        }
        // LINK's rest (its GETATTR answered DELAY): the file's entry.
        Step::Getattr if slot.kind == Kind::Link => {
            Flow::Done(entry(fs, &slot.fh2, &g.attrs.ok_or(Error::Io)?).map(Reply::Entry))
        }
        Step::Getattr | Step::Setattr => Flow::Done(Ok(Reply::Attr(stat(&g.attrs.ok_or(Error::Io)?)?, t))),
        Step::Link => Flow::Done(entry(fs, &slot.fh2, &g.attrs.ok_or(Error::Io)?).map(Reply::Entry)),
        Step::Access => {
            if !access_ok(slot.mask_req, g.access.ok_or(Error::Io)?) {
                return Err(Error::AccessDenied);
            }
            Flow::Done(Ok(Reply::Empty))
        }
        Step::Readlink => {
            let target = g.link.ok_or(Error::Io)?;
            let mut w = done.data(slot.token).ok_or(Error::Io)?;
            if target.len() > w.available() {
                return Err(Error::NameTooLong);
            }
            w.write_all(target)?;
            Flow::Done(Ok(Reply::Data(target.len())))
        }
        Step::Statfs => Flow::Done(Ok(Reply::StatFs(statfs(&g.attrs.ok_or(Error::Io)?)))),
        Step::OpenFh | Step::OpenCreate | Step::OpenRest => opened(fs, slot, &g)?,
        Step::Probe => {
            let fh = g.fh.ok_or(Error::Io)?;
            let ftype = g.attrs.and_then(|a| a.ftype).ok_or(Error::Io)?;
            let is_dir = ftype == Ftype4::Dir;
            if slot.kind == Kind::Rmdir && !is_dir {
                return Err(Error::from_errno(libc::ENOTDIR));
            }
            if slot.kind == Kind::Unlink && is_dir {
                return Err(Error::from_errno(libc::EISDIR));
            }
            match fs.nodes.open_node(&fh).filter(|_| slot.kind == Kind::Unlink) {
                // Open: renamed to its silly name until the last close (as Linux's client).
                Some(n) => {
                    slot.handle = n;
                    slot.fh2 = slot.fh;
                    slot.names.set_b(&silly_name(n))?;
                    slot.step = Step::Rename;
                }
                None => slot.step = Step::Remove,
            }
            Flow::Next
        }
        Step::Remove => Flow::Done(Ok(Reply::Empty)),
        Step::Rename => {
            if slot.kind == Kind::Unlink && fs.nodes.set_silly(slot.handle, slot.fh) {
                // The last RELEASE ran while the RENAME was out: nobody else removes the
                // silly name.
                slot.names.set(&silly_name(slot.handle), b"")?;
                slot.silly = true;
                slot.step = Step::Remove;
                return Ok(Flow::Next);
            }
            Flow::Done(Ok(Reply::Empty))
        }
        Step::Read => {
            let r = g.read.ok_or(Error::Io)?;
            let count = r.count.min(slot.chunk);
            slot.done += count;
            if r.eof || count == 0 || slot.done >= slot.size {
                Flow::Done(Ok(Reply::Data(slot.done as usize)))
            } else {
                slot.chunk = (slot.size - slot.done).min(slot.max);
                Flow::Next
            }
        }
        Step::Write => {
            if let (Some(id), Some((committed, verf))) = (slot.unstable.take(), g.write_verf) {
                let count = g.written.unwrap_or(0);
                fs.unstable.written(id, verf, committed == Stable4::FileSync && count == slot.chunk);
            }
            let count = g.written.ok_or(Error::Io)?.min(slot.chunk);
            if count == 0 {
                return Err(Error::Io);
            }
            slot.done += count;
            if slot.done >= slot.size {
                Flow::Done(Ok(Reply::Written(slot.done as usize)))
            } else {
                slot.chunk = (slot.size - slot.done).min(slot.max);
                Flow::Next
            }
        }
        Step::Readdir => {
            let (verf, entries, eof) = g.dir.ok_or(Error::Io)?;
            let fileid = g.first_attrs.and_then(|a| a.fileid).unwrap_or(0);
            if !advances(&entries, slot.cookie, eof) {
                log::warn!(
                    "NFS server's READDIR reply from cookie {} does not move the listing on",
                    slot.cookie
                );
                return Err(Error::Io);
            }
            let mut w = done.data(slot.token).ok_or(Error::Io)?;
            let mut out = DirentWriter::new(&mut w);
            let (last, all) = list(fs, slot, fileid, entries, &mut out).ok_or(Error::Io)?;
            if out.bytes_written() == 0 && !(eof && all) {
                // Nothing the guest can take (every name skipped: empty, with `/` or NUL, too
                // long; or none fits), and not the end: 0 bytes would end its listing here.
                log::warn!(
                    "NFS server's READDIR from cookie {} gives no entry this client can list",
                    slot.cookie
                );
                return Err(Error::Io);
            }
            fs.handles.set_cookieverf(slot.handle, verf, if eof && all { last } else { 0 });
            Flow::Done(Ok(Reply::Data(out.bytes_written())))
        }
        // Answered above; the lock steps are `lock`'s.
        // The reclaim's steps are background calls (`reclaim`): never a guest request's; the
        // COMMIT's are `commit`'s.
        Step::ProbeTarget
        | Step::Close
        | Step::Delegreturn
        | Step::ReclaimOpen
        | Step::ReclaimComplete
        | Step::Commit
        | Step::Resend => return Err(Error::Io),
        Step::Lockt | Step::Lock | Step::Locku | Step::Free | Step::Reopen => return Err(Error::Io),
    };
    Ok(flow)
}

/// An OPEN succeeded and a later operation of its COMPOUND failed with `s`. DELAY or GRACE: the
/// rest goes again after a wait (`OpenRest`: the OPEN again would open twice, and GUARDED or
/// EXCLUSIVE be EEXIST). Another error is the request's, after a CLOSE of the open, which no
/// handle keeps.
fn open_unfinished(slot: &mut Slot, g: &Got<'_>, s: Nfsstat4) -> Flow {
    if let Some(o) = g.open {
        slot.opened = Some(o);
    }
    if let Some(fh) = g.fh {
        slot.obj = fh;
        slot.have_obj = true;
    } else if slot.kind == Kind::Open {
        slot.obj = slot.fh;
        slot.have_obj = true;
    }
    if g.setattr {
        slot.sattr2 = None;
    }
    if let Some(wait) = later(s) {
        slot.step = Step::OpenRest;
        return Flow::After(wait);
    }
    let Some((stateid, _, _)) = slot.opened else { return Flow::Done(Err(error(s))) };
    slot.answer = Some(Err(error(s)));
    if !slot.have_obj {
        // No handle of the file to CLOSE it by (its GETFH failed): the lease ends the open.
        log::info!("nfs4.1: an open of a file made in node {} stays (no handle to close it)", slot.nodeid);
        return Flow::Done(Err(error(s)));
    }
    slot.stateid = stateid;
    slot.silly = false;
    slot.step = Step::Close;
    Flow::Next
}

/// OPEN answered: the handle keeps the open's stateid (CREATE: the new file's entry too); a
/// delegation granted despite WANT_NO_DELEG is returned first.
fn opened(fs: &Shared, slot: &mut Slot, g: &Got<'_>) -> Result<Flow, Error> {
    let (stateid, rflags, deleg) = g.open.or(slot.opened).ok_or(Error::Io)?;
    // The rest of an OPEN's COMPOUND: the file's handle came with the first.
    let g_fh = g.fh.or(slot.have_obj.then_some(slot.obj));
    if rflags & open_result::CONFIRM != 0 {
        // NFSv4.0's OPEN_CONFIRM: never in 4.1.
        log::warn!("nfs4.1: the server asks OPEN_CONFIRM, which NFSv4.1 has not");
        return Err(Error::Io);
    }
    let answer = match slot.kind {
        Kind::MknodReg => {
            let (fh, a) = (g_fh.ok_or(Error::Io)?, g.attrs.ok_or(Error::Io)?);
            // A delegation granted anyway is returned on the file made.
            slot.obj = fh;
            entry(fs, &fh, &a).map(Reply::Entry)
        }
        Kind::Create => {
            let (fh, a) = (g_fh.ok_or(Error::Io)?, g.attrs.ok_or(Error::Io)?);
            slot.obj = fh;
            entry(fs, &fh, &a).and_then(|e| match open_handle(fs, e.ino, slot.flags, stateid, &slot.cred) {
                Ok(fh) => Ok(Reply::Created(e, Opened { fh, open_flags: fs.cache.file_open_flags() })),
                Err(err) => {
                    fs.nodes.forget(e.ino, 1);
                    Err(err)
                }
            })
        }
        _ => {
            slot.obj = slot.fh;
            open_handle(fs, slot.nodeid, slot.flags, stateid, &slot.cred)
                .map(|fh| Reply::Open(Opened { fh, open_flags: fs.cache.file_open_flags() }))
        }
    };
    if slot.kind != Kind::MknodReg && answer.is_err() {
        // No handle keeps the open: close it on the server, then answer.
        slot.stateid = stateid;
        slot.silly = false;
        slot.answer = Some(answer);
        slot.step = Step::Close;
        return Ok(Flow::Next);
    }
    if let Some(d) = deleg {
        slot.deleg = d;
        slot.answer = Some(answer);
        slot.step = Step::Delegreturn;
        return Ok(Flow::Next);
    }
    Ok(Flow::Done(answer))
}

/// A FUSE handle of `nodeid` opened with `flags` by `cred`, keeping the open `stateid`.
fn open_handle(
    fs: &Shared,
    nodeid: u64,
    flags: u32,
    stateid: Stateid,
    cred: &Cred,
) -> filesystem::Result<u64> {
    fs.nodes.opened(nodeid)?;
    let file = OpenFile {
        state: kept_state(stateid),
        opener: (cred.uid, cred.gid),
        ..OpenFile::new(nodeid, flags, false)
    };
    fs.handles.open(file).inspect_err(|_| {
        fs.nodes.closed(nodeid);
    })
}

/// Whether a READDIR reply to a call from `cookie` moves the listing on, checked before
/// anything is written or looked up: one with no entry and no eof, or an entry whose cookie is
/// the one asked for, or one of those NFSv4 keeps (0, 1, 2: RFC 8881 18.23.3), would make the
/// guest ask the same again for ever: EIO, never a loop.
pub(super) fn advances(entries: &DirEntries<'_>, cookie: u64, eof: bool) -> bool {
    let mut any = false;
    for e in entries.clone() {
        match e {
            Ok(e) if e.cookie != cookie && e.cookie > 2 => any = true,
            _ => return false,
        }
    }
    any || eof
}

/// Writes `.` and `..` if due, then the `entries` that fit into `out`: the offset of the last
/// entry given, and whether every one fit; `None` if an entry does not decode.
fn list(
    fs: &Shared,
    slot: &Slot,
    fileid: u64,
    entries: DirEntries<'_>,
    out: &mut DirentWriter<'_, '_>,
) -> Option<(u64, bool)> {
    let plus = slot.kind == Kind::Readdirplus;
    let mut last = slot.offset;
    let dots: &[(&[u8], u64)] = match slot.dots {
        2 => &[(b".", 1), (b"..", 2)],
        1 => &[(b"..", 2)],
        _ => &[],
    };
    for &(name, off) in dots {
        // NFSv4 gives neither: both are the directory's fileid here (its parent's is not known
        // without another call; the kernel takes `..` from its own dentries).
        let d = DirEntry { ino: fileid, offset: off, typ: libc::DT_DIR.into(), name };
        let fits = if plus {
            let attr = Stat { ino: fileid, mode: libc::S_IFDIR, nlink: 2, ..Stat::default() };
            out.add_plus(&d, &Entry { ino: 0, attr, ..Entry::default() })
        } else {
            out.add(&d)
        };
        if !fits {
            return Some((last, false));
        }
        last = off;
    }
    for e in entries {
        let e = e.ok()?;
        if e.name.is_empty() || e.name.len() > NAME_MAX || e.name.contains(&b'/') || e.name.contains(&0) {
            continue;
        }
        let a = &e.attrs;
        let failed = a.rdattr_error.is_some_and(|s| s != Nfsstat4::Ok);
        let typ = a.ftype.filter(|_| !failed).map_or(0, |t| super::attr::type_bits(t) >> 12);
        let d = DirEntry { ino: a.fileid.unwrap_or(0), offset: e.cookie, typ, name: e.name };
        if !plus {
            if !out.add(&d) {
                return Some((last, false));
            }
            last = e.cookie;
            continue;
        }
        let looked_up = match a.filehandle {
            Some(fh) if !failed => entry(fs, &fh, a).ok(),
            _ => None,
        };
        let ent =
            looked_up.unwrap_or(Entry { ino: 0, attr: stat(a).unwrap_or_default(), ..Entry::default() });
        if !out.add_plus(&d, &ent) {
            if looked_up.is_some() {
                fs.nodes.forget(ent.ino, 1);
            }
            return Some((last, false));
        }
        last = e.cookie;
    }
    Some((last, true))
}

#[cfg(test)]
mod tests {
    use super::advances;
    use crate::nfs::wire::nfs4::{decode_compound, Fattr4, OpRes};
    use crate::nfs::wire::xdr::{Decoder, Encoder};

    /// A COMPOUND reply with one READDIR result listing `entries` (cookie, name), then `eof`;
    /// whether the engine takes it as moving on from `asked`.
    fn moves_on(asked: u64, entries: &[(u64, &[u8])], eof: bool) -> bool {
        let mut buf = [0u8; 1024];
        let mut e = Encoder::new(&mut buf);
        e.u32(0).unwrap(); // NFS4_OK
        e.opaque(b"", 64).unwrap();
        e.u32(1).unwrap();
        e.u32(26).unwrap(); // OP_READDIR
        e.u32(0).unwrap();
        e.fixed(&[7; 8]).unwrap();
        for (cookie, name) in entries {
            e.bool(true).unwrap();
            e.u64(*cookie).unwrap();
            e.opaque(name, 255).unwrap();
            Fattr4::default().encode(&mut e).unwrap();
        }
        e.bool(false).unwrap();
        e.bool(eof).unwrap();
        let n = e.position();
        let c = decode_compound(&mut Decoder::new(&buf[..n])).unwrap();
        let Some(Ok(OpRes::Readdir { entries, eof, .. })) = c.results.clone().next() else { panic!() };
        advances(&entries, asked, eof)
    }

    #[test]
    fn a_readdir_that_does_not_move_on_is_refused() {
        assert!(moves_on(0, &[(3, b"a"), (4, b"b")], false));
        assert!(moves_on(4, &[(5, b"c")], true));
        assert!(moves_on(4, &[], true), "the end");
        // A hostile or broken server: the same cookie again with eof false, nothing and no eof,
        // a cookie NFSv4 keeps for itself.
        assert!(!moves_on(4, &[(4, b"b")], false), "the cookie asked for again");
        assert!(!moves_on(4, &[(5, b"c"), (4, b"b")], false));
        assert!(!moves_on(4, &[], false), "nothing, and not the end");
        assert!(!moves_on(0, &[(0, b"a")], false));
        assert!(!moves_on(0, &[(2, b"a")], true), "cookie 2 is `..`'s");
    }
}
