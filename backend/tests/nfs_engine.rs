//! The NFS engine against a scripted server (the client tests' fake server), where what
//! ganesha cannot be made to do on cue is deterministic: a COMMIT whose write verifier differs
//! from the WRITE's (the stored data must go again, FILE_SYNC, before FLUSH is acknowledged), a
//! server that lost an UNSTABLE write and says so only through the verifier, garbage in place of
//! a reply (EIO for that request, the connection reset, the next request served), JUKEBOX
//! (tried again), and the caller's credentials on every call.

mod harness;
#[path = "nfs_fake_server/mod.rs"]
mod nfs_fake_server;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::{parse, request, HDR, LINUX_FLAGS};
use nfs_fake_server::{attr, enc, getattr_ok, record, reply, write_args, write_ok, Act, Call, FakeServer};
use virtiofs_backend::abi::{self, opcode};
use virtiofs_backend::nfs::wire::nfs3::{Fattr, Ftype};
use virtiofs_backend::nfs::{NfsFs, NfsOptions};
use virtiofs_backend::server::{PollerEngine, Submitted};
use virtiofs_backend::Server;
use vm_memory::{ByteValued, VolatileSlice};

const MOUNT_PROG: u32 = 100_005;
const NFS_PROG: u32 = 100_003;
const VERF_A: [u8; 8] = *b"verf-AAA";
const VERF_B: [u8; 8] = *b"verf-BBB";

/// What the scripted server does with GETATTRs of the file and COMMITs.
#[derive(Default)]
struct Script {
    /// Answer the next GETATTR of the file with garbage.
    garbage_getattr: bool,
    /// Answer the next GETATTR of the file with JUKEBOX.
    jukebox_getattr: bool,
    /// The verifier COMMIT returns.
    commit_verf: Option<[u8; 8]>,
    /// Answer every COMMIT with NFS3ERR_IO.
    commit_fails: bool,
    /// The file's contents as the server holds them.
    data: Vec<u8>,
    /// Answer every READ with one byte, not at its end (however far the offset).
    trickle_reads: bool,
    /// The root's listing: the entries (file id, name, cookie) and eof of the READDIR(PLUS)
    /// reply to a call from a cookie.
    listing: Option<Listing>,
}

