//! A small fake NFS server for the client's tests: it accepts TCP connections on 127.0.0.1,
//! reassembles each call's record, decodes the RPC header and hands the call to the test's
//! handler, which answers with a list of [`Act`]s: bytes to send (well-formed replies built by
//! the helpers here, or anything hostile: truncated records, unknown XIDs, oversized counts,
//! garbage), a delay, or closing the connection. Threads are fine here: this is the server.
//! [`nfs4`] parses NFSv4.1 COMPOUND calls and encodes their results.
#![allow(dead_code)]

pub mod nfs4;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use virtiofs_backend::nfs::wire::nfs3::{Fattr, Ftype, NfsTime};
use virtiofs_backend::nfs::wire::rpc;
use virtiofs_backend::nfs::wire::xdr::{Decoder, Encoder};

/// One call the server received.
#[derive(Clone, Debug)]
pub struct Call {
    /// Which connection (0 for the first accepted).
    pub conn: usize,
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc: u32,
    /// AUTH_SYS uid, gid, number of supplementary groups.
    pub sys: Option<(u32, u32, u32)>,
    /// The arguments (after the RPC header), WRITE data included.
    pub args: Vec<u8>,
    /// Fragments the call's record came in.
    pub fragments: usize,
}

/// What the server does in answer to a call.
pub enum Act {
    /// Write these bytes as they are (record marks included).
    Send(Vec<u8>),
    /// Wait.
    Sleep(Duration),
    /// Close the connection (after what was sent before).
    Close,
}

pub type Handler = Box<dyn FnMut(&Call) -> Vec<Act> + Send>;

