//! The control socket (`--control-socket`) of a running daemon, driven while the host driver
//! model runs a workload: the counters and latency histograms match what was sent, a reset
//! starts them again, malformed JSON-RPC gets errors, and `virtiofs-dpu stats` prints a table,
//! JSON and a Prometheus exposition that a format checker accepts.

mod common;
use common::{wait_for, Daemon, BIN};

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use virtiofs_device::stats::OpClass;
use virtiofs_dpu::ops::control_socket::ControlClient;
use virtiofs_dpu::ops::report::StatsReport;
use virtiofs_tools::{DriverError, DriverOptions, FsDriver};

fn stats(c: &mut ControlClient) -> StatsReport {
    serde_json::from_value(c.call("get_stats", Value::Null).unwrap()).unwrap()
}

/// One raw line to the socket, one line back.
fn raw(path: &Path, line: &str) -> Value {
    let mut s = UnixStream::connect(path).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"))
}

#[test]
fn control_socket_counts_what_the_driver_sent() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("d.sock");
    let ctl = dir.path().join("ctl.sock");
    let _daemon = Daemon(
        Command::new(BIN)
            .args(["--socket-path", sock.to_str().unwrap(), "--control-socket", ctl.to_str().unwrap()])
            .args(["--socket-mode", "0660"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&sock);
    wait_for(&ctl);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o660);

    let mut c = ControlClient::connect(&ctl).unwrap();
    let dev = c.call("get_device", Value::Null).unwrap();
    assert_eq!(dev["client"]["connected"], json!(false));
    assert_eq!(dev["config"]["backend"]["kind"], json!("ramfs"));
    assert_eq!(dev["config"]["profile"]["queue_size"], json!(128));

    let mut d = FsDriver::connect(&sock, DriverOptions::default()).expect("driver brings the device up");
    d.init().unwrap();
    let dev = c.call("get_device", Value::Null).unwrap();
    assert_eq!(dev["client"]["connected"], json!(true), "{dev}");
    let status = dev["client"]["driver_status"].as_u64().unwrap();
    assert_eq!(status & 4, 4, "DRIVER_OK: {dev}");

    // A reader polls get_stats while the workload runs: counters only grow.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (ctl, done) = (ctl.clone(), done.clone());
        std::thread::spawn(move || {
            let mut c = ControlClient::connect(&ctl).unwrap();
            let mut last = 0u64;
            let mut polls = 0;
            while !done.load(Ordering::Relaxed) {
                let r = stats(&mut c);
                let n: u64 = r.device.requests().iter().sum();
                assert!(n >= last, "requests went from {last} to {n}");
                last = n;
                polls += 1;
            }
            polls
        })
    };

    let base = stats(&mut c);
    let (e, o) = d.create(1, "f", 0o644, libc::O_RDWR as u32).unwrap();
    let (writes, reads, getattrs, failures) = (40u64, 60u64, 30u64, 7u64);
    let data = vec![0x5au8; 4096];
    let mut slowest = [Duration::ZERO; 2];
    for i in 0..writes {
        let t = Instant::now();
        assert_eq!(d.write(e.nodeid, o.fh, i * 4096, &data).unwrap(), 4096);
        slowest[1] = slowest[1].max(t.elapsed());
    }
    for i in 0..reads {
        let t = Instant::now();
        assert_eq!(d.read(e.nodeid, o.fh, (i % writes) * 4096, 4096).unwrap().len(), 4096);
        slowest[0] = slowest[0].max(t.elapsed());
    }
    for _ in 0..getattrs {
        d.getattr(e.nodeid).unwrap();
    }
    let mut errno = 0;
    for _ in 0..failures {
        match d.getattr(999_999) {
            Err(DriverError::Fuse { errno: e, .. }) => errno = e,
            other => panic!("GETATTR of no node: {other:?}"),
        }
    }
    done.store(true, Ordering::Relaxed);
    assert!(watcher.join().unwrap() > 0);

    let r = stats(&mut c).since(&base);
    let class = |k| r.device.class(k).unwrap().clone();
    let (rd, wr, md) = (class(OpClass::Read), class(OpClass::Write), class(OpClass::Metadata));
    assert_eq!((rd.requests, rd.bytes, rd.errors), (reads, reads * 4096, 0), "{rd:?}");
    assert_eq!((wr.requests, wr.bytes, wr.errors), (writes, writes * 4096, 0), "{wr:?}");
    // CREATE, the GETATTRs and the failed ones.
    assert_eq!((md.requests, md.errors), (1 + getattrs + failures, failures), "{md:?}");
    let errs: BTreeMap<u16, u64> = r.device.errors.iter().map(|e| (e.errno, e.count)).collect();
    assert_eq!(errs, BTreeMap::from([(errno as u16, failures)]));
    let q1 = &r.device.queues[1];
    assert_eq!((q1.bytes_read, q1.bytes_written, q1.errors), (reads * 4096, writes * 4096, failures));
    assert_eq!(q1.requests, reads + writes + 1 + getattrs + failures);
    for (c, slowest) in [(&rd, slowest[0]), (&wr, slowest[1])] {
        let h = &c.histogram;
        assert!(r.device.latency_histograms);
        assert_eq!(h.count, c.requests, "every request timed: {c:?}");
        assert_eq!(h.buckets.iter().map(|b| b.count).sum::<u64>(), h.count);
        let l = c.latency;
        assert!(0 < l.p50_ns && l.p50_ns <= l.p90_ns && l.p90_ns <= l.p99_ns && l.p99_ns <= l.p999_ns);
        assert!(l.p999_ns <= l.max_ns.max(1));
        // Device-side latency is part of what the driver waited for.
        assert!(l.max_ns <= slowest.as_nanos() as u64, "device max {} ns > driver's {slowest:?}", l.max_ns);
    }

    // A reset: only what comes after it counts.
    assert_eq!(c.call("reset_stats", Value::Null).unwrap(), json!(true));
    for _ in 0..10 {
        d.getattr(e.nodeid).unwrap();
    }
    let r = stats(&mut c);
    let md = r.device.class(OpClass::Metadata).unwrap();
    assert_eq!((md.requests, md.histogram.count), (10, 10), "{md:?}");
    assert_eq!(r.device.class(OpClass::Read).unwrap().requests, 0);
    assert!(r.interval_s < r.uptime_s);

    // Malformed requests get JSON-RPC errors; the connection goes on.
    assert_eq!(raw(&ctl, "{not json")["error"]["code"], json!(-32700));
    assert_eq!(raw(&ctl, r#"{"jsonrpc":"1.0","method":"get_stats","id":1}"#)["error"]["code"], json!(-32600));
    assert_eq!(raw(&ctl, r#"{"jsonrpc":"2.0","method":"nope","id":2}"#)["error"]["code"], json!(-32601));
    let bad = raw(&ctl, r#"{"jsonrpc":"2.0","method":"set_log_level","params":{"level":"loud"},"id":3}"#);
    assert_eq!((bad["error"]["code"].clone(), bad["id"].clone()), (json!(-32602), json!(3)));
    let ok = raw(&ctl, r#"{"jsonrpc":"2.0","method":"set_log_level","params":{"level":"warn"},"id":"x"}"#);
    assert_eq!((ok["result"].clone(), ok["id"].clone()), (json!("info"), json!("x")));
    let batch = raw(
        &ctl,
        r#"[{"jsonrpc":"2.0","method":"rpc_get_methods","id":1},{"jsonrpc":"2.0","method":"reset_stats"}]"#,
    );
    assert_eq!(batch.as_array().map(Vec::len), Some(1), "the notification gets no response: {batch}");
    assert!(c.call("get_stats", json!({"x": 1})).is_err(), "params where none are taken");

    // The stats command.
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["stats", "--control-socket", ctl.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let table = run(&[]);
    assert!(
        table.contains("read MiB/s") && table.contains("p99.9 us") && table.contains("metadata"),
        "{table}"
    );
    let js: StatsReport = serde_json::from_str(&run(&["--json"])).unwrap();
    assert!(js.device.queues.len() == 2);
    let prom = run(&["--prometheus"]);
    let families = check_exposition(&prom).unwrap_or_else(|e| panic!("{e}\n{prom}"));
    for f in [
        "virtiofs_dpu_requests_total",
        "virtiofs_dpu_request_latency_seconds",
        "virtiofs_dpu_in_flight_requests",
    ] {
        assert!(families.contains(f), "{f} missing");
    }
    let watched = Command::new(BIN)
        .args(["stats", "--control-socket", ctl.to_str().unwrap(), "--watch", "0"])
        .output()
        .unwrap();
    assert_eq!(watched.status.code(), Some(2), "--watch 0 is refused");
    d.shutdown().unwrap();
}

/// Checks `text` against the Prometheus text exposition format 0.0.4: HELP/TYPE lines, sample
/// lines `name{label="value",...} number`, names and labels well formed, each family's TYPE
/// before its samples and declared once, histogram buckets cumulative with `+Inf` equal to
/// `_count`. Returns the families.
fn check_exposition(text: &str) -> Result<BTreeSet<String>, String> {
    let name_ok = |n: &str| {
        let mut c = n.chars();
        c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
    };
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut buckets: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts: BTreeMap<String, f64> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let (kw, name, arg) = (w.next().unwrap_or(""), w.next().unwrap_or(""), w.next().unwrap_or(""));
            if !name_ok(name) {
                return Err(format!("line {n}: bad metric name {name:?}"));
            }
            match kw {
                "HELP" => {}
                "TYPE" => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg) {
                        return Err(format!("line {n}: bad type {arg:?}"));
                    }
                    if types.insert(name.to_string(), arg.to_string()).is_some() {
                        return Err(format!("line {n}: {name} typed twice"));
                    }
                }
                _ => return Err(format!("line {n}: unknown comment keyword {kw:?}")),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or(format!("line {n}: no value"))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().map_err(|e| format!("line {n}: value {v:?}: {e}"))?,
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, ""),
            Some((name, rest)) => (name, rest.strip_suffix('}').ok_or(format!("line {n}: unclosed labels"))?),
        };
        if !name_ok(name) {
            return Err(format!("line {n}: bad metric name {name:?}"));
        }
        let mut le = None;
        let mut key = Vec::new();
        if !labels.is_empty() {
            for pair in labels.split(',') {
                let (k, v) = pair.split_once('=').ok_or(format!("line {n}: label {pair:?}"))?;
                let v = v
                    .strip_prefix('"')
                    .and_then(|v| v.strip_suffix('"'))
                    .ok_or(format!("line {n}: unquoted {pair:?}"))?;
                if !name_ok(k) || k.contains(':') || v.contains('"') || v.contains('\\') {
                    return Err(format!("line {n}: bad label {pair:?}"));
                }
                if k == "le" {
                    le = Some(if v == "+Inf" {
                        f64::INFINITY
                    } else {
                        v.parse::<f64>().map_err(|e| format!("line {n}: le {v:?}: {e}"))?
                    });
                } else {
                    key.push(pair.to_string());
                }
            }
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s).filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        if !types.contains_key(family) {
            return Err(format!("line {n}: {name} has no TYPE before it"));
        }
        let series_key = format!("{family}{{{}}}", key.join(","));
        if name.ends_with("_bucket") && family != name {
            buckets
                .entry(series_key)
                .or_default()
                .push((le.ok_or(format!("line {n}: bucket without le"))?, value));
        } else if name.ends_with("_count") && family != name {
            counts.insert(series_key, value);
        }
    }
    for (series, b) in &buckets {
        if !b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1) {
            return Err(format!("{series}: buckets not increasing and cumulative"));
        }
        match b.last() {
            Some(&(le, v)) if le.is_infinite() && Some(&v) == counts.get(series) => {}
            _ => return Err(format!("{series}: no +Inf bucket equal to _count")),
        }
    }
    Ok(types.into_keys().collect())
}

#[test]
fn the_exposition_checker_rejects_malformed_text() {
    assert!(check_exposition("# TYPE a counter\na 1\n").is_ok());
    assert!(check_exposition("a 1\n").is_err(), "no TYPE");
    assert!(check_exposition("# TYPE a counter\na{x=1} 1\n").is_err(), "unquoted label");
    assert!(check_exposition("# TYPE a counter\na one\n").is_err(), "not a number");
    let h = "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n";
    assert!(check_exposition(h).is_err(), "not cumulative");
}

/// A daemon of one RAM function (tag `a`) with a control socket, given `extra` flags; waits for
/// both sockets.
fn daemon_with(dir: &Path, extra: &[&str]) -> Daemon {
    let (sock, ctl) = (dir.join("d.sock"), dir.join("ctl.sock"));
    // A killed daemon's socket files stay: not to be taken for the new one's.
    let _ = std::fs::remove_file(&sock);
    let _ = std::fs::remove_file(&ctl);
    let d = Daemon(
        Command::new(BIN)
            .args(["--socket-path", sock.to_str().unwrap(), "--tag", "a"])
            .args(["--control-socket", ctl.to_str().unwrap()])
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&sock);
    wait_for(&ctl);
    // Answering: its socket files' access is set by then.
    let deadline = Instant::now() + Duration::from_secs(10);
    while ControlClient::connect(&ctl).and_then(|mut c| c.call("rpc_get_methods", Value::Null)).is_err() {
        assert!(Instant::now() < deadline, "the control socket does not answer");
        std::thread::sleep(Duration::from_millis(10));
    }
    d
}

/// `virtiofs-dpu stats` run as `uid`:`gid` against `ctl`: its exit status and stderr.
fn stats_as(ctl: &Path, uid: u32, gid: u32) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let out = Command::new(BIN)
        .args(["stats", "--json", "--function", "a", "--control-socket", ctl.to_str().unwrap()])
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The control socket has its own owner, group and mode (issue 21): by default the daemon's
/// uid's, mode 0600, whatever --socket-group and --socket-mode give the vfio-user socket;
/// --control-socket-group and --control-socket-mode set it. And, run as root, a client of
/// another uid that the file's mode lets connect is still refused by its credentials unless it
/// is of the control group.
#[test]
fn the_control_socket_has_its_own_access_and_checks_its_clients() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (uid, gid) = own_ids();
    let dir = tempfile::tempdir().unwrap();
    {
        let _d = daemon_with(dir.path(), &["--socket-group", "4321", "--socket-mode", "0666"]);
        let vfio = std::fs::metadata(dir.path().join("d.sock")).unwrap();
        assert_eq!((vfio.gid(), vfio.mode() & 0o777), (4321, 0o666), "the vfio-user socket's access");
        let m = std::fs::metadata(dir.path().join("ctl.sock")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (uid, gid, 0o600), "the control socket's default");
        ControlClient::connect(&dir.path().join("ctl.sock"))
            .unwrap()
            .call("get_device", Value::Null)
            .unwrap();
    }
    {
        let _d =
            daemon_with(dir.path(), &["--control-socket-group", "4321", "--control-socket-mode", "0660"]);
        let m = std::fs::metadata(dir.path().join("ctl.sock")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (uid, 4321, 0o660));
    }
    if uid != 0 {
        eprintln!("not root: the check of another uid's credentials is not run");
        return;
    }
    // Another uid may reach the socket file (mode 0666, a directory it may search) ...
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ctl = dir.path().join("ctl.sock");
    {
        let _d = daemon_with(dir.path(), &["--control-socket-mode", "0666"]);
        // ... but is refused by its credentials, with a reason.
        let (ok, err) = stats_as(&ctl, 65534, 65534);
        assert!(!ok && err.contains("permission denied"), "{err}");
        // Root still may.
        let (ok, err) = stats_as(&ctl, 0, 0);
        assert!(ok, "{err}");
    }
    {
        // A member of the control group may; another group may not.
        let _d =
            daemon_with(dir.path(), &["--control-socket-group", "65534", "--control-socket-mode", "0666"]);
        let (ok, err) = stats_as(&ctl, 65534, 65534);
        assert!(ok, "{err}");
        let (ok, err) = stats_as(&ctl, 65533, 65533);
        assert!(!ok && err.contains("permission denied"), "{err}");
    }
}