/// See [`Script::listing`].
type Listing = fn(u64) -> (Vec<(u64, &'static [u8], u64)>, bool);

fn dir_attr() -> Fattr {
    Fattr { mode: 0o755, ..attr(Ftype::Dir, 4096, 1) }
}

fn post_op(e: &mut virtiofs_backend::nfs::wire::xdr::Encoder<'_>, a: Option<&Fattr>) {
    e.bool(a.is_some()).unwrap();
    if let Some(a) = a {
        a.encode(e).unwrap();
    }
}

fn serve(script: &Arc<Mutex<Script>>, c: &Call) -> Vec<Act> {
    let mut s = script.lock().unwrap();
    let file = attr(Ftype::Reg, s.data.len() as u64, 2);
    let body = match (c.prog, c.proc) {
        // MNT: the root handle, AUTH_SYS accepted.
        (MOUNT_PROG, 1) => enc(|e| {
            e.u32(0).unwrap();
            e.opaque(b"root", 64).unwrap();
            e.u32(1).unwrap();
            e.u32(1).unwrap();
        }),
        (MOUNT_PROG, _) => Vec::new(),
        // FSINFO.
        (NFS_PROG, 19) => enc(|e| {
            e.u32(0).unwrap();
            post_op(e, None);
            for v in [65536, 65536, 4096, 65536, 65536, 4096, 4096] {
                e.u32(v).unwrap();
            }
            e.u64(u64::MAX).unwrap();
            e.u32(0).unwrap();
            e.u32(1).unwrap();
            e.u32(0x1b).unwrap();
        }),
        // GETATTR.
        (NFS_PROG, 1) => {
            if c.args.get(4..8) == Some(b"root") {
                getattr_ok(&dir_attr())
            } else if std::mem::take(&mut s.garbage_getattr) {
                // A reply with the right XID: NFS3_OK, then a file type that does not exist.
                return vec![Act::Send(record(&reply(c.xid, &[0, 0, 0, 0, 0, 0, 0, 99])))];
            } else if std::mem::take(&mut s.jukebox_getattr) {
                // GETATTR3res's failure is the status alone.
                enc(|e| e.u32(10008).unwrap())
            } else {
                getattr_ok(&file)
            }
        }
        // LOOKUP of NAME: the file "file-NAME".
        (NFS_PROG, 3) => {
            let mut d = virtiofs_backend::nfs::wire::xdr::Decoder::new(&c.args);
            d.opaque(64, "dir").unwrap();
            let fh = [&b"file-"[..], d.opaque(255, "name").unwrap()].concat();
            enc(|e| {
                e.u32(0).unwrap();
                e.opaque(&fh, 64).unwrap();
                post_op(e, Some(&file));
                post_op(e, Some(&dir_attr()));
            })
        }
        // REMOVE (wcc_data), RENAME (two of them): done.
        (NFS_PROG, 12) => enc(|e| (0..3).for_each(|_| e.u32(0).unwrap())),
        (NFS_PROG, 14) => enc(|e| (0..5).for_each(|_| e.u32(0).unwrap())),
        // ACCESS: everything asked is granted.
        (NFS_PROG, 4) => {
            let mask = u32::from_be_bytes(c.args[c.args.len() - 4..].try_into().unwrap());
            enc(|e| {
                e.u32(0).unwrap();
                post_op(e, None);
                e.u32(mask).unwrap();
            })
        }
        // WRITE: UNSTABLE ones under verifier A; FILE_SYNC ones under B.
        (NFS_PROG, 7) => {
            let (_, off, count, stable, data) = write_args(&c.args);
            let end = off as usize + data.len();
            if s.data.len() < end {
                s.data.resize(end, 0);
            }
            s.data[off as usize..end].copy_from_slice(&data);
            let verf = if stable == 0 { VERF_A } else { VERF_B };
            write_ok(count, stable, verf)
        }
        // SETATTR: a size truncates or extends.
        (NFS_PROG, 2) => {
            let mut d = virtiofs_backend::nfs::wire::xdr::Decoder::new(&c.args);
            d.opaque(64, "fh").unwrap();
            // sattr3: mode, uid, gid (set_it + value each), then size.
            for _ in 0..3 {
                if d.bool().unwrap() {
                    d.u32().unwrap();
                }
            }
            if d.bool().unwrap() {
                let size = d.u64().unwrap() as usize;
                s.data.resize(size, 0);
            }
            let a = attr(Ftype::Reg, s.data.len() as u64, 2);
            enc(|e| {
                e.u32(0).unwrap();
                post_op(e, None);
                post_op(e, Some(&a));
            })
        }
        // READ.
        (NFS_PROG, 6) => {
            let (_, off, count) = nfs_fake_server::read_args(&c.args);
            if s.trickle_reads {
                return vec![Act::Send(record(&reply(c.xid, &nfs_fake_server::read_ok(&file, b"x", false))))];
            }
            let from = (off as usize).min(s.data.len());
            let to = (from + count as usize).min(s.data.len());
            nfs_fake_server::read_ok(&file, &s.data[from..to], to == s.data.len())
        }
        // READDIR (16), READDIRPLUS (17) of the root, as the script lists it.
        (NFS_PROG, 16 | 17) if s.listing.is_some() => {
            let mut d = virtiofs_backend::nfs::wire::xdr::Decoder::new(&c.args);
            d.opaque(64, "dir").unwrap();
            let cookie = d.u64().unwrap();
            let (entries, eof) = (s.listing.unwrap())(cookie);
            let file = attr(Ftype::Reg, 0, 2);
            enc(|e| {
                e.u32(0).unwrap();
                post_op(e, Some(&dir_attr()));
                e.fixed(&VERF_A).unwrap();
                for (fileid, name, cookie) in entries {
                    e.bool(true).unwrap();
                    e.u64(fileid).unwrap();
                    e.opaque(name, 255).unwrap();
                    e.u64(cookie).unwrap();
                    if c.proc == 17 {
                        post_op(e, Some(&Fattr { fileid, ..file }));
                        e.bool(true).unwrap();
                        e.opaque(&[&b"file-"[..], name].concat(), 64).unwrap();
                    }
                }
                e.bool(false).unwrap();
                e.bool(eof).unwrap();
            })
        }
        // COMMIT.
        (NFS_PROG, 21) if s.commit_fails => nfs_fake_server::failed_post_op(5),
        (NFS_PROG, 21) => {
            let verf = s.commit_verf.unwrap_or(VERF_A);
            enc(|e| {
                e.u32(0).unwrap();
                post_op(e, None);
                post_op(e, None);
                e.fixed(&verf).unwrap();
            })
        }
        _ => nfs_fake_server::failed_post_op(10004),
    };
    vec![Act::Send(record(&reply(c.xid, &body)))]
}

struct Rig {
    server: FakeServer,
    script: Arc<Mutex<Script>>,
    srv: Arc<Server<NfsFs>>,
    e: PollerEngine<NfsFs>,
    out: Vec<u8>,
}

impl Rig {
    fn new() -> Rig {
        Self::with(|_| {})
    }

    fn with(tune: impl FnOnce(&mut NfsOptions)) -> Rig {
        let script = Arc::new(Mutex::new(Script::default()));
        let s2 = script.clone();
        let server = FakeServer::start(move |c| serve(&s2, c));
        let port = server.addr().port();
        let url = format!("nfs://127.0.0.1/exp?nfsport={port}&mountport={port}");
        let mut opts = NfsOptions::new(url.parse().unwrap());
        opts.timeout = Duration::from_secs(5);
        tune(&mut opts);
        let fs = NfsFs::connect(opts).expect("the scripted server mounts");
        let srv = Arc::new(Server::with_lock_waits(fs));
        let e = PollerEngine::for_poller(srv.clone(), 0);
        let mut r = Rig { server, script, srv, e, out: vec![0u8; (1 << 20) + 4096] };
        let mut init = request(opcode::INIT, 0, 1, 0, 0, &[&harness::init_in(41, LINUX_FLAGS)]);
        assert_eq!(r.run(&mut init).0.error, 0);
        r
    }

    /// One request to its reply: the header and body.
    fn run(&mut self, req: &mut [u8]) -> (abi::OutHeader, Vec<u8>) {
        let out = &mut self.out;
        let len = {
            let readable = [VolatileSlice::from(&mut *req)];
            let writable = [VolatileSlice::from(&mut out[..])];
            let mut len = match self.e.submit(1, &readable, &writable) {
                Submitted::Done(n) => Some(n),
                Submitted::Pending => None,
                Submitted::Wait(_) => unreachable!(),
            };
            let deadline = Instant::now() + Duration::from_secs(20);
            while len.is_none() {
                self.e.poll(&mut |_, n, _| len = Some(n));
                assert!(Instant::now() < deadline, "no reply");
            }
            len.unwrap_or(0)
        };
        let h: abi::OutHeader = parse(out);
        (h, out[HDR..len as usize].to_vec())
    }

    /// LOOKUP and OPEN of "f": node and handle.
    fn open_f(&mut self) -> (u64, u64) {
        let (h, body) = self.run(&mut request(opcode::LOOKUP, 1, 2, 1000, 100, &[b"f\0"]));
        assert_eq!(h.error, 0);
        let node = parse::<abi::EntryOut>(&body).nodeid;
        let arg = abi::OpenIn { flags: libc::O_RDWR as u32, open_flags: 0 };
        let (h, body) = self.run(&mut request(opcode::OPEN, node, 3, 1000, 100, &[arg.as_slice()]));
        assert_eq!(h.error, 0);
        (node, parse::<abi::OpenOut>(&body).fh)
    }
}

#[test]
fn a_commit_with_another_verifier_sends_the_stored_writes_again_before_flush_returns() {
    let mut r = Rig::new();
    let (node, fh) = r.open_f();
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    let w = abi::WriteIn { fh, offset: 4096, size: data.len() as u32, ..Default::default() };
    let (h, _) = r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), &data]));
    assert_eq!(h.error, 0);
    // The server restarts and loses the uncommitted write: its COMMIT has a new verifier.
    {
        let mut s = r.script.lock().unwrap();
        s.data.iter_mut().for_each(|b| *b = 0);
        s.commit_verf = Some(VERF_B);
    }
    let flush = abi::FlushIn { fh, ..Default::default() };
    let (h, _) = r.run(&mut request(opcode::FLUSH, node, 5, 1000, 100, &[flush.as_slice()]));
    assert_eq!(h.error, 0);
    // Acknowledged only after the data went again, FILE_SYNC, where it was.
    assert_eq!(&r.script.lock().unwrap().data[4096..], &data[..]);
    let calls = r.server.calls();
    let writes: Vec<(u64, u32, Vec<u8>)> = calls
        .iter()
        .filter(|c| c.prog == NFS_PROG && c.proc == 7)
        .map(|c| {
            let (_, off, _, stable, d) = write_args(&c.args);
            (off, stable, d)
        })
        .collect();
    assert_eq!(writes.len(), 2, "the WRITE and its replay");
    assert_eq!((writes[0].0, writes[0].1), (4096, 0), "first UNSTABLE");
    assert_eq!((writes[1].0, writes[1].1), (4096, 2), "then FILE_SYNC");
    assert!(writes[1].2 == data);
    let commit = calls.iter().position(|c| c.proc == 21 && c.prog == NFS_PROG).unwrap();
    let replay = calls.iter().rposition(|c| c.proc == 7 && c.prog == NFS_PROG).unwrap();
    assert!(commit < replay, "COMMIT, then the replay");
    let st = r.srv.filesystem().stats();
    assert_eq!((st.unstable.resent, st.unstable.bytes_now), (1, 0), "{st:?}");
    // A second FLUSH has nothing left to commit: no server call.
    let n = r.server.calls().len();
    let (h, _) = r.run(&mut request(opcode::FLUSH, node, 6, 1000, 100, &[flush.as_slice()]));
    assert_eq!((h.error, r.server.calls().len()), (0, n));
}

