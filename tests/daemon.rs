//! The `virtiofs-dpu` binary as a subprocess: a client that drops mid-request, a reconnect that
//! works, a clean exit on SIGTERM, and configuration errors that name the key.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use virtiofs_device::vfio_user::wire::{self, cmd, Header};
use vm_memory::ByteValued;

const BIN: &str = env!("CARGO_BIN_EXE_virtiofs-dpu");

fn spawn(args: &[&str]) -> Child {
    Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start virtiofs-dpu")
}

fn wait_for_socket(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(path).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("daemon exited early: {status}");
        }
        assert!(Instant::now() < deadline, "socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn connect(path: &Path) -> UnixStream {
    // The probe connection of wait_for_socket may still be held by the server for a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut c = s;
        if try_version(&mut c) {
            return c;
        }
        assert!(Instant::now() < deadline, "server never accepted a session");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn send(s: &mut UnixStream, id: u16, command: u16, payload: &[u8]) {
    let h = Header { msg_id: id, command, msg_size: (16 + payload.len()) as u32, flags: 0, error: 0 };
    let mut b = h.as_slice().to_vec();
    b.extend_from_slice(payload);
    s.write_all(&b).unwrap();
}

fn recv(s: &mut UnixStream) -> Option<(Header, Vec<u8>)> {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).ok()?;
    let hdr: Header = wire::read_obj(&h)?;
    let mut p = vec![0u8; hdr.msg_size as usize - 16];
    s.read_exact(&mut p).ok()?;
    Some((hdr, p))
}

fn try_version(s: &mut UnixStream) -> bool {
    let mut p = wire::Version { major: 0, minor: 0 }.as_slice().to_vec();
    p.extend_from_slice(b"{\"capabilities\":{\"max_msg_fds\":8}}\0");
    send(s, 1, cmd::VERSION, &p);
    matches!(recv(s), Some((h, _)) if h.flags & wire::FLAG_ERROR == 0)
}

fn config_read32(s: &mut UnixStream, offset: u64) -> u32 {
    send(s, 2, cmd::REGION_READ, wire::RegionAccess { offset, region: 7, count: 4 }.as_slice());
    let (h, p) = recv(s).expect("reply");
    assert_eq!(h.flags & wire::FLAG_ERROR, 0);
    u32::from_le_bytes(p[16..20].try_into().unwrap())
}

fn sigterm(child: &Child) {
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(Instant::now() < deadline, "daemon did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn drop_mid_request_reconnect_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let mut child = spawn(&["--socket-path", sock.to_str().unwrap(), "--tag", "subproc"]);
    wait_for_socket(&sock, &mut child);

    // Session 1: negotiate, then die in the middle of a REGION_WRITE.
    let mut s = connect(&sock);
    assert_eq!(config_read32(&mut s, 0), 0x105a_1af4);
    let h = Header { msg_id: 9, command: cmd::REGION_WRITE, msg_size: 16 + 16 + 4, flags: 0, error: 0 };
    let mut partial = h.as_slice().to_vec();
    partial.extend_from_slice(&wire::RegionAccess { offset: 0x3c, region: 7, count: 4 }.as_slice()[..10]);
    s.write_all(&partial).unwrap();
    drop(s);

    // Session 2 starts over and works.
    let mut s = connect(&sock);
    assert_eq!(config_read32(&mut s, 0), 0x105a_1af4);
    drop(s);

    sigterm(&child);
    let status = wait_exit(&mut child);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "exit status; log:\n{err}");
    assert!(err.contains("requests per queue"), "per-queue counters printed at exit:\n{err}");
    assert!(!sock.exists(), "socket file removed at exit");
}

#[test]
fn bad_profile_is_rejected_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "queue_size = 100\n").unwrap();
    let sock = dir.path().join("d.sock");
    let out = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("queue_size"), "{err}");
    std::fs::write(&cfg, "queue_sise = 128\n").unwrap();
    let out = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("queue_sise"));
}

#[test]
fn shipped_profile_and_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/hw-configs/ci.toml");
    let mut child = spawn(&["--socket-path", sock.to_str().unwrap(), "--config", cfg]);
    wait_for_socket(&sock, &mut child);
    let mut s = connect(&sock);
    // Device config: tag from the profile and 2 request queues.
    send(&mut s, 3, cmd::REGION_READ, wire::RegionAccess { offset: 0x2000, region: 4, count: 40 }.as_slice());
    let (_, p) = recv(&mut s).unwrap();
    assert_eq!(&p[16..25], b"virtiofs\0");
    assert_eq!(u32::from_le_bytes(p[16 + 36..16 + 40].try_into().unwrap()), 2);
    drop(s);
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    assert_eq!(wait_exit(&mut child).code(), Some(0));
}
