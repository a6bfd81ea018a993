//! Writes seed inputs of the `nfs_reply` fuzz target from a real server's replies:
//! `cargo run --example nfs_seeds -- NFS_URL PORTMAPPER_PORT OUT_DIR` (from `fuzz/`), with
//! `NFS_URL` an export served by nfs-ganesha as `tools/nfs/ganesha.sh start` prints it
//! (`nfs://127.0.0.1/PATH?nfsport=N&mountport=M`).
//!
//! A blocking client of its own sends each call (every procedure the backend uses, with
//! successes and failures, RPC-level refusals, MOUNT MNT, portmapper GETPORT) and keeps each
//! reply's record as the server framed it; every reply becomes inputs for the decoder mode
//! (one reply each) and for the session mode (the call, then its reply under several
//! framings), and MNT/GETPORT for the start-up mode. See `virtiofs_fuzz_common::nfs`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use virtiofs_backend::nfs::url::NfsUrl;
use virtiofs_backend::nfs::wire::nfs3::{self, Args, CreateHow, Fh, Ftype, Proc, Sattr, Stable};
use virtiofs_backend::nfs::wire::xdr::{self, Decoder, Encoder};
use virtiofs_backend::nfs::wire::{mount, portmap, rpc};
use virtiofs_fuzz_common::nfs::{action, DECODE_GETPORT, DECODE_MNT, PROCS};

/// A reply as received: the record's body (marks removed).
struct Reply {
    body: Vec<u8>,
}

fn call_raw(addr: SocketAddr, prog: u32, vers: u32, proc: u32, args: &[u8], xid: u32) -> Reply {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 8192];
    let mut e = Encoder::new(&mut buf);
    let mark = e.reserve_u32().unwrap();
    let auth = rpc::AuthSys { stamp: 1, machine: b"seeds", uid: 0, gid: 0, gids: &[] };
    rpc::encode_call(&mut e, xid, prog, vers, proc, &auth).unwrap();
    let n = e.position();
    let total = n - 4 + args.len();
    e.patch_u32(mark, 0x8000_0000 | total as u32);
    let mut msg = buf[..n].to_vec();
    msg.extend_from_slice(args);
    s.write_all(&msg).unwrap();
    let mut body = Vec::new();
    loop {
        let mut m = [0u8; 4];
        s.read_exact(&mut m).unwrap();
        let m = u32::from_be_bytes(m);
        let at = body.len();
        body.resize(at + (m & 0x7fff_ffff) as usize, 0);
        s.read_exact(&mut body[at..]).unwrap();
        if m & 0x8000_0000 != 0 {
            break;
        }
    }
    Reply { body }
}

fn encode(args: &Args<'_>, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 8192 + payload.len()];
    let mut e = Encoder::new(&mut buf);
    nfs3::encode_args(&mut e, args).unwrap();
    let n = e.position();
    let mut v = buf[..n].to_vec();
    v.extend_from_slice(payload);
    v.resize(v.len() + xdr::pad(payload.len()), 0);
    v
}

/// The handle in a LOOKUP or CREATE-like reply.
fn handle_of(proc: Proc, r: &Reply) -> Fh {
    let mut d = Decoder::new(&r.body);
    rpc::decode_reply(&mut d).unwrap().1.unwrap();
    match nfs3::decode_res(proc, &mut d).unwrap() {
        nfs3::Res::Lookup { fh, .. } => fh,
        nfs3::Res::Created { fh: Some(fh), .. } => fh,
        other => panic!("no handle in {other:?}"),
    }
}