#[test]
fn the_same_verifier_commits_without_replay() {
    let mut r = Rig::new();
    let (node, fh) = r.open_f();
    let w = abi::WriteIn { fh, offset: 0, size: 5, ..Default::default() };
    assert_eq!(r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), b"hello"])).0.error, 0);
    let fsync = abi::FsyncIn { fh, fsync_flags: 0, padding: 0 };
    assert_eq!(r.run(&mut request(opcode::FSYNC, node, 5, 1000, 100, &[fsync.as_slice()])).0.error, 0);
    let writes = r.server.calls().iter().filter(|c| c.prog == NFS_PROG && c.proc == 7).count();
    assert_eq!(writes, 1);
    assert_eq!(r.srv.filesystem().stats().unstable.bytes_now, 0);
}

#[test]
fn garbage_for_a_reply_is_eio_and_the_next_request_is_served() {
    let mut r = Rig::new();
    let (node, _) = r.open_f();
    r.script.lock().unwrap().garbage_getattr = true;
    let before = r.server.connections();
    let getattr = abi::GetattrIn::default();
    let (h, _) = r.run(&mut request(opcode::GETATTR, node, 7, 1000, 100, &[getattr.as_slice()]));
    assert_eq!(-h.error, libc::EIO);
    let (h, body) = r.run(&mut request(opcode::GETATTR, node, 8, 1000, 100, &[getattr.as_slice()]));
    assert_eq!(h.error, 0);
    let a: abi::AttrOut = parse(&body);
    assert_eq!((a.attr.ino, a.attr.mode & libc::S_IFMT), (2, libc::S_IFREG));
    assert_eq!(r.server.connections(), before + 1, "the connection was reset");
    let st = r.srv.filesystem().stats();
    assert!(st.bad_replies >= 1, "{st:?}");
}

