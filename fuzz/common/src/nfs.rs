//! The `nfs_reply` target: what a remote NFS server sends the remote backend. The first byte
//! chooses how the rest is fed:
//!
//! - `0`: each record is one reply for a decoder alone: the RPC reply header (accept and
//!   reject states, verifier) and then the results of the procedure, MOUNT MNT or portmapper
//!   GETPORT the flags name (bit 7: no RPC header, the results alone);
//! - `1`, `2`: a session over a real loopback TCP connection ([`Conn`], as a poller drives it):
//!   each record is an action (a call, a reply framed into fragments the input chooses, a READ
//!   reply whose data the harness makes up to any length, raw bytes, polls, the server hanging
//!   up, `abort_all`), written in pieces with a poll after each, so the record-mark reassembly,
//!   the reply matching by XID and the READ data placement see every split;
//! - `3`: the blocking start-up path (`setup::mount`: portmapper GETPORT, then MOUNT MNT) against
//!   a server thread that answers each connection with the records' bytes.
//!
//! Invariants checked beyond "no panic": every call the connection accepted ends exactly once
//! (at the latest on `abort_all`), a READ never reports more data than it asked, and nothing is
//! left in flight.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use virtiofs_backend::io::{Reader, Writer};
use virtiofs_backend::nfs::conn::{CallError, Conn, ConnConfig, Cred, Sink};
use virtiofs_backend::nfs::setup;
use virtiofs_backend::nfs::url::NfsUrl;
use virtiofs_backend::nfs::wire::nfs3::{
    self, Args, CreateHow, Fattr, Fh, Ftype, NfsTime, Proc, Res, Sattr, Stable,
};
use virtiofs_backend::nfs::wire::xdr::{self, Decoder, Encoder};
use virtiofs_backend::nfs::wire::{mount, portmap, rpc, WireError};
use vm_memory::VolatileSlice;

use super::records;

/// Every procedure the backend calls, in the order the inputs number them.
pub const PROCS: [Proc; 21] = Proc::ALL;

/// Decoder numbers past [`PROCS`]: MOUNT MNT and portmapper GETPORT.
pub const DECODE_MNT: u8 = 21;
/// See [`DECODE_MNT`].
pub const DECODE_GETPORT: u8 = 22;

/// The connection's largest READ/WRITE (its receive buffer is this plus its reply slack).
pub const MAX_IO: u32 = 64 << 10;

/// Session actions (a record's flags, low 3 bits).
pub mod action {
    /// A call: `[proc][count: u32 le][buffer]` (buffer: 0 none, 1 exact, 2 in three pieces,
    /// 3 one byte short).
    pub const CALL: u8 = 0;
    /// A reply: `[xid][framing][bytes]` (see `super::frame`); the XID of a call seen on the
    /// wire is written over the first word unless `xid` has bit 7.
    pub const REPLY: u8 = 1;
    /// A READ reply made up here: `[xid][framing][shape][len: u32 le][attr bytes...]`.
    pub const READ_REPLY: u8 = 2;
    /// Bytes as they are, in pieces (the flags' bits 3-4 as the framing's split).
    pub const RAW: u8 = 3;
    /// As many polls as the record has bytes (at most 16).
    pub const POLL: u8 = 4;
    /// The server hangs up.
    pub const HANG_UP: u8 = 5;
    /// `Conn::abort_all`.
    pub const ABORT: u8 = 6;
}

/// Entry point: see the module's documentation.
pub fn nfs_reply(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 4 {
        0 => decoders(rest),
        1 | 2 => session(rest),
        _ => startup(rest),
    }
}

// ---------------------------------------------------------------------------------------------
// The decoders alone

