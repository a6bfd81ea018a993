//! Decoding NFSv3 replies' results in place: [`Res`], one variant per kind of result, with
//! READDIR(PLUS) entries iterated from the receive buffer ([`DirEntries`]), [`decode_res`], and
//! [`decode_read_head`] for a READ reply up to its data.

use super::status::Nfsstat;
use super::types::{
    decode_post_op_attr, decode_post_op_fh, decode_wcc, Fattr, Fh, NfsTime, Proc, Stable, MAX_NAME, MAX_PATH,
};
use crate::nfs::wire::xdr::Decoder;
use crate::nfs::wire::WireError;

/// A decoded reply, borrowed from the connection's receive buffer (valid only inside
/// `Sink::done`). Pre-op wcc attributes are dropped.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub enum Res<'a> {
    Null,
    /// GETATTR.
    Attr(Fattr),
    Setattr {
        attr: Option<Fattr>,
    },
    Lookup {
        fh: Fh,
        attr: Option<Fattr>,
        dir_attr: Option<Fattr>,
    },
    Access {
        access: u32,
        attr: Option<Fattr>,
    },
    Readlink {
        target: &'a [u8],
        attr: Option<Fattr>,
    },
    /// The data already went into the Writer that `Sink::read_buffer(tag)` gave (or was dropped
    /// if it gave none); `count` bytes were placed (or dropped).
    Read {
        count: u32,
        eof: bool,
        attr: Option<Fattr>,
    },
    Write {
        count: u32,
        committed: Stable,
        verf: [u8; 8],
        attr: Option<Fattr>,
    },
    /// CREATE, MKDIR, SYMLINK, MKNOD: the handle and attributes are optional in RFC 1813.
    Created {
        fh: Option<Fh>,
        attr: Option<Fattr>,
        dir_attr: Option<Fattr>,
    },
    /// REMOVE, RMDIR (the directory's attributes), RENAME (the target directory's), LINK (the
    /// file's).
    Changed {
        attr: Option<Fattr>,
    },
    /// READDIR / READDIRPLUS: iterate entries in place.
    Dir {
        verf: [u8; 8],
        entries: DirEntries<'a>,
        eof: bool,
        dir_attr: Option<Fattr>,
    },
    Fsstat {
        tbytes: u64,
        fbytes: u64,
        abytes: u64,
        tfiles: u64,
        ffiles: u64,
        afiles: u64,
    },
    Fsinfo {
        rtmax: u32,
        rtpref: u32,
        wtmax: u32,
        wtpref: u32,
        dtpref: u32,
        maxfilesize: u64,
        properties: u32,
    },
    Commit {
        verf: [u8; 8],
    },
    /// Any procedure failing with a status (NFS3ERR_*); post-op attr of the object if sent.
    Failed {
        status: Nfsstat,
        attr: Option<Fattr>,
    },
}

/// One READDIR(PLUS) entry, borrowed from the reply.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry3<'a> {
    /// The server's file id.
    pub fileid: u64,
    /// The name.
    pub name: &'a [u8],
    /// Cookie to continue after this entry.
    pub cookie: u64,
    /// READDIRPLUS: attributes, if sent.
    pub attr: Option<Fattr>,
    /// READDIRPLUS: handle, if sent.
    pub fh: Option<Fh>,
}

/// An iterator over READDIR(PLUS) entries, decoding in place. The whole list was checked once
/// when the reply was decoded, so an error here means a bug, but it is reported, not assumed.
#[derive(Clone, Debug)]
pub struct DirEntries<'a> {
    d: Decoder<'a>,
    plus: bool,
    done: bool,
}

impl<'a> DirEntries<'a> {
    fn entry(&mut self) -> Result<Option<DirEntry3<'a>>, WireError> {
        let d = &mut self.d;
        if !d.bool()? {
            return Ok(None);
        }
        let fileid = d.u64()?;
        let name = d.opaque(MAX_NAME, "filename3")?;
        let cookie = d.u64()?;
        let (attr, fh) =
            if self.plus { (decode_post_op_attr(d)?, decode_post_op_fh(d)?) } else { (None, None) };
        Ok(Some(DirEntry3 { fileid, name, cookie, attr, fh }))
    }
}