#[test]
fn jukebox_is_tried_again_and_credentials_go_with_every_call() {
    let mut r = Rig::new();
    let (node, _) = r.open_f();
    r.script.lock().unwrap().jukebox_getattr = true;
    let getattr = abi::GetattrIn::default();
    let (h, _) = r.run(&mut request(opcode::GETATTR, node, 7, 1000, 100, &[getattr.as_slice()]));
    assert_eq!(h.error, 0, "JUKEBOX means later, not an error");
    let getattrs: Vec<Call> = r
        .server
        .calls()
        .into_iter()
        .filter(|c| c.prog == NFS_PROG && c.proc == 1 && c.args.get(4..8) != Some(b"root"))
        .collect();
    assert_eq!(getattrs.len(), 2);
    for c in r
        .server
        .calls()
        .iter()
        .filter(|c| c.prog == NFS_PROG && c.proc != 19 && c.args.get(4..8) != Some(b"root"))
    {
        assert_eq!(c.sys.map(|s| (s.0, s.1)), Some((1000, 100)), "proc {} as the caller", c.proc);
    }
}

#[test]
fn without_a_store_every_write_is_file_sync_and_flush_needs_no_call() {
    let mut r = Rig::with(|o| o.unstable_bytes = 0);
    let (node, fh) = r.open_f();
    let w = abi::WriteIn { fh, offset: 0, size: 5, ..Default::default() };
    assert_eq!(r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), b"hello"])).0.error, 0);
    let n = r.server.calls().len();
    let flush = abi::FlushIn { fh, ..Default::default() };
    assert_eq!(r.run(&mut request(opcode::FLUSH, node, 5, 1000, 100, &[flush.as_slice()])).0.error, 0);
    let calls = r.server.calls();
    assert_eq!(calls.len(), n, "nothing to commit");
    let w = calls.iter().find(|c| c.prog == NFS_PROG && c.proc == 7).unwrap();
    assert_eq!(write_args(&w.args).3, 2, "FILE_SYNC");
    assert_eq!(&r.script.lock().unwrap().data[..], b"hello");
}