fn decoders(data: &[u8]) {
    for (flags, body) in records(data) {
        let which = (flags & 0x7f) % (DECODE_GETPORT + 1);
        let mut d = Decoder::new(body);
        if flags & 0x80 == 0 {
            match rpc::decode_reply(&mut d) {
                Ok((_, Ok(()))) => {}
                Ok((_, Err(_))) | Err(_) => continue,
            }
        }
        match which {
            DECODE_MNT => {
                let _ = mount::decode_mnt(&mut d);
            }
            DECODE_GETPORT => {
                let _ = portmap::decode_getport(&mut d);
            }
            n => {
                let proc = PROCS[usize::from(n)];
                if proc == Proc::Read {
                    let mut head = d.clone();
                    if let Ok(nfs3::ReadHead::Ok { len, count, .. }) =
                        nfs3::decode_read_head(&mut head, MAX_IO)
                    {
                        assert!(len <= MAX_IO && len == count, "READ head over its bound");
                        let _ = head.fixed(len as usize);
                    }
                }
                if let Ok(res) = nfs3::decode_res(proc, &mut d) {
                    look_at(&res);
                }
            }
        }
    }
}

/// Walks what a decoded reply borrows (READDIR entries are decoded lazily).
fn look_at(res: &Res<'_>) {
    if let Res::Dir { entries, .. } = res {
        for e in entries.clone().flatten() {
            assert!(e.name.len() <= nfs3::MAX_NAME as usize);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A session over a connection

/// The server side of the session's connections (one listener for the process).
fn listener() -> Option<&'static TcpListener> {
    static LISTENER: OnceLock<Option<TcpListener>> = OnceLock::new();
    LISTENER
        .get_or_init(|| {
            let l = TcpListener::bind("127.0.0.1:0").ok()?;
            l.set_nonblocking(true).ok()?;
            Some(l)
        })
        .as_ref()
}

/// Buffers of one call, lent to the connection by tag.
struct Bufs<'m> {
    tag: u32,
    proc: Proc,
    asked: u32,
    slices: Vec<VolatileSlice<'m>>,
}

#[derive(Default)]
struct FuzzSink<'m> {
    bufs: Vec<Bufs<'m>>,
    /// Calls accepted and not yet ended.
    pending: Vec<u32>,
}

impl Sink for FuzzSink<'_> {
    fn read_buffer(&mut self, tag: u32) -> Option<Writer<'_>> {
        let b = self.bufs.iter().find(|b| b.tag == tag && b.proc == Proc::Read)?;
        Some(Writer::new(&b.slices))
    }

    fn payload(&mut self, tag: u32) -> Option<Reader<'_>> {
        let b = self.bufs.iter().find(|b| b.tag == tag && b.proc == Proc::Write)?;
        Some(Reader::new(&b.slices))
    }

    fn done(&mut self, tag: u32, res: Result<Res<'_>, CallError>) {
        let at = self.pending.iter().position(|&t| t == tag);
        let Some(at) = at else { panic!("call {tag} ended twice, or was never accepted") };
        self.pending.swap_remove(at);
        let b = self.bufs.iter().position(|b| b.tag == tag);
        if let Ok(res) = &res {
            look_at(res);
            if let (Res::Read { count, .. }, Some(b)) = (res, b) {
                assert!(*count <= self.bufs[b].asked, "READ of {} returned {count}", self.bufs[b].asked);
            }
        }
        if let Some(b) = b {
            self.bufs.swap_remove(b);
        }
    }
}

/// The server's end: the connection accepted last and the calls read from it.
struct Server {
    stream: Option<TcpStream>,
    inbox: Vec<u8>,
    /// XIDs of calls seen on the wire, most recent last (retransmissions included).
    seen: VecDeque<u32>,
}

