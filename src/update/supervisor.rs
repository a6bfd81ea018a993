//! The supervisor (`--live-update`): a small process that takes no guest or client input. It
//! starts the serving process (this binary, with the same arguments, confined as any daemon),
//! and on a live update starts the new one beside it, connected to the old one. It tells the
//! service manager READY=1 when the first serving process serves, forwards SIGTERM, SIGINT,
//! SIGUSR1 and SIGHUP to the serving process, and exits with its status when it ends.
//!
//! What it accepts from a serving process (over the channel each one gets at its start) is
//! checked like any input: a request to start a binary other than its own is refused unless
//! that binary lies in the directory `--update-binary-dir` names; one update at a time.
//!
//! Crash recovery (issue 24): each serving process sends the supervisor a checkpoint of every
//! function as it changes, with its descriptors, on a channel of its own
//! ([`super::recovery`]); the supervisor keeps the newest of each. When the serving process
//! dies unasked, the supervisor starts a new one and replays the checkpoints to it over the
//! exchange a live update uses, at most `--crash-limit` times in its window; past that (or
//! with `0/0`) it ends with the serving process's status, as the daemon did before.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::mpsc::{self, channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::{error, info, warn};
use signal_hook::consts::{SIGHUP, SIGINT, SIGKILL, SIGTERM, SIGUSR1};

use super::channel::{Channel, ChannelError, ReadAhead};
use super::recovery::{ADOPTS, CHECKPOINT_FD, RECOVERING};
use super::state::{Msg, STATE_VERSION};
use super::{SupervisorMsg, EXPECT_FDS, SUPERVISOR_FD, TAKEOVER_FD};
use crate::error_chain;
use crate::ops::deploy::{Notifier, SUPERVISED_LISTEN_FD};
use crate::settings::AllowCreate;
use crate::sys;
use virtiofs_device::vfio_user::socket_file::{bind_exclusive_with, remove_unserved, SocketAccess};

/// What the supervisor's loop hears.
enum Event {
    Msg(u32, SupervisorMsg),
    Exited(u32, ExitStatus),
    Signal(i32),
    /// Checkpoints of process `pid`'s (each a [`Kept`] as JSON, with its descriptors), in the
    /// order sent.
    Kept(u32, Vec<(serde_json::Value, Vec<File>)>),
    /// Process `pid`'s checkpoint channel ended: every checkpoint it sent has come (`false`: it
    /// could not be read to its end, and what was kept of it is not to be trusted).
    KeptClosed(u32, bool),
    /// The replay of the checkpoints to recovering process `pid` ended.
    Replayed(u32, Result<(), String>),
}

/// How often a serving process that died unasked is replaced (`--crash-limit N/SECONDS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashLimit {
    /// Most recoveries in [`Self::within`] (0: none).
    pub count: u32,
    /// The window.
    pub within: Duration,
}

impl CrashLimit {
    /// Reads `N/SECONDS`.
    pub fn parse(s: &str) -> Result<CrashLimit, String> {
        let (n, secs) = s.split_once('/').ok_or("not N/SECONDS")?;
        let count = n.trim().parse::<u32>().map_err(|e| format!("{n:?}: {e}"))?;
        let secs = secs.trim().parse::<u64>().map_err(|e| format!("{secs:?}: {e}"))?;
        if count > 0 && secs == 0 {
            return Err("a window of 0 seconds".into());
        }
        Ok(CrashLimit { count, within: Duration::from_secs(secs) })
    }

    /// Whether one more recovery is allowed after those at `past` (pruned to the window).
    fn allows(&self, past: &mut std::collections::VecDeque<Instant>, now: Instant) -> bool {
        while past.front().is_some_and(|t| now.duration_since(*t) > self.within) {
            past.pop_front();
        }
        past.len() < self.count as usize
    }
}

/// The newest checkpoints of one serving process: each function's (in creation order) and
/// the control socket's, each as the message that replays it with its descriptors.
#[derive(Default)]
struct Checkpoints {
    functions: Vec<(String, serde_json::Value, Vec<File>)>,
    control: Option<(serde_json::Value, Vec<File>)>,
    /// Each function's backend descriptors held for it (`Kept::Hold`: a shared directory's
    /// nodes and handles), by key, with what each is.
    held: HashMap<String, Held>,
    /// The functions whose held descriptors are to be those of the process this one took
    /// over from (`Kept::Adopt`, a live update), until they come over ([`Self::adopt`]): the
    /// keys this one let go meanwhile that it did not hold (the predecessor's, not to come).
    adopting: HashMap<String, std::collections::HashSet<u64>>,
    /// The functions whose held descriptors may miss some (see [`Self::adopt`]).
    incomplete: std::collections::HashSet<String>,
    /// What the predecessor held for functions this process has not said yet whether it
    /// adopts (its `Kept::Adopt` may come after the predecessor's end), and whether all of it
    /// was read.
    inherited: HashMap<String, (Held, bool)>,
    /// The functions this process gives its own descriptors for (`Kept::LetAll`): nothing of
    /// the predecessor's is kept for them.
    own: std::collections::HashSet<String>,
    /// Function checkpoints that are the predecessor's (taken at the commit), to be replaced
    /// by its later ones until this process sends its own.
    theirs: std::collections::HashSet<String>,
    /// Functions this process ended before its predecessor's checkpoints were all read: none
    /// of those comes back.
    ended: std::collections::HashSet<String>,
}

/// A function's held descriptors, by key, with what each is.
type Held = std::collections::BTreeMap<u64, (serde_json::Value, Arc<File>)>;