impl<'a> Iterator for DirEntries<'a> {
    type Item = Result<DirEntry3<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.entry() {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The part of a READ reply before its data.
#[derive(Clone, Copy, Debug)]
pub enum ReadHead {
    /// NFS3_OK: `count` and `eof` as sent, then `len` bytes of data (and padding) follow.
    Ok {
        /// Attributes of the file.
        attr: Option<Fattr>,
        /// Bytes read (the server's `count`).
        count: u32,
        /// End of file reached.
        eof: bool,
        /// Length of the data opaque (must equal `count`).
        len: u32,
    },
    /// A failure: the whole reply (nothing follows).
    Failed {
        /// The status.
        status: Nfsstat,
        /// Attributes of the file.
        attr: Option<Fattr>,
    },
}

/// Decodes a READ reply up to its data. Fails if the data's length disagrees with `count` or
/// exceeds `asked` (a server may not return more than asked).
pub fn decode_read_head(d: &mut Decoder<'_>, asked: u32) -> Result<ReadHead, WireError> {
    let status = d.u32()?;
    let attr = decode_post_op_attr(d)?;
    if status != 0 {
        return Ok(ReadHead::Failed { status: Nfsstat::from_u32(status), attr });
    }
    let count = d.u32()?;
    let eof = d.bool()?;
    let len = d.u32()?;
    if len > asked {
        return Err(WireError::TooLong { what: "READ data", len, max: asked });
    }
    if len != count {
        return Err(WireError::BadValue { what: "READ count (data length differs)", value: count });
    }
    Ok(ReadHead::Ok { attr, count, eof, len })
}

/// Decodes the results of `proc` (after the RPC reply header): everything but READ, whose data
/// the connection places itself (see [`decode_read_head`]). Every byte must be used.
pub fn decode_res<'a>(proc: Proc, d: &mut Decoder<'a>) -> Result<Res<'a>, WireError> {
    let res = decode_body(proc, d)?;
    d.finish()?;
    Ok(res)
}

