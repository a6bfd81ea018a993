//! The control socket: JSON-RPC 2.0 on a unix stream socket, one JSON object (or batch array)
//! per line each way, with SPDK's style of method names:
//!
//! | method | params | result |
//! |---|---|---|
//! | `get_device` | `{"tag"}` or none | the effective configuration, the client's state, uptime |
//! | `get_stats` | `{"tag"}` or none | `{"uptime_s", "interval_s", "device": DeviceStats, "fuse": FuseStats}`, the device's counters since the last `reset_stats` |
//! | `reset_stats` | `{"tag"}` or none | `true`; the device's counters and histograms start again from zero |
//! | `set_log_level` | `{"level": "off"\|"error"\|"warn"\|"info"\|"debug"\|"trace"}` | the previous level |
//! | `rpc_get_methods` | none | the method names |
//! | `create_function` | `{"socket_path", "tag", ...}` (any key of a `[[function]]` table) | the new function ([`crate::functions::FunctionInfo`]) |
//! | `delete_function` | `{"tag"}` | `{"tag", "requests", "removed"}` once it is gone (below) |
//! | `list_functions` | none | every function ([`crate::functions::FunctionInfo`]) |
//!
//! `get_device`, `get_stats` and `reset_stats` take an optional `{"tag"}` (default: the first
//! function; `reset_stats`: every function).
//!
//! `delete_function` answers once the function is gone, which may take up to its
//! `remove_timeout_ms`: its client is asked to let the device go (the device-request
//! interrupt, which QEMU turns into a hot-unplug request to the guest) and is served until it
//! does. `"removed"` says how it went: `"client released it"`, `"timed out"` (the client was
//! disconnected at the bound), `"client takes no removal request: disconnected"` or
//! `"no client"`. The wait blocks nothing else: the removal runs on a thread of its own, this
//! socket goes on answering every other request (of this client too: responses carry the
//! request's `id` and may come out of order; a batch holding a `delete_function` is answered as
//! a whole once all of it is done), and `list_functions` shows the function with `"state":
//! "removing"` meanwhile.
//!
//! It runs on a thread of its own and reads the device's statistics as data: the pollers'
//! single-writer counters and the state the control plane publishes
//! ([`virtiofs_device::stats`]); it shares no lock with them and sends them nothing. A reset is
//! a baseline kept here ([`DeviceStats::since`]); the FUSE side's counters are not reset.
//! Malformed input gets a JSON-RPC error (parse error, invalid request, unknown method, invalid
//! params); a line longer than [`MAX_LINE`] ends the connection after an error; at most
//! [`MAX_CONNECTIONS`] clients at once.
//!
//! Who may connect ([`ControlAccess`]): the socket file is the daemon's uid's, with its own
//! group and mode (`--control-socket-group`, `--control-socket-mode`; default mode 0600, the
//! group left alone), not the vfio-user sockets'. Each accepted client's credentials
//! (`SO_PEERCRED`) are checked as well ([`peer_allowed`]): root, the daemon's uid, or a member
//! of the control group (its primary gid, or a supplementary group read from
//! `/proc/PID/status`); anyone else gets a `permission denied` error and is disconnected.

use std::collections::HashMap;
use std::os::unix::net::UnixListener as StdListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, LevelFilter};
use mio::Waker;
use serde_json::{json, Value};
use virtiofs_device::stats::DeviceStats;
use virtiofs_device::vfio_user::StopHandle;

use crate::functions::{FunctionError, FunctionSet};

mod access;
mod client;
mod serve;

pub use access::{peer_allowed, status_groups, ControlAccess, PeerCred, DEFAULT_MODE};
pub use client::{ClientError, ControlClient};
pub use serve::{EVICTABLE_AFTER, OUTPUT_HIGH};
use virtiofs_device::vfio_user::socket_file::{bind_exclusive_with, BindError, SocketAccess, SocketFiles};