impl Checkpoints {
    /// Keeps `kept` (a [`Kept`] as JSON, whose `function` and `control` are the handover's
    /// `Msg::Function` and `Msg::Control` as they are encoded: replayed verbatim).
    fn keep(&mut self, kept: serde_json::Value, files: Vec<File>) -> Result<(), String> {
        let tag = |v: &serde_json::Value| v.get("tag").and_then(|t| t.as_str()).map(str::to_string);
        if let Some(part) = kept.get("function") {
            let tag = tag(part).ok_or("a function checkpoint without a tag")?;
            self.theirs.remove(&tag);
            self.ended.remove(&tag);
            match self.functions.iter_mut().find(|f| f.0 == tag) {
                Some(f) => *f = (tag, kept, files),
                None => self.functions.push((tag, kept, files)),
            }
        } else if kept.get("control").is_some() {
            self.control = Some((kept, files));
        } else if let Some(f) = kept.get("forget") {
            let tag = tag(f).ok_or("a forget without a tag")?;
            self.functions.retain(|f| f.0 != tag);
            self.drop_function(&tag);
            self.ended.insert(tag);
        } else if let Some(h) = kept.get("hold") {
            let tag = tag(h).ok_or("a hold without a tag")?;
            let items = h.get("items").and_then(|i| i.as_array()).ok_or("a hold without items")?;
            if items.len() != files.len() {
                return Err(format!("a hold of {} items with {} descriptors", items.len(), files.len()));
            }
            let held = self.held.entry(tag).or_default();
            for (item, file) in items.iter().zip(files) {
                let key = item.get(0).and_then(|k| k.as_u64()).ok_or("a held item without a key")?;
                let what = item.get(1).cloned().ok_or("a held item without what it is")?;
                held.insert(key, (what, Arc::new(file)));
            }
        } else if let Some(l) = kept.get("let") {
            let tag = tag(l).ok_or("a let without a tag")?;
            let keys = l.get("keys").and_then(|k| k.as_array()).ok_or("a let without keys")?;
            let held = self.held.entry(tag.clone()).or_default();
            let adopting = self.adopting.get_mut(&tag);
            let mut absent = Vec::new();
            for k in keys.iter().filter_map(|k| k.as_u64()) {
                if held.remove(&k).is_none() {
                    absent.push(k);
                }
            }
            if let Some(a) = adopting {
                a.extend(absent);
            }
        } else if let Some(a) = kept.get("adopt") {
            let tag = tag(a).ok_or("an adopt without a tag")?;
            self.incomplete.remove(&tag);
            self.own.remove(&tag);
            self.adopting.entry(tag.clone()).or_default();
            if let Some((theirs, complete)) = self.inherited.remove(&tag) {
                self.take_over(tag, theirs, complete);
            }
        } else if let Some(l) = kept.get("let_all") {
            let tag = tag(l).ok_or("a let_all without a tag")?;
            self.held.remove(&tag);
            self.adopting.remove(&tag);
            self.incomplete.remove(&tag);
            self.inherited.remove(&tag);
            self.own.insert(tag);
        } else {
            return Err(format!("an unknown checkpoint: {}", kept.as_object().map_or(0, |o| o.len())));
        }
        Ok(())
    }

    /// Drops the checkpoint of the function whose socket is `path` (its socket file is being
    /// removed: the copy of its lock kept here would stop that).
    fn drop_socket(&mut self, path: &Path) {
        let named = |v: &serde_json::Value, key: &str| {
            v.get("function")
                .and_then(|f| f.get(key))
                .and_then(|p| p.as_str())
                .is_some_and(|p| Path::new(p) == path)
        };
        let gone: Vec<String> = (self.functions.iter())
            .filter(|(_, v, _)| named(v, "path") || named(v, "socket_file"))
            .map(|(t, _, _)| t.clone())
            .collect();
        self.functions.retain(|(_, v, _)| !named(v, "path") && !named(v, "socket_file"));
        for t in gone {
            self.drop_function(&t);
        }
    }

    /// Function `tag` is gone: what is held or inherited for it closes.
    fn drop_function(&mut self, tag: &str) {
        self.held.remove(tag);
        self.adopting.remove(tag);
        self.incomplete.remove(tag);
        self.inherited.remove(tag);
        self.own.remove(tag);
    }

    fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.control.is_none()
    }

    /// The descriptors `old` (the process this one took over from) held for the functions
    /// this one adopts: each that this one neither holds anew nor let go meanwhile; and its
    /// checkpoints of functions this one has not sent yet. The rest of `old`'s close. `complete`: every checkpoint of `old` was read; if not, or if `old`
    /// held nothing for a function adopted, that function's held set is marked incomplete
    /// (a recovery then ends the function rather than lose nodes the guest knows).
    fn adopt(&mut self, old: Checkpoints, complete: bool) {
        for (tag, theirs) in old.held {
            if self.ended.contains(&tag) {
                continue;
            }
            // What the predecessor held may itself miss some (its own predecessor's).
            let complete = complete && !old.incomplete.contains(&tag);
            if self.adopting.contains_key(&tag) {
                self.take_over(tag, theirs, complete);
            } else if !self.own.contains(&tag) {
                // Its `Kept::Adopt` may be on its way still.
                self.inherited.insert(tag, (theirs, complete));
            }
        }
        for (tag, _) in self.adopting.drain() {
            warn!("supervisor: function {tag:?}: the previous process held nothing for it: a crash ends it");
            self.incomplete.insert(tag);
        }
        // Its checkpoints that came after the commit, of functions this one has not sent its
        // own of yet (replacing the ones taken at the commit), and not of functions it ended.
        for f in old.functions {
            if self.ended.contains(&f.0) {
                continue;
            }
            match self.functions.iter_mut().find(|m| m.0 == f.0) {
                Some(m) if self.theirs.contains(&f.0) => *m = f,
                Some(_) => {}
                None => {
                    self.theirs.insert(f.0.clone());
                    self.functions.push(f);
                }
            }
        }
        self.ended.clear();
        if self.control.is_none() {
            self.control = old.control;
        }
    }

    /// A crashed process's store as its recovery is given it: what it inherited and had not
    /// yet said it adopts counts as held (the recovered process gives every descriptor again,
    /// replacing these, and lets go of what it drops).
    fn fold_inherited(&mut self) {
        for (tag, (theirs, complete)) in std::mem::take(&mut self.inherited) {
            if !complete {
                self.incomplete.insert(tag.clone());
            }
            let mine = self.held.entry(tag).or_default();
            for (k, v) in theirs {
                mine.entry(k).or_insert(v);
            }
        }
    }

    /// `theirs` (the predecessor's for `tag`) joins what this process holds for it.
    fn take_over(&mut self, tag: String, theirs: Held, complete: bool) {
        let gone = self.adopting.remove(&tag).unwrap_or_default();
        if !complete {
            self.incomplete.insert(tag.clone());
        }
        let (theirs_n, gone_n) = (theirs.len(), gone.len());
        let mine = self.held.entry(tag.clone()).or_default();
        for (k, v) in theirs {
            if !gone.contains(&k) {
                mine.entry(k).or_insert(v);
            }
        }
        info!(
            "supervisor: function {tag:?}: {theirs_n} descriptor(s) taken over from the previous process \
             ({gone_n} let go meanwhile); {} held",
            mine.len()
        );
    }

    /// New descriptors of everything, to send while these stay for a next crash.
    /// (A shared directory's held descriptors are shared with the replay, not duplicated: a
    /// share may hold most of the supervisor's descriptor budget.)
    fn copy(&self) -> std::io::Result<Vec<(serde_json::Value, ReplayFds)>> {
        let dup = |files: &[File]| -> std::io::Result<Vec<OwnedFd>> {
            files.iter().map(|f| f.try_clone().map(OwnedFd::from)).collect()
        };
        let mut all = Vec::new();
        if let Some((m, f)) = &self.control {
            all.push((m.clone(), ReplayFds { owned: dup(f)?, shared: Vec::new() }));
        }
        for (tag, m, f) in &self.functions {
            let mut m = m.clone();
            let fds = dup(f)?;
            let mut shared = Vec::new();
            // A shared directory's checkpoint: the descriptors held for it go after its own,
            // each named in its backend part.
            let part = m
                .get_mut("function")
                .and_then(|f| f.get_mut("backend"))
                .and_then(|b| b.get_mut("passthrough_kept"))
                .and_then(|p| p.as_object_mut());
            // A process that died before it said it adopts its predecessor's descriptors
            // (it never served the function) is recovered with them.
            let (held, incomplete) = match (self.held.get(tag), self.inherited.get(tag)) {
                (Some(h), _) => (Some(h), self.incomplete.contains(tag)),
                (None, Some((h, complete))) => (Some(h), !complete),
                (None, None) => (None, self.incomplete.contains(tag)),
            };
            if let Some(part) = part {
                let items: Vec<serde_json::Value> = (held.iter().flat_map(|h| h.iter()))
                    .map(|(k, (what, _))| serde_json::json!([k, what]))
                    .collect();
                part.insert("held".into(), serde_json::Value::Array(items));
                if incomplete {
                    part.insert("incomplete".into(), serde_json::Value::Bool(true));
                }
                shared.extend(held.iter().flat_map(|h| h.values()).map(|(_, file)| file.clone()));
            }
            all.push((m, ReplayFds { owned: fds, shared }));
        }
        Ok(all)
    }
}