/// The running server; dropping it stops it.
pub struct FakeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
    accepted: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FakeServer {
    pub fn start(handler: impl FnMut(&Call) -> Vec<Act> + Send + 'static) -> FakeServer {
        Self::start_at(SocketAddr::from(([127, 0, 0, 1], 0)), handler)
    }

    /// A server on `addr` (one that was there before and went: a restart on its port).
    pub fn start_at(addr: SocketAddr, handler: impl FnMut(&Call) -> Vec<Act> + Send + 'static) -> FakeServer {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (s, c, a) = (stop.clone(), calls.clone(), accepted.clone());
        let mut handler: Handler = Box::new(handler);
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let n = a.fetch_add(1, Ordering::SeqCst);
                        serve(stream, n, &s, &c, &mut handler);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        FakeServer { addr, stop, calls, accepted, thread: Some(thread) }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Calls received so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_full(s: &mut TcpStream, mut buf: &mut [u8], stop: &AtomicBool) -> bool {
    while !buf.is_empty() {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        match s.read(buf) {
            Ok(0) => return false,
            Ok(n) => buf = &mut buf[n..],
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

fn serve(mut s: TcpStream, conn: usize, stop: &AtomicBool, calls: &Mutex<Vec<Call>>, handler: &mut Handler) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    s.set_nodelay(true).unwrap();
    loop {
        let mut rec = Vec::new();
        let mut fragments = 0;
        loop {
            let mut mark = [0u8; 4];
            if !read_full(&mut s, &mut mark, stop) {
                return;
            }
            let mark = u32::from_be_bytes(mark);
            let len = (mark & 0x7fff_ffff) as usize;
            assert!(len <= 64 << 20, "client sent a record mark of {len} bytes");
            let at = rec.len();
            rec.resize(at + len, 0);
            if !read_full(&mut s, &mut rec[at..], stop) {
                return;
            }
            fragments += 1;
            if mark & 0x8000_0000 != 0 {
                break;
            }
        }
        let mut d = Decoder::new(&rec);
        let h = rpc::decode_call(&mut d).expect("the client sent a malformed call header");
        let call = Call {
            conn,
            xid: h.xid,
            prog: h.prog,
            vers: h.vers,
            proc: h.proc,
            sys: h.sys,
            args: d.rest().to_vec(),
            fragments,
        };
        calls.lock().unwrap().push(call.clone());
        for act in handler(&call) {
            match act {
                Act::Send(bytes) => {
                    if s.write_all(&bytes).is_err() {
                        return;
                    }
                }
                Act::Sleep(d) => std::thread::sleep(d),
                Act::Close => return,
            }
        }
    }
}

/// Encodes with `f` into a fresh buffer.
pub fn enc(f: impl FnOnce(&mut Encoder<'_>)) -> Vec<u8> {
    let mut buf = vec![0u8; 4 << 20];
    let mut e = Encoder::new(&mut buf);
    f(&mut e);
    let n = e.position();
    buf.truncate(n);
    buf
}

/// `body` as one record (last fragment).
pub fn record(body: &[u8]) -> Vec<u8> {
    let mut v = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(body);
    v
}

/// `body` as a record cut into fragments of `size` bytes.
pub fn fragments(body: &[u8], size: usize) -> Vec<u8> {
    let mut v = Vec::new();
    let chunks: Vec<&[u8]> = body.chunks(size).collect();
    for (i, c) in chunks.iter().enumerate() {
        let last = if i + 1 == chunks.len() { 0x8000_0000u32 } else { 0 };
        v.extend_from_slice(&(last | c.len() as u32).to_be_bytes());
        v.extend_from_slice(c);
    }
    v
}

/// An accepted, successful RPC reply with these results (the record's body).
pub fn reply(xid: u32, results: &[u8]) -> Vec<u8> {
    let mut v = enc(|e| rpc::encode_success_reply(e, xid).unwrap());
    v.extend_from_slice(results);
    v
}

pub fn attr(ftype: Ftype, size: u64, fileid: u64) -> Fattr {
    let t = NfsTime { sec: 1_700_000_000, nsec: 5 };
    Fattr {
        ftype,
        mode: 0o644,
        nlink: 1,
        uid: 1000,
        gid: 100,
        size,
        used: size,
        rdev: (0, 0),
        fsid: 7,
        fileid,
        atime: t,
        mtime: t,
        ctime: t,
    }
}

/// GETATTR3resok.
pub fn getattr_ok(a: &Fattr) -> Vec<u8> {
    enc(|e| {
        e.u32(0).unwrap();
        a.encode(e).unwrap();
    })
}

/// READ3resok with `data` (the opaque length given separately, to lie about it).
pub fn read_ok_with(a: Option<&Fattr>, count: u32, eof: bool, len: u32, data: &[u8]) -> Vec<u8> {
    enc(|e| {
        e.u32(0).unwrap();
        e.bool(a.is_some()).unwrap();
        if let Some(a) = a {
            a.encode(e).unwrap();
        }
        e.u32(count).unwrap();
        e.bool(eof).unwrap();
        e.u32(len).unwrap();
        e.fixed(data).unwrap();
    })
}

pub fn read_ok(a: &Fattr, data: &[u8], eof: bool) -> Vec<u8> {
    read_ok_with(Some(a), data.len() as u32, eof, data.len() as u32, data)
}

/// WRITE3resok (no wcc data).
pub fn write_ok(count: u32, committed: u32, verf: [u8; 8]) -> Vec<u8> {
    enc(|e| {
        e.u32(0).unwrap();
        e.bool(false).unwrap();
        e.bool(false).unwrap();
        e.u32(count).unwrap();
        e.u32(committed).unwrap();
        e.fixed(&verf).unwrap();
    })
}

/// A failure status with no attributes for procedures whose resfail is one post_op_attr.
pub fn failed_post_op(status: u32) -> Vec<u8> {
    enc(|e| {
        e.u32(status).unwrap();
        e.bool(false).unwrap();
    })
}

/// The READ arguments: (handle, offset, count).
pub fn read_args(args: &[u8]) -> (Vec<u8>, u64, u32) {
    let mut d = Decoder::new(args);
    let fh = d.opaque(64, "fh").unwrap().to_vec();
    (fh, d.u64().unwrap(), d.u32().unwrap())
}

/// The WRITE arguments: (handle, offset, count, stable, data).
pub fn write_args(args: &[u8]) -> (Vec<u8>, u64, u32, u32, Vec<u8>) {
    let mut d = Decoder::new(args);
    let fh = d.opaque(64, "fh").unwrap().to_vec();
    let (off, count, stable) = (d.u64().unwrap(), d.u32().unwrap(), d.u32().unwrap());
    let data = d.opaque(u32::MAX, "data").unwrap().to_vec();
    d.finish().unwrap();
    (fh, off, count, stable, data)
}