/// This test process's effective uid and gid, from /proc (no `unsafe` in tests).
fn own_ids() -> (u32, u32) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(2).unwrap().parse::<u32>().unwrap()
    };
    (field("Uid:"), field("Gid:"))
}

/// `create_function` is off without `--allow-create`, and with it refuses a share outside the
/// allowed roots (by `..` or by a symbolic link too), a socket outside the allowed directories,
/// a socket name that is a symbolic link or a file, and a remote host not listed; what is
/// allowed is created, on its canonical paths.
#[test]
fn create_function_is_limited_to_what_allow_create_names() {
    use virtiofs_dpu::ops::control_socket::ClientError;
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let denied = |c: &mut ControlClient, params: Value, what: &str| {
        let e = c.call("create_function", params.clone()).unwrap_err();
        match &e {
            ClientError::Rpc { code: -32001, message, .. } if message.contains(what) => {}
            _ => panic!("{params}: expected a refusal naming {what:?}, got {e:?}"),
        }
    };
    {
        let _d = daemon_with(dir.path(), &[]);
        let mut c = ControlClient::connect(&ctl).unwrap();
        let s = dir.path().join("x.sock");
        denied(&mut c, json!({"socket_path": s, "tag": "x"}), "--allow-create");
        denied(&mut c, json!({"socket_path": s, "tag": "x", "shared_dir": "/"}), "--allow-create");
        assert!(!s.exists());
    }
    let (roots, socks, other) =
        (dir.path().join("shares"), dir.path().join("socks"), dir.path().join("other"));
    for d in [&roots, &socks, &other, &roots.join("sub")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::os::unix::fs::symlink(&other, roots.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere.sock"), socks.join("link.sock")).unwrap();
    std::fs::write(socks.join("file.sock"), b"not a socket").unwrap();
    std::fs::write(dir.path().join("elsewhere.sock"), b"").unwrap();
    let allow = format!("roots={},sockets={}", roots.display(), socks.display());
    let _d = daemon_with(dir.path(), &["--allow-create", &allow, "--allow-create", "remotes=10.0.0.5"]);
    let mut c = ControlClient::connect(&ctl).unwrap();
    let ok_sock = socks.join("ok.sock");
    for (share, why) in [
        ("/".into(), "not beneath"),
        (roots.join("../other"), "not beneath"),
        (roots.join("link"), "not beneath"),
    ] {
        denied(&mut c, json!({"socket_path": ok_sock, "tag": "x", "shared_dir": share}), why);
    }
    for (sock, why) in [
        (dir.path().join("x.sock"), "is not allowed"),
        (socks.join("../x.sock"), "is not allowed"),
        (socks.join("link.sock"), "symbolic link"),
        (socks.join("file.sock"), "not a socket"),
    ] {
        denied(&mut c, json!({"socket_path": sock, "tag": "x"}), why);
    }
    denied(
        &mut c,
        json!({"socket_path": ok_sock, "tag": "x", "remote": "nfs://10.0.0.6/export"}),
        "10.0.0.6",
    );
    // Every address of an NFSv4.1 URL must be allowed, not only the first.
    denied(
        &mut c,
        json!({"socket_path": ok_sock, "tag": "x", "remote": "nfs://10.0.0.5,10.0.0.6/export?version=4.1"}),
        "10.0.0.6",
    );
    // Nothing was bound or written by the refusals.
    assert!(!ok_sock.exists() && !dir.path().join("x.sock").exists());
    assert_eq!(std::fs::read(socks.join("file.sock")).unwrap(), b"not a socket");
    assert_eq!(std::fs::read(dir.path().join("elsewhere.sock")).unwrap(), b"");
    // Allowed: a share beneath the root (named through a `..` that stays inside), a socket in
    // the directory.
    let info = c
        .call(
            "create_function",
            json!({"socket_path": ok_sock, "tag": "ok", "shared_dir": roots.join("sub/../sub")}),
        )
        .unwrap();
    assert_eq!(info["backend"], json!("passthrough"), "{info}");
    let canon_sock = socks.canonicalize().unwrap().join("ok.sock");
    assert_eq!(info["socket_path"], json!(canon_sock), "{info}");
    assert_eq!(
        info["spec"]["backend"]["shared_dir"],
        json!(roots.join("sub").canonicalize().unwrap()),
        "{info}"
    );
    assert!(ok_sock.exists());
    let tags: Vec<Value> = c
        .call("list_functions", Value::Null)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["tag"].clone())
        .collect();
    assert_eq!(tags, [json!("a"), json!("ok")]);
}

/// A second daemon given a live daemon's `--control-socket` refuses to start (non-zero exit,
/// naming the socket in use) and leaves it serving: whether the lock file tells it, or, with
/// the lock file gone, the socket answering a connection.
#[test]
fn a_second_daemon_does_not_take_a_live_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let _first = daemon_with(dir.path(), &[]);
    let second = |name: &str| {
        let sock = dir.path().join(name);
        let out = Command::new(BIN)
            .args(["--socket-path", sock.to_str().unwrap(), "--control-socket", ctl.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!sock.exists(), "the refused daemon's own socket stays behind");
        (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let answers = || {
        let mut c = ControlClient::connect(&ctl).expect("the first daemon's control socket is still there");
        let dev = c.call("get_device", Value::Null).unwrap();
        assert_eq!(dev["config"]["socket_path"], json!(dir.path().join("d.sock")), "{dev}");
    };
    let (status, err) = second("e.sock");
    assert!(!status.success() && err.contains("in use") && err.contains("lock file"), "{status}: {err}");
    answers();
    // Without the lock file the connect probe finds the socket alive.
    std::fs::remove_file(dir.path().join("ctl.sock.lock")).unwrap();
    let (status, err) = second("f.sock");
    assert!(!status.success() && err.contains("accepts connections"), "{status}: {err}");
    answers();
}

/// Bounds on what a `create_function` client can make the daemon hold: a numeric key past its
/// bound is refused naming the key and the bound, and no more than `--max-functions` functions.
#[test]
fn create_function_is_bounded() {
    use virtiofs_dpu::ops::control_socket::ClientError;
    let dir = tempfile::tempdir().unwrap();
    let allow = format!("sockets={}", dir.path().display());
    let _d = daemon_with(dir.path(), &["--allow-create", &allow, "--max-functions", "2"]);
    let mut c = ControlClient::connect(&dir.path().join("ctl.sock")).unwrap();
    let s = |n: &str| dir.path().join(n);
    for (key, value, bound) in [
        ("ramfs_size", json!("2T"), "1099511627776"),
        ("ramfs_inodes", json!(1u64 << 33), "4294967296"),
        ("nfs_max_nodes", json!(1u64 << 30), "16777216"),
        ("nfs_unstable_bytes", json!(1u64 << 40), "4294967296"),
    ] {
        let mut params = json!({"socket_path": s("x.sock"), "tag": "x"});
        params[key] = value;
        let e = c.call("create_function", params).unwrap_err();
        assert!(
            matches!(&e, ClientError::Rpc { code: -32602, message, .. } if message.contains(key) && message.contains(bound)),
            "{key}: {e:?}"
        );
    }
    assert!(!s("x.sock").exists());
    c.call("create_function", json!({"socket_path": s("b.sock"), "tag": "b"})).unwrap();
    let e = c.call("create_function", json!({"socket_path": s("c.sock"), "tag": "c"})).unwrap_err();
    assert!(matches!(&e, ClientError::Rpc { message, .. } if message.contains("--max-functions")), "{e:?}");
    assert!(!s("c.sock").exists());
}

/// Issue 21: with `MAX_CONNECTIONS` clients connected and none idle long enough to make room,
/// one more is told to try again (-32000) and closed; the others are served.
#[test]
fn a_client_past_the_connection_bound_is_told_to_try_again() {
    use virtiofs_dpu::ops::control_socket::MAX_CONNECTIONS;
    let dir = tempfile::tempdir().unwrap();
    let ctl = dir.path().join("ctl.sock");
    let _d = daemon_with(dir.path(), &[]);
    let clients: Vec<UnixStream> = (0..MAX_CONNECTIONS).map(|_| UnixStream::connect(&ctl).unwrap()).collect();
    let mut extra = UnixStream::connect(&ctl).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut answer = String::new();
    BufReader::new(&mut extra).read_line(&mut answer).unwrap();
    let v: Value = serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer:?}: {e}"));
    assert_eq!(v["error"]["code"], json!(-32000), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("try again"), "{v}");
    // One of the connected clients is served.
    let mut first = &clients[0];
    writeln!(first, "{}", json!({"jsonrpc": "2.0", "id": 1, "method": "rpc_get_methods"})).unwrap();
    let mut answer = String::new();
    BufReader::new(first).read_line(&mut answer).unwrap();
    assert!(answer.contains("get_stats"), "{answer}");
}

/// Issue 21: a `--control-socket` whose lock file is a symbolic link is refused at start (the
/// link is not followed: its target is not created), and nothing is left behind.
#[test]
fn a_control_socket_lock_file_that_is_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, ctl) = (dir.path().join("d.sock"), dir.path().join("ctl.sock"));
    let target = dir.path().join("elsewhere");
    std::os::unix::fs::symlink(&target, dir.path().join("ctl.sock.lock")).unwrap();
    let out = Command::new(BIN)
        .args(["--socket-path", sock.to_str().unwrap(), "--control-socket", ctl.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("ctl.sock.lock") && err.contains("regular file"), "{err}");
    assert!(!target.exists(), "the lock file's link was followed");
    assert!(!ctl.exists() && !sock.exists(), "a refused start left a socket behind");
}