/// How long the recovering process may take to say hello (it starts and confines itself),
/// and then to build every function.
const REPLAY_BOUND: Duration = Duration::from_secs(30);

/// Replays `parts` to a recovering process at the other end of `chan` (the exchange of a
/// live update, the supervisor in the old process's place).
/// A replayed message's descriptors: its own copies, then those shared with the store.
struct ReplayFds {
    owned: Vec<OwnedFd>,
    shared: Vec<Arc<File>>,
}

fn replay(chan: &Channel, parts: Vec<(serde_json::Value, ReplayFds)>, updates: u64) -> Result<(), String> {
    let err = |e: ChannelError| crate::error_chain(&e);
    match chan.recv::<Msg>(REPLAY_BOUND).map_err(err)? {
        (Msg::Hello { reads, .. }, _) if reads.contains(&STATE_VERSION) => {}
        (Msg::Hello { reads, .. }, _) => {
            return Err(format!("it reads formats {reads:?}, not {STATE_VERSION}"))
        }
        (Msg::Refused { reason }, _) => return Err(reason),
        (other, _) => return Err(format!("expected hello, got {other:?}")),
    }
    for (msg, fds) in &parts {
        let borrowed: Vec<_> =
            fds.owned.iter().map(|f| f.as_fd()).chain(fds.shared.iter().map(|f| f.as_fd())).collect();
        chan.send(msg, &borrowed).map_err(err)?;
    }
    chan.send(&Msg::End { updates, recoveries: 0 }, &[]).map_err(err)?;
    match chan.recv::<Msg>(REPLAY_BOUND).map_err(err)? {
        (Msg::Ready, _) => chan.send(&Msg::Commit, &[]).map_err(err),
        (Msg::Refused { reason }, _) => Err(reason),
        (other, _) => Err(format!("expected ready, got {other:?}")),
    }
}

/// A serving process.
struct Proc {
    pid: u32,
    chan: Arc<Channel>,
    /// Its binary (a process that replaces it after a crash runs the same one).
    binary: PathBuf,
}

/// How long a channel reader waits for a message to begin (a bound the idle channels never
/// reach; each message, once begun, has the channel's own bound).
const IDLE_BOUND: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long an unasked exit waits for the dead process's last checkpoints before the
/// recovery uses what came.
const LAST_CHECKPOINTS_BOUND: Duration = Duration::from_secs(1);
/// How long the rest of a checkpoint that began to arrive may take.
const MESSAGE_BOUND: Duration = Duration::from_secs(30);
/// The most checkpoints read at one wake-up before they are handed on.
const KEPT_BATCH: usize = 4096;
/// How long the checkpoint reader rests after a wake-up before it waits for more (what a
/// burst of messages waits at most for being read; the sender's socket buffer holds it).
const KEPT_COALESCE: Duration = Duration::from_micros(250);
/// Recoveries in a row whose new process did not take over before the supervisor gives up.
const FAILED_IN_A_ROW: u32 = 3;

/// How the supervisor starts serving processes.
pub struct Launch {
    /// Its own binary (the path a package update replaces).
    pub binary: PathBuf,
    /// The arguments the serving process gets (the supervisor's own).
    pub args: Vec<OsString>,
    /// Where other binaries may come from (`--update-binary-dir`), canonical.
    pub binary_dir: Option<PathBuf>,
    /// What this supervisor binds and removes for a confined serving process.
    pub sockets: SocketRules,
    /// The socket systemd's activation gave the supervisor, passed on to every serving process
    /// (inherited, named by [`SUPERVISED_LISTEN_FD`]).
    pub activated: Option<OwnedFd>,
    /// How often a serving process that died is replaced (`--crash-limit`).
    pub crash_limit: CrashLimit,
}

/// The sockets a supervisor binds and removes for its serving process, which, confined, can
/// reach no host path: `create_function`'s (only where `--allow-create sockets=DIR` allows),
/// and, when a function goes, its socket file (one of the command line's, or in those
/// directories; never one a server still holds).
#[derive(Debug, Default)]
pub struct SocketRules {
    /// The command line's and profile's function sockets (canonical directory, name).
    pub functions: Vec<PathBuf>,
    /// `--allow-create`.
    pub allow: Option<AllowCreate>,
    /// `--socket-group`, `--socket-mode`.
    pub access: (Option<u32>, Option<u32>),
}

impl SocketRules {
    /// The sockets of `spec`.
    pub fn of(spec: &crate::settings::DaemonSpec) -> SocketRules {
        let functions = (spec.functions.iter())
            .filter_map(|f| match &f.socket {
                crate::settings::Socket::SocketPath(p) => canonical(p),
                _ => None,
            })
            .collect();
        SocketRules {
            functions,
            allow: spec.defaults.allow_create.clone(),
            access: spec.defaults.socket_access,
        }
    }