impl Server {
    /// Takes a new connection if one waits, and reads the calls that arrived.
    fn pump(&mut self) {
        if let Some(l) = listener() {
            while let Ok((s, _)) = l.accept() {
                if s.set_nonblocking(true).is_ok() {
                    let _ = s.set_nodelay(true);
                    self.stream = Some(s);
                    self.inbox.clear();
                }
            }
        }
        let Some(s) = self.stream.as_mut() else { return };
        let mut buf = [0u8; 16 << 10];
        loop {
            match s.read(&mut buf) {
                Ok(0) => {
                    self.stream = None;
                    break;
                }
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        // The client sends each call as one fragment.
        while self.inbox.len() >= 4 {
            let mark = u32::from_be_bytes([self.inbox[0], self.inbox[1], self.inbox[2], self.inbox[3]]);
            let len = (mark & 0x7fff_ffff) as usize;
            if self.inbox.len() < 4 + len {
                break;
            }
            if let Ok(h) = rpc::decode_call(&mut Decoder::new(&self.inbox[4..4 + len])) {
                if self.seen.len() == 64 {
                    self.seen.pop_front();
                }
                self.seen.push_back(h.xid);
            }
            self.inbox.drain(..4 + len);
        }
    }

    /// The XID `choice` names: one seen on the wire (bit 7 clear), or none (keep the bytes').
    fn xid(&self, choice: u8) -> Option<u32> {
        if choice & 0x80 != 0 || self.seen.is_empty() {
            return None;
        }
        // From the most recent backwards: 0 is the last call sent.
        let i = usize::from(choice) % self.seen.len();
        Some(self.seen[self.seen.len() - 1 - i])
    }

    /// Writes `bytes` (non-blocking; a full socket gets polls to drain it, a bounded number).
    fn write(&mut self, mut bytes: &[u8], conn: &mut Conn, sink: &mut FuzzSink<'_>) {
        let mut stalls = 0;
        while !bytes.is_empty() {
            let Some(s) = self.stream.as_mut() else { return };
            match s.write(bytes) {
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock && stalls < 64 => {
                    stalls += 1;
                    conn.poll(Instant::now(), sink);
                }
                Err(_) => {
                    self.stream = None;
                    return;
                }
            }
        }
    }
}

/// Fragment sizes a framing byte chooses from (low 4 bits; 0 = one fragment).
const FRAGMENT_SIZES: [usize; 16] = [0, 1, 2, 3, 4, 5, 7, 8, 12, 16, 31, 64, 132, 256, 1000, 4096];
/// Write piece sizes (bits 6-7 of the framing byte; 0 = one write).
const PIECE_SIZES: [usize; 4] = [0, 1, 7, 1500];

/// `body` as a record: cut into fragments as `framing` says (bits 0-3 the size, bit 4 clears
/// the last-fragment bit of the final one so the record goes on in the next action, bit 5 puts
/// an empty fragment first).
fn frame(body: &[u8], framing: u8) -> Vec<u8> {
    let size = FRAGMENT_SIZES[usize::from(framing & 15)];
    let mut out = Vec::with_capacity(body.len() + 16);
    if framing & 0x20 != 0 {
        out.extend_from_slice(&0u32.to_be_bytes());
    }
    let pieces: Vec<&[u8]> =
        if size == 0 || body.is_empty() { vec![body] } else { body.chunks(size).collect() };
    let n = pieces.len();
    for (i, p) in pieces.into_iter().enumerate() {
        let last = i + 1 == n && framing & 0x10 == 0;
        let mark = if last { 0x8000_0000 } else { 0 } | p.len() as u32;
        out.extend_from_slice(&mark.to_be_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// A made-up READ reply: `shape` bit 0 attributes (from `attr` bytes, else a plain file's),
/// bit 1 eof, bit 2 a `count` that differs from the data's length, bit 3 padding left out,
/// bit 4 a failure status (no data), bit 5 an RPC refusal (PROG_MISMATCH) instead.
fn read_reply(xid: u32, shape: u8, len: u32, attr: &[u8]) -> Vec<u8> {
    let t = NfsTime { sec: 1_700_000_000, nsec: 1 };
    let plain = Fattr {
        ftype: Ftype::Reg,
        mode: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: u64::from(len),
        used: u64::from(len),
        rdev: (0, 0),
        fsid: 1,
        fileid: 2,
        atime: t,
        mtime: t,
        ctime: t,
    };
    // The head (RPC header, status, attributes, count, eof, length): at most 152 bytes.
    let mut head = [0u8; 160];
    let mut e = Encoder::new(&mut head);
    let encoded = (|| {
        if shape & 0x20 != 0 {
            for w in [xid, rpc::REPLY, 0, 0, 0, 2, 2, 2] {
                e.u32(w)?;
            }
            return Ok(false);
        }
        rpc::encode_success_reply(&mut e, xid)?;
        e.u32(if shape & 0x10 != 0 { 5 } else { 0 })?;
        e.bool(shape & 1 != 0)?;
        if shape & 1 != 0 {
            match attr.get(..nfs3::FATTR3_SIZE) {
                Some(a) => e.fixed(a)?,
                None => plain.encode(&mut e)?,
            }
        }
        if shape & 0x10 != 0 {
            return Ok(false);
        }
        e.u32(if shape & 4 != 0 { len ^ 1 } else { len })?;
        e.bool(shape & 2 != 0)?;
        e.u32(len)?;
        Ok::<_, WireError>(true)
    })();
    let n = e.position();
    let mut out = head[..n].to_vec();
    if encoded == Ok(true) {
        // The data (a pattern) and its padding (unless the shape leaves it out).
        out.extend((0..len as usize).map(|i| (i as u8).wrapping_mul(31)));
        if shape & 8 == 0 {
            out.resize(out.len() + xdr::pad(len as usize), 0);
        }
    }
    out
}

/// The arguments of a call of `proc` (one handle, one name: the results are what is fuzzed).
fn call<'a>(proc: Proc, fh: &'a Fh, sattr: &'a Sattr, count: u32) -> Args<'a> {
    let name: &'static [u8] = b"f";
    match proc {
        Proc::Null => Args::Null,
        Proc::Getattr => Args::Getattr { fh },
        Proc::Setattr => Args::Setattr { fh, attr: sattr, guard_ctime: None },
        Proc::Lookup => Args::Lookup { dir: fh, name },
        Proc::Access => Args::Access { fh, mask: 0x3f },
        Proc::Readlink => Args::Readlink { fh },
        Proc::Read => Args::Read { fh, offset: 0, count },
        Proc::Write => Args::Write { fh, offset: 0, count, stable: Stable::Unstable },
        Proc::Create => Args::Create { dir: fh, name, how: CreateHow::Unchecked(sattr) },
        Proc::Mkdir => Args::Mkdir { dir: fh, name, attr: sattr },
        Proc::Symlink => Args::Symlink { dir: fh, name, attr: sattr, target: b"t" },
        Proc::Mknod => Args::Mknod { dir: fh, name, ftype: Ftype::Fifo, attr: sattr, rdev: (0, 0) },
        Proc::Remove => Args::Remove { dir: fh, name },
        Proc::Rmdir => Args::Rmdir { dir: fh, name },
        Proc::Rename => Args::Rename { from_dir: fh, from_name: name, to_dir: fh, to_name: b"g" },
        Proc::Link => Args::Link { fh, dir: fh, name },
        Proc::Readdir => Args::Readdir { dir: fh, cookie: 0, verf: [0; 8], count },
        Proc::Readdirplus => {
            Args::Readdirplus { dir: fh, cookie: 0, verf: [0; 8], dircount: count, maxcount: count }
        }
        Proc::Fsstat => Args::Fsstat { fh },
        Proc::Fsinfo => Args::Fsinfo { fh },
        Proc::Commit => Args::Commit { fh, offset: 0, count },
    }
}

/// Bytes of buffer memory one session lends its calls (a call past it gets none).
const ARENA: usize = 512 << 10;

fn session(data: &[u8]) {
    let Some(l) = listener() else { return };
    let Ok(addr) = l.local_addr() else { return };
    // Connections a previous input left in the backlog are not this one's.
    while l.accept().is_ok() {}
    let cfg = ConnConfig {
        addr,
        slots: 8,
        max_io: MAX_IO,
        // Timers never fire within an input: what is fuzzed is the bytes, not the clock.
        timeout: Duration::from_secs(600),
        retransmit: Duration::from_secs(600),
        machine_name: "fuzz".into(),
    };
    let Ok(mut conn) = Conn::new(cfg) else { return };
    let mut arena = vec![0u8; ARENA];
    let mut free: &mut [u8] = &mut arena[..];
    let mut sink = FuzzSink::default();
    let mut server = Server { stream: None, inbox: Vec::new(), seen: VecDeque::new() };
    let fh = Fh::new(&[0xfe, 1, 2, 3, 4, 5, 6, 7]).expect("8 bytes");
    let sattr = Sattr::default();
    let mut next_tag = 1u32;
    let settle = |conn: &mut Conn, sink: &mut FuzzSink<'_>, server: &mut Server, rounds: usize| {
        for _ in 0..rounds {
            conn.poll(Instant::now(), sink);
            server.pump();
        }
    };
    for (flags, body) in records(data) {
        match flags & 7 {
            action::CALL => {
                let Some((&p, rest)) = body.split_first() else { continue };
                let proc = PROCS[usize::from(p) % PROCS.len()];
                let mut count = [0u8; 4];
                let n = rest.len().min(4);
                count[..n].copy_from_slice(&rest[..n]);
                // Mostly within the bound (over it a little: the connection refuses those).
                let count = u32::from_le_bytes(count) % (MAX_IO + 2);
                let spec = rest.get(4).copied().unwrap_or(1) & 3;
                let tag = next_tag;
                next_tag += 1;
                if matches!(proc, Proc::Read | Proc::Write) && spec != 0 {
                    let len = if spec == 3 { (count as usize).saturating_sub(1) } else { count as usize };
                    if len <= free.len() {
                        let (mine, rest) = std::mem::take(&mut free).split_at_mut(len);
                        free = rest;
                        let slices = if spec == 2 && len >= 3 {
                            let (a, bc) = mine.split_at_mut(len / 3);
                            let (b, c) = bc.split_at_mut(len / 3);
                            vec![VolatileSlice::from(a), VolatileSlice::from(b), VolatileSlice::from(c)]
                        } else {
                            vec![VolatileSlice::from(mine)]
                        };
                        sink.bufs.push(Bufs { tag, proc, asked: count, slices });
                    }
                }
                let args = call(proc, &fh, &sattr, count);
                // The tag is pending before the call: a WRITE without payload ends inside it.
                sink.pending.push(tag);
                if conn.call(tag, &Cred::ROOT, &args, &mut sink).is_err() {
                    sink.pending.retain(|&t| t != tag);
                    sink.bufs.retain(|b| b.tag != tag);
                }
                settle(&mut conn, &mut sink, &mut server, 3);
            }
            action::REPLY | action::READ_REPLY | action::RAW => {
                let (bytes, pieces) = match flags & 7 {
                    action::RAW => (body.to_vec(), PIECE_SIZES[usize::from((flags >> 3) & 3)]),
                    kind => {
                        if body.len() < 2 {
                            continue;
                        }
                        let (choice, framing) = (body[0], body[1]);
                        let xid = server.xid(choice);
                        let record = if kind == action::REPLY {
                            let mut r = body[2..].to_vec();
                            if let Some(x) = xid {
                                if r.len() < 4 {
                                    r.resize(4, 0);
                                }
                                r[..4].copy_from_slice(&x.to_be_bytes());
                            }
                            r
                        } else {
                            let shape = body.get(2).copied().unwrap_or(0);
                            let mut len = [0u8; 4];
                            let tail = body.get(3..).unwrap_or(&[]);
                            let n = tail.len().min(4);
                            len[..n].copy_from_slice(&tail[..n]);
                            // Up to twice the bound: a server may send more than asked.
                            let len = u32::from_le_bytes(len) % (2 * MAX_IO + 1);
                            read_reply(xid.unwrap_or(0), shape, len, tail.get(4..).unwrap_or(&[]))
                        };
                        (frame(&record, framing), PIECE_SIZES[usize::from(framing >> 6)])
                    }
                };
                server.pump();
                if pieces == 0 {
                    server.write(&bytes, &mut conn, &mut sink);
                    settle(&mut conn, &mut sink, &mut server, 2);
                } else {
                    // Byte-wise splits only at the start (a header's worth): the rest in one.
                    let (head, tail) = bytes.split_at(bytes.len().min(pieces * 64));
                    for p in head.chunks(pieces) {
                        server.write(p, &mut conn, &mut sink);
                        conn.poll(Instant::now(), &mut sink);
                    }
                    server.write(tail, &mut conn, &mut sink);
                    settle(&mut conn, &mut sink, &mut server, 2);
                }
            }
            action::POLL => settle(&mut conn, &mut sink, &mut server, body.len().clamp(1, 16)),
            action::HANG_UP => {
                server.stream = None;
                server.inbox.clear();
                settle(&mut conn, &mut sink, &mut server, 4);
            }
            action::ABORT => {
                conn.abort_all(&mut sink);
                assert_eq!(conn.in_flight(), 0, "abort_all left calls in flight");
                settle(&mut conn, &mut sink, &mut server, 1);
            }
            _ => {}
        }
    }
    // The server hangs up first (no TIME_WAIT on the client's ports), then every call ends.
    server.stream = None;
    conn.poll(Instant::now(), &mut sink);
    conn.abort_all(&mut sink);
    assert_eq!(conn.in_flight(), 0, "calls left in flight after abort_all");
    assert!(sink.pending.is_empty(), "calls {:?} never ended", sink.pending);
    drop(conn);
    while l.accept().is_ok() {}
}

// ---------------------------------------------------------------------------------------------
// Start-up: portmapper and MOUNT over blocking connections

/// What the start-up server answers, one entry per connection: the bytes, and whether the
/// first word of each record is set to the call's XID.
struct Scripts {
    queue: Mutex<VecDeque<(Vec<u8>, bool)>>,
    addr: SocketAddr,
}

fn startup_server() -> Option<&'static Scripts> {
    static SERVER: OnceLock<Option<&'static Scripts>> = OnceLock::new();
    *SERVER.get_or_init(|| {
        let l = TcpListener::bind("127.0.0.1:0").ok()?;
        let addr = l.local_addr().ok()?;
        let scripts: &'static Scripts =
            Box::leak(Box::new(Scripts { queue: Mutex::new(VecDeque::new()), addr }));
        std::thread::Builder::new()
            .name("fuzz-nfs-startup".into())
            .spawn(move || {
                for s in l.incoming().flatten() {
                    let script = scripts.queue.lock().map(|mut q| q.pop_front()).unwrap_or(None);
                    if let Some((bytes, patch)) = script {
                        answer(s, bytes, patch);
                    }
                }
            })
            .ok()?;
        Some(scripts)
    })
}

/// Reads one call from `s`, writes `bytes` (with its XID if `patch`), hangs up.
fn answer(mut s: TcpStream, mut bytes: Vec<u8>, patch: bool) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
    let mut mark = [0u8; 4];
    if s.read_exact(&mut mark).is_err() {
        return;
    }
    let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
    if len > 4096 {
        return;
    }
    let mut call = vec![0u8; len];
    if s.read_exact(&mut call).is_err() {
        return;
    }
    if patch {
        if let Ok(h) = rpc::decode_call(&mut Decoder::new(&call)) {
            // The first record's XID: after its mark.
            if bytes.len() >= 8 {
                bytes[4..8].copy_from_slice(&h.xid.to_be_bytes());
            }
        }
    }
    let _ = s.write_all(&bytes);
}

/// `setup::mount` with the GETPORT of the NFS program and the MNT answered by the records (the
/// MOUNT port is given, so that a fuzzed GETPORT never sends the client anywhere else). Record
/// flags: bit 0 sets the XID, bits 1-7 the framing (see [`frame`]; bit 7 set: the bytes as
/// they are, marks included).
fn startup(data: &[u8]) {
    let Some(srv) = startup_server() else { return };
    let mut scripts = VecDeque::new();
    for (flags, body) in records(data).take(2) {
        let bytes = if flags & 0x80 != 0 { body.to_vec() } else { frame(body, (flags >> 1) & 0x3f) };
        scripts.push_back((bytes, flags & 1 != 0));
    }
    let ask_portmapper = scripts.len() == 2;
    if let Ok(mut q) = srv.queue.lock() {
        *q = scripts;
    }
    let url = NfsUrl {
        host: "127.0.0.1".into(),
        port: Some(srv.addr.port()),
        export: "/export".into(),
        nfsport: if ask_portmapper { None } else { Some(2049) },
        mountport: Some(srv.addr.port()),
        version: Default::default(),
        also: Vec::new(),
    };
    let _ = setup::mount(&url, Duration::from_secs(2));
    if let Ok(mut q) = srv.queue.lock() {
        q.clear();
    }
}