#[test]
fn reads_and_writes_larger_than_the_servers_transfer_size_go_in_pieces() {
    let mut r = Rig::new();
    let (node, fh) = r.open_f();
    // The scripted server's rtmax and wtmax are 64 KiB.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let w = abi::WriteIn { fh, offset: 0, size: data.len() as u32, ..Default::default() };
    let (h, body) = r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), &data]));
    assert_eq!(h.error, 0);
    assert_eq!(parse::<abi::WriteOut>(&body).size as usize, data.len());
    let writes = r.server.calls().iter().filter(|c| c.prog == NFS_PROG && c.proc == 7).count();
    assert_eq!(writes, 4, "200,000 bytes in 64 KiB pieces");
    assert!(r.script.lock().unwrap().data == data);
    let rd = abi::ReadIn { fh, offset: 1000, size: 199_500, ..Default::default() };
    let (h, body) = r.run(&mut request(opcode::READ, node, 5, 1000, 100, &[rd.as_slice()]));
    assert_eq!(h.error, 0);
    assert_eq!(body.len(), 199_000, "short at the end of the file only");
    assert!(body == data[1000..]);
    let reads = r.server.calls().iter().filter(|c| c.prog == NFS_PROG && c.proc == 6).count();
    assert_eq!(reads, 4);
}

/// The (procedure, stable) of every WRITE, COMMIT and SETATTR the server saw, in order.
fn data_calls(server: &FakeServer) -> Vec<(u32, u32)> {
    server
        .calls()
        .iter()
        .filter(|c| c.prog == NFS_PROG && matches!(c.proc, 2 | 7 | 21))
        .map(|c| (c.proc, if c.proc == 7 { write_args(&c.args).3 } else { 0 }))
        .collect()
}