    /// Binds `path` for `create_function`: the listener and its lock file, locked.
    fn bind(&self, path: &Path) -> Result<(std::os::unix::net::UnixListener, std::fs::File), String> {
        let allow = self.allow.as_ref().ok_or("create_function is off (no --allow-create)")?;
        let path = allow.socket_path(path)?;
        let (group, mode) = self.access;
        let (listener, files) =
            bind_exclusive_with(&path, SocketAccess { group, mode }).map_err(|e| error_chain(&e))?;
        let (_, lock) = files.into_parts();
        let lock = lock.ok_or("the socket's lock is missing")?;
        Ok((listener, lock))
    }

    /// Removes the socket file at `path` if it is one of the daemon's and nobody serves it.
    fn unlink(&self, path: &Path) -> Result<bool, String> {
        let full = canonical(path).ok_or_else(|| format!("{}: no such directory", path.display()))?;
        let allowed = self.functions.contains(&full)
            || self
                .allow
                .as_ref()
                .is_some_and(|a| full.parent().is_some_and(|d| a.sockets.iter().any(|s| s == d)));
        if !allowed {
            return Err(format!("{}: not a socket of this daemon's", path.display()));
        }
        remove_unserved(&full).map_err(|e| format!("{}: {e}", full.display()))
    }
}

/// `path` with its directory canonical (the name itself is not followed).
fn canonical(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.canonicalize().ok()?,
        _ => std::env::current_dir().ok()?,
    };
    Some(dir.join(name))
}

impl Launch {
    /// The binary a `Spawn` asks for, if allowed.
    fn binary(&self, asked: Option<&Path>) -> Result<PathBuf, String> {
        let Some(p) = asked else { return Ok(self.binary.clone()) };
        let dir = self.binary_dir.as_ref().ok_or_else(|| {
            format!("{}: another binary needs a supervisor started with --update-binary-dir", p.display())
        })?;
        let real = p.canonicalize().map_err(|e| format!("{}: {e}", p.display()))?;
        if !real.starts_with(dir) || !real.is_file() {
            return Err(format!("{}: not a file in --update-binary-dir {}", p.display(), dir.display()));
        }
        Ok(real)
    }

    /// Starts `binary` as a serving process; `peer`: its end of a handover channel.
    fn spawn(
        &self,
        binary: &Path,
        peer: Option<UnixStream>,
        events: &Sender<Event>,
    ) -> std::io::Result<Proc> {
        self.spawn_expecting(binary, peer, None, None, events)
    }

    /// As [`Self::spawn`]; `expect_fds`: the descriptors the process it takes over holds;
    /// `recovering`: it takes over from checkpoints, after this many recoveries.
    fn spawn_expecting(
        &self,
        binary: &Path,
        peer: Option<UnixStream>,
        expect_fds: Option<usize>,
        recovering: Option<u64>,
        events: &Sender<Event>,
    ) -> std::io::Result<Proc> {
        let (mine, theirs) = UnixStream::pair()?;
        sys::set_inherited(&theirs.as_fd(), true)?;
        let mut cmd = Command::new(binary);
        cmd.args(&self.args).env(SUPERVISOR_FD, theirs.as_raw_fd().to_string()).env_remove("NOTIFY_SOCKET");
        // The checkpoint channel, if crashes are recovered from.
        let checkpoints = match self.crash_limit.count {
            0 => None,
            _ => {
                let (mine, theirs) = UnixStream::pair()?;
                sys::set_inherited(&theirs.as_fd(), true)?;
                cmd.env(CHECKPOINT_FD, theirs.as_raw_fd().to_string());
                cmd.env(ADOPTS, "1");
                Some((Channel::new(mine)?, theirs))
            }
        };
        if let Some(n) = recovering {
            cmd.env(RECOVERING, n.to_string());
        }
        if let Some(fd) = &self.activated {
            sys::set_inherited(&fd.as_fd(), true)?;
            cmd.env(SUPERVISED_LISTEN_FD, fd.as_raw_fd().to_string());
        }
        if let Some(p) = &peer {
            sys::set_inherited(&p.as_fd(), true)?;
            cmd.env(TAKEOVER_FD, p.as_raw_fd().to_string());
        }
        if let Some(n) = expect_fds {
            cmd.env(EXPECT_FDS, n.to_string());
        }
        let mut child = cmd.spawn()?;
        drop((theirs, peer));
        let pid = child.id();
        if let Some((chan, theirs)) = checkpoints {
            drop(theirs);
            let tx = events.clone();
            std::thread::Builder::new().name(format!("kept-{pid}")).spawn(move || {
                let mut reader = ReadAhead::new(&chan);
                let read = loop {
                    // Kept as the serving process wrote them (JSON as it is: a newer binary's
                    // fields are not dropped), replayed verbatim. Every message already there
                    // is read at one wake-up and handed on as one event, and the next
                    // wake-up waits a little: a share making nodes sends a message per node,
                    // and a wake-up each would take the cores its pollers spin on.
                    let mut batch = Vec::new();
                    let mut bound = IDLE_BOUND;
                    let end = loop {
                        match reader.recv::<serde_json::Value>(bound) {
                            Ok(k) => batch.push(k),
                            Err(ChannelError::Closed) => break Some(true),
                            Err(e) => {
                                error!(
                                    "supervisor: the checkpoints of process {pid} cannot be read ({}): \
                                     a crash of it will not be recovered",
                                    error_chain(&e)
                                );
                                break Some(false);
                            }
                        }
                        bound = MESSAGE_BOUND;
                        if batch.len() >= KEPT_BATCH || !reader.more() {
                            break None;
                        }
                    };
                    if !batch.is_empty() && tx.send(Event::Kept(pid, batch)).is_err() {
                        return;
                    }
                    if let Some(read) = end {
                        break read;
                    }
                    std::thread::sleep(KEPT_COALESCE);
                };
                let _ = tx.send(Event::KeptClosed(pid, read));
            })?;
        }
        let tx = events.clone();
        std::thread::Builder::new().name(format!("wait-{pid}")).spawn(move || {
            let status = child.wait().unwrap_or_else(|_| ExitStatus::from_raw(1 << 8));
            let _ = tx.send(Event::Exited(pid, status));
        })?;
        let chan = Arc::new(Channel::new(mine)?);
        let (c, tx) = (chan.clone(), events.clone());
        std::thread::Builder::new().name(format!("chan-{pid}")).spawn(move || loop {
            match c.recv::<SupervisorMsg>(IDLE_BOUND) {
                Ok((m, _)) => {
                    if tx.send(Event::Msg(pid, m)).is_err() {
                        return;
                    }
                }
                Err(ChannelError::Timeout(_)) => {}
                Err(ChannelError::Closed) => return,
                Err(e) => {
                    warn!("supervisor: process {pid}: {}", error_chain(&e));
                    return;
                }
            }
        })?;
        info!("supervisor: started serving process {pid} ({})", binary.display());
        Ok(Proc { pid, chan, binary: binary.to_path_buf() })
    }
}