fn decode_body<'a>(proc: Proc, d: &mut Decoder<'a>) -> Result<Res<'a>, WireError> {
    if proc == Proc::Null {
        return Ok(Res::Null);
    }
    let status = d.u32()?;
    let failed = |attr| failure(status, attr);
    let ok = status == 0;
    match proc {
        Proc::Null => Ok(Res::Null),
        Proc::Getattr => {
            if ok {
                Ok(Res::Attr(Fattr::decode(d)?))
            } else {
                failed(None)
            }
        }
        Proc::Setattr => {
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Setattr { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Lookup => {
            if ok {
                let fh = Fh::decode3(d)?;
                let attr = decode_post_op_attr(d)?;
                let dir_attr = decode_post_op_attr(d)?;
                Ok(Res::Lookup { fh, attr, dir_attr })
            } else {
                failed(decode_post_op_attr(d)?)
            }
        }
        Proc::Access => {
            let attr = decode_post_op_attr(d)?;
            if ok {
                Ok(Res::Access { access: d.u32()?, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Readlink => {
            let attr = decode_post_op_attr(d)?;
            if ok {
                Ok(Res::Readlink { target: d.opaque(MAX_PATH, "nfspath3")?, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Read => decode_read(d, status),
        Proc::Write => {
            let attr = decode_wcc(d)?;
            if ok {
                let count = d.u32()?;
                let committed = Stable::from_u32(d.u32()?)?;
                let verf = d.array::<8>()?;
                Ok(Res::Write { count, committed, verf, attr })
            } else {
                failed(attr)
            }
        }
        Proc::Create | Proc::Mkdir | Proc::Symlink | Proc::Mknod => {
            if ok {
                let fh = decode_post_op_fh(d)?;
                let attr = decode_post_op_attr(d)?;
                let dir_attr = decode_wcc(d)?;
                Ok(Res::Created { fh, attr, dir_attr })
            } else {
                failed(decode_wcc(d)?)
            }
        }
        Proc::Remove | Proc::Rmdir => {
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Changed { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Rename => {
            let _from = decode_wcc(d)?;
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Changed { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Link => {
            let attr = decode_post_op_attr(d)?;
            let _dir = decode_wcc(d)?;
            if ok {
                Ok(Res::Changed { attr })
            } else {
                failed(attr)
            }
        }
        Proc::Readdir | Proc::Readdirplus => decode_dir(proc, d, status),
        Proc::Fsstat => decode_fsstat(d, status),
        Proc::Fsinfo => decode_fsinfo(d, status),
        Proc::Commit => {
            let attr = decode_wcc(d)?;
            if ok {
                Ok(Res::Commit { verf: d.array::<8>()? })
            } else {
                failed(attr)
            }
        }
    }
}

/// A failure's result: its status, and the attributes it carried.
fn failure<'a>(status: u32, attr: Option<Fattr>) -> Result<Res<'a>, WireError> {
    Ok(Res::Failed { status: Nfsstat::from_u32(status), attr })
}

/// READ's results, decoded from one buffer.
fn decode_read<'a>(d: &mut Decoder<'a>, status: u32) -> Result<Res<'a>, WireError> {
    // Whole-buffer decoding of a READ (the data is skipped; the connection places it).
    let attr = decode_post_op_attr(d)?;
    if status != 0 {
        return failure(status, attr);
    }
    let count = d.u32()?;
    let eof = d.bool()?;
    let data = d.opaque(u32::MAX, "READ data")?;
    if data.len() != count as usize {
        return Err(WireError::BadValue { what: "READ count (data length differs)", value: count });
    }
    Ok(Res::Read { count, eof, attr })
}

/// READDIR's or READDIRPLUS's results: the entries are checked here and iterated in place later.
fn decode_dir<'a>(proc: Proc, d: &mut Decoder<'a>, status: u32) -> Result<Res<'a>, WireError> {
    let dir_attr = decode_post_op_attr(d)?;
    if status != 0 {
        return failure(status, dir_attr);
    }
    let verf = d.array::<8>()?;
    let entries = DirEntries { d: d.clone(), plus: proc == Proc::Readdirplus, done: false };
    // Check the whole list once (and find `eof` after it); entries are decoded again,
    // in place, by whoever iterates.
    let mut walk = entries.clone();
    while walk.entry()?.is_some() {}
    *d = walk.d;
    let eof = d.bool()?;
    Ok(Res::Dir { verf, entries, eof, dir_attr })
}

/// FSSTAT's results.
fn decode_fsstat<'a>(d: &mut Decoder<'a>, status: u32) -> Result<Res<'a>, WireError> {
    let attr = decode_post_op_attr(d)?;
    if status != 0 {
        return failure(status, attr);
    }
    let r = Res::Fsstat {
        tbytes: d.u64()?,
        fbytes: d.u64()?,
        abytes: d.u64()?,
        tfiles: d.u64()?,
        ffiles: d.u64()?,
        afiles: d.u64()?,
    };
    let _invarsec = d.u32()?;
    Ok(r)
}

/// FSINFO's results.
fn decode_fsinfo<'a>(d: &mut Decoder<'a>, status: u32) -> Result<Res<'a>, WireError> {
    let attr = decode_post_op_attr(d)?;
    if status != 0 {
        return failure(status, attr);
    }
    let rtmax = d.u32()?;
    let rtpref = d.u32()?;
    let _rtmult = d.u32()?;
    let wtmax = d.u32()?;
    let wtpref = d.u32()?;
    let _wtmult = d.u32()?;
    let dtpref = d.u32()?;
    let maxfilesize = d.u64()?;
    let _time_delta = NfsTime::decode(d)?;
    let properties = d.u32()?;
    Ok(Res::Fsinfo { rtmax, rtpref, wtmax, wtpref, dtpref, maxfilesize, properties })
}