#[test]
fn a_truncate_commits_the_stored_writes_first() {
    let mut r = Rig::new();
    let (node, fh) = r.open_f();
    let w = abi::WriteIn { fh, offset: 0, size: 8192, ..Default::default() };
    assert_eq!(
        r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), &[1u8; 8192]])).0.error,
        0
    );
    // The server restarted meanwhile: the COMMIT before the truncate replays the write, and
    // the truncate comes after it (a replay after the truncate would bring the data back).
    r.script.lock().unwrap().commit_verf = Some(VERF_B);
    let sa = abi::SetattrIn { valid: abi::fattr::SIZE, size: 100, ..Default::default() };
    let (h, body) = r.run(&mut request(opcode::SETATTR, node, 5, 1000, 100, &[sa.as_slice()]));
    assert_eq!(h.error, 0);
    assert_eq!(parse::<abi::AttrOut>(&body).attr.size, 100);
    assert_eq!(data_calls(&r.server), vec![(7, 0), (21, 0), (7, 2), (2, 0)]);
    assert_eq!(r.script.lock().unwrap().data.len(), 100);
    assert_eq!(r.srv.filesystem().stats().unstable.bytes_now, 0);
}

/// `calls` starts with `prefix`, and only COMMITs (background ones: the store is past its
/// high-water mark) come after it.
fn starts_with_then_commits(calls: &[(u32, u32)], prefix: &[(u32, u32)]) {
    assert!(calls.len() >= prefix.len() && calls[..prefix.len()] == *prefix, "{calls:?}");
    assert!(calls[prefix.len()..].iter().all(|c| c.0 == 21), "{calls:?}");
}

#[test]
fn a_write_that_finds_the_store_full_waits_for_a_background_commit() {
    let mut r = Rig::with(|o| o.unstable_bytes = 8192);
    let (node, fh) = r.open_f();
    let w = abi::WriteIn { fh, offset: 0, size: 8192, ..Default::default() };
    assert_eq!(
        r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), &[1u8; 8192]])).0.error,
        0
    );
    let w = abi::WriteIn { fh, offset: 0, size: 4096, ..Default::default() };
    assert_eq!(
        r.run(&mut request(opcode::WRITE, node, 5, 1000, 100, &[w.as_slice(), &[2u8; 4096]])).0.error,
        0
    );
    // The store was full: a COMMIT the engine sent on its own (no FLUSH) made room, and the new
    // write went UNSTABLE into it (not FILE_SYNC).
    starts_with_then_commits(&data_calls(&r.server), &[(7, 0), (21, 0), (7, 0)]);
    {
        let s = r.script.lock().unwrap();
        assert!(s.data[..4096].iter().all(|&b| b == 2) && s.data[4096..].iter().all(|&b| b == 1));
    }
    let st = r.srv.filesystem().stats().unstable;
    assert!(st.background_commits >= 1, "{st:?}");
    assert_eq!((st.full, st.stored, st.high_water), (0, 2, 8192), "{st:?}");
    assert!(st.bytes_now <= 4096, "{st:?}");
}

#[test]
fn a_write_waits_for_room_one_retransmission_interval_at_most() {
    // The server refuses every COMMIT: the background ones free nothing, so the write that
    // found the store full stops waiting after `retransmit` (not its 5 s deadline) and commits
    // the file itself, which fails with the server's error.
    let mut r = Rig::with(|o| {
        o.unstable_bytes = 8192;
        o.retransmit = Duration::from_millis(300);
    });
    r.script.lock().unwrap().commit_fails = true;
    let (node, fh) = r.open_f();
    let w = abi::WriteIn { fh, offset: 0, size: 8192, ..Default::default() };
    assert_eq!(
        r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), &[1u8; 8192]])).0.error,
        0
    );
    let t0 = Instant::now();
    let w = abi::WriteIn { fh, offset: 0, size: 4096, ..Default::default() };
    let e = r.run(&mut request(opcode::WRITE, node, 5, 1000, 100, &[w.as_slice(), &[2u8; 4096]])).0.error;
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(2), "{took:?}");
    assert_eq!(e, -libc::EIO);
    let st = r.srv.filesystem().stats().unstable;
    assert!(st.background_commits >= 2 && st.waited == 1, "{st:?}");
    assert_eq!(st.bytes_now, 8192, "the first write stays stored: nothing committed it");
}