/// A record of the fuzz input framing: `[len: u16 le][flags][bytes]`.
fn rec(out: &mut Vec<u8>, flags: u8, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.push(flags);
    out.extend_from_slice(bytes);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert!(args.len() == 4, "usage: nfs_seeds NFS_URL PORTMAPPER_PORT OUT_DIR");
    let url = args[1].parse::<NfsUrl>().expect("an nfs:// URL with nfsport and mountport");
    let pmap_port: u16 = args[2].parse().expect("a port");
    let out = Path::new(&args[3]);
    std::fs::create_dir_all(out).unwrap();
    let host: std::net::IpAddr = url.host.parse().expect("an address");
    let nfs = SocketAddr::new(host, url.nfsport.expect("nfsport in the URL"));
    let mnt = SocketAddr::new(host, url.mountport.expect("mountport in the URL"));
    let pmap = SocketAddr::new(host, pmap_port);
    let xid = std::cell::Cell::new(0x5eed_0000u32);
    let next = || {
        xid.set(xid.get() + 1);
        xid.get()
    };

    // Start-up: GETPORT (registered and not), MNT (the export and a path that is none).
    let getport = |prog, vers| {
        let mut b = [0u8; 16];
        portmap::encode_getport(&mut Encoder::new(&mut b), prog, vers).unwrap();
        call_raw(pmap, portmap::PROGRAM, portmap::VERSION, portmap::PROC_GETPORT, &b, next())
    };
    let port_mount = getport(mount::PROGRAM, mount::VERSION);
    let port_none = getport(0x2000_0042, 1);
    let dirpath = |p: &str| {
        let mut b = vec![0u8; 1100];
        let mut e = Encoder::new(&mut b);
        mount::encode_dirpath(&mut e, p.as_bytes()).unwrap();
        let n = e.position();
        b.truncate(n);
        b
    };
    let mnt_ok =
        call_raw(mnt, mount::PROGRAM, mount::VERSION, mount::PROC_MNT, &dirpath(&url.export), next());
    let mnt_bad =
        call_raw(mnt, mount::PROGRAM, mount::VERSION, mount::PROC_MNT, &dirpath("/no/such/export"), next());
    let root = {
        let mut d = Decoder::new(&mnt_ok.body);
        rpc::decode_reply(&mut d).unwrap().1.unwrap();
        match mount::decode_mnt(&mut d).unwrap() {
            mount::MntRes::Ok { root, .. } => root,
            other => panic!("MNT refused: {other:?}"),
        }
    };

    // NFSv3: every procedure, successes and failures.
    let mut replies: Vec<(&'static str, Proc, u32, Reply)> = Vec::new();
    let mut nfs_call = |name: &'static str, args: Args<'_>, payload: &[u8]| {
        let proc = args.proc();
        let count = match args {
            Args::Read { count, .. } | Args::Write { count, .. } | Args::Readdir { count, .. } => count,
            Args::Readdirplus { maxcount, .. } => maxcount,
            _ => 0,
        };
        let r = call_raw(nfs, nfs3::PROGRAM, nfs3::VERSION, proc as u32, &encode(&args, payload), next());
        replies.push((name, proc, count, Reply { body: r.body.clone() }));
        r
    };
    let sattr = Sattr::default();
    let mode = Sattr { mode: Some(0o600), ..Sattr::default() };
    nfs_call("null", Args::Null, &[]);
    nfs_call("getattr", Args::Getattr { fh: &root }, &[]);
    nfs_call("fsinfo", Args::Fsinfo { fh: &root }, &[]);
    nfs_call("fsstat", Args::Fsstat { fh: &root }, &[]);
    nfs_call("access", Args::Access { fh: &root, mask: 0x3f }, &[]);
    nfs_call("lookup-noent", Args::Lookup { dir: &root, name: b"missing" }, &[]);
    let bogus = Fh::new(&[0x42; 28]).unwrap();
    nfs_call("getattr-badhandle", Args::Getattr { fh: &bogus }, &[]);
    let f =
        nfs_call("create", Args::Create { dir: &root, name: b"f", how: CreateHow::Unchecked(&sattr) }, &[]);
    let f = handle_of(Proc::Create, &f);
    nfs_call("create-exist", Args::Create { dir: &root, name: b"f", how: CreateHow::Guarded(&sattr) }, &[]);
    nfs_call("lookup", Args::Lookup { dir: &root, name: b"f" }, &[]);
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
    nfs_call("write", Args::Write { fh: &f, offset: 0, count: 40_000, stable: Stable::Unstable }, &data);
    nfs_call("write-sync", Args::Write { fh: &f, offset: 5, count: 3, stable: Stable::FileSync }, &data[..3]);
    nfs_call("commit", Args::Commit { fh: &f, offset: 0, count: 0 }, &[]);
    nfs_call("read-small", Args::Read { fh: &f, offset: 0, count: 100 }, &[]);
    nfs_call("read-odd", Args::Read { fh: &f, offset: 1, count: 7 }, &[]);
    nfs_call("read-big", Args::Read { fh: &f, offset: 0, count: 32_768 }, &[]);
    nfs_call("read-eof", Args::Read { fh: &f, offset: 1 << 20, count: 4096 }, &[]);
    nfs_call("setattr", Args::Setattr { fh: &f, attr: &mode, guard_ctime: None }, &[]);
    let d = nfs_call("mkdir", Args::Mkdir { dir: &root, name: b"d", attr: &sattr }, &[]);
    let d = handle_of(Proc::Mkdir, &d);
    nfs_call("symlink", Args::Symlink { dir: &root, name: b"s", attr: &sattr, target: b"f" }, &[]);
    let s = nfs_call("lookup-symlink", Args::Lookup { dir: &root, name: b"s" }, &[]);
    let s = handle_of(Proc::Lookup, &s);
    nfs_call("readlink", Args::Readlink { fh: &s }, &[]);
    nfs_call("readlink-notlink", Args::Readlink { fh: &f }, &[]);
    nfs_call("link", Args::Link { fh: &f, dir: &d, name: b"h" }, &[]);
    nfs_call(
        "mknod",
        Args::Mknod { dir: &root, name: b"p", ftype: Ftype::Fifo, attr: &sattr, rdev: (0, 0) },
        &[],
    );
    nfs_call("readdir", Args::Readdir { dir: &root, cookie: 0, verf: [0; 8], count: 4096 }, &[]);
    nfs_call(
        "readdirplus",
        Args::Readdirplus { dir: &root, cookie: 0, verf: [0; 8], dircount: 4096, maxcount: 16384 },
        &[],
    );
    nfs_call("rmdir-notempty", Args::Rmdir { dir: &root, name: b"d" }, &[]);
    nfs_call("rename", Args::Rename { from_dir: &root, from_name: b"f", to_dir: &root, to_name: b"g" }, &[]);
    nfs_call("remove", Args::Remove { dir: &root, name: b"g" }, &[]);
    nfs_call("remove-noent", Args::Remove { dir: &root, name: b"g" }, &[]);
    nfs_call("remove-h", Args::Remove { dir: &d, name: b"h" }, &[]);
    nfs_call("rmdir", Args::Rmdir { dir: &root, name: b"d" }, &[]);
    // RPC-level refusals: a version not served, a procedure that is none, arguments cut short.
    let mismatch = call_raw(nfs, nfs3::PROGRAM, 7, 1, &encode(&Args::Getattr { fh: &root }, &[]), next());
    let unavail = call_raw(nfs, nfs3::PROGRAM, nfs3::VERSION, 40, &[], next());
    let garbage = call_raw(nfs, nfs3::PROGRAM, nfs3::VERSION, 1, &[0, 0, 0], next());
    replies.push(("rpc-prog-mismatch", Proc::Getattr, 0, mismatch));
    replies.push(("rpc-proc-unavail", Proc::Getattr, 0, unavail));
    replies.push(("rpc-garbage-args", Proc::Getattr, 0, garbage));

    let write = |name: String, bytes: Vec<u8>| std::fs::write(out.join(name), bytes).unwrap();
    for (name, proc, count, r) in &replies {
        let idx = PROCS.iter().position(|p| p == proc).unwrap() as u8;
        // Decoders alone.
        let mut v = vec![0u8];
        rec(&mut v, idx, &r.body);
        write(format!("dec-{name}"), v);
        // A session: the call, its reply in one record, in 4-byte fragments split byte-wise,
        // and in 132-byte fragments that do not end (the next record goes on with a poll).
        for (tag, framing) in
            [("whole", 0u8), ("frag4-bytewise", 4 | 0x40), ("frag132-open", 12 | 0x10 | 0x80)]
        {
            let mut v = vec![1u8];
            let mut c = vec![idx];
            c.extend_from_slice(&count.to_le_bytes());
            c.push(if *proc == Proc::Read { 2 } else { 1 });
            rec(&mut v, action::CALL, &c);
            let mut b = vec![0u8, framing];
            b.extend_from_slice(&r.body);
            rec(&mut v, action::REPLY, &b);
            rec(&mut v, action::POLL, &[0; 4]);
            write(format!("ses-{name}-{tag}"), v);
        }
    }
    // Start-up: GETPORT then MNT, as the server framed them (XIDs set by the harness).
    for (name, pm, m) in [("startup-ok", &port_mount, &mnt_ok), ("startup-refused", &port_none, &mnt_bad)] {
        let mut v = vec![3u8];
        rec(&mut v, 1, &pm.body);
        rec(&mut v, 1, &m.body);
        write(name.into(), v);
        let mut v = vec![0u8];
        rec(&mut v, DECODE_GETPORT, &pm.body);
        rec(&mut v, DECODE_MNT, &m.body);
        write(format!("dec-{name}"), v);
    }
    // Big READs made up by the harness: direct placement, data cut by a fragment, data short.
    for (name, len, shape, framing) in [
        ("read-direct", 40_000u32, 3u8, 0u8),
        ("read-direct-frag", 20_001, 1, 15),
        ("read-lying", 30_000, 5, 0),
    ] {
        let mut v = vec![2u8];
        let mut c = vec![6u8];
        c.extend_from_slice(&len.to_le_bytes());
        c.push(2);
        rec(&mut v, action::CALL, &c);
        let mut b = vec![0u8, framing, shape];
        b.extend_from_slice(&len.to_le_bytes());
        rec(&mut v, action::READ_REPLY, &b);
        rec(&mut v, action::POLL, &[0; 8]);
        write(format!("ses-{name}"), v);
    }
    eprintln!("{} replies captured into {}", replies.len() + 4, out.display());
}
