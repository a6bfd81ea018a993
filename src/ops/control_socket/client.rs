//! The client side of the control socket (`virtiofs-dpu stats`, tests, operators' tools): one
//! request, one response.

use std::io::{ErrorKind, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

/// A client of the control socket: one request, one response.
pub struct ControlClient {
    stream: std::io::BufReader<std::os::unix::net::UnixStream>,
    next_id: u64,
}

/// Why a control-socket call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached or broke.
    #[error("control socket {path}")]
    Io {
        /// The socket's path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The daemon answered with an error.
    #[error("control socket: {method}: error {code}: {message}")]
    Rpc {
        /// The method called.
        method: String,
        /// The JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// The answer was not a JSON-RPC response.
    #[error("control socket: {method}: malformed response: {detail}")]
    Malformed {
        /// The method called.
        method: String,
        /// What was wrong.
        detail: String,
    },
}

impl ControlClient {
    /// Connects to the control socket at `path`.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let io = |source| ClientError::Io { path: path.display().to_string(), source };
        let s = std::os::unix::net::UnixStream::connect(path).map_err(io)?;
        s.set_read_timeout(Some(Duration::from_secs(10))).map_err(io)?;
        Ok(ControlClient { stream: std::io::BufReader::new(s), next_id: 1 })
    }

    /// Waits at most `timeout` for each answer from now on (10 s by default).
    pub fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.stream.get_ref().set_read_timeout(Some(timeout))
    }

    /// Calls `method` with `params`; returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        use std::io::BufRead;
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
        if !params.is_null() {
            req["params"] = params;
        }
        let io = |source| ClientError::Io { path: String::new(), source };
        let line = format!("{req}\n");
        let written = self.stream.get_mut().write_all(line.as_bytes());
        let mut answer = String::new();
        // A daemon that refused the connection wrote why before closing it: read that first.
        let read = self.stream.read_line(&mut answer);
        match (written, read) {
            (_, Ok(n)) if n > 0 => {}
            (Err(e), _) | (Ok(()), Err(e)) => return Err(io(e)),
            (Ok(()), Ok(_)) => {
                return Err(io(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the daemon closed the connection",
                )))
            }
        }
        let malformed = |detail: String| ClientError::Malformed { method: method.into(), detail };
        let v: Value = serde_json::from_str(&answer).map_err(|e| malformed(e.to_string()))?;
        if let Some(e) = v.get("error") {
            return Err(ClientError::Rpc {
                method: method.into(),
                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: e.get("message").and_then(Value::as_str).unwrap_or("").into(),
            });
        }
        if v.get("id") != Some(&json!(id)) {
            return Err(malformed(format!("id {:?}, expected {id}", v.get("id"))));
        }
        v.get("result").cloned().ok_or_else(|| malformed("no result".into()))
    }
}