/// Runs the supervisor until the serving process ends; its exit status.
pub fn run(launch: Launch) -> ExitCode {
    let (tx, events) = channel();
    // The checkpoints it keeps hold every function's descriptors (two sets during a
    // recovery): the soft limit of open files goes up to the hard one.
    match sys::nofile_limit() {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = sys::set_nofile_limit(hard, hard) {
                warn!("supervisor: cannot raise the open files limit from {soft} to {hard}: {e}");
            }
        }
        Ok(_) => {}
        Err(e) => warn!("supervisor: cannot read the open files limit: {e}"),
    }
    let notifier = match Notifier::from_env() {
        Ok(n) => n,
        Err(e) => {
            error!("{}", error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGUSR1, SIGHUP]);
    let mut signals = match signals {
        Ok(s) => s,
        Err(e) => {
            error!("supervisor: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stx = tx.clone();
    let _ = std::thread::Builder::new().name("signals".into()).spawn(move || {
        for s in signals.forever() {
            if stx.send(Event::Signal(s)).is_err() {
                return;
            }
        }
    });
    let mut current = match launch.spawn(&launch.binary, None, &tx) {
        Ok(p) => p,
        Err(e) => {
            error!("supervisor: cannot start {}: {e}", launch.binary.display());
            return ExitCode::FAILURE;
        }
    };
    let mut pending: Option<Proc> = None;
    let (mut ready, mut stopping, mut updates) = (false, false, 0u64);
    // Crash recovery: each serving process's newest checkpoints, and the recoveries' state.
    let mut kept: HashMap<u32, Checkpoints> = HashMap::new();
    // Processes that handed over to a new one (old -> new) whose held descriptors go over
    // once every checkpoint of theirs is read (their channel closed).
    let mut handed: HashMap<u32, u32> = HashMap::new();
    let mut rec = Recovery::default();
    loop {
        // While a dead process's last checkpoints may still be on their way, wait for them a
        // bounded time.
        let ev = match &rec.dying {
            Some(d) => match events.recv_timeout(LAST_CHECKPOINTS_BOUND.saturating_sub(d.since.elapsed())) {
                Ok(ev) => ev,
                Err(mpsc::RecvTimeoutError::Timeout) => Event::KeptClosed(d.pid, true),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
            None => match events.recv() {
                Ok(ev) => ev,
                Err(_) => break,
            },
        };
        match ev {
            Event::Kept(pid, batch) => {
                let live = pid == current.pid
                    || pending.as_ref().is_some_and(|p| p.pid == pid)
                    || handed.contains_key(&pid);
                if !live {
                    continue; // a process that is gone: its descriptors close here
                }
                let mine = kept.entry(pid).or_default();
                for (k, files) in batch {
                    if let Err(e) = mine.keep(k, files) {
                        warn!("supervisor: a checkpoint of process {pid} not kept: {e}");
                    }
                }
            }
            Event::KeptClosed(pid, read) => {
                if !read {
                    // What came may miss later changes (a window mapped since): not used.
                    kept.remove(&pid);
                    rec.unreadable.insert(pid);
                }
                // Only a process still known (a dead one's id may be another's later).
                let known = pid == current.pid
                    || pending.as_ref().is_some_and(|p| p.pid == pid)
                    || handed.contains_key(&pid)
                    || rec.dying.as_ref().is_some_and(|d| d.pid == pid);
                if !known {
                    kept.remove(&pid);
                    continue;
                }
                rec.closed.insert(pid);
                if let Some(new) = handed.remove(&pid) {
                    // Every checkpoint of a process that handed over is in: its held
                    // descriptors go to its successor.
                    let old = kept.remove(&pid).unwrap_or_default();
                    kept.entry(new).or_default().adopt(old, read);
                    rec.forget(pid);
                    // The successor's recovery waited for them.
                    match &rec.dying {
                        Some(d) if d.pid == new && rec.closed.contains(&new) => {
                            let read = !rec.unreadable.contains(&new);
                            let _ = tx.send(Event::KeptClosed(new, read));
                        }
                        _ => {}
                    }
                    continue;
                }
                if let Some(d) = rec.dying.as_ref().filter(|d| d.pid == pid) {
                    if let Some((&old, _)) = handed.iter().find(|(_, &n)| n == pid) {
                        if d.since.elapsed() < LAST_CHECKPOINTS_BOUND {
                            continue; // its predecessor's held descriptors first
                        }
                        error!(
                            "supervisor: the checkpoints of process {old}, which handed over to {pid}, did not \
                             all come: the descriptors it held are not recovered"
                        );
                        handed.remove(&old);
                        let o = kept.remove(&old).unwrap_or_default();
                        kept.entry(pid).or_default().adopt(o, false);
                    }
                }
                if let Some(d) = rec.dying.take_if(|d| d.pid == pid) {
                    if stopping {
                        return exit_code(d.status);
                    }
                    if rec.unreadable.contains(&pid) {
                        error!(
                            "supervisor: the serving process {pid} ended ({}) unasked; its checkpoints could not \
                             be read: not recovering; the daemon ends",
                            d.status
                        );
                        return exit_code(rec.status_of(pid, d.status));
                    }
                    let mut store = kept.remove(&pid).unwrap_or_default();
                    store.fold_inherited();
                    rec.forget(pid);
                    match rec.recover(&launch, d, store, updates, &tx) {
                        Ok((p, store)) => {
                            kept.insert(p.pid, store);
                            current = p;
                        }
                        Err(code) => return code,
                    }
                }
            }
            Event::Replayed(pid, result) => {
                let Some((at, since)) = rec.replaying.take() else { continue };
                if at != pid {
                    rec.replaying = Some((at, since));
                    continue;
                }
                match result {
                    Ok(()) => {
                        rec.failed_in_a_row = 0;
                        info!(
                            "supervisor: recovery {}: process {pid} took every function over in {:.1} ms",
                            rec.recoveries,
                            since.elapsed().as_secs_f64() * 1e3
                        );
                    }
                    Err(why) => {
                        rec.failed_in_a_row += 1;
                        error!(
                            "supervisor: recovery {}: process {pid} did not take over: {why}",
                            rec.recoveries
                        );
                        // Only while it runs (its exit not seen: its id is not another's yet).
                        if pid == current.pid && rec.dying.is_none() {
                            rec.killed.insert(pid);
                            let _ = sys::signal_process(pid, SIGKILL);
                        }
                    }
                }
            }
            Event::Exited(pid, status)
                if pid == current.pid && !stopping && launch.crash_limit.count > 0 && rec.dying.is_none() =>
            {
                if let Some(p) = pending.take() {
                    let _ = sys::signal_process(p.pid, SIGKILL);
                }
                // A recovering process that died before it took over: a failed recovery.
                if rec.replaying.take_if(|r| r.0 == pid).is_some() {
                    rec.failed_in_a_row += 1;
                }
                // Only a process that served (said ready, or kept a checkpoint) is replaced: one
                // that failed to start fails the daemon, as before.
                let served = rec.ready.contains(&pid) || kept.get(&pid).is_some_and(|k| !k.is_empty());
                if !served {
                    error!("supervisor: the serving process {pid} ended ({status}) before it served; the daemon ends");
                    return exit_code(rec.status_of(pid, status));
                }
                let d = Dying { pid, status, since: Instant::now(), binary: current.binary.clone() };
                if rec.closed.contains(&pid) {
                    // Every checkpoint it sent has come: recover now.
                    let read = !rec.unreadable.contains(&pid);
                    let _ = tx.send(Event::KeptClosed(pid, read));
                }
                rec.dying = Some(d);
            }
            Event::Msg(pid, SupervisorMsg::Ready) if pid == current.pid => {
                rec.ready.insert(pid);
                if !ready {
                    ready = true;
                    if let Some(n) = &notifier {
                        match n.notify(&format!("READY=1\nMAINPID={}", std::process::id())) {
                            Ok(()) => info!("told the service manager READY=1"),
                            Err(e) => warn!("{}", error_chain(&e)),
                        }
                    }
                }
            }
            Event::Msg(pid, SupervisorMsg::Spawn { binary }) if pid == current.pid => {
                let answer = if pending.is_some() {
                    Err("an update is under way already".to_string())
                } else if !handed.is_empty() {
                    Err("the previous update's hand-over is not done yet".to_string())
                } else {
                    launch.binary(binary.as_deref()).and_then(|b| {
                        let (old_end, new_end) = UnixStream::pair().map_err(|e| e.to_string())?;
                        // What the new process will receive, about: the old one's descriptors.
                        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).ok();
                        let p = launch
                            .spawn_expecting(&b, Some(new_end), fds, None, &tx)
                            .map_err(|e| format!("{}: {e}", b.display()))?;
                        Ok((p, old_end))
                    })
                };
                let sent = match answer {
                    Ok((p, old_end)) => {
                        let r = current.chan.send(&SupervisorMsg::Spawned { pid: p.pid }, &[old_end.as_fd()]);
                        pending = Some(p);
                        r
                    }
                    Err(reason) => {
                        warn!("supervisor: update refused: {reason}");
                        current.chan.send(&SupervisorMsg::SpawnFailed { reason }, &[])
                    }
                };
                if let Err(e) = sent {
                    warn!("supervisor: cannot answer process {}: {}", current.pid, error_chain(&e));
                }
            }
            Event::Msg(pid, SupervisorMsg::Committed { pid: new }) if pid == current.pid => {
                match pending.take() {
                    Some(p) if p.pid == new => {
                        updates += 1;
                        info!("supervisor: update {updates}: process {new} serves; {pid} exits");
                        // The new process's checkpoints, and the old one's of functions it has
                        // not sent yet (its servers send theirs as they start).
                        if let Some(old) = kept.get_mut(&pid) {
                            let (functions, control) =
                                (std::mem::take(&mut old.functions), old.control.take());
                            let mine = kept.entry(new).or_default();
                            for f in functions {
                                if !mine.functions.iter().any(|m| m.0 == f.0) {
                                    mine.theirs.insert(f.0.clone());
                                    mine.functions.push(f);
                                }
                            }
                            if mine.control.is_none() {
                                mine.control = control;
                            }
                        }
                        // Its held descriptors go over once all it sent is read (it closed
                        // its checkpoint channel before it said this).
                        if rec.closed.contains(&pid) {
                            let read = !rec.unreadable.contains(&pid);
                            let old = kept.remove(&pid).unwrap_or_default();
                            kept.entry(new).or_default().adopt(old, read);
                        } else {
                            handed.insert(pid, new);
                        }
                        current = p;
                    }
                    other => {
                        warn!("supervisor: process {pid} says {new} took over, which it did not start");
                        pending = other;
                    }
                }
            }
            Event::Msg(pid, SupervisorMsg::Bind { path }) if pid == current.pid => {
                let sent = match launch.sockets.bind(&path) {
                    Ok((listener, lock)) => {
                        info!("supervisor: bound {} for process {pid}", path.display());
                        let r = current.chan.send(&SupervisorMsg::Bound, &[listener.as_fd(), lock.as_fd()]);
                        if r.is_err() {
                            let _ = std::fs::remove_file(&path);
                        }
                        r
                    }
                    Err(reason) => {
                        warn!("supervisor: not binding {} for process {pid}: {reason}", path.display());
                        current.chan.send(&SupervisorMsg::BindFailed { reason }, &[])
                    }
                };
                if let Err(e) = sent {
                    warn!("supervisor: cannot answer process {}: {}", current.pid, error_chain(&e));
                }
            }
            Event::Msg(pid, SupervisorMsg::Unlink { path }) if pid == current.pid => {
                // The function is gone: its checkpoint (and the copy of its lock) goes first,
                // whichever of the two channels told of it first.
                if let Some(k) = kept.get_mut(&pid) {
                    k.drop_socket(&path);
                }
                match launch.sockets.unlink(&path) {
                    Ok(true) => info!("supervisor: removed the socket file {}", path.display()),
                    Ok(false) => {}
                    Err(e) => warn!("supervisor: not removing {}: {e}", path.display()),
                }
            }
            Event::Msg(pid, SupervisorMsg::Abandon { pid: new }) if pid == current.pid => {
                if let Some(p) = pending.take_if(|p| p.pid == new) {
                    info!("supervisor: update to process {new} called off; ending it");
                    let _ = sys::signal_process(p.pid, SIGKILL);
                }
            }
            Event::Msg(pid, m) => {
                if pending.as_ref().is_none_or(|p| p.pid != pid) || !matches!(m, SupervisorMsg::Ready) {
                    warn!("supervisor: ignored {m:?} from process {pid}");
                }
            }
            Event::Exited(pid, status) if pid == current.pid => {
                if !stopping {
                    error!("supervisor: the serving process {pid} ended ({status}) unasked; the daemon ends");
                }
                if let Some(p) = pending.take() {
                    let _ = sys::signal_process(p.pid, SIGKILL);
                }
                return exit_code(rec.status_of(pid, status));
            }
            Event::Exited(pid, status) => {
                if !handed.contains_key(&pid) {
                    kept.remove(&pid);
                    rec.forget(pid);
                }
                if pending.as_ref().is_some_and(|p| p.pid == pid) {
                    pending = None;
                    warn!("supervisor: the new process {pid} ended ({status}) before taking over");
                } else {
                    info!("supervisor: process {pid} ended ({status})");
                }
            }
            Event::Signal(sig) => {
                stopping |= sig == SIGTERM || sig == SIGINT;
                if rec.dying.is_some() {
                    // The serving process is gone (its id may be another's now); SIGTERM and
                    // SIGINT end the daemon once its checkpoints are in, others are dropped.
                    info!("supervisor: signal {sig} while the serving process is replaced: not forwarded");
                    continue;
                }
                if let Err(e) = sys::signal_process(current.pid, sig) {
                    warn!("supervisor: cannot signal process {}: {e}", current.pid);
                }
            }
        }
    }
    ExitCode::FAILURE
}

/// A serving process that died unasked, waiting for its last checkpoints.
struct Dying {
    pid: u32,
    status: ExitStatus,
    since: Instant,
    binary: PathBuf,
}

/// What the supervisor knows of crash recoveries.
#[derive(Default)]
struct Recovery {
    /// When the recent ones were (for `--crash-limit`).
    crashes: std::collections::VecDeque<Instant>,
    /// Recoveries so far.
    recoveries: u64,
    /// Recoveries in a row whose new process did not take over.
    failed_in_a_row: u32,
    /// The recovering process and since when.
    replaying: Option<(u32, Instant)>,
    /// A dead process waiting for its checkpoint channel's end.
    dying: Option<Dying>,
    /// Processes whose checkpoint channel ended.
    closed: std::collections::HashSet<u32>,
    /// Processes that said they serve.
    ready: std::collections::HashSet<u32>,
    /// Recovering processes the supervisor killed (they did not take over).
    killed: std::collections::HashSet<u32>,
    /// Processes whose checkpoints could not be read to their end.
    unreadable: std::collections::HashSet<u32>,
    /// The status of the last crash that was not the supervisor's own kill.
    crash_status: Option<ExitStatus>,
}

impl Recovery {
    /// Forgets process `pid` (gone: its id may be reused).
    fn forget(&mut self, pid: u32) {
        self.closed.remove(&pid);
        self.ready.remove(&pid);
        self.unreadable.remove(&pid);
    }

    /// The status to report for `pid`'s end: a crash's own, or, for a recovering process the
    /// supervisor killed, the crash it was recovering from.
    fn status_of(&self, pid: u32, status: ExitStatus) -> ExitStatus {
        match self.crash_status {
            Some(s) if self.killed.contains(&pid) => s,
            _ => status,
        }
    }

    /// Starts a process that takes over from `store` (the dead process's checkpoints), unless
    /// the limits say to give up (the daemon's exit code then); the process and the store
    /// (kept for it until it sends its own).
    fn recover(
        &mut self,
        launch: &Launch,
        d: Dying,
        store: Checkpoints,
        updates: u64,
        tx: &Sender<Event>,
    ) -> Result<(Proc, Checkpoints), ExitCode> {
        let status = self.status_of(d.pid, d.status);
        if !self.killed.remove(&d.pid) {
            self.crash_status = Some(d.status);
        }
        let now = Instant::now();
        if self.failed_in_a_row >= FAILED_IN_A_ROW || !launch.crash_limit.allows(&mut self.crashes, now) {
            error!(
                "supervisor: the serving process {} ended ({}) unasked; {} recoveries in {:?}, {} failed in a row: \
                 not recovering again; the daemon ends and its functions with it",
                d.pid,
                d.status,
                self.crashes.len(),
                launch.crash_limit.within,
                self.failed_in_a_row
            );
            return Err(exit_code(status));
        }
        self.crashes.push_back(now);
        self.recoveries += 1;
        let n = self.recoveries;
        error!(
            "supervisor: the serving process {} ended ({}) unasked; recovery {n}: starting a new one for {} \
             function(s), {:.1} ms after the exit was seen",
            d.pid,
            d.status,
            store.functions.len(),
            d.since.elapsed().as_secs_f64() * 1e3
        );
        let started = store.copy().and_then(|parts| {
            let (old_end, new_end) = UnixStream::pair()?;
            let chan = Channel::new(old_end)?;
            let p = launch.spawn_expecting(&d.binary, Some(new_end), None, Some(n - 1), tx)?;
            Ok((p, chan, parts))
        });
        let (p, chan, parts) = match started {
            Ok(s) => s,
            Err(e) => {
                error!("supervisor: recovery {n}: cannot start a process: {e}; the daemon ends");
                return Err(exit_code(status));
            }
        };
        let (new, ttx) = (p.pid, tx.clone());
        let _ = std::thread::Builder::new().name(format!("replay-{new}")).spawn(move || {
            let r = replay(&chan, parts, updates);
            let _ = ttx.send(Event::Replayed(new, r));
        });
        self.replaying = Some((new, d.since));
        Ok((p, store))
    }
}

/// The serving process's exit status as the supervisor's.
fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(c: &mut Checkpoints, tag: &str, keys: &[u64]) {
        let items: Vec<_> =
            keys.iter().map(|k| serde_json::json!([k, {"node": {"key": [1, 2, 3], "kind": 0}}])).collect();
        let files = keys.iter().map(|_| tempfile::tempfile().unwrap()).collect();
        c.keep(serde_json::json!({"hold": {"tag": tag, "items": items}}), files).unwrap();
    }

    fn keys(c: &Checkpoints, tag: &str) -> Vec<u64> {
        c.held.get(tag).map(|h| h.keys().copied().collect()).unwrap_or_default()
    }

    /// A live update's successor takes over its predecessor's held descriptors for the
    /// functions it adopts: less those it let go before they came over, its own newer ones
    /// kept; a function it did not adopt gets none; a predecessor not read to its end, or one
    /// that held nothing for an adopted function, leaves that function marked incomplete
    /// (replayed as such).
    #[test]
    fn a_successor_adopts_what_its_predecessor_held() {
        let mut old = Checkpoints::default();
        hold(&mut old, "a", &[1, 2, 3, 4]);
        hold(&mut old, "b", &[7]);
        hold(&mut old, "d", &[5, 6]);
        hold(&mut old, "e", &[8]);
        let mut new = Checkpoints::default();
        new.keep(serde_json::json!({"adopt": {"tag": "a"}}), Vec::new()).unwrap();
        new.keep(serde_json::json!({"adopt": {"tag": "c"}}), Vec::new()).unwrap();
        new.keep(serde_json::json!({"let_all": {"tag": "e"}}), Vec::new()).unwrap();
        // Before the predecessor's descriptors come: a node of its let go, one made anew.
        new.keep(serde_json::json!({"let": {"tag": "a", "keys": [2]}}), Vec::new()).unwrap();
        hold(&mut new, "a", &[9]);
        new.adopt(old, true);
        assert_eq!(keys(&new, "a"), [1, 3, 4, 9]);
        assert!(keys(&new, "b").is_empty(), "not adopted (yet)");
        assert!(!new.incomplete.contains("a"));
        assert!(new.incomplete.contains("c"), "adopted, but the predecessor held nothing for it");
        assert!(!new.inherited.contains_key("e"), "a function it gives its own for keeps nothing of them");
        // After: lets apply as usual.
        new.keep(serde_json::json!({"let": {"tag": "a", "keys": [1]}}), Vec::new()).unwrap();
        assert_eq!(keys(&new, "a"), [3, 4, 9]);
        // An adopt that comes after the predecessor's descriptors takes them then.
        new.keep(serde_json::json!({"adopt": {"tag": "d"}}), Vec::new()).unwrap();
        assert_eq!(keys(&new, "d"), [5, 6]);
        new.keep(serde_json::json!({"let_all": {"tag": "b"}}), Vec::new()).unwrap();
        assert!(new.inherited.is_empty(), "a function given anew drops what was inherited");

        let mut partial = Checkpoints::default();
        partial.keep(serde_json::json!({"adopt": {"tag": "a"}}), Vec::new()).unwrap();
        let mut old = Checkpoints::default();
        hold(&mut old, "a", &[1]);
        partial.adopt(old, false);
        assert!(partial.incomplete.contains("a"), "the predecessor was not read to its end");
        partial.functions.push((
            "a".into(),
            serde_json::json!({"function": {"tag": "a", "backend": {"passthrough_kept": {"held": []}}}}),
            Vec::new(),
        ));
        let copy = partial.copy().unwrap();
        assert_eq!(copy[0].0["function"]["backend"]["passthrough_kept"]["incomplete"], true);
        assert_eq!(copy[0].1.shared.len(), 1);

        // A second update: what was incomplete stays so, read to its end or not.
        let mut next = Checkpoints::default();
        next.keep(serde_json::json!({"adopt": {"tag": "a"}}), Vec::new()).unwrap();
        next.adopt(partial, true);
        assert!(next.incomplete.contains("a"), "its predecessor's set was incomplete");

        // A process that died before it said it adopts: recovered with what it inherited.
        let mut old = Checkpoints::default();
        hold(&mut old, "f", &[1, 2]);
        let mut early = Checkpoints::default();
        early.adopt(old, true);
        early.functions.push((
            "f".into(),
            serde_json::json!({"function": {"tag": "f", "backend": {"passthrough_kept": {"held": []}}}}),
            Vec::new(),
        ));
        let copy = early.copy().unwrap();
        let part = &copy[0].0["function"]["backend"]["passthrough_kept"];
        assert_eq!(part["held"].as_array().map(|a| a.len()), Some(2), "{part}");
        assert!(part.get("incomplete").is_none());
        assert_eq!(copy[0].1.shared.len(), 2);
        // Its recovery's store holds them (given again by the recovered process, replacing).
        early.fold_inherited();
        assert_eq!(keys(&early, "f"), [1, 2]);
        assert!(early.inherited.is_empty());
    }

    /// The predecessor's checkpoints read after the commit replace those taken at the commit
    /// until the successor sends its own; a function the successor ended does not come back.
    #[test]
    fn late_checkpoints_of_the_predecessor_replace_those_taken_at_the_commit() {
        let f = |tag: &str, n: u64| serde_json::json!({"function": {"tag": tag, "n": n}});
        let mut new = Checkpoints::default();
        // Taken at the commit.
        new.functions.push(("a".into(), f("a", 1), Vec::new()));
        new.functions.push(("b".into(), f("b", 1), Vec::new()));
        new.functions.push(("c".into(), f("c", 1), Vec::new()));
        new.theirs.extend(["a".to_string(), "b".to_string(), "c".to_string()]);
        // The successor's own of b, and it ends c.
        new.keep(f("b", 9), Vec::new()).unwrap();
        new.keep(serde_json::json!({"forget": {"tag": "c"}}), Vec::new()).unwrap();
        let mut old = Checkpoints::default();
        for t in ["a", "b", "c"] {
            old.keep(f(t, 2), Vec::new()).unwrap();
        }
        hold(&mut old, "c", &[1]);
        new.adopt(old, true);
        let n = |t: &str| new.functions.iter().find(|m| m.0 == t).map(|m| m.1["function"]["n"].as_u64());
        assert_eq!(n("a"), Some(Some(2)), "the predecessor's later one");
        assert_eq!(n("b"), Some(Some(9)), "the successor's own");
        assert_eq!(n("c"), None, "ended by the successor");
        assert!(new.inherited.is_empty() && keys(&new, "c").is_empty());
    }

    /// What the supervisor binds and removes for a confined serving process: a socket in the
    /// allowed directory only; a removal only of one of the daemon's sockets, only while no
    /// server holds its lock, never anything else.
    #[test]
    fn the_supervisor_binds_and_removes_only_the_daemons_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let socks = dir.path().join("socks");
        std::fs::create_dir(&socks).unwrap();
        let arg = format!("sockets={}", socks.display());
        let allow = AllowCreate::from_args(&[arg]).unwrap();
        let fixed = dir.path().join("fixed.sock");
        let rules = SocketRules { functions: vec![canonical(&fixed).unwrap()], allow, access: (None, None) };

        let outside = dir.path().join("outside.sock");
        assert!(rules.bind(&outside).unwrap_err().contains("not allowed"));
        assert!(!outside.exists());
        let made = socks.join("made.sock");
        let (listener, lock) = rules.bind(&made).unwrap();
        // Held (the lock is open): not removed.
        assert_eq!(rules.unlink(&made), Ok(false));
        assert!(made.exists());
        drop((listener, lock));
        assert_eq!(rules.unlink(&made), Ok(true));
        assert!(!made.exists());
        // Not one of the daemon's: refused, whatever it is.
        let other = dir.path().join("other.sock");
        let _l = std::os::unix::net::UnixListener::bind(&other).unwrap();
        assert!(rules.unlink(&other).unwrap_err().contains("not a socket of this daemon"));
        assert!(other.exists());
        // One of the daemon's that is not a socket: left alone.
        std::fs::write(&fixed, b"a file").unwrap();
        assert_eq!(rules.unlink(&fixed), Ok(false));
        assert!(fixed.exists());
    }
}