#[test]
fn a_background_commit_that_shows_a_restart_leaves_the_replays_to_the_next_write_of_the_file() {
    // The server's COMMIT verifier is not the WRITEs': it restarted, losing the stored write.
    let mut r = Rig::with(|o| o.unstable_bytes = 8192);
    r.script.lock().unwrap().commit_verf = Some(VERF_B);
    let (node, fh) = r.open_f();
    let w = abi::WriteIn { fh, offset: 0, size: 8192, ..Default::default() };
    assert_eq!(
        r.run(&mut request(opcode::WRITE, node, 4, 1000, 100, &[w.as_slice(), &[1u8; 8192]])).0.error,
        0
    );
    // The store full of what must be sent again: no COMMIT can free room, so the write commits
    // the file itself, replays the lost write FILE_SYNC, and only then goes (UNSTABLE: room).
    r.script.lock().unwrap().data.clear();
    let w = abi::WriteIn { fh, offset: 0, size: 4096, ..Default::default() };
    let e = r.run(&mut request(opcode::WRITE, node, 5, 1000, 100, &[w.as_slice(), &[2u8; 4096]])).0.error;
    assert_eq!(e, 0);
    starts_with_then_commits(&data_calls(&r.server), &[(7, 0), (21, 0), (21, 0), (7, 2), (7, 0)]);
    {
        let s = r.script.lock().unwrap();
        assert_eq!(s.data.len(), 8192);
        assert!(s.data[..4096].iter().all(|&b| b == 2) && s.data[4096..].iter().all(|&b| b == 1));
    }
    let st = r.srv.filesystem().stats().unstable;
    assert_eq!((st.resent, st.full), (1, 1), "{st:?}");
}

#[test]
fn a_read_at_the_end_of_the_offset_space_stops_there_however_the_server_answers() {
    // A server that gives one byte per READ and never says EOF, to a READ whose offset plus
    // size passes 2^64: the request is cut at the last offset (no call's offset wraps or
    // overflows) and answered with the bytes it got.
    let mut r = Rig::new();
    let (node, fh) = r.open_f();
    r.script.lock().unwrap().trickle_reads = true;
    let read = abi::ReadIn { fh, offset: u64::MAX - 4, size: 4096, ..Default::default() };
    let (h, body) = r.run(&mut request(opcode::READ, node, 9, 1000, 100, &[read.as_slice()]));
    assert_eq!((h.error, body.len()), (0, 4));
    assert_eq!(body, b"xxxx");
    let offsets: Vec<u64> = r
        .server
        .calls()
        .iter()
        .filter(|c| c.prog == NFS_PROG && c.proc == 6)
        .map(|c| nfs_fake_server::read_args(&c.args).1)
        .collect();
    assert_eq!(offsets, [u64::MAX - 4, u64::MAX - 3, u64::MAX - 2, u64::MAX - 1]);
}

/// The name of a REMOVE's or RENAME's (target) name argument.
fn name_arg(c: &Call) -> Vec<u8> {
    let mut d = virtiofs_backend::nfs::wire::xdr::Decoder::new(&c.args);
    d.opaque(64, "dir").unwrap();
    let name = d.opaque(255, "name").unwrap();
    if c.proc == 14 {
        d.opaque(64, "to dir").unwrap();
        return d.opaque(255, "to name").unwrap().to_vec();
    }
    name.to_vec()
}

#[test]
fn a_release_goes_by_the_node_of_its_handle_not_the_node_id_the_guest_names() {
    // "f" is unlinked while open (renamed to its silly name); its RELEASE, sent with another
    // node's id, still removes f's silly name (not one made of the other node's id).
    let mut r = Rig::new();
    let (node, fh) = r.open_f();
    let (h, body) = r.run(&mut request(opcode::LOOKUP, 1, 20, 1000, 100, &[b"g\0"]));
    assert_eq!(h.error, 0);
    let other = parse::<abi::EntryOut>(&body).nodeid;
    assert_ne!(other, node);
    assert_eq!(r.run(&mut request(opcode::UNLINK, 1, 21, 1000, 100, &[b"f\0"])).0.error, 0);
    let renames: Vec<Call> =
        r.server.calls().into_iter().filter(|c| c.prog == NFS_PROG && c.proc == 14).collect();
    assert_eq!(renames.len(), 1, "renamed, not removed, while open");
    let silly = name_arg(&renames[0]);
    let release = abi::ReleaseIn { fh, ..Default::default() };
    assert_eq!(r.run(&mut request(opcode::RELEASE, other, 22, 1000, 100, &[release.as_slice()])).0.error, 0);
    let removes: Vec<Vec<u8>> =
        r.server.calls().iter().filter(|c| c.prog == NFS_PROG && c.proc == 12).map(name_arg).collect();
    assert_eq!(removes, [silly], "the silly name of the file whose handle was closed goes");
}