/// Longest request line accepted, in bytes.
pub const MAX_LINE: usize = 1 << 20;
/// Most clients served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Most requests in one batch.
pub const MAX_BATCH: usize = 64;
/// Most requests worked on by threads of their own at once (creations and removals).
pub const MAX_JOBS: usize = 8;
/// A client that sends nothing and reads nothing for this long is dropped.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the control socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ControlSocketError {
    /// The socket could not be bound: a live daemon serves it, something else is in the way,
    /// or a system call failed.
    #[error("control socket")]
    Bind(#[from] BindError),
    /// The event loop or its thread could not be set up.
    #[error("control socket {path}: cannot start")]
    Setup {
        /// The socket's path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A JSON-RPC error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The line is not JSON (-32700).
    #[error("Parse error: {0}")]
    Parse(String),
    /// Not a JSON-RPC 2.0 request object (-32600).
    #[error("Invalid Request: {0}")]
    InvalidRequest(String),
    /// No such method (-32601).
    #[error("Method not found: {0}")]
    MethodNotFound(String),
    /// The method's parameters are wrong (-32602).
    #[error("Invalid params: {0}")]
    InvalidParams(String),
    /// The method failed for a reason of the daemon's (-32000): a function's socket or backend
    /// could not be set up, or the daemon cannot make functions.
    #[error("Server error: {0}")]
    Server(String),
    /// The client may not use the control socket (-32001).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
}

impl RpcError {
    /// The JSON-RPC error code.
    pub fn code(&self) -> i64 {
        match self {
            RpcError::Parse(_) => -32700,
            RpcError::InvalidRequest(_) => -32600,
            RpcError::MethodNotFound(_) => -32601,
            RpcError::InvalidParams(_) => -32602,
            RpcError::Server(_) => -32000,
            RpcError::PermissionDenied(_) => -32001,
        }
    }

    fn to_json(&self, id: Value) -> Value {
        json!({"jsonrpc": "2.0", "error": {"code": self.code(), "message": self.to_string()}, "id": id})
    }
}

/// What the control socket serves: the daemon's functions and what it knows of itself.
pub struct ControlState {
    /// The functions (statistics, client state; created and removed here).
    pub functions: Arc<FunctionSet>,
    /// What the daemon says of itself ([`crate::settings::DaemonSpec::describe`]); `get_device`
    /// adds it to the function's spec.
    pub config: Value,
    /// When the daemon started.
    pub started: Instant,
    /// Live updates (`None`: the daemon runs without a supervisor).
    pub updater: Option<Arc<crate::update::Updater>>,
}

/// The methods and the reset baselines (per function tag).
struct Methods {
    state: ControlState,
    baselines: HashMap<String, (DeviceStats, Instant)>,
}

/// A method's work that may take long (a function's removal): run on a thread of its own.
type Job = Box<dyn FnOnce() -> Result<Value, RpcError> + Send>;

/// What a method gives: its result, or the work that will make it.
enum Outcome {
    Now(Value),
    Later(Job),
}

/// The answer to one request object: a response now (`None` for a notification), or later.
enum Answer {
    Now(Option<Value>),
    /// The request's `id` (`None`: a notification) and the work that makes its result.
    Later(Option<Value>, Job),
}

/// The response line to one request line, or its parts still being worked on.
struct LineAnswer {
    /// One slot per request of the line (a single request: one slot).
    slots: Vec<Option<Value>>,
    /// The slots whose result a job makes.
    jobs: Vec<(usize, Option<Value>, Job)>,
    /// The line was a batch (its response is an array).
    batch: bool,
}

impl LineAnswer {
    fn now(response: Option<Value>) -> Self {
        LineAnswer { slots: vec![response], jobs: Vec::new(), batch: false }
    }

    /// The response line, once every slot is filled (`None`: nothing to send).
    fn text(self) -> Option<String> {
        if self.batch {
            let out: Vec<Value> = self.slots.into_iter().flatten().collect();
            (!out.is_empty()).then(|| Value::Array(out).to_string())
        } else {
            self.slots.into_iter().next().flatten().map(|v| v.to_string())
        }
    }
}

/// The method names.
pub const METHODS: [&str; 9] = [
    "get_device",
    "get_stats",
    "reset_stats",
    "set_log_level",
    "rpc_get_methods",
    "create_function",
    "delete_function",
    "list_functions",
    "live_update",
];

/// The `binary` of `live_update`'s `params` (`None`: the supervisor's own), refusing other
/// keys.
fn binary_param(params: &Value) -> Result<Option<PathBuf>, RpcError> {
    let bad = || RpcError::InvalidParams("expected {} or {\"binary\": PATH}".into());
    match params {
        Value::Null => Ok(None),
        Value::Object(m) if m.is_empty() => Ok(None),
        Value::Object(m) if m.len() == 1 => match m.get("binary") {
            Some(Value::String(p)) if !p.is_empty() => Ok(Some(PathBuf::from(p))),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The `tag` of `params` (`None`: none given, the first function), refusing other keys.
fn tag_param(params: &Value) -> Result<Option<String>, RpcError> {
    match params {
        Value::Object(m) => {
            if let Some(k) = m.keys().find(|k| k.as_str() != "tag") {
                return Err(RpcError::InvalidParams(format!("unknown parameter {k:?} (only \"tag\")")));
            }
            match m.get("tag") {
                None => Ok(None),
                Some(Value::String(t)) => Ok(Some(t.clone())),
                Some(_) => Err(RpcError::InvalidParams("\"tag\" must be a string".into())),
            }
        }
        other => no_params(other).map(|()| None),
    }
}

/// A JSON object as a TOML table (a function's description), refusing nulls and non-objects.
fn json_table(params: &Value) -> Result<toml::Table, RpcError> {
    if !params.is_object() {
        return Err(RpcError::InvalidParams("expected an object with \"socket_path\" and \"tag\"".into()));
    }
    serde_json::from_value::<toml::Table>(params.clone())
        .map_err(|e| RpcError::InvalidParams(format!("not a function description: {e}")))
}

fn no_params(params: &Value) -> Result<(), RpcError> {
    match params {
        Value::Null => Ok(()),
        Value::Object(m) if m.is_empty() => Ok(()),
        Value::Array(a) if a.is_empty() => Ok(()),
        _ => Err(RpcError::InvalidParams("this method takes no parameters".into())),
    }
}

/// Parses a log level name.
pub fn parse_level(s: &str) -> Option<LevelFilter> {
    s.parse().ok()
}

impl Methods {
    fn call(&mut self, method: &str, params: &Value) -> Result<Outcome, RpcError> {
        let value = match method {
            "get_device" => {
                let tag = tag_param(params)?;
                let (device, _, mut config) = self.function(tag.as_deref())?;
                // The function's spec, beside what the daemon says of itself.
                if let (Some(f), Some(d)) = (config.as_object_mut(), self.state.config.as_object()) {
                    for (k, v) in d {
                        f.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                    f.insert("log_level".into(), log::max_level().to_string().to_lowercase().into());
                }
                Ok(json!({
                    "name": "virtiofs-dpu",
                    "version": env!("CARGO_PKG_VERSION"),
                    "pid": std::process::id(),
                    "uptime_s": self.state.started.elapsed().as_secs_f64(),
                    "config": config,
                    "client": device.client(),
                    "functions": self.state.functions.tags(),
                    "live_update": self.state.updater.is_some(),
                    "updates": self.state.updater.as_ref().map_or(0, |u| u.updates()),
                    "recoveries": self.state.updater.as_ref().map_or(0, |u| u.recoveries()),
                    "state_format": crate::update::state::STATE_VERSION,
                }))
            }
            "get_stats" => {
                let tag = tag_param(params)?;
                let (device, fuse, _) = self.function(tag.as_deref())?;
                let name = self.tag_of(tag);
                let now = device.stats();
                let (device, since) = match self.baselines.get(&name) {
                    Some((base, at)) => (now.since(base), *at),
                    None => (now, self.state.started),
                };
                Ok(json!({
                    "tag": name,
                    "uptime_s": self.state.started.elapsed().as_secs_f64(),
                    "interval_s": since.elapsed().as_secs_f64(),
                    "recoveries": self.state.updater.as_ref().map_or(0, |u| u.recoveries()),
                    "checkpoints": self.state.updater.as_ref().and_then(|u| u.checkpoints()),
                    "device": device,
                    "fuse": fuse(),
                }))
            }
            "reset_stats" => {
                let tags = match tag_param(params)? {
                    Some(t) => vec![t],
                    None => self.state.functions.tags(),
                };
                for t in tags {
                    let (device, _, _) = self.function(Some(&t))?;
                    self.baselines.insert(t, (device.stats(), Instant::now()));
                }
                Ok(Value::Bool(true))
            }
            "create_function" => {
                // Off this thread: starting a backend may wait (an NFS export's MOUNT and first
                // calls, up to its `nfs_timeout_ms`).
                let table = json_table(params)?;
                let functions = self.state.functions.clone();
                return Ok(Outcome::Later(Box::new(move || {
                    let info = functions.create(table).map_err(function_error)?;
                    Ok(json!(info))
                })));
            }
            "delete_function" => {
                let tag = tag_param(params)?
                    .ok_or_else(|| RpcError::InvalidParams("expected {\"tag\": TAG}".into()))?;
                self.baselines.remove(&tag);
                let functions = self.state.functions.clone();
                return Ok(Outcome::Later(Box::new(move || {
                    let gone = functions.delete(&tag).map_err(function_error)?;
                    Ok(json!({
                        "tag": tag,
                        "requests": gone.stats.requests().iter().sum::<u64>(),
                        "removed": gone.how.describe(),
                    }))
                })));
            }
            "live_update" => {
                let binary = binary_param(params)?;
                let Some(updater) = self.state.updater.clone() else {
                    return Err(RpcError::Server(crate::update::UpdateError::NoSupervisor.to_string()));
                };
                let functions = self.state.functions.clone();
                return Ok(Outcome::Later(Box::new(move || {
                    let r = updater.live_update(&functions, binary);
                    let v = r.map_err(|e| RpcError::Server(crate::error_chain(&e)))?;
                    // This process ends once the answer is out; the new one serves.
                    crate::update::exit_after_answer();
                    Ok(v)
                })));
            }
            "list_functions" => {
                no_params(params)?;
                Ok(json!(self.state.functions.list()))
            }
            "set_log_level" => {
                let level = params
                    .get("level")
                    .and_then(Value::as_str)
                    .ok_or_else(|| RpcError::InvalidParams("expected {\"level\": NAME}".into()))?;
                let level = parse_level(level).ok_or_else(|| {
                    RpcError::InvalidParams(format!(
                        "level {level:?}: expected off, error, warn, info, debug or trace"
                    ))
                })?;
                let before = log::max_level();
                log::set_max_level(level);
                log::info!("control socket: log level {before} -> {level}");
                Ok(Value::String(before.to_string().to_lowercase()))
            }
            "rpc_get_methods" => {
                no_params(params)?;
                Ok(json!(METHODS))
            }
            other => Err(RpcError::MethodNotFound(other.to_string())),
        };
        value.map(Outcome::Now)
    }

    /// The function `tag` (the first with `None`).
    fn function(
        &self,
        tag: Option<&str>,
    ) -> Result<(StopHandle, crate::functions::FuseStatsFn, Value), RpcError> {
        self.state.functions.get(tag).ok_or_else(|| match tag {
            Some(t) => RpcError::InvalidParams(format!("no function with tag {t:?}")),
            None => RpcError::InvalidParams("the daemon serves no function".into()),
        })
    }

    /// `tag`, or the first function's.
    fn tag_of(&self, tag: Option<String>) -> String {
        tag.or_else(|| self.state.functions.tags().into_iter().next()).unwrap_or_default()
    }

    /// The answer to one request object.
    fn request(&mut self, req: &Value) -> Answer {
        match self.request_inner(req) {
            Ok(a) => a,
            Err(response) => Answer::Now(Some(response)),
        }
    }

    /// [`Self::request`]; `Err` is an error response to send as it is.
    fn request_inner(&mut self, req: &Value) -> Result<Answer, Value> {
        let Value::Object(obj) = req else {
            return Err(RpcError::InvalidRequest("not an object".into()).to_json(Value::Null));
        };
        let id = obj.get("id").cloned();
        let err_id = id.clone().unwrap_or(Value::Null);
        match &id {
            None | Some(Value::Null | Value::String(_) | Value::Number(_)) => {}
            Some(_) => {
                return Err(RpcError::InvalidRequest("id must be a string, number or null".into())
                    .to_json(Value::Null))
            }
        }
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(RpcError::InvalidRequest("\"jsonrpc\" must be \"2.0\"".into()).to_json(err_id));
        }
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            return Err(RpcError::InvalidRequest("\"method\" must be a string".into()).to_json(err_id));
        };
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        if !matches!(params, Value::Null | Value::Object(_) | Value::Array(_)) {
            return Err(
                RpcError::InvalidRequest("\"params\" must be an object or an array".into()).to_json(err_id)
            );
        }
        let result = self.call(method, &params);
        debug!("control socket: {method}: {}", if result.is_ok() { "ok" } else { "error" });
        Ok(match result {
            Ok(Outcome::Later(job)) => Answer::Later(id, job),
            // A notification gets no response.
            Ok(Outcome::Now(v)) => Answer::Now(id.map(|id| json!({"jsonrpc": "2.0", "result": v, "id": id}))),
            Err(e) => Answer::Now(id.map(|id| e.to_json(id))),
        })
    }

    /// The answer to one request line.
    fn line(&mut self, line: &[u8]) -> LineAnswer {
        let text = match std::str::from_utf8(line) {
            Ok(t) => t.trim(),
            Err(e) => return LineAnswer::now(Some(RpcError::Parse(e.to_string()).to_json(Value::Null))),
        };
        if text.is_empty() {
            return LineAnswer::now(None);
        }
        let v: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => return LineAnswer::now(Some(RpcError::Parse(e.to_string()).to_json(Value::Null))),
        };
        let (reqs, batch) = match v {
            Value::Array(reqs) if reqs.is_empty() => {
                return LineAnswer::now(Some(
                    RpcError::InvalidRequest("empty batch".into()).to_json(Value::Null),
                ))
            }
            Value::Array(reqs) if reqs.len() > MAX_BATCH => {
                return LineAnswer::now(Some(
                    RpcError::InvalidRequest(format!(
                        "a batch of {} requests: at most {MAX_BATCH}",
                        reqs.len()
                    ))
                    .to_json(Value::Null),
                ))
            }
            Value::Array(reqs) => (reqs, true),
            v => (vec![v], false),
        };
        let mut answer = LineAnswer { slots: Vec::with_capacity(reqs.len()), jobs: Vec::new(), batch };
        for r in &reqs {
            match self.request(r) {
                Answer::Now(v) => answer.slots.push(v),
                Answer::Later(id, job) => {
                    answer.jobs.push((answer.slots.len(), id, job));
                    answer.slots.push(None);
                }
            }
        }
        answer
    }
}

/// A function that could not be created or removed, as a JSON-RPC error: a bad description is
/// invalid params, the rest (a socket in use, a backend that cannot start) a server error.
fn function_error(e: FunctionError) -> RpcError {
    match e {
        FunctionError::Invalid(_) | FunctionError::Exists(_) | FunctionError::NotFound(_) => {
            RpcError::InvalidParams(e.to_string())
        }
        FunctionError::Spec(_) => RpcError::InvalidParams(crate::error_chain(&e)),
        FunctionError::NotAllowed(why) => RpcError::PermissionDenied(why),
        other => RpcError::Server(crate::error_chain(&other)),
    }
}

/// A bound control socket, not served yet (bound early, before a sandbox changes the root).
pub struct BoundControlSocket {
    path: PathBuf,
    listener: StdListener,
    /// The socket file and `PATH.lock`, locked for as long as the socket is served.
    files: SocketFiles,
    /// The uid that bound it (the socket file's owner).
    uid: u32,
    access: ControlAccess,
}

impl BoundControlSocket {
    /// Binds `path`, replacing a stale socket file there, and gives the socket file `access`'s
    /// group and mode. A live socket is not replaced: a daemon holding `PATH.lock`, or a
    /// socket that accepts a connection, makes this fail ([`BindError::InUse`]); nor is
    /// anything that is not a socket. A failed bind leaves nothing behind.
    pub fn bind(path: &Path, access: ControlAccess) -> Result<Self, ControlSocketError> {
        let (listener, files) =
            bind_exclusive_with(path, SocketAccess { group: access.group, mode: Some(access.mode) })?;
        let uid = crate::sys::effective_uid();
        Ok(BoundControlSocket { path: path.to_path_buf(), listener, files, uid, access })
    }

    /// Leaves the socket file in place at exit (the process's root changed after binding, so
    /// the path names something else now).
    pub fn keep_socket_file(&mut self) {
        self.files.keep_socket_file();
    }

    /// A control socket handed over by the process this one took over from (a live update);
    /// `uid`: this process's effective uid (read before its system-call filter).
    pub fn handed(
        path: PathBuf,
        listener: StdListener,
        files: SocketFiles,
        access: ControlAccess,
        uid: u32,
    ) -> Self {
        BoundControlSocket { path, listener, files, uid, access }
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves `state` on a thread of its own until the returned handle is stopped or dropped.
    pub fn serve(self, state: ControlState) -> Result<ControlSocket, ControlSocketError> {
        let BoundControlSocket { path, listener, mut files, uid, access } = self;
        files.served();
        if let Some(u) = &state.updater {
            let copy = listener.try_clone().and_then(|l| Ok((l, files.handed_over()?)));
            match copy {
                Ok((listener, files)) => {
                    u.keep_control(crate::update::ControlCopy { path: path.clone(), listener, files })
                }
                Err(e) => log::warn!("control socket: no copy for a live update (it would not move): {e}"),
            }
        }
        let shown = path.display().to_string();
        let setup = |source| ControlSocketError::Setup { path: shown.clone(), source };
        let methods = Methods { state, baselines: HashMap::new() };
        let (waker, stop, join) = serve::spawn(listener, methods, uid, access.group).map_err(setup)?;
        Ok(ControlSocket { path, files, waker, stop, join: Some(join) })
    }
}

/// A control socket being served.
pub struct ControlSocket {
    path: PathBuf,
    /// The socket file (removed when serving stops) and the lock, held until then.
    files: SocketFiles,
    waker: Arc<Waker>,
    /// Tells the loop to end (its waker also says that a job finished).
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
}

impl ControlSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving and removes the socket file.
    pub fn stop(mut self) {
        self.shut();
    }

    /// Stops serving and leaves the socket file (a live update's new process serves it).
    pub fn stop_handed_over(mut self) {
        self.files.keep_socket_file();
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(j) = self.join.take() {
            self.stop.store(true, Ordering::SeqCst);
            let _ = self.waker.wake();
            let _ = j.join();
            self.files.remove_socket_file();
        }
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.shut();
    }
}
