//! The supervisor's side end to end: a listening socket bound by the test and handed to the
//! daemon as descriptor N (`--fd N`) or by systemd socket activation (`LISTEN_PID`,
//! `LISTEN_FDS`, descriptor 3), the host driver model served through it, and `sd_notify`:
//! `READY=1` on the test's `NOTIFY_SOCKET` once the sockets listen, `STOPPING=1` at SIGTERM.
//!
//! The descriptor reaches the daemon as a supervisor passes it: the test makes it the standard
//! input of a shell, which moves it to the wanted number and `exec`s the daemon (same pid, so
//! `LISTEN_PID=$$` is the daemon's).

mod common;
use common::{Daemon, BIN};

use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use virtiofs_dpu::ops::control_socket::ControlClient;
use virtiofs_tools::{DriverOptions, FsDriver};

/// Starts `script` under `sh -c` (`$0` is the daemon) with `listener` as its standard input
/// and `NOTIFY_SOCKET` set to `notify`.
fn spawn_with_listener(script: &str, listener: UnixListener, notify: &Path, extra: &[&str]) -> Child {
    Command::new("sh")
        .args(["-c", &format!("{script} \"$@\""), BIN])
        .args(extra)
        .stdin(Stdio::from(OwnedFd::from(listener)))
        .stderr(Stdio::piped())
        .env("NOTIFY_SOCKET", notify)
        .env_remove("LISTEN_PID")
        .env_remove("LISTEN_FDS")
        .spawn()
        .unwrap()
}

/// The next notification, within 10 s.
fn next_notification(n: &UnixDatagram, daemon: &mut Daemon) -> String {
    n.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 512];
    match n.recv(&mut buf) {
        Ok(len) => String::from_utf8_lossy(&buf[..len]).into_owned(),
        Err(e) => {
            let _ = daemon.0.kill();
            let mut err = String::new();
            daemon.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("no notification ({e}); log:\n{err}");
        }
    }
}

/// The driver model brings the device up through `sock` and runs a few requests.
fn serve_through(sock: &Path) {
    let mut d =
        FsDriver::connect(sock, DriverOptions::default()).expect("bring-up through the inherited socket");
    d.init().unwrap();
    let (e, o) = d.create(1, "f", 0o644, libc::O_RDWR as u32).unwrap();
    assert_eq!(d.write(e.nodeid, o.fh, 0, b"through the supervisor's socket").unwrap(), 31);
    assert_eq!(d.read(e.nodeid, o.fh, 0, 64).unwrap(), b"through the supervisor's socket");
}

fn stop(mut daemon: Daemon, notify: &UnixDatagram) -> String {
    let st = Command::new("kill").args(["-TERM", &daemon.0.id().to_string()]).status().unwrap();
    assert!(st.success());
    assert_eq!(next_notification(notify, &mut daemon), "STOPPING=1");
    let status = daemon.0.wait().unwrap();
    let mut err = String::new();
    daemon.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "clean exit; log:\n{err}");
    err
}

/// A test's files: the device socket (bound, its listener), the control socket's path, and the
/// `NOTIFY_SOCKET` (its path, bound).
struct Setup {
    sock: PathBuf,
    ctl: PathBuf,
    notify_path: PathBuf,
    notify: UnixDatagram,
    listener: UnixListener,
}

fn setup(dir: &Path) -> Setup {
    let (sock, ctl, notify_path) = (dir.join("vfio-user.sock"), dir.join("ctl.sock"), dir.join("notify"));
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    Setup { sock, ctl, notify_path, notify, listener }
}

#[test]
fn fd_n_from_a_supervisor_with_sd_notify() {
    let dir = tempfile::tempdir().unwrap();
    let Setup { sock, ctl, notify_path, notify, listener } = setup(dir.path());
    let mut daemon = Daemon(spawn_with_listener(
        "exec \"$0\" --fd 7 7<&0 0</dev/null",
        listener,
        &notify_path,
        &["--control-socket", ctl.to_str().unwrap()],
    ));
    let ready = next_notification(&notify, &mut daemon);
    assert_eq!(ready, format!("READY=1\nMAINPID={}", daemon.0.id()));
    // READY=1 means serving: the control socket answers at once, without waiting for it.
    let mut c = ControlClient::connect(&ctl).unwrap();
    let dev = c.call("get_device", Value::Null).unwrap();
    assert_eq!(dev["config"]["fd"], Value::from(7), "{dev}");
    serve_through(&sock);
    let dev = c.call("get_device", Value::Null).unwrap();
    assert_eq!(dev["client"]["connections"], Value::from(1), "{dev}");
    drop(c);
    let log = stop(daemon, &notify);
    assert!(log.contains("READY=1"), "{log}");
}

