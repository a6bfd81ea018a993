//! The directories family: OPENDIR, RELEASEDIR and FSYNCDIR (answered on the device: NFSv3 has
//! no directory opens, and its directory operations are synchronous), and READDIR and
//! READDIRPLUS, one READDIR(PLUS) call each, whose entries go straight into the request's reply
//! buffers. A listing's cookie verifier, and where it reached the end, are kept in the open
//! handle for the next READDIR.

use super::object::{entry, open_handle};
use super::slot::{unexpected, Call, Flow, Kind, Prepared, Slot, NAME_MAX};
use crate::filesystem::seam::Completions;
use crate::filesystem::seam::DirentWriter;
use crate::filesystem::{DirEntry, Entry, Error, Reply};
use crate::nfs::convert::{nfs_error, stat, type_bits};
use crate::nfs::shared::Shared;
use crate::nfs::wire::nfs3::{DirEntries, Res};

/// OPENDIR of the request's node with `flags`: a device-side handle.
pub(super) fn opendir(fs: &Shared, slot: &mut Slot, flags: u32) -> Result<Prepared, Error> {
    fs.nodes.fh(slot.nodeid)?;
    open_handle(fs, slot.nodeid, flags, true).map(Prepared::Answered)
}

/// RELEASEDIR of handle `fh`.
pub(super) fn releasedir(fs: &Shared, fh: u64) -> Result<Prepared, Error> {
    if let Some(f) = fs.handles.close(fh) {
        let _ = fs.nodes.closed(f.nodeid);
    }
    Ok(Prepared::Answered(Reply::Empty))
}

/// FSYNCDIR: nothing to do, NFSv3 directory operations are synchronous on the server (RFC 1813,
/// 3.3.21).
pub(super) fn fsyncdir() -> Result<Prepared, Error> {
    Ok(Prepared::Answered(Reply::Empty))
}

/// READDIR (or READDIRPLUS if `plus`) of `size` bytes from `offset`, through handle `fh`.
pub(super) fn readdir(
    fs: &Shared,
    slot: &mut Slot,
    fh: u64,
    offset: u64,
    size: u32,
    plus: bool,
) -> Result<Prepared, Error> {
    let f = fs.handles.get(fh).filter(|f| f.dir && f.nodeid == slot.nodeid).ok_or(Error::BadHandle)?;
    slot.fh = fs.nodes.fh(slot.nodeid)?;
    slot.handle = fh;
    slot.offset = offset;
    if offset != 0 && offset == f.eof_at {
        // The last listing reached the end here: nothing more (the kernel asks once
        // more after the last entry; NFSv3 would answer an empty eof).
        return Ok(Prepared::Answered(Reply::Data(0)));
    }
    slot.cookieverf = if offset == 0 { [0; 8] } else { f.cookieverf };
    slot.size = size.clamp(512, fs.limits.read);
    // READDIRPLUS replies carry handles and attributes: room for about twice as much.
    slot.chunk = slot.size.saturating_mul(2).saturating_add(1024).min(fs.limits.read.max(fs.limits.write));
    let kind = if plus { Kind::Readdirplus } else { Kind::Readdir };
    Ok(Prepared::Send(kind, Call::Readdir))
}

/// What the reply `res` to a READDIR(PLUS) call means: its entries go into the request's reply
/// buffers (from `done`).
pub(super) fn reply(fs: &Shared, slot: &mut Slot, res: Res<'_>, done: &mut Completions<'_>) -> Flow {
    match (slot.call, res) {
        (_, Res::Failed { status, .. }) => Flow::Done(Err(nfs_error(status))),
        (Call::Readdir, Res::Dir { verf, entries, eof, .. }) => {
            if !advances(&entries, slot.offset, eof) {
                log::warn!(
                    "NFS server's READDIR reply from cookie {} does not move the listing on",
                    slot.offset
                );
                return Flow::Done(Err(Error::Io));
            }
            let Some(mut w) = done.data(slot.token) else { return Flow::Done(Err(Error::Io)) };
            let mut out = DirentWriter::new(&mut w);
            let Some((last, all)) = list(fs, slot, entries, &mut out) else {
                return Flow::Done(Err(Error::Io));
            };
            fs.handles.set_cookieverf(slot.handle, verf, if eof && all { last } else { 0 });
            Flow::Done(Ok(Reply::Data(out.bytes_written())))
        }
        (call, _) => unexpected(call),
    }
}

/// Whether a READDIR(PLUS) reply to a call from `cookie` moves the listing on, checked before
/// anything is written or looked up. The guest asks next from the cookie of the last entry it
/// took, so a reply that does not advance would make it ask the same again for ever: one with no
/// entry and no eof, or with an entry whose cookie is the one asked for, or 0 (the start of the
/// listing, never an entry's by RFC 1813, 3.3.16). A decoding error is not advancing either (and
/// would be EIO anyway).
fn advances(entries: &DirEntries<'_>, cookie: u64, eof: bool) -> bool {
    let mut any = false;
    for e in entries.clone() {
        match e {
            Ok(e) if e.cookie != cookie && e.cookie != 0 => any = true,
            _ => return false,
        }
    }
    any || eof
}

/// Writes the `entries` of a reply that fit into `out`: the cookie of the last entry given, and
/// whether every entry of the reply fit; `None` if an entry does not decode.
fn list(
    fs: &Shared,
    slot: &Slot,
    entries: DirEntries<'_>,
    out: &mut DirentWriter<'_, '_>,
) -> Option<(u64, bool)> {
    let plus = slot.kind == Kind::Readdirplus;
    let mut last = 0;
    let mut all = true;
    for e in entries {
        let Ok(e) = e else {
            return None;
        };
        if e.name.is_empty() || e.name.len() > NAME_MAX || e.name.contains(&b'/') || e.name.contains(&0) {
            continue;
        }
        let typ = e.attr.map_or(0, |a| type_bits(a.ftype) >> 12);
        let d = DirEntry { ino: e.fileid, offset: e.cookie, typ, name: e.name };
        if !plus {
            if !out.add(&d) {
                all = false;
                break;
            }
            last = e.cookie;
            continue;
        }
        let dots = e.name == b"." || e.name == b"..";
        let looked_up = match (e.fh, e.attr) {
            (Some(fh), Some(a)) if !dots => entry(fs, &fh, &a).ok(),
            _ => None,
        };
        let ent = looked_up
            .unwrap_or(Entry { attr: e.attr.as_ref().map(stat).unwrap_or_default(), ..Entry::default() });
        let ent = if looked_up.is_none() { Entry { ino: 0, ..ent } } else { ent };
        if !out.add_plus(&d, &ent) {
            if looked_up.is_some() {
                fs.nodes.forget(ent.ino, 1);
            }
            all = false;
            break;
        }
        last = e.cookie;
    }
    Some((last, all))
}