/// READDIR (or READDIRPLUS) of the root from `offset`: the errno, and (name, next offset) of
/// each entry.
fn list_root(r: &mut Rig, op: u32, offset: u64) -> (i32, Vec<(Vec<u8>, u64)>) {
    let open = abi::OpenIn { flags: libc::O_RDONLY as u32, open_flags: 0 };
    let (h, body) = r.run(&mut request(opcode::OPENDIR, 1, 30, 1000, 100, &[open.as_slice()]));
    assert_eq!(h.error, 0);
    let fh = parse::<abi::OpenOut>(&body).fh;
    let read = abi::ReadIn { fh, offset, size: 4096, ..Default::default() };
    let (h, body) = r.run(&mut request(op, 1, 31, 1000, 100, &[read.as_slice()]));
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        // READDIRPLUS records start with a fuse_entry_out.
        if op == opcode::READDIRPLUS {
            at += std::mem::size_of::<abi::EntryOut>();
        }
        let d: abi::Dirent = parse(&body[at..]);
        out.push((body[at + 24..at + 24 + d.namelen as usize].to_vec(), d.off));
        at += abi::dirent_size(d.namelen as usize);
    }
    let release = abi::ReleaseIn { fh, ..Default::default() };
    assert_eq!(r.run(&mut request(opcode::RELEASEDIR, 1, 32, 1000, 100, &[release.as_slice()])).0.error, 0);
    (h.error, out)
}

#[test]
fn a_readdir_reply_that_does_not_move_on_is_eio() {
    // Issue 21: the guest asks the next READDIR from the cookie of the last entry it took, so a
    // server that answers a cookie with an entry of that same cookie (or an empty listing that
    // does not end) would loop the guest for ever. Such a reply is EIO; the normal paging, where
    // each reply moves on and the last says eof, is served.
    let mut r = Rig::new();
    let normal: Listing = |cookie| match cookie {
        0 => (vec![(10, b"a", 1), (11, b"b", 2)], false),
        2 => (vec![(12, b"c", 3)], true),
        _ => (vec![], true),
    };
    r.script.lock().unwrap().listing = Some(normal);
    for op in [opcode::READDIR, opcode::READDIRPLUS] {
        assert_eq!(list_root(&mut r, op, 0), (0, vec![(b"a".to_vec(), 1), (b"b".to_vec(), 2)]));
        assert_eq!(list_root(&mut r, op, 2), (0, vec![(b"c".to_vec(), 3)]));
    }
    let broken: [(&str, Listing); 4] = [
        ("the requested cookie again", |c| (vec![(12, b"c", c)], false)),
        ("the requested cookie after one that moves on", |c| (vec![(12, b"c", c + 1), (13, b"d", c)], false)),
        ("no entry and no eof", |_| (vec![], false)),
        ("cookie 0, the start again", |c| (vec![(12, b"c", c + 1), (13, b"d", 0)], true)),
    ];
    for (what, listing) in broken {
        r.script.lock().unwrap().listing = Some(listing);
        for op in [opcode::READDIR, opcode::READDIRPLUS] {
            for offset in [0, 2] {
                let (errno, entries) = list_root(&mut r, op, offset);
                assert_eq!(errno, -libc::EIO, "{what}, op {op}, from {offset}: {entries:?}");
                assert!(entries.is_empty());
            }
        }
    }
    // The next listing from a server that behaves again is served.
    r.script.lock().unwrap().listing = Some(normal);
    assert_eq!(list_root(&mut r, opcode::READDIR, 2), (0, vec![(b"c".to_vec(), 3)]));
}