#[test]
fn systemd_socket_activation() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("vfio-user.sock");
    let notify_path = dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let listener = UnixListener::bind(&sock).unwrap();
    // No --socket-path and no --fd: LISTEN_PID (the shell's pid, which exec keeps) and LISTEN_FDS.
    let script = "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" 3<&0 0</dev/null";
    let mut daemon = Daemon(spawn_with_listener(script, listener, &notify_path, &[]));
    let ready = next_notification(&notify, &mut daemon);
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    serve_through(&sock);
    // A second client after the first left: the inherited socket keeps listening.
    serve_through(&sock);
    stop(daemon, &notify);
}

#[test]
fn activation_for_another_process_or_a_bad_descriptor_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify");
    let _notify = UnixDatagram::bind(&notify_path).unwrap();
    let run = |script: &str, listener: UnixListener| {
        let out = spawn_with_listener(script, listener, &notify_path, &[]).wait_with_output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // The variable a socket-activated supervisor sets, set to something else.
    let l = UnixListener::bind(dir.path().join("c")).unwrap();
    let (code, err) = run("VIRTIOFS_DPU_LISTEN_FD=x exec \"$0\" 3<&0 0</dev/null", l);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("VIRTIOFS_DPU_LISTEN_FD") && err.contains("not a descriptor number"), "{err}");
    // LISTEN_PID of another process: not ours, so no socket at all.
    let l = UnixListener::bind(dir.path().join("a")).unwrap();
    let (code, err) = run("LISTEN_PID=1 LISTEN_FDS=1 exec \"$0\" 3<&0 0</dev/null", l);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no socket"), "{err}");
    // --fd naming something that is not a socket.
    let l = UnixListener::bind(dir.path().join("b")).unwrap();
    let (code, err) = run("exec \"$0\" --fd 9 9</dev/null", l);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--fd 9") && err.contains("not a socket"), "{err}");
    // --fd naming a closed descriptor; 3 is the number the daemon's own first descriptor would
    // take, so it must be claimed (and found closed) before the daemon opens anything.
    // (The shell's redirections take one digit: 12 is simply never opened.)
    for (fd, script) in [(3, "exec \"$0\" --fd 3 3<&-"), (12, "exec \"$0\" --fd 12")] {
        let l = UnixListener::bind(dir.path().join(format!("c{fd}"))).unwrap();
        let (code, err) = run(script, l);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(&format!("--fd {fd}")) && err.contains("not open"), "{err}");
    }
}

/// Socket activation of a `--live-update` daemon: the supervisor is the activated process
/// (`LISTEN_PID` names it), passes the socket on to its serving process, says `READY=1` once
/// that one serves, and the socket goes on through a live update to the next serving process.
#[test]
fn socket_activation_under_live_update() {
    let dir = tempfile::tempdir().unwrap();
    let Setup { sock, ctl, notify_path, notify, listener } = setup(dir.path());
    let script = "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" 3<&0 0</dev/null";
    let ctl_arg = ctl.to_str().unwrap();
    let mut daemon = Daemon(spawn_with_listener(
        script,
        listener,
        &notify_path,
        &["--live-update", "--control-socket", ctl_arg],
    ));
    let ready = next_notification(&notify, &mut daemon);
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    serve_through(&sock);
    let mut c = ControlClient::connect(&ctl).unwrap();
    let before = c.call("get_device", Value::Null).unwrap()["pid"].clone();
    assert_ne!(before, Value::from(daemon.0.id()), "the supervisor serves nothing itself");
    c.set_timeout(Duration::from_secs(30)).unwrap();
    let answer = c.call("live_update", Value::Null).unwrap();
    assert_eq!(answer["functions"], Value::from(1), "{answer}");
    drop(c);
    std::thread::sleep(Duration::from_millis(400));
    let after = ControlClient::connect(&ctl).unwrap().call("get_device", Value::Null).unwrap()["pid"].clone();
    assert_ne!(after, before, "still the first serving process");
    serve_through(&sock);
    let st = Command::new("kill").args(["-TERM", &daemon.0.id().to_string()]).status().unwrap();
    assert!(st.success());
    let status = daemon.0.wait().unwrap();
    let mut err = String::new();
    daemon.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "clean exit; log:\n{err}");
}
